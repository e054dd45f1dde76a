"""Real coding agents, run non-interactively against a server on loopback: Claude Code, Codex
CLI, opencode and Qwen Code from npm (`.ci/run` installs them into `.agents/`, or AGENTS_DIR),
and aider from PyPI (`.venv-aider/`, or AIDER). Each runs in a home and a working folder of its
own, with its telemetry, update checks and error reporting off; what it sent is read off the
server's access log."""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.server import ROOT, ServerProcess

NPM_AGENTS = {"claude": "claude", "codex": "codex", "opencode": "opencode", "qwen": "qwen"}
QUIET = {
    # Claude Code
    "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    # opencode
    "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    # aider (litellm's price table comes with it, not from the network)
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
}
ACCESS = re.compile(r"vertex_gguf\.access \[\w+\]: (GET|POST) (\S+) (\d{3}) \S+ ([\d.]+)s"
                    r"(?: api=\w+)?(?: prompt_tokens=(\d+))?")


def agent(name: str) -> str:
    """The agent's command; the test skips without it, or fails under CI_REQUIRE_ALL."""
    if name == "aider":
        found = os.environ.get("AIDER") or str(ROOT / ".venv-aider" / "bin" / "aider")
    else:
        base = Path(os.environ.get("AGENTS_DIR") or ROOT / ".agents")
        found = str(base / "node_modules" / ".bin" / NPM_AGENTS[name])
    if Path(found).is_file():
        return found
    if os.environ.get("CI_REQUIRE_ALL"):
        pytest.fail(f"{name} is not installed ({found}): .ci/run installs the agents")
    pytest.skip(f"{name} is not installed ({found}): .ci/run installs the agents")


@dataclass
class Exchange:
    method: str
    path: str
    status: int
    seconds: float
    prompt_tokens: int | None


@dataclass
class Run:
    code: int
    out: str
    exchanges: list[Exchange]
    seconds: float

    def report(self) -> str:
        """What to record of a run: its requests, the first turn's prompt and time."""
        first = next((e for e in self.exchanges if e.prompt_tokens), None)
        head = (f"first turn: {first.prompt_tokens} prompt tokens in {first.seconds:.1f} s; "
                if first else "")
        return (f"{head}{len(self.exchanges)} requests, {self.seconds:.0f} s in all, exit "
                f"{self.code}")


def exchanges(srv: ServerProcess, since: int) -> list[Exchange]:
    """The API requests the server logged after byte ``since`` of its log (health checks
    left out)."""
    text = Path(srv.log_path).read_bytes()[since:].decode(errors="replace")
    out = []
    for m in ACCESS.finditer(text):
        if m.group(2).startswith("/health"):
            continue
        out.append(Exchange(m.group(1), m.group(2), int(m.group(3)), float(m.group(4)),
                            int(m.group(5)) if m.group(5) else None))
    return out


def run(srv: ServerProcess, cmd: list[str], home: Path, cwd: Path,
        env: dict[str, str] | None = None, timeout: float = 600) -> Run:
    """The agent's command, non-interactive, in its own home and folder; what it printed and
    the requests it made."""
    home.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    full = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
            "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
            "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state"),
            **QUIET, **(env or {})}
    since = Path(srv.log_path).stat().st_size
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=full, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)
    seconds = time.monotonic() - t0
    time.sleep(0.2)  # the access line of the last request is written as its response closes
    return Run(proc.returncode, proc.stdout + proc.stderr, exchanges(srv, since), seconds)
