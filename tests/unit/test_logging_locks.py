"""Logging from native threads under gevent (app.process.worker.native_logging_locks).

gevent's patching turns the logging module's lock and every handler's into gevent locks, and
native threads contending for one wait for ever: the engine thread and the prep pool's threads
log. Each case runs in a fresh interpreter patched as the worker is, ten pool threads logging
200 lines each; with the worker's native locks every thread finishes, without them (the
control) some never do, so the test cannot pass vacuously.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import os, sys, time
from gevent import monkey
monkey.patch_all()
import logging
import gevent
from gevent.threadpool import ThreadPool
logging.basicConfig(stream=open(os.devnull, "w"), level=logging.INFO, force=True)
if sys.argv[1] == "native":
    from app.process.worker import native_logging_locks
    native_logging_locks()
log = logging.getLogger("t")
done = []
def work(i):
    for n in range(200):
        log.info("line %d %d", i, n)
    done.append(i)
pool = ThreadPool(10)
for i in range(10):
    pool.spawn(work, i)
deadline = time.monotonic() + 20
while len(done) < 10 and time.monotonic() < deadline:
    gevent.sleep(0.05)
print(len(done), flush=True)
os._exit(0)
"""


def finished(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


def test_native_threads_log_freely_with_the_workers_locks() -> None:
    assert finished("native") == 10


def test_with_gevents_locks_they_do_not() -> None:
    """The control: the same threads under gevent's locks; if this ever passes, gevent changed
    and native_logging_locks may be dropped."""
    assert finished("patched") < 10
