"""The C++ runtime pin (app.base.cxx_runtime), in process: importing the app pins libstdc++ into
the global scope; the end-to-end proof that it matters is tests/e2e/test_cxx_runtime.py."""

from __future__ import annotations

import subprocess
import sys

import app  # noqa: F401  (what pins it)
from app.base import cxx_runtime


def test_importing_the_app_pins_libstdcxx() -> None:
    r = cxx_runtime.runtime()
    assert r.pinned and r.global_scope and cxx_runtime.is_global()
    assert r.library is not None and r.library.startswith("libstdc++.so.6")
    assert "joined the global scope" in r.line()
    assert cxx_runtime.pin() is r  # once per process


CHILD = """
import sys

seen = []


class Watch:  # notes, as greenlet (gevent's C++) is about to load, whether the pin has run
    def find_spec(self, name, path=None, target=None):
        if name == "greenlet" and not seen:
            module = sys.modules.get("app.base.cxx_runtime")
            seen.append(bool(module and module._runtime and module._runtime.pinned))


sys.meta_path.insert(0, Watch())
import app  # noqa: E402,F401

print(seen, "greenlet" in sys.modules)
import app.process.server  # noqa: E402,F401  (what python -m app serves with: gevent)

print(seen)
"""


def test_pinned_before_gevent_loads_greenlet() -> None:
    """In a fresh interpreter, the pin has run by the time greenlet's C++ code is imported;
    the app package itself loads no greenlet (an engine process imports it too)."""
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[] False", "[True]"]


def test_without_libstdcxx_it_says_why(monkeypatch) -> None:
    """A C-only image: pin() is a no-op that says why, and never raises."""
    monkeypatch.setattr(cxx_runtime, "_runtime", None)
    monkeypatch.setattr(cxx_runtime, "SONAME", "libstdc++-missing.so.6")
    r = cxx_runtime.pin()
    assert not r.pinned and r.error and "libstdc++-missing.so.6" in r.error
    assert "not pinned" in r.line()
