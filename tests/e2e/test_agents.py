"""End to end with the real default model: coding agents, unmodified, run non-interactively
with their documented flags against a server behind an API key (tests/support/agents.py):
Claude Code (`-p`, Messages), Codex CLI (`exec`, Responses), opencode (`run`, on its
openai-compatible, Anthropic and OpenAI Responses providers), Qwen Code (its OpenAI, Responses
and Anthropic modes) and aider (one edit, Chat Completions). Each finishes its turn with exit 0
and every request it made answered 200; the answers are not judged (the model is tiny).

The runs here offer the agent no tools (each agent's own switch for it), so a turn ends when
the tiny model answers. With their full tool sets the agents loop on a 135M model's calls for
minutes; those runs are the AGENTS_FULL=1 tier (not in CI), whose results are recorded in
bench/RESULTS.md. The server runs as a user would run it for agents: a context large enough
for their system prompts, and MAX_TOKENS_CLAMP (they reserve 32000 output tokens)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.agents import Run, agent, run
from tests.support.server import running_server

KEY = "sk-agents-test"
ASK = "Say hello in one short sentence."


@pytest.fixture(scope="module")
def srv(default_model):
    env = {"PARALLEL": "2", "CTX_SIZE": "32768", "MAX_TOKENS_LIMIT": "256",
           "MAX_TOKENS_CLAMP": "true", "DEFAULT_TEMPERATURE": "0", "SERVED_MODEL_NAME": "smol",
           "API_KEY": KEY,
           "LOG_LEVEL": "info"}
    with running_server(env) as server:
        yield server


def finished(got: Run, path: str, exit_zero: bool = True) -> None:
    """The turn ended well: exit 0, it said something, and every request it made was
    answered 200 (some of them on ``path``). ``exit_zero=False`` for an agent with its full
    tool set: whether it ends its turn is then up to the tiny model's calls (a call cut off by
    the token limit ends Codex's turn with an error of its own), not the protocol."""
    if exit_zero:
        assert got.code == 0, f"{got.report()}\n{got.exchanges}\n{got.out[-3000:]}"
    assert got.out.strip()
    assert any(e.path.startswith(path) for e in got.exchanges), (path, got.exchanges)
    bad = [e for e in got.exchanges if e.status != 200]
    assert not bad, (bad, got.out[-2000:])
    print(got.report())


def full() -> None:
    if not os.environ.get("AGENTS_FULL"):
        pytest.skip("the agents with their full tool sets: AGENTS_FULL=1 (minutes each)")


# ---- Claude Code ------------------------------------------------------------------------------


def claude(srv, tmp_path: Path, *args: str) -> Run:
    env = {"ANTHROPIC_BASE_URL": srv.base, "ANTHROPIC_API_KEY": KEY}
    return run(srv, [agent("claude"), "-p", ASK, "--model", "smol", *args],
               tmp_path / "home", tmp_path / "work", env)


def test_claude_code(srv, tmp_path):
    finished(claude(srv, tmp_path, "--bare", "--tools", ""), "/v1/messages")


def test_claude_code_with_its_tools(srv, tmp_path):
    full()
    finished(claude(srv, tmp_path, "--permission-mode", "acceptEdits"), "/v1/messages",
             exit_zero=False)


# ---- Codex CLI --------------------------------------------------------------------------------

# Codex's tools, each behind a feature it can turn off
CODEX_TOOLS = ("goals", "multi_agent", "shell_tool", "unified_exec", "view_image",
               "image_generation", "apps", "plugins", "tool_suggest", "skill_search",
               "sleep_tool", "browser_use", "computer_use")


def codex(srv, tmp_path: Path, *args: str) -> Run:
    provider = (f'model_providers.local={{name="local", base_url="{srv.base}/v1", '
                'wire_api="responses", env_key="LOCAL_KEY"}')
    env = {"CODEX_HOME": str(tmp_path / "home"), "LOCAL_KEY": KEY}
    return run(srv, [agent("codex"), "exec", "--skip-git-repo-check", "-m", "smol",
                     "-c", "model_provider=local", "-c", provider, *args, ASK],
               tmp_path / "home", tmp_path / "work", env)


def test_codex(srv, tmp_path):
    off = [arg for name in CODEX_TOOLS for arg in ("--disable", name)]
    finished(codex(srv, tmp_path, *off, "-c", "web_search=disabled", "-c",
                   "tools.experimental_request_user_input.enabled=false"), "/v1/responses")


def test_codex_with_its_tools(srv, tmp_path):
    """Codex's full set: its MCP-style namespace tools and hosted web_search included."""
    full()
    finished(codex(srv, tmp_path, "--sandbox", "read-only"), "/v1/responses", exit_zero=False)


# ---- opencode ---------------------------------------------------------------------------------

OPENCODE_PROVIDERS = {  # provider -> (its npm package in opencode, the route it speaks)
    "compat": ("@ai-sdk/openai-compatible", "/v1/chat/completions"),
    "anthropic": ("@ai-sdk/anthropic", "/v1/messages"),
    "responses": ("@ai-sdk/openai", "/v1/responses"),
}


@pytest.mark.parametrize("provider", sorted(OPENCODE_PROVIDERS))
def test_opencode(srv, tmp_path, provider):
    npm, path = OPENCODE_PROVIDERS[provider]
    work = tmp_path / "work"
    work.mkdir()
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {provider: {"npm": npm, "name": provider,
                                "options": {"baseURL": f"{srv.base}/v1", "apiKey": KEY},
                                "models": {"smol": {"name": "smol"}}}},
        "model": f"{provider}/smol", "autoupdate": False, "share": "disabled",
        "tools": {"*": False}, "agent": {"build": {"maxSteps": 2}},
    }
    (work / "opencode.json").write_text(json.dumps(config))
    got = run(srv, [agent("opencode"), "run", ASK], tmp_path / "home", work)
    finished(got, path)


# ---- Qwen Code --------------------------------------------------------------------------------

QWEN_MODES = {"openai": "/v1/chat/completions", "openai-responses": "/v1/responses",
              "anthropic": "/v1/messages"}
QWEN_TOOLS = ("edit", "get_goal", "notebook_edit", "read_file", "run_shell_command",
              "update_goal", "write_file", "glob", "grep_search", "list_directory",
              "web_fetch", "todo_write", "save_memory", "task", "skill", "exit_plan_mode")


@pytest.mark.parametrize("mode", sorted(QWEN_MODES))
def test_qwen_code(srv, tmp_path, mode):
    base = srv.base if mode == "anthropic" else f"{srv.base}/v1"
    env = {"OPENAI_BASE_URL": base, "OPENAI_API_KEY": KEY, "OPENAI_MODEL": "smol",
           "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_MODEL": "smol"}
    got = run(srv, [agent("qwen"), ASK, "--auth-type", mode, "-m", "smol", "--bare",
                    "--exclude-tools", *QWEN_TOOLS], tmp_path / "home", tmp_path / "work", env)
    finished(got, QWEN_MODES[mode])


# ---- aider ------------------------------------------------------------------------------------


def test_aider_makes_one_edit_request(srv, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text('print("hello")\n')
    got = run(srv, [agent("aider"), "--model", "openai/smol", "--openai-api-base",
                    f"{srv.base}/v1", "--openai-api-key", KEY, "--no-git", "--yes-always",
                    "--no-analytics", "--no-check-update", "--no-show-model-warnings",
                    "--no-pretty", "--no-stream", "--map-tokens", "0",
                    "--message", "Add a comment at the top of hello.py.", "hello.py"],
              tmp_path / "home", work)
    finished(got, "/v1/chat/completions")
