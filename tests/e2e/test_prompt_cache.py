"""The host-RAM prompt cache end to end (PROMPT_CACHE_RAM_MB), on the real default model through
gunicorn: a conversation whose only slot another conversation took answers its next turn from
the cache (its prompt copied back, not decoded: the usage's cached tokens say so, /health's
counters too) with the same greedy bytes as when its slot had kept it; another API key's
identical prompt never gets it."""

from __future__ import annotations

import pytest
import requests

from tests.support.long_prompts import complete, story
from tests.support.server import ServerProcess, running_server

KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"



@pytest.fixture(scope="module")
def srv(default_model) -> ServerProcess:
    env = {"PARALLEL": "1", "CTX_SIZE": "2048", "PROMPT_CACHE_MIN_TOKENS": "64",
           "API_KEY": f"{KEY_A},{KEY_B}"}
    with running_server(env) as s:
        yield s



def _cache(srv: ServerProcess) -> dict:
    health = requests.get(srv.url("/health"), headers={"Authorization": f"Bearer {KEY_A}"},
                          timeout=30).json()
    return health["engine"]["prompt_cache"]


def test_a_conversation_whose_slot_was_taken_answers_from_the_cache(srv):
    first = story(1)
    reply, _, _ = complete(srv, KEY_A, first)
    turn2 = first + reply + " Then the river"
    complete(srv, KEY_A, turn2)
    # the reference: the same turn again while the slot still holds it (the same prefix
    # reused, so the same tail decoded in the same batch shape as after a copy back)
    kept, n_prompt, kept_cached = complete(srv, KEY_A, turn2)
    assert kept and kept_cached == n_prompt - 1
    complete(srv, KEY_A, story(2))  # another conversation takes the only slot
    before = _cache(srv)
    assert before["entries"] >= 1 and before["saved"] >= 1
    # another key's identical prompt: nothing of key A's, decoded whole
    _, _, other_cached = complete(srv, KEY_B, turn2)
    assert other_cached == 0
    assert _cache(srv)["restored"] == before["restored"]
    again, n_again, cached = complete(srv, KEY_A, turn2)
    after = _cache(srv)
    assert after["restored"] == before["restored"] + 1
    assert after["restored_tokens"] - before["restored_tokens"] == cached
    assert (again, n_again, cached) == (kept, n_prompt, kept_cached)  # the same bytes
    metrics = requests.get(srv.url("/metrics"), headers={"Authorization": f"Bearer {KEY_A}"},
                           timeout=30).text
    assert f"vertex_gguf_prompt_cache_restored_total {float(after['restored'])}" in metrics
    assert (f"vertex_gguf_prompt_cache_restored_tokens_total "
            f"{float(after['restored_tokens'])}") in metrics
    line = next(x for x in metrics.splitlines() if x.startswith("vertex_gguf_prompt_cache_bytes "))
    assert float(line.split()[1]) == after["bytes"] > 0
