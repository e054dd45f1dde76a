"""Long prompts of their own and one greedy completion's answer, for the prompt-cache tests
(tests/e2e/test_prompt_cache.py, tests/e2e/test_prompt_files.py)."""

from __future__ import annotations

import requests

from tests.support.server import ServerProcess

WORDS = ["river", "stone", "lantern", "orchard", "copper", "meadow", "violet", "harbor",
         "thunder", "maple", "canvas", "falcon", "ember", "glacier", "saffron", "quarry"]


def story(seed: int, n: int = 300) -> str:
    """A long prompt of its own from its first word (no prefix shared with another seed's)."""
    return f"Story {seed}: " + " ".join(WORDS[(seed * 7 + i * i) % len(WORDS)] for i in range(n))


def complete(srv: ServerProcess, key: str, prompt: str) -> tuple[str, int, int]:
    """A greedy completion with API key ``key``: its text, prompt tokens and cached tokens."""
    r = requests.post(srv.url("/v1/completions"), headers={"Authorization": f"Bearer {key}"},
                      json={"prompt": prompt, "max_tokens": 12, "temperature": 0}, timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    usage = body["usage"]
    return (body["choices"][0]["text"], usage["prompt_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"])
