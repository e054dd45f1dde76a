"""What a resumable stream (X-Conversation-Id) adds per token, in memory and with Redis.

Two measurements, in one run:

1. Per token, in process: the CPU time a token's SSE frame costs to go through a session (the
   ring write, and the POST's own reader reading it back), and the Redis mirror's work for it
   against a real redis-server on loopback (one pipeline per flush: XADD, HSET, an XTRIM now
   and then), flushing after every token (a quiet server) and after every 8 (a busy one).
   The frames are real chat-completion chunks as the server writes them.
2. End to end: the real server and model, N concurrent greedy streams, plain, resumable in
   memory and resumable through Redis, each in the same run; aggregate tokens/s and the ratio
   to plain.

Not a test: the figures depend on the machine.

    python bench/stream_resume.py [--tokens 300] [--streams 4] [--frames 200000]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402
import requests  # noqa: E402

from app.api.openai.stream import ChunkWriter  # noqa: E402
from app.protocol.stream_policy import PROFILES  # noqa: E402
from app.streams import Streams  # noqa: E402
from app.streams.session import Session  # noqa: E402
from bench.common import free_port, serve  # noqa: E402

BODY = {"messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}],
        "temperature": 0, "ignore_eos": True, "stream": True}


def frames(n: int) -> list[bytes]:
    """``n`` one-token chat chunks, as the server frames them."""
    w = ChunkWriter("chat", "chatcmpl-0123456789abcdef01234567", int(time.time()), "model",
                    PROFILES["openai"])
    words = ["The", " lighthouse", " keeper", " watched", " the", " sea", ",", " and"]
    out = []
    for i in range(n):
        w.count(0, i + 1)
        out.append(w.text(0, words[i % len(words)])[0])
    return out


def per_token_memory(data: list[bytes], cap: int) -> float:
    """CPU µs per frame: written to a session and read back by a connected reader."""
    s = Session("bench", "uid", "", cap, b": ping\n\n")
    hub = Streams(cap, 300, None)
    reader = hub._follow(s, 0)  # the POST's own reader, as the server runs it
    t = time.process_time()
    for frame in data:
        s.write(frame)
        next(reader)
    s.finish()
    return (time.process_time() - t) / len(data) * 1e6


class RedisServer:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (apt-get install redis-server)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        for _ in range(200):  # bounded: 10 s
            try:
                client.ping()
                break
            except redis.RedisError:
                time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def per_token_redis(data: list[bytes], url: str, cap: int, every: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per frame of the mirror's Redis work, flushing every ``every``
    frames: the mirror's own flush (app.streams.redis_store.queue_bytes), one pipeline each."""
    from app.streams.redis_store import _data, _meta, queue_bytes

    client = redis.Redis.from_url(url)
    uid = f"bench-{every}"
    client.delete(_data(uid), _meta(uid))
    written = 0
    entries: deque[tuple[int, int]] = deque()
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(data), every):
        pipe = client.pipeline(transaction=False)
        written = queue_bytes(pipe, uid, b"".join(data[i: i + every]), written, entries, cap)
        pipe.execute()
    n = len(data)
    out = ((time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6)
    client.delete(_data(uid), _meta(uid))
    return out


def run_streams(base: str, n: int, tokens: int, resumable: bool) -> float:
    """Aggregate completion tokens/s of ``n`` concurrent streams."""
    def one(i: int) -> int:
        headers = {"X-Conversation-Id": f"bench-{time.monotonic_ns()}-{i}"} if resumable else {}
        body = {**BODY, "max_tokens": tokens, "stream_options": {"include_usage": True}}
        with requests.post(base + "/v1/chat/completions", json=body, headers=headers,
                           stream=True, timeout=600) as r:
            r.raise_for_status()
            data = b"".join(r.iter_content(chunk_size=None))
        assert data.endswith(b"data: [DONE]\n\n")
        return data.count(b'"content":"')

    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        total = sum(pool.map(one, range(n)))
    return total / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--frames", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cap = 4 * 1024 * 1024
    data = frames(args.frames)
    size = sum(map(len, data)) / len(data)
    rs = RedisServer()
    try:
        print(f"frame: {size:.0f} bytes on average ({len(data)} frames; ring {cap} bytes = "
              f"{cap / size:.0f} tokens)")
        print(f"memory ring, write + read back: {per_token_memory(data, cap):.2f} µs CPU/token")
        for every in (1, 8):
            cpu, wall = per_token_redis(data[:50_000], rs.url, cap, every)
            print(f"redis mirror, a flush every {every} token(s): {cpu:.1f} µs CPU/token, "
                  f"{wall:.1f} µs wall/token")
        env = {"THREADS": "2", "PARALLEL": str(args.streams), "CTX_SIZE": "4096"}
        rows: dict[str, list[float]] = {"plain": [], "memory": [], "redis": []}
        with serve(Path(__file__).resolve().parent.parent, env) as plain_base, \
                serve(Path(__file__).resolve().parent.parent,
                      {**env, "STREAM_STORE": rs.url}) as redis_base:
            run_streams(plain_base, args.streams, 50, False)  # warm both
            run_streams(redis_base, args.streams, 50, True)
            for _ in range(args.rounds):  # interleaved, so drift hits all three alike
                rows["plain"].append(run_streams(plain_base, args.streams, args.tokens, False))
                rows["memory"].append(run_streams(plain_base, args.streams, args.tokens, True))
                rows["redis"].append(run_streams(redis_base, args.streams, args.tokens, True))
        plain = sorted(rows["plain"])[len(rows["plain"]) // 2]
        print(f"\n{args.streams} streams x {args.tokens} tokens, median of {args.rounds}:")
        print("| stream | tok/s | ratio to plain |")
        print("|---|---|---|")
        for name, values in rows.items():
            med = sorted(values)[len(values) // 2]
            print(f"| {name} | {med:.1f} | {med / plain:.3f} |")
    finally:
        rs.stop()


if __name__ == "__main__":
    main()
