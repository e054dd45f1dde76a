"""One C++ runtime per process, its locale numbered first (docs/crashes.md, "Two C++ runtimes").

libstdc++ numbers its locale facets (``std::collate<char>::id`` and a hundred more) through
GNU-unique symbols, which the dynamic linker shares across the whole process whatever
RTLD_LOCAL says. If a second, statically linked libstdc++ that exports those symbols numbers
them before libstdc++.so.6 does, libstdc++'s own locale keeps a ``codecvt`` facet where
``collate`` should be, and the first ``std::regex`` llama.cpp compiles while it reads a
vocabulary dies (``std::bad_cast`` with GCC 12's headers, SIGSEGV in ``codecvt::do_unshift``
with GCC 13's). llama-server is immune because libstdc++.so.6 is in its executable's global
scope and builds its locale at start; a Python process only ever loads it RTLD_LOCAL.

``pin()`` gives this process what llama-server has: libstdc++.so.6 joins the global scope, so
every later library binds its C++ symbols to it, and its classic locale is built now, so its
numbering is the one every copy sees. It runs first thing in ``app/__init__.py`` (before gevent
loads greenlet), so in the process that forks the workers and in every process that imports
the app; it is cheap and idempotent, and a no-op where there is no libstdc++.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import asdict, dataclass

SONAME = "libstdc++.so.6"  # the soname of every libstdc++ since GCC 3.4
_CLASSIC = "_ZNSt6locale7classicEv"  # std::locale::classic()


@dataclass(frozen=True)
class Runtime:
    """What ``pin()`` did: /props "cxx_runtime", and the server's start-up line."""

    pinned: bool  # libstdc++ is in the global scope and its locale was built by us, first
    library: str | None = None  # the file it resolved to, libstdc++.so.6.0.30
    path: str | None = None  # where that file is
    global_scope: bool = False  # std::locale::classic() resolves from the global scope
    error: str | None = None  # why it could not be pinned (no libstdc++: a C-only image)

    def line(self) -> str:
        if self.pinned:
            return (f"C++ runtime: {self.library or SONAME} ({self.path or 'path unknown'}) "
                    "joined the global scope and built its locale first")
        return f"C++ runtime: not pinned ({self.error or 'pin() did not run'})"

    def as_dict(self) -> dict:
        return asdict(self)


_runtime: Runtime | None = None


def runtime() -> Runtime:
    """What ``pin()`` found, or an unpinned record if it has not run in this process."""
    return _runtime or Runtime(pinned=False, global_scope=is_global())


def pin() -> Runtime:
    """Load libstdc++.so.6 into the global scope and build its classic locale, once."""
    global _runtime
    if _runtime is not None:
        return _runtime
    try:
        lib = ctypes.CDLL(SONAME, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        classic = getattr(lib, _CLASSIC)
    except (OSError, AttributeError) as exc:
        _runtime = Runtime(pinned=False, error=f"{SONAME}: {exc}")
        return _runtime
    classic.restype = ctypes.c_void_p
    classic.argtypes = []
    classic()  # constructs the classic locale: every standard facet id numbered by this copy
    path = _mapped(SONAME.split(".so")[0] + ".so")
    _runtime = Runtime(pinned=True, library=os.path.basename(path) if path else None,
                       path=path, global_scope=is_global())
    return _runtime


def is_global() -> bool:
    """Whether std::locale::classic() resolves from the process's global scope (dlopen(NULL)):
    true once libstdc++ joined it (or the executable links it, as llama-server does)."""
    try:
        return hasattr(ctypes.CDLL(None), _CLASSIC)
    except OSError:
        return False


def _mapped(stem: str) -> str | None:
    """The real path of the mapped file whose name starts with ``stem`` (libstdc++.so)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if os.path.basename(path).startswith(stem):
                    return os.path.realpath(path)
    except OSError:
        pass
    return None
