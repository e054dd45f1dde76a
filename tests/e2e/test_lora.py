"""End to end: LoRA adapters per request on a real server. Two random-weight adapters for the
suite's model (tests/support/lora_adapter.py) are loaded at start; each is listed as a model,
chosen by ``model`` or by llama-server's ``lora`` field, gives what it gives alone when run
beside the other and the base, does not starve behind a stream of another set, and never
reuses KV computed under another set. POST /lora-adapters answers to the operator's key only."""

from __future__ import annotations

import concurrent.futures as cf

import anthropic
import pytest
import requests

from tests.support.lora_adapter import write_lora
from tests.support.server import ServerProcess, running_server

USER, ADMIN = "user-key-0000000001", "admin-key-000000000001"
AUTH = {"Authorization": f"Bearer {USER}"}
ASK = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def adapters(default_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    return (write_lora(default_model, d / "a.gguf", seed=0),
            write_lora(default_model, d / "b.gguf", seed=1, std=0.04))


@pytest.fixture(scope="module")
def server(adapters):
    a, b = adapters
    env = {"LORA_ADAPTERS": f"sql={a},poet={b}:0.5", "PARALLEL": "4", "SLOTS_PER_REQUEST": "1",
           "CTX_SIZE": "1024", "API_KEY": USER, "ADMIN_API_KEY": ADMIN}
    with running_server(env) as srv:
        yield srv


def chat(srv: ServerProcess, model: str | None = None, messages=ASK, **kw) -> dict:
    body = {"messages": messages, "temperature": 0, "max_tokens": 16, **kw}
    if model is not None:
        body["model"] = model
    r = requests.post(srv.url("/v1/chat/completions"), json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def text(body: dict) -> str:
    return body["choices"][0]["message"]["content"]


def test_models_lists_each_adapter_with_its_parent(server):
    data = requests.get(server.url("/v1/models"), headers=AUTH, timeout=30).json()["data"]
    base = data[0]["id"]
    assert [(m["id"], m.get("parent")) for m in data] == [
        (base, None), ("sql", base), ("poet", base)]
    card = requests.get(server.url("/v1/models/sql"), headers=AUTH, timeout=30).json()
    assert card["parent"] == base
    listed = requests.get(server.url("/lora-adapters"), headers=AUTH, timeout=30).json()
    assert listed == [{"id": 0, "name": "sql", "scale": 0.0, "scale_when_named": 1.0},
                      {"id": 1, "name": "poet", "scale": 0.0, "scale_when_named": 0.5}]


def test_an_adapter_by_name_or_by_lora_field_and_scale_zero_is_the_base(server):
    base = text(chat(server))
    sql = chat(server, "sql")
    assert sql["model"] == "sql"
    assert text(sql) != base
    assert text(chat(server, lora=[{"id": 0, "scale": 1.0}])) == text(sql)
    assert text(chat(server, lora=[{"id": 0, "scale": 0.0}])) == base
    assert text(chat(server, "sql", lora=[{"id": 0, "scale": 0.0}])) == base
    poet = text(chat(server, "poet"))  # at its LORA_ADAPTERS scale, 0.5
    assert poet == text(chat(server, lora=[{"id": 1, "scale": 0.5}])) and poet != base


def test_adapters_side_by_side_give_what_they_give_alone(server):
    """The base and two adapters at once: no two share a decode step, so each reply is the
    one it gives alone. (Two requests of one set do share steps, and llama.cpp's logits then
    differ in the last bits, as they do without adapters: not asked here.)"""
    names = [None, "sql", "poet"]
    asks = [ASK, ASK, [{"role": "user", "content": "Count to five."}]]
    alone = [text(chat(server, n, m)) for n, m in zip(names, asks, strict=True)]
    with cf.ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda nm: text(chat(server, nm[0], nm[1])),
                                 zip(names, asks, strict=True)))
    assert together == alone


def test_a_stream_of_one_set_does_not_starve_another(server):
    """Two long base streams, then a short adapter request: served in turn with them, it ends
    while they are still generating (each set gets every other step)."""
    order: list[str] = []

    def long_stream(i: int) -> None:
        body = {"messages": [{"role": "user", "content": f"Write a long story, part {i}."}],
                "temperature": 0, "max_tokens": 160, "stream": True, "ignore_eos": True}
        with requests.post(server.url("/v1/chat/completions"), json=body, headers=AUTH,
                           stream=True, timeout=300) as r:
            for _ in r.iter_lines():
                pass
        order.append(f"base{i}")

    with cf.ThreadPoolExecutor(3) as pool:
        streams = [pool.submit(long_stream, i) for i in range(2)]
        # the short request goes in once both streams generate
        for _ in range(400):
            if requests.get(server.url("/health"), timeout=10).json()["engine"]["running"] >= 2:
                break
        chat(server, "sql", max_tokens=12, ignore_eos=True)
        order.append("sql")
        for f in streams:
            f.result()
    assert order[0] == "sql", order


def test_the_prefix_cache_is_partitioned_by_adapter_set(server):
    msgs = [{"role": "user", "content": "A prompt long enough to cache: " + "word " * 60}]
    chat(server, None, msgs)
    again = chat(server, None, msgs)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert again > 60
    first = chat(server, "poet", msgs)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first == 0  # the base's KV (and the server's opening) is not the adapter's
    second = chat(server, "poet", msgs)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert second > 60


def test_other_apis_pick_an_adapter_by_model(server):
    client = anthropic.Anthropic(base_url=server.base, api_key=USER, max_retries=0)
    got = client.messages.create(model="sql", max_tokens=16, messages=ASK,
                                 extra_body={"temperature": 0})
    assert got.model == "sql"
    assert got.content[0].text == text(chat(server, "sql"))
    # a Vertex predict envelope: the instance's model picks it
    r = requests.post(server.url("/predict"), headers=AUTH, timeout=120, json={"instances": [
        {"messages": ASK, "model": "sql", "temperature": 0, "max_tokens": 16},
        {"messages": ASK, "temperature": 0, "max_tokens": 16}]})
    assert r.status_code == 200, r.text
    named, plain = r.json()["predictions"]
    assert text(named) == text(chat(server, "sql")) and text(plain) == text(chat(server))


@pytest.mark.parametrize("bad", [
    {"lora": [{"id": 7, "scale": 1.0}]},
    {"lora": [{"id": 0, "scale": "1"}]},
    {"lora": [{"id": 0, "scale": 99.0}]},
    {"lora": [{"id": 0}]},
    {"lora": {"id": 0, "scale": 1.0}},
])
def test_bad_lora_fields_are_400s(server, bad):
    r = requests.post(server.url("/v1/chat/completions"), headers=AUTH, timeout=30,
                      json={"messages": ASK, "max_tokens": 4, **bad})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("lora")


def test_post_lora_adapters_takes_the_operator_key_only(server):
    url = server.url("/lora-adapters")
    body = [{"id": 0, "scale": 1.0}]
    r = requests.post(url, json=body, headers=AUTH, timeout=30)
    assert r.status_code == 403 and "ADMIN_API_KEY" in r.json()["error"]["message"]
    base = text(chat(server))
    admin = {"Authorization": f"Bearer {ADMIN}"}
    try:
        r = requests.post(url, json=body, headers=admin, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()[0]["scale"] == 1.0
        assert text(chat(server)) == text(chat(server, "sql"))  # the default for everyone
        assert text(chat(server, "poet")) != text(chat(server))  # a name still wins
        bad = requests.post(url, json=[{"id": 5, "scale": 1.0}], headers=admin, timeout=30)
        assert bad.status_code == 400
    finally:
        requests.post(url, json=[], headers=admin, timeout=30).raise_for_status()
    assert text(chat(server)) == base


def test_post_lora_adapters_is_off_without_an_admin_key(server_factory, adapters):
    srv = server_factory({"LORA_ADAPTERS": f"sql={adapters[0]}", "PARALLEL": "2",
                          "CTX_SIZE": "512"})
    srv.wait_ready()
    r = requests.post(srv.url("/lora-adapters"), json=[{"id": 0, "scale": 1}], timeout=30)
    assert r.status_code == 403 and "off" in r.json()["error"]["message"]


def test_an_adapter_of_another_model_stops_the_start(server_factory, default_model, tmp_path):
    other = write_lora(default_model, tmp_path / "other.gguf", width=512)
    srv = server_factory({"LORA_ADAPTERS": f"wrong={other}", "PARALLEL": "2", "CTX_SIZE": "512"})
    assert srv.exit_code() != 0
    assert "LORA_ADAPTERS wrong" in srv.logs() and "could not apply it" in srv.logs()
