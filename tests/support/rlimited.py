"""``python -m tests.support.rlimited BYTES [ARGS...]``: the server (``python -m app ARGS``) under
an address-space limit (RLIMIT_AS), as a container's memory limit would hold it.

On a test machine with memory to spare, a request that makes llama.cpp allocate gigabytes just
succeeds (slowly, and at every other user's expense); under the limit the same allocation
fails, as it does on a small instance, so a test sees whether a request field can size one.
The limit is set, then the process becomes the server (exec: the same pid, so the gunicorn
master is still ``ServerProcess.proc``, and its workers inherit the limit).
"""

from __future__ import annotations

import os
import resource
import sys


def main() -> None:
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.execv(sys.executable, [sys.executable, "-m", "app", *sys.argv[2:]])


if __name__ == "__main__":
    main()
