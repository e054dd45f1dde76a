"""One C++ runtime per process (app.base.cxx_runtime; docs/crashes.md, "Two C++ runtimes").

The GPU's load crash, on the CPU: a library carrying its own exported copy of libstdc++ is
loaded after the app's imports and before llama.cpp reads the default model's vocabulary,
whose pre-tokenizer compiles a std::regex. The engine must load it with the fix, and must fail
without it (std::bad_cast with GCC 12's libstdc++, SIGSEGV with GCC 13's and later), so this
test cannot pass with a guard that no longer guards anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import foreign_cxx

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> Path:
    if foreign_cxx.compiler() is None:
        if os.environ.get("CI_REQUIRE_ALL"):
            pytest.fail("g++ is missing (CI_REQUIRE_ALL): the foreign C++ runtime cannot be built")
        pytest.skip("no g++ to build a library with its own libstdc++")
    lib = foreign_cxx.build(tmp_path_factory.mktemp("foreign"))
    # the premise: the copy exports the facet ids the linker shares across the process
    assert foreign_cxx.FACET_ID in foreign_cxx.exported_unique(lib)
    return lib


def run(mode: str, foreign: Path | str, model: Path) -> tuple[int, dict | None, str]:
    """The child's exit status, what its load came to, and its stderr."""
    r = subprocess.run([sys.executable, "-m", "tests.support.foreign_cxx", mode, str(foreign),
                        str(model)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return r.returncode, json.loads(lines[-1]) if lines else None, r.stderr


def test_engine_loads_beside_a_foreign_runtime(foreign: Path, default_model: Path) -> None:
    rc, result, err = run("pinned", foreign, default_model)
    assert rc == 0 and result is not None, err[-2000:]
    assert result["stage"] == "ready", (result, err[-2000:])
    assert result["pinned"] and result["global"]


def test_without_the_pin_the_same_load_breaks(foreign: Path, default_model: Path) -> None:
    rc, result, err = run("unpinned", foreign, default_model)
    assert result is None or not result["pinned"]
    if rc in (-signal.SIGSEGV, -signal.SIGABRT):  # GCC >= 13: the virtual call lands in codecvt
        return
    assert rc == 0 and result is not None, err[-2000:]
    assert result["stage"] == "failed", result
    assert "bad_cast" in err, err[-2000:]  # GCC <= 12: use_facet<collate> found another facet


def test_without_the_foreign_runtime_unpinned_loads(default_model: Path) -> None:
    """The control: the unpinned process itself is sound; the foreign copy is what breaks it."""
    rc, result, err = run("unpinned", "-", default_model)
    assert rc == 0 and result is not None and result["stage"] == "ready", err[-2000:]
    assert not result["pinned"]


def test_a_hidden_copy_is_harmless(foreign: Path, default_model: Path) -> None:
    """A static libstdc++ linked with -Wl,--exclude-libs,ALL (as the builds link) exports no
    facet id, and the load works even without the pin."""
    hidden = foreign_cxx.build(foreign.parent, hidden=True)
    assert not foreign_cxx.exported_unique(hidden)
    rc, result, err = run("unpinned", hidden, default_model)
    assert rc == 0 and result is not None and result["stage"] == "ready", err[-2000:]
