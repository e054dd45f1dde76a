"""End to end: images through a real projector. The suite's model with a random-weight mlp
projector built by the test (tests/support/tiny_mmproj.py) behind a real server, driven by the
official openai and anthropic SDKs and a Vertex predict envelope. The projector's weights
are noise, so the tests check the pipeline, not what the model says: an image's tokens are
counted, two images give two answers at temperature 0 and the same image the same one, a
repeated image comes from the cache, and every bad image is a clear 4xx while the server
stays up."""

from __future__ import annotations

import base64
import concurrent.futures as cf
from pathlib import Path

import anthropic
import openai
import pytest
import requests
from gguf import GGUFReader

from tests.support.images import data_url, encoded, png_bomb, wav
from tests.support.mtmd_reference import reference_answer
from tests.support.server import VERTEX_PREDICT, ServerProcess, free_port, running_server
from tests.support.tiny_mmproj import N_TOKENS, TINY_GEMMA3, build_tiny_mmproj

ASK = "Describe this image."
GREEDY = {"temperature": 0, "max_tokens": 12}


def n_embd(model: Path) -> int:
    reader = GGUFReader(str(model))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    return int(reader.fields[f"{arch}.embedding_length"].parts[-1][0])


@pytest.fixture(scope="module")
def mmproj(default_model, tmp_path_factory) -> Path:
    return build_tiny_mmproj(tmp_path_factory.mktemp("vision") / "mmproj.gguf", n_embd(default_model))


@pytest.fixture(scope="module")
def server(mmproj) -> ServerProcess:
    port = free_port()
    env = {"MMPROJ": str(mmproj), "PARALLEL": "3", "IMAGES_PER_REQUEST": "3",
           "IMAGE_MAX_BYTES": "200000", "AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port),
           "AIP_PREDICT_ROUTE": VERTEX_PREDICT}
    with running_server(env) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=120)


def image_message(url: str | None, text: str = ASK) -> list[dict]:
    parts = [{"type": "text", "text": text}]
    if url is not None:
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return [{"role": "user", "content": parts}]


def chat(client, url: str | None, **kw):
    return client.chat.completions.create(model="m", messages=image_message(url), **GREEDY, **kw)


def test_props_say_the_model_sees(server):
    props = requests.get(server.url("/props"), timeout=10).json()
    assert props["modalities"] == {"vision": True, "audio": False}
    models = requests.get(server.url("/v1/models"), timeout=10).json()["data"]
    assert models[0]["meta"]["modalities"] == {"vision": True, "audio": False}
    assert health_body(server)["modalities"] == {"vision": True, "audio": False}


def test_an_image_is_counted_as_its_tokens(client):
    with_image = chat(client, data_url(encoded("red")))
    text_only = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": [{"type": "text", "text": ASK}]}], **GREEDY)
    assert with_image.usage.prompt_tokens == text_only.usage.prompt_tokens + N_TOKENS


def health_body(server) -> dict:
    return requests.get(server.url("/health"), timeout=10).json()


def engine_stats(server) -> dict:
    return health_body(server)["engine"]


def test_different_images_differ_and_a_repeat_is_the_same_and_cached(server, client):
    red = data_url(encoded((200, 30, 30)))
    before = engine_stats(server)
    first = chat(client, red)
    blue = chat(client, data_url(encoded((30, 30, 200))))
    again = chat(client, red)
    after = engine_stats(server)
    # the repeat skipped the encoder: two images encoded, one taken from the cache
    assert after["images_encoded"] - before["images_encoded"] == 2
    assert after["image_cache_hits"] - before["image_cache_hits"] == 1
    assert first.choices[0].message.content != blue.choices[0].message.content
    assert again.choices[0].message.content == first.choices[0].message.content
    # the whole prompt but its last token came from the cache, the image's KV with it
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    # blue after red: the text before the image was reused, nothing of the image
    cached = blue.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= blue.usage.prompt_tokens - N_TOKENS - 1


def colliding_pngs() -> tuple[bytes, bytes]:
    """Two 8 x 8 PNGs whose pixel digests (app.core.media: sha256 of size and pixels) share
    their first 7 hex digits, the 28 bits an image's placeholder id is made of: a birthday
    search, about 2^14 digests (10 ms), bounded and the same every run."""
    import hashlib
    import io

    from PIL import Image as PILImage

    seen: dict[str, bytes] = {}
    for i in range(1 << 22):
        pixels = i.to_bytes(4, "little") * 48  # 8 x 8 x RGB
        head = hashlib.sha256(b"8x8:" + pixels).hexdigest()[:7]
        if head in seen:
            break
        seen[head] = pixels
    else:
        raise AssertionError("no collision in 2^22 digests")
    out = []
    for raw in (seen[head], pixels):
        buf = io.BytesIO()
        PILImage.frombytes("RGB", (8, 8), raw).save(buf, "PNG")
        out.append(buf.getvalue())
    return out[0], out[1]


def test_an_image_whose_placeholder_collides_is_computed_afresh(client):
    """Two images whose ids in the prompt are equal (28 bits of their digests) but whose
    digests are not: the second reuses the text before its image and none of the first's
    image KV, and answers as it does with no cache at all."""
    first, second = (data_url(raw) for raw in colliding_pngs())
    chat(client, first)
    b = chat(client, second)
    fresh = chat(client, second, extra_body={"cache_prompt": False})
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    cached = b.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= b.usage.prompt_tokens - N_TOKENS - 1
    assert b.choices[0].message.content == fresh.choices[0].message.content


def test_the_same_pixels_in_another_format_hit_the_same_cache(client):
    png = chat(client, data_url(encoded("green", fmt="PNG")))
    gif = chat(client, data_url(encoded("green", fmt="GIF"), "image/gif"))
    assert gif.choices[0].message.content == png.choices[0].message.content
    assert gif.usage.prompt_tokens_details.cached_tokens == gif.usage.prompt_tokens - 1


def test_two_images_in_one_turn_in_their_order(client):
    red, blue = data_url(encoded("red")), data_url(encoded("blue"))

    def both(a, b):
        return client.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": a}}, {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": b}}]}], **GREEDY)

    rb, br = both(red, blue), both(blue, red)
    assert rb.usage.prompt_tokens == br.usage.prompt_tokens
    assert rb.choices[0].message.content != br.choices[0].message.content


def test_images_stream_like_text(client):
    chunks = list(chat(client, data_url(encoded("red")), stream=True,
                       stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat(client, data_url(encoded("red"))).choices[0].message.content
    assert chunks[-1].usage.prompt_tokens > N_TOKENS


def test_anthropic_sdk_sends_a_base64_image(server, client):
    ac = anthropic.Anthropic(base_url=server.url(""), api_key="x", max_retries=0, timeout=120)
    raw = encoded("red")
    msg = ac.messages.create(model="m", max_tokens=12, messages=[
        {"role": "user", "content": [
            {"type": "text", "text": ASK},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(raw).decode()}}]}])
    count = ac.messages.count_tokens(model="m", messages=[{"role": "user", "content": [
        {"type": "text", "text": ASK},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(raw).decode()}}]}])
    # Anthropic's input_tokens leaves out what was read from the cache
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == count.input_tokens
    # the same image and words as a Chat Completions turn (there a text block and an image
    # join with no blank line between them)
    assert count.input_tokens >= chat(client, data_url(raw)).usage.prompt_tokens > N_TOKENS


def test_responses_input_image(client):
    url = data_url(encoded("red"))
    resp = client.responses.create(model="m", temperature=0, max_output_tokens=12, input=[
        {"role": "user", "content": [{"type": "input_text", "text": ASK},
                                     {"type": "input_image", "image_url": url}]}])
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.input_tokens == chat(client, url).usage.prompt_tokens


def test_gemini_sdk_inline_image(server, client):
    from google import genai
    from google.genai import types

    raw = encoded("red")
    g = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=server.url("")))
    parts = [types.Part(text=ASK), types.Part.from_bytes(data=raw, mime_type="image/png")]
    config = types.GenerateContentConfig(temperature=0, max_output_tokens=12)
    reply = g.models.generate_content(model="m", contents=[types.Content(role="user", parts=parts)],
                                      config=config)
    same = chat(client, data_url(raw))
    assert reply.text == same.choices[0].message.content
    assert reply.usage_metadata.prompt_token_count == same.usage.prompt_tokens
    counted = g.models.count_tokens(model="m", contents=[types.Content(role="user", parts=parts)])
    assert counted.total_tokens == same.usage.prompt_tokens
    with pytest.raises(genai.errors.ClientError) as err:  # a file URI nobody allowed
        g.models.generate_content(model="m", config=config, contents=[types.Content(
            role="user", parts=[types.Part.from_uri(file_uri="gs://b/x.png", mime_type="image/png")])])
    assert err.value.code == 400 and "IMAGE_BUCKETS" in err.value.message


def test_ollama_sdk_images(server, client):
    import ollama

    raw = encoded("red")
    o = ollama.Client(host=server.url(""))
    options = {"temperature": 0, "num_predict": 12}
    reply = o.chat(model="m", options=options,
                   messages=[{"role": "user", "content": ASK, "images": [raw]}])
    gen = o.generate(model="m", prompt=ASK, images=[raw], options=options)
    # Ollama puts a turn's images before its text
    first = client.chat.completions.create(model="m", **GREEDY, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(raw)}}, {"type": "text", "text": ASK}]}])
    assert reply.message.content == gen.response == first.choices[0].message.content
    assert reply.prompt_eval_count == first.usage.prompt_tokens


def test_vertex_predict_envelope_carries_images(server, client):
    url = data_url(encoded("red"))
    body = {"instances": [{"messages": image_message(url), **GREEDY},
                          {"messages": image_message("https://example.com/x.png"), **GREEDY}]}
    r = requests.post(server.url(VERTEX_PREDICT), json=body, timeout=120)
    assert r.status_code == 200
    ok, bad = r.json()["predictions"]
    assert ok["choices"][0]["message"]["content"] == chat(client, url).choices[0].message.content
    assert "not fetched" in bad["error"]["message"]


@pytest.mark.parametrize("url, status, code", [
    (data_url(png_bomb()), 400, "image_too_large"),
    (data_url(b"GIF89a but not really a gif at all"), 400, "invalid_image"),
    (data_url(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64, "video/mp4"), 400, "invalid_image"),
    (data_url(encoded("red", (40, 40), "BMP")), 400, "invalid_image"),
    ("data:image/png;base64," + "A" * 300_000, 413, "payload_too_large"),
    ("https://example.com/cat.png", 400, "image_url_not_allowed"),
    ("file:///etc/passwd", 400, "invalid_image"),
])
def test_bad_images_are_clear_errors_and_the_server_stays_up(server, client, url, status, code):
    with pytest.raises(openai.APIStatusError) as err:
        chat(client, url)
    assert err.value.status_code == status
    assert err.value.body["code"] == code and err.value.body["param"] == "messages.0.content.1.image_url.url"
    assert requests.get(server.url("/health"), timeout=10).status_code == 200


def test_gs_images_from_the_buckets_the_operator_lists(server_factory, gcs_proxy, mmproj):
    srv = server_factory({"MMPROJ": str(mmproj), "STORAGE_EMULATOR_HOST": gcs_proxy.url,
                          "IMAGE_BUCKETS": "models", "PARALLEL": "1"})
    srv.wait_ready()
    c = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0, timeout=60)
    by_url = chat(c, "gs://models/images/red.png")
    inline = chat(c, data_url(encoded("red")))
    assert by_url.choices[0].message.content == inline.choices[0].message.content
    assert by_url.usage.prompt_tokens == inline.usage.prompt_tokens
    for url, code in (("gs://models/images/missing.png", "image_not_found"),
                      ("gs://another-bucket/red.png", "image_url_not_allowed"),
                      ("https://127.0.0.1:1/red.png", "image_url_not_allowed")):
        with pytest.raises(openai.BadRequestError) as err:
            chat(c, url)
        assert err.value.body["code"] == code, url
        assert err.value.body["param"] == "messages.0.content.1.image_url.url"


def test_too_many_images(client):
    part = {"type": "image_url", "image_url": {"url": data_url(encoded("red", (8, 8)))}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": [part] * 4}],
                                       **GREEDY)
    assert err.value.body["code"] == "too_many_images"
    assert err.value.body["param"] == "messages.0.content.3.image_url.url"


def test_a_forged_image_mark_in_text_is_only_text(client):
    forged = client.chat.completions.create(model="m", messages=[
        {"role": "user", "content": "look: \ufdd2 here"}], **GREEDY)
    assert forged.choices[0].finish_reason  # answered as text, no image expected or read


def test_image_requests_beside_text_streams_all_finish(client):
    """Three streams at once, two with images: each gets its whole answer."""
    def text_stream() -> int:
        s = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Count."}],
                                           stream=True, temperature=0, max_tokens=24)
        return sum(1 for c in s if c.choices and c.choices[0].delta.content)

    with cf.ThreadPoolExecutor(3) as pool:
        streams = pool.submit(text_stream)
        images = [pool.submit(chat, client, data_url(encoded(c))) for c in ("red", "blue")]
        assert streams.result(timeout=120) > 0
        assert all(f.result(timeout=120).choices[0].finish_reason for f in images)


def test_a_projector_whose_images_attend_both_ways(default_model, tmp_path):
    """Gemma 3's projector type: libmtmd decodes its image tokens with causal attention off
    for the whole context. The image is decoded alone, so the other sequences' next step is
    causal again: a text answer is the same beside image requests as alone."""
    proj = build_tiny_mmproj(tmp_path / "mmproj-gemma3.gguf", n_embd(default_model),
                             shape=TINY_GEMMA3)
    with running_server({"MMPROJ": str(proj), "PARALLEL": "3"}) as srv:
        c = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0, timeout=120)
        ask = [{"role": "user", "content": "Name three colours."}]
        alone = c.chat.completions.create(model="m", messages=ask, temperature=0, max_tokens=24)
        with cf.ThreadPoolExecutor(3) as pool:
            text = pool.submit(c.chat.completions.create, model="m", messages=ask,
                               temperature=0, max_tokens=24)
            images = [pool.submit(chat, c, data_url(encoded(col))) for col in ("red", "blue")]
            red, blue = (f.result(timeout=120) for f in images)
            beside = text.result(timeout=120)
        assert beside.choices[0].message.content == alone.choices[0].message.content
        assert red.choices[0].message.content != blue.choices[0].message.content
        again = chat(c, data_url(encoded("red")))
        assert again.choices[0].message.content == red.choices[0].message.content
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
        # the projector wraps its 4 image tokens in text of its own (Gemma 3's image markers)
        assert red.usage.prompt_tokens > chat(c, None).usage.prompt_tokens + TINY_GEMMA3.n_tokens


def test_a_model_without_a_projector_refuses_images(default_model):
    with running_server({"PARALLEL": "1"}) as srv:
        c = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as err:
            chat(c, data_url(encoded("red")))
        assert "no vision projector" in err.value.body["message"]
        assert err.value.body["code"] == "image_input_not_supported"
        assert requests.get(srv.url("/props"), timeout=10).json()["modalities"]["vision"] is False


def test_the_encoder_cache_is_per_key_and_bounded(default_model, mmproj):
    """The projector in process: a repeat from the same key scope skips the encoder, another
    key's identical image does not, and the cache drops the oldest past its bytes."""
    from llama_cpp import llama_cpp as ll

    from app.core.media import MediaInput, MediaLimits, decode
    from app.engine.llama_media import Projector

    limits = MediaLimits(8, 1 << 20, 10**7, 256)
    red, blue = (decode(MediaInput(encoded(c), "p"), limits) for c in ("red", "blue"))
    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    params.n_gpu_layers = 0
    model = ll.llama_model_load_from_file(str(default_model).encode(), params)
    try:
        one_image = N_TOKENS * n_embd(default_model) * 4  # float32 embeddings
        for limit, hits in ((1 << 20, 1), (one_image, 0)):
            proj = Projector(ll, model, str(mmproj), use_gpu=False, n_threads=1, cache_bytes=limit)
            try:
                spans = []
                for image, scope in ((red, "a"), (blue, "a"), (red, "a"), (red, "b")):
                    tokens, new = proj.image_tokens(image, 5, scope)
                    assert len(tokens) == N_TOKENS and new[0].start == 5
                    spans += new
                assert (proj.encodes, proj.cache_hits) == (4 - hits, hits)
                assert spans[0].placeholder == spans[2].placeholder != spans[1].placeholder
                assert (spans[0].embd == spans[3].embd).all()  # the same image, encoded again
                for span in spans:
                    proj.free_span(span)
            finally:
                proj.close()
    finally:
        ll.llama_model_free(model)


# ---- M-RoPE: Qwen-VL's 2-D image positions -----------------------------------------------------


@pytest.fixture(scope="module")
def qwen2vl(default_model, tmp_path_factory) -> tuple[Path, Path]:
    from tests.support import tiny_qwen2vl

    d = tmp_path_factory.mktemp("qwen2vl")
    return (tiny_qwen2vl.build_text(d / "tiny-qwen2vl.gguf", default_model),
            tiny_qwen2vl.build_projector(d / "mmproj-tiny-qwen2vl.gguf"))


def test_m_rope_images_are_placed_as_libmtmd_places_them(qwen2vl):
    """A Qwen2-VL pair: an image of 12 tokens moves the position by 4. The server's greedy
    tokens equal libmtmd's own evaluation of the same prompt, fresh and after reusing the
    image's KV from the cache with other words after it."""
    from llama_cpp import mtmd_cpp as mt
    from PIL import Image as PILImage

    from app.engine.types import MEDIA
    from app.formats.chat_template import render

    model, proj = qwen2vl
    raw = encoded((120, 40, 200), (64, 48))
    rgb = PILImage.open(__import__("io").BytesIO(raw)).convert("RGB").tobytes()
    template = bytes(GGUFReader(str(model)).fields["tokenizer.chat_template"].parts[-1]).decode()
    with running_server({"MODEL": str(model), "MMPROJ": str(proj), "PARALLEL": "2"}) as srv:
        c = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0, timeout=120)
        for words in ("Describe this image.", "What colour is it?"):
            turn = [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(raw)}},
                {"type": "text", "text": words}]}]
            reply = c.chat.completions.create(
                model="m", messages=turn, temperature=0, max_tokens=8, logprobs=True,
                extra_body={"return_tokens_as_token_ids": True})
            got = [int(t.token.split(":")[1]) for t in reply.choices[0].logprobs.content]
            prompt = render(template, [{"role": "user", "content": MEDIA + words}])
            want = reference_answer(model, proj, prompt.replace(MEDIA, mt.mtmd_default_marker().decode()),
                                    [(rgb, 64, 48)], 8)
            assert got == want, words
        # the second question reused the image's KV (its 12 tokens and the words before it),
        # and its own words went in at positions counted from there
        # (what was not cached: the new words and the assistant's cue, a dozen tokens)
        usage = reply.usage
        assert usage.prompt_tokens - 15 <= usage.prompt_tokens_details.cached_tokens


# ---- audio: a projector that hears --------------------------------------------------------------


def audio_message(raw: bytes, text: str = "What do you hear?") -> list[dict]:
    b64 = base64.b64encode(raw).decode()
    return [{"role": "user", "content": [
        {"type": "text", "text": text},
        {"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}}]}]


def test_a_projector_that_hears(default_model, tmp_path, server):
    """A random-weight Qwen2-Audio-type projector: WAV in on Chat Completions and Gemini, the
    sound's tokens counted, two sounds differ, a repeat is the same and cached; images to it,
    and sounds to a projector that only sees, are 400s naming the part."""
    from google import genai
    from google.genai import types

    from tests.support.tiny_audio import build_tiny_audio

    proj = build_tiny_audio(tmp_path / "mmproj-audio.gguf", n_embd(default_model))
    with running_server({"MMPROJ": str(proj), "PARALLEL": "2", "CTX_SIZE": "2048"}) as srv:
        assert requests.get(srv.url("/props"), timeout=10).json()["modalities"] == {
            "vision": False, "audio": True}
        c = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0, timeout=120)

        def hear(raw: bytes, cache: bool = True):
            # noise after noise ends at once: ignore_eos keeps it talking
            return c.chat.completions.create(
                model="m", messages=audio_message(raw), **GREEDY, logprobs=True,
                extra_body={"ignore_eos": True, "cache_prompt": cache})

        def heard(reply) -> list[float]:
            """What the sound did to the model: each token's log probability (a small model
            may write the same words after two sounds, never with the same certainty)."""
            return [t.logprob for t in reply.choices[0].logprobs.content]

        # each decoded afresh, the same way: the same sound gives the same numbers exactly
        low, high, again = (hear(wav(1.0, f), cache=False) for f in (220, 880, 220))
        assert heard(low) != heard(high)
        assert heard(again) == heard(low)
        cached = hear(wav(1.0, 220))  # decoded once more, then reused from the cache
        cached = hear(wav(1.0, 220))
        assert cached.usage.prompt_tokens_details.cached_tokens == cached.usage.prompt_tokens - 1
        # a 30 s chunk of Whisper frames: 750 tokens, whatever the sound's length
        text_only = c.chat.completions.create(model="m", **GREEDY, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What do you hear?"}]}])
        assert low.usage.prompt_tokens >= text_only.usage.prompt_tokens + 750
        # the same sound at 44.1 kHz is resampled to the projector's 16 kHz
        assert hear(wav(1.0, 220, 44100)).usage.prompt_tokens == low.usage.prompt_tokens
        g = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=srv.url("")))
        reply = g.models.generate_content(
            model="m", config=types.GenerateContentConfig(temperature=0, max_output_tokens=12),
            contents=[types.Content(role="user", parts=[
                types.Part(text="What do you hear?"),
                types.Part.from_bytes(data=wav(1.0, 220), mime_type="audio/wav")])])
        assert reply.usage_metadata.prompt_token_count == low.usage.prompt_tokens
        with pytest.raises(openai.BadRequestError) as err:
            chat(c, data_url(encoded("red")))
        assert err.value.body["code"] == "image_input_not_supported"
        with pytest.raises(openai.BadRequestError) as err:
            hear(wav(90.0, 220, 8000))
        assert err.value.body["code"] == "audio_too_long"
    # and the module's server, whose projector only sees
    cv = openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as err:
        cv.chat.completions.create(model="m", messages=audio_message(wav(0.5)), **GREEDY)
    assert err.value.body["code"] == "audio_input_not_supported"
    assert err.value.body["param"] == "messages.0.content.1.input_audio.data"


# ---- decoding memory per worker (IMAGE_DECODE_BUDGET; security3 M2) -----------------------------


def worker_pid(server: ServerProcess) -> int:
    """The gunicorn worker: the one child of the server's master process."""
    pid = server.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_a_burst_of_inflating_images_is_decoded_within_the_workers_budget(mmproj):
    """Five requests at once, each a ~100 KB PNG that decodes to 4900 x 4900 RGBA plus its RGB
    copy (about 190 MB): with a budget of one such image, the worker's peak memory grows by
    one image's decode and the requests' own memory (1.9 images' worth here), not by every
    image (the review measured +2.2 GB for five 7000 x 7000 ones; with the budget but without
    its trim it was still 5.1 images' worth: glibc kept each prep thread's decode in its
    arena)."""
    import io

    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.new("RGBA", (4900, 4900)).save(buf, "PNG")
    url = data_url(buf.getvalue())
    one = 4900 * 4900 * 8 // 1024  # KiB: the decode_cost of one
    env = {"MMPROJ": str(mmproj), "PARALLEL": "3", "IMAGE_MAX_BYTES": "2000000",
           "IMAGE_DECODE_BUDGET": str((one + 1024) * 1024), "PREPARE_TIMEOUT": "600"}
    with running_server(env) as srv:
        client = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0, timeout=600)
        chat(client, data_url(encoded("red")))  # warm: the projector's buffers are allocated
        pid = worker_pid(srv)
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from now
        base = kib(pid, "VmRSS")
        with cf.ThreadPoolExecutor(5) as pool:
            replies = list(pool.map(lambda _: chat(client, url), range(5)))
        assert all(r.choices[0].finish_reason for r in replies)
        grew = kib(pid, "VmHWM") - base
        assert grew < one * 2.5, f"peak grew {grew} KiB; one image's decode is {one} KiB"
