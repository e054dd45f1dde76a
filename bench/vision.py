"""Images against llama-server, in one run, on the same model and projector: what an image
costs a request, what a repeated image costs, and what image requests do to text streams
already running.

The projector has the shape of a small vision model's encoder (a CLIP ViT-B/14 at 224
pixels: 86M parameters in float16, 256 tokens per image) with random weights, built by
tests/support/tiny_mmproj.py for the model's width. Speed does not depend on what the weights
say. Each server runs in turn:

1. **Cost of an image.** A chat with one new image, then the same chat without it, then the
   first one again. The time to the first token of each: the image's cost is the first minus
   the second, and a repeat shows what the cache saves.
2. **Beside streams.** ``--streams`` text streams run. After a moment, ``--images`` image
   requests arrive one after another. Each stream's inter-token gaps are recorded while the
   images are processed and compared with the same streams alone.

    python bench/vision.py --llama-server bench/gpu/work/build-cpu/bin/llama-server

Not a test: figures depend on the machine. Record them in bench/RESULTS.md, machine named.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import io
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
from common import ROOT, process, serve

sys.path.insert(0, str(ROOT))
from PIL import Image  # noqa: E402

from app.model.default import default_model_path  # noqa: E402
from app.settings import DEFAULT_CACHE_DIR  # noqa: E402
from tests.support.tiny_mmproj import VIT_B, build_tiny_mmproj  # noqa: E402


def jpeg(seed: int) -> str:
    """A 640 x 480 photo-sized JPEG, different for each seed, as a data URL."""
    import base64

    import numpy as np

    rng = np.random.default_rng(seed)
    pixels = (rng.random((480, 640, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


# a new text prompt about as long as an image's 256 tokens (for the same test with text)
LONG = " ".join(f"word{i}" for i in range(120))


def body(image: str | None, max_tokens: int, stream: bool) -> dict:
    if image == "text":
        image, text = None, LONG + f" {time.perf_counter()}"
    else:
        text = "Describe this picture in detail."
    content: list[dict] = [{"type": "text", "text": text}]
    if image:
        content.append({"type": "image_url", "image_url": {"url": image}})
    return {"model": "m", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream, "ignore_eos": True}


def ttft(base: str, image: str | None) -> float:
    """Seconds to the first streamed token."""
    t0 = time.perf_counter()
    with requests.post(base + "/v1/chat/completions", json=body(image, 4, True), stream=True,
                       timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: {") and b'"content":"' in line:
                return time.perf_counter() - t0
    raise RuntimeError("no token came")


def stream_gaps(base: str, n_tokens: int, out: list[float], start: threading.Event) -> None:
    """One text stream; the gaps between its tokens (seconds) appended to ``out``."""
    start.wait(60)
    last = None
    with requests.post(base + "/v1/chat/completions", json=body(None, n_tokens, True),
                       stream=True, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                now = time.perf_counter()
                if last is not None:
                    out.append(now - last)
                last = now


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def beside_streams(base: str, streams: int, images: int, tokens: int, seed: int) -> dict:
    """Text streams alone, then the same with image requests arriving meanwhile."""
    out: dict = {}
    for label, n_images in (("alone", 0), ("with images", images), ("with long prompts", images)):
        gaps: list[float] = []
        start = threading.Event()
        with cf.ThreadPoolExecutor(streams + 1) as pool:
            futs = [pool.submit(stream_gaps, base, tokens, gaps, start) for _ in range(streams)]
            start.set()
            time.sleep(1.0)
            image_s = [ttft(base, "text" if label == "with long prompts" else jpeg(seed + k))
                       for k in range(n_images)]
            for f in futs:
                f.result(600)
        out[label] = {"gap_p50_ms": pct(gaps, .5) * 1000, "gap_p95_ms": pct(gaps, .95) * 1000,
                      "gap_max_ms": max(gaps) * 1000, "image_ttft_s": image_s}
    return out


def measure(base: str, args: argparse.Namespace, seed: int) -> dict:
    ttft(base, jpeg(999))  # warm: the first image's graph and buffers
    first = ttft(base, jpeg(seed))
    text = ttft(base, None)
    again = ttft(base, jpeg(seed))
    return {"image_ttft_s": first, "text_ttft_s": text, "repeat_ttft_s": again,
            **beside_streams(base, args.streams, args.images, args.tokens, seed + 100)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(default_model_path(DEFAULT_CACHE_DIR)))
    ap.add_argument("--llama-server", help="llama-server built from the same llama.cpp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--images", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=192, help="tokens per text stream")
    args = ap.parse_args()
    from gguf import GGUFReader

    reader = GGUFReader(args.model)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    n_embd = int(reader.fields[f"{arch}.embedding_length"].parts[-1][0])
    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp:  # 170 MB: removed after
        run(args, build_tiny_mmproj(Path(tmp) / "mmproj-vitb.gguf", n_embd, shape=VIT_B))


def run(args: argparse.Namespace, proj: Path) -> None:
    """Each server in turn with projector ``proj``, then the table."""
    print(f"projector: ViT-B/14 shape, {proj.stat().st_size / 1e6:.0f} MB, {VIT_B.n_tokens} "
          f"tokens per image", file=sys.stderr)
    results: dict[str, dict] = {}
    env = {"MODEL": args.model, "MMPROJ": str(proj), "PARALLEL": str(args.parallel),
           "CTX_SIZE": str(args.ctx), "THREADS": str(args.threads), "LOG_LEVEL": "warning",
           "STREAM_HEARTBEAT_SECONDS": "0"}
    with serve(ROOT, env) as base:
        results["vertex-gguf"] = measure(base, args, 1)
    if args.llama_server:
        cmd = [args.llama_server, "-m", args.model, "--mmproj", str(proj), "--host", "127.0.0.1",
               "--port", "{port}", "-np", str(args.parallel), "-c", str(args.ctx * args.parallel),
               "-t", str(args.threads), "-tb", str(args.threads)]
        with process(cmd, None, "/health", "llama-server", 300) as base:
            results["llama-server"] = measure(base, args, 1)
    ref = results.get("llama-server")
    print(f"model {Path(args.model).name}, projector ViT-B/14 (random, f16, {VIT_B.n_tokens} "
          f"tokens), 640x480 JPEGs, threads {args.threads}, {args.parallel} slots; "
          f"{args.streams} text streams of {args.tokens} tokens beside {args.images} images")
    print("| server | TTFT with a new image s | text only s | image cost s | repeated image s "
          "| stream gap p50 / p95 / max ms, alone | with images arriving | with 256-token text "
          "prompts arriving | image TTFT beside streams s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        a, w, t = r["alone"], r["with images"], r["with long prompts"]
        cost = r["image_ttft_s"] - r["text_ttft_s"]
        ratio = ""
        if ref is not None and name != "llama-server":
            ratio = f" ({cost / (ref['image_ttft_s'] - ref['text_ttft_s']):.2f}x)"
        print(f"| {name} | {r['image_ttft_s']:.2f} | {r['text_ttft_s']:.3f} | {cost:.2f}{ratio} | "
              f"{r['repeat_ttft_s']:.3f} | {a['gap_p50_ms']:.0f} / {a['gap_p95_ms']:.0f} / "
              f"{a['gap_max_ms']:.0f} | {w['gap_p50_ms']:.0f} / {w['gap_p95_ms']:.0f} / "
              f"{w['gap_max_ms']:.0f} | {t['gap_p50_ms']:.0f} / {t['gap_p95_ms']:.0f} / "
              f"{t['gap_max_ms']:.0f} | {', '.join(f'{x:.2f}' for x in w['image_ttft_s'])} |")


if __name__ == "__main__":
    main()
