"""End to end: video through a real projector. The tiny Qwen2-VL pair (tests/support/
tiny_qwen2vl.py) behind a real server; videos made by the test (frames drawn with Pillow,
encoded by ffmpeg). A video is its frames, each an image: the same greedy reply as sending those
frames as images, the frame count in usage, a repeated video's frames from the image cache; on
Chat Completions (vLLM's video_url, llama-server's input_video), Gemini and a Vertex envelope;
every bad video a clear 4xx in the calling API's shape while the server stays up."""

from __future__ import annotations

import base64
import http.server
import io
from collections.abc import Iterator

import openai
import pytest
import requests
from PIL import Image as PILImage

from app.core.video import VideoLimits, extract
from tests.support.images import data_url
from tests.support.mtmd_reference import reference_answer
from tests.support.server import VERTEX_PREDICT, free_port, loopback_http, running_server
from tests.support.videos import ffmpeg
from tests.support.videos import video as make_video

ASK = "What happens in this video?"
GREEDY = {"temperature": 0, "max_tokens": 8}
SIDE = 64  # VIDEO_MAX_SIDE: a 64 x 48 frame is 12 tokens to the tiny projector


@pytest.fixture(scope="module")
def qwen2vl(default_model, tmp_path_factory):
    from tests.support import tiny_qwen2vl

    ffmpeg()
    d = tmp_path_factory.mktemp("qwen2vl-video")
    return (tiny_qwen2vl.build_text(d / "tiny-qwen2vl.gguf", default_model),
            tiny_qwen2vl.build_projector(d / "mmproj-tiny-qwen2vl.gguf"))


class Files(http.server.BaseHTTPRequestHandler):
    """A listed video host: ``files`` by path."""

    files: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def host() -> Iterator[http.server.ThreadingHTTPServer]:
    with loopback_http(Files) as srv:
        yield srv


@pytest.fixture(scope="module")
def server(qwen2vl, host):
    model, proj = qwen2vl
    port = free_port()
    env = {"MODEL": str(model), "MMPROJ": str(proj), "PARALLEL": "2", "IMAGES_PER_REQUEST": "4",
           "VIDEO_MAX_SIDE": str(SIDE), "VIDEO_MAX_BYTES": "200000", "AIP_MODE": "PREDICTION",
           "AIP_HTTP_PORT": str(port), "AIP_PREDICT_ROUTE": VERTEX_PREDICT,
           "IMAGE_URL_HOSTS": f"127.0.0.1:{host.server_address[1]}"}
    with running_server(env) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=120)


def video_message(part: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": ASK}, part]}]


def video_url(raw: bytes) -> dict:
    return {"type": "video_url", "video_url": {"url": data_url(raw, "video/mp4")}}


def chat_raw(server, messages: list[dict], **kw) -> dict:
    r = requests.post(server.url("/v1/chat/completions"), timeout=120,
                      json={"model": "m", "messages": messages, **GREEDY, **kw})
    assert r.status_code == 200, r.text + server.logs()[-3000:]
    return r.json()


def engine_stats(server) -> dict:
    return requests.get(server.url("/health"), timeout=10).json()["engine"]


def test_a_video_is_its_frames_merged_as_libmtmd_merges_them(server, qwen2vl):
    """Qwen2-VL merges two adjacent frames into one set of tokens: three frames are a pair
    and a frame alone, two images' worth of tokens, and the server's greedy tokens are
    libmtmd's own for the same frames, all mergeable."""
    from gguf import GGUFReader
    from llama_cpp import mtmd_cpp as mt

    from app.engine.types import MEDIA
    from app.formats.chat_template import render

    raw = make_video(3, fps=4, size=(128, 96))
    frames = extract(raw, VideoLimits(max_side=SIDE), "x")
    assert len(frames) == 3
    as_video = chat_raw(server, video_message(video_url(raw)), logprobs=True,
                        return_tokens_as_token_ids=True)
    assert as_video["usage"]["prompt_tokens_details"]["video_frames"] == 3
    model, proj = qwen2vl
    template = bytes(GGUFReader(str(model)).fields["tokenizer.chat_template"].parts[-1]).decode()
    prompt = render(template, [{"role": "user", "content": ASK + MEDIA}])
    rgbs = [(im.tobytes(), im.width, im.height)
            for im in (PILImage.open(io.BytesIO(f)).convert("RGB") for f in frames)]
    want = reference_answer(model, proj, prompt.replace(MEDIA, mt.mtmd_default_marker().decode() * 3),
                            rgbs, GREEDY["max_tokens"], mergeable=True)
    got = [int(t["token"].split(":")[1]) for t in as_video["choices"][0]["logprobs"]["content"]]
    assert got == want
    text_only = chat_raw(server, [{"role": "user", "content": ASK}])
    one = chat_raw(server, [{"role": "user", "content": [
        {"type": "text", "text": ASK}, {"type": "image_url", "image_url": {"url": data_url(
            frames[0])}}]}])
    per_image = one["usage"]["prompt_tokens"] - text_only["usage"]["prompt_tokens"]
    assert per_image > 2  # an image's tokens, and its wrappers (vision_start, vision_end)
    assert as_video["usage"]["prompt_tokens"] == text_only["usage"]["prompt_tokens"] + 2 * per_image
    # streamed, the usage chunk carries the frames too
    r = requests.post(server.url("/v1/chat/completions"), timeout=120, stream=True, json={
        "model": "m", "messages": video_message(video_url(raw)), **GREEDY, "stream": True,
        "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    assert '"video_frames":3' in r.text.replace(" ", "")


def test_a_repeated_video_hits_the_image_cache_per_frame_pair(server, client):
    raw = make_video(4, fps=2, first=5)
    before = engine_stats(server)
    first = client.chat.completions.create(model="m", messages=video_message(video_url(raw)),
                                           **GREEDY)
    again = client.chat.completions.create(model="m", messages=video_message(video_url(raw)),
                                           **GREEDY)
    after = engine_stats(server)
    # four frames, two merged pairs: each pair encoded once, then found in the cache
    assert after["images_encoded"] - before["images_encoded"] == 2
    assert after["image_cache_hits"] - before["image_cache_hits"] == 2
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


def test_llama_servers_input_video_and_a_vertex_envelope(server):
    raw = make_video(2, fps=2, first=9)
    want = chat_raw(server, video_message(video_url(raw)))["choices"][0]["message"]["content"]
    b64 = base64.b64encode(raw).decode()
    for part in ({"type": "input_video", "input_video": {"data": b64}},
                 {"type": "input_video", "input_video": b64}):
        got = chat_raw(server, video_message(part))
        assert got["choices"][0]["message"]["content"] == want
        assert got["usage"]["prompt_tokens_details"]["video_frames"] == 2
    body = {"instances": [{"messages": video_message(video_url(raw)), **GREEDY},
                          {"messages": video_message(video_url(b"not a video")), **GREEDY}]}
    r = requests.post(server.url(VERTEX_PREDICT), json=body, timeout=120)
    assert r.status_code == 200
    ok, bad = r.json()["predictions"]
    assert ok["choices"][0]["message"]["content"] == want
    assert "not an MP4/MOV" in bad["error"]["message"]


def test_gemini_sdk_inline_video(server):
    from google import genai
    from google.genai import types

    raw = make_video(2, fps=2, first=13)
    want = chat_raw(server, video_message(video_url(raw)))
    g = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=server.url("")))
    config = types.GenerateContentConfig(temperature=0, max_output_tokens=8)
    parts = [types.Part(text=ASK), types.Part.from_bytes(data=raw, mime_type="video/mp4")]
    reply = g.models.generate_content(model="m", contents=[types.Content(role="user", parts=parts)],
                                      config=config)
    assert reply.text == want["choices"][0]["message"]["content"]
    assert reply.usage_metadata.prompt_token_count == want["usage"]["prompt_tokens"]
    # videoMetadata: the first second only, one frame
    clip = types.Part(inline_data=types.Blob(data=raw, mime_type="video/mp4"),
                      video_metadata=types.VideoMetadata(end_offset="1s"))
    one = g.models.generate_content(model="m", config=config, contents=[
        types.Content(role="user", parts=[types.Part(text=ASK), clip])])
    first = extract(raw, VideoLimits(max_side=SIDE), "x")[0]
    as_image = chat_raw(server, [{"role": "user", "content": [
        {"type": "text", "text": ASK}, {"type": "image_url", "image_url": {"url": data_url(first)}}]}])
    assert one.usage_metadata.prompt_token_count == as_image["usage"]["prompt_tokens"]
    assert one.text == as_image["choices"][0]["message"]["content"]
    bad = [types.Part(text=ASK), types.Part.from_bytes(data=b"RIFF\0\0\0\0AVI junk" * 20,
                                                       mime_type="video/avi")]
    with pytest.raises(genai.errors.ClientError) as err:
        g.models.generate_content(model="m", contents=[types.Content(role="user", parts=bad)],
                                  config=config)
    assert err.value.code == 400 and "cannot be decoded (avi)" in err.value.message
    with pytest.raises(genai.errors.ClientError) as err:  # a file URI nobody allowed
        g.models.generate_content(model="m", config=config, contents=[types.Content(
            role="user", parts=[types.Part.from_uri(file_uri="gs://b/x.mp4",
                                                    mime_type="video/mp4")])])
    assert err.value.code == 400 and "IMAGE_BUCKETS" in err.value.message


@pytest.mark.parametrize("url, status, code", [
    (data_url(b"hello, not a video" * 4, "video/mp4"), 400, "invalid_video"),
    (data_url(b"\x00\x00\x00\x18ftypisom" + bytes(4000), "video/mp4"), 400, "invalid_video"),
    ("data:video/mp4;base64," + "A" * 300_000, 413, "payload_too_large"),
    ("https://example.com/cat.mp4", 400, "image_url_not_allowed"),
    ("file:///etc/passwd", 400, "invalid_video"),
])
def test_bad_videos_are_clear_errors_and_the_server_stays_up(server, client, url, status, code):
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="m", messages=video_message(
            {"type": "video_url", "video_url": {"url": url}}), **GREEDY)
    assert err.value.status_code == status
    assert err.value.body["code"] == code
    assert err.value.body["param"] == "messages.0.content.1.video_url.url"
    assert requests.get(server.url("/health"), timeout=10).status_code == 200


def test_a_truncated_video_is_a_400(server, client):
    raw = make_video(3, fps=4)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=video_message(
            video_url(raw[: len(raw) // 2])), **GREEDY)
    assert err.value.body["code"] == "invalid_video"


def test_a_projector_that_cannot_see_refuses_video(default_model, tmp_path):
    """An audio-only projector reads no video: a 400 naming the part, in each API's shape."""
    from gguf import GGUFReader

    from tests.support.tiny_audio import build_tiny_audio

    reader = GGUFReader(str(default_model))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    n_embd = int(reader.fields[f"{arch}.embedding_length"].parts[-1][0])
    proj = build_tiny_audio(tmp_path / "mmproj-audio.gguf", n_embd)
    raw = make_video(1, fps=1)
    with running_server({"MMPROJ": str(proj), "PARALLEL": "1", "CTX_SIZE": "2048"}) as srv:
        r = requests.post(srv.url("/v1/chat/completions"), timeout=60, json={
            "model": "m", "messages": video_message(video_url(raw)), **GREEDY})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["code"] == "video_input_not_supported"
        assert err["param"] == "messages.0.content.1.video_url.url"
        g = requests.post(srv.url("/v1beta/models/m:generateContent"), timeout=60, json={
            "contents": [{"role": "user", "parts": [{"text": ASK}, {"inlineData": {
                "mimeType": "video/mp4", "data": base64.b64encode(raw).decode()}}]}]})
        assert g.status_code == 400
        assert g.json()["error"]["status"] == "INVALID_ARGUMENT"
        assert "reads no video" in g.json()["error"]["message"]


def test_a_video_from_a_listed_host_reads_as_the_same_video_inline(server, host):
    """The image rules name the hosts; VIDEO_MAX_BYTES bounds what is read."""
    raw = make_video(2, fps=2, first=17)
    Files.files.update({"/clip.mp4": raw, "/big.mp4": raw + bytes(250_000)})
    base = f"http://127.0.0.1:{host.server_address[1]}"
    inline = chat_raw(server, video_message(video_url(raw)))
    by_url = chat_raw(server, video_message({"type": "video_url",
                                             "video_url": {"url": f"{base}/clip.mp4"}}))
    assert by_url["choices"][0]["message"] == inline["choices"][0]["message"]
    assert by_url["usage"]["prompt_tokens"] == inline["usage"]["prompt_tokens"]
    r = requests.post(server.url("/v1/chat/completions"), timeout=60, json={
        "model": "m", "messages": video_message({"type": "input_video",
                                                 "input_video": {"url": f"{base}/big.mp4"}}),
        **GREEDY})
    assert r.status_code == 413 and "VIDEO_MAX_BYTES" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "messages.0.content.1.input_video.url"


def test_merged_frames_cross_to_an_engine_process(server, qwen2vl):
    """ENGINE_PROCESS=on: a video's merged pairs go over the engine's wire as they are, and
    the reply is the in-process one."""
    raw = make_video(2, fps=2, first=21)
    want = chat_raw(server, video_message(video_url(raw)))
    model, proj = qwen2vl
    with running_server({"MODEL": str(model), "MMPROJ": str(proj), "PARALLEL": "1",
                         "VIDEO_MAX_SIDE": str(SIDE), "ENGINE_PROCESS": "on"}) as srv:
        got = chat_raw(srv, video_message(video_url(raw)))
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
    assert got["usage"]["prompt_tokens_details"]["video_frames"] == 2
