"""The first answer after a restart on a long agent prompt (issue 52, part 3): with
PROMPT_CACHE_DIR a local folder, a gs:// prefix (the storage emulator), or unset.

Each case starts the server, sends a coding agent's first turn (a system prompt of about
``--prompt-tokens`` tokens and a question), stops it with SIGTERM (the drain writes the slot's
conversation to the folder), starts it again on the same folder, and sends the next turn (the
first turn, its reply, a new question): that turn's time to first token, its cached tokens,
and its reply, which must be the same bytes in every case. Also the seconds SIGTERM took to
exit and the restart's seconds to ready.

    python bench/prompt_files.py [--prompt-tokens 8000]

Not a test: the figures depend on the machine (CPU, disk, page cache). Talks to loopback only.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import requests
from common import serve
from models import BUCKET, Storage

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["def", "class", "return", "import", "self", "value", "index", "result", "config", "request", "response", "token", "model", "cache", "slot", "engine", "stream", "error", "retry", "bound", "check", "file", "path", "write", "read", "buffer", "thread", "lock", "queue", "event", "state", "load"]


def system_prompt(n_tokens: int) -> str:
    """A coding agent's system prompt of roughly ``n_tokens`` tokens: rules and tool specs
    (pseudo-random code words from a fixed seed: the same text in every case)."""
    rng = random.Random(52)
    lines = ["You are a coding agent. Follow the rules and use the tools below."]
    while len(" ".join(lines)) < n_tokens * 5:  # ~5 characters a token on this vocabulary
        lines.append(f"- rule {len(lines)}: " + " ".join(rng.choice(WORDS) for _ in range(24)))
    return "\n".join(lines)


def chat(base: str, messages: list[dict]) -> dict:
    """One streamed turn: its time to first token, cached tokens and text."""
    body = {"messages": messages, "max_tokens": 24, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, text, usage = None, "", {}
    with requests.post(f"{base}/v1/chat/completions", json=body, stream=True, timeout=1800) as r:
        r.raise_for_status()
        for line in r.iter_lines(chunk_size=None):
            if not line.startswith(b"data: {"):
                continue
            obj = json.loads(line[6:])
            for choice in obj.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - t0
                text += piece
            usage = obj.get("usage") or usage
    return {"ttft_s": round(first if first is not None else time.perf_counter() - t0, 3),
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "text": text}


def case(name: str, env: dict[str, str], system: str) -> dict:
    turn1 = [{"role": "system", "content": system},
             {"role": "user", "content": "Read config.py and say what the cache bound is."}]
    with serve(ROOT, env) as base:
        first = chat(base, turn1)
        t_stop = time.perf_counter()
    stop_s = time.perf_counter() - t_stop  # SIGTERM to exit: the drain's writes included
    turn2 = [*turn1, {"role": "assistant", "content": first["text"]},
             {"role": "user", "content": "Now raise it to 2048 and run the tests."}]
    t0 = time.perf_counter()
    with serve(ROOT, env) as base:
        ready_s = time.perf_counter() - t0
        second = chat(base, turn2)
    return {"case": name, "first_turn_ttft_s": first["ttft_s"], "sigterm_exit_s": round(stop_s, 2),
            "restart_ready_s": round(ready_s, 2), **{f"next_turn_{k}": v for k, v in second.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", type=int, default=8000)
    args = ap.parse_args()
    system = system_prompt(args.prompt_tokens)
    base_env = {"PARALLEL": "1", "CTX_SIZE": str(args.prompt_tokens + 1024),
                "STREAM_HEARTBEAT_SECONDS": "0"}
    folder = Path(tempfile.mkdtemp(prefix="bench-prompt-files-"))
    storage = Storage()
    rows = []
    try:
        rows.append(case("no folder", base_env, system))
        rows.append(case("local folder", {**base_env, "PROMPT_CACHE_DIR": str(folder)}, system))
        rows.append(case("gs:// (storage emulator)", {
            **base_env, "PROMPT_CACHE_DIR": f"gs://{BUCKET}/prompts",
            "STORAGE_EMULATOR_HOST": storage.url}, system))
    finally:
        storage.stop()
        shutil.rmtree(folder, ignore_errors=True)
    texts = {r["next_turn_text"] for r in rows}
    for r in rows:
        print(json.dumps(r))
    print(json.dumps({"same_reply_in_every_case": len(texts) == 1,
                      "speedup_local": round(rows[0]["next_turn_ttft_s"] / rows[1]["next_turn_ttft_s"], 1),
                      "speedup_gcs": round(rows[0]["next_turn_ttft_s"] / rows[2]["next_turn_ttft_s"], 1)}))


if __name__ == "__main__":
    main()
