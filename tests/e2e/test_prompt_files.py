"""Prompts kept across restarts (PROMPT_CACHE_DIR) end to end, on the real default model through
gunicorn: SIGTERM's drain writes the slot's conversation to the folder; the next server reads it
back for that conversation's next turn (the same greedy bytes as when the slot had kept it,
its prompt not decoded again); another key's identical prompt never gets it; a damaged file is
refused with a warning and costs only the decode. And llama-server's slot routes: save, erase
and restore a slot to a named file, the operator's key only, the name confined to the folder."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import requests

from tests.support.long_prompts import complete, story
from tests.support.server import ServerProcess, wait_for

KEY_A, KEY_B, ADMIN = "key-a-0123456789", "key-b-0123456789", "admin-key-0123456789"



def _server(folder: Path, engine_process: str = "off", **env: str) -> ServerProcess:
    srv = ServerProcess({"PARALLEL": "1", "CTX_SIZE": "2048", "PROMPT_CACHE_MIN_TOKENS": "64",
                         "PROMPT_CACHE_DIR": str(folder), "API_KEY": f"{KEY_A},{KEY_B}",
                         "ADMIN_API_KEY": ADMIN, "ENGINE_PROCESS": engine_process, **env})
    srv.wait_ready()
    return srv



def _health(srv: ServerProcess) -> dict:
    return requests.get(srv.url("/health"), headers={"Authorization": f"Bearer {KEY_A}"},
                        timeout=30).json()


def _disk(srv: ServerProcess) -> dict:
    return _health(srv)["engine"]["prompt_cache"]["disk"]


def _terminate(srv: ServerProcess) -> str:
    """SIGTERM, the exit waited for; the server's log."""
    os.killpg(srv.proc.pid, signal.SIGTERM)
    srv.proc.wait(60)
    logs = srv.logs()
    srv.stop()
    return logs


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.kv"))


@pytest.fixture(scope="module")
def kept(default_model, tmp_path_factory) -> tuple[Path, str, tuple[str, int, int]]:
    """A conversation's next turn answered with its slot kept (the reference), then the
    server stopped by SIGTERM: the folder, the turn's prompt, and the reference answer."""
    folder = tmp_path_factory.mktemp("prompts")
    srv = _server(folder)
    try:
        first = story(1)
        reply, _, _ = complete(srv, KEY_A, first)
        turn = first + reply + " Then the river"
        complete(srv, KEY_A, turn)
        reference = complete(srv, KEY_A, turn)  # the same prefix reused: n - 1 cached
        assert reference[2] == reference[1] - 1
    finally:
        logs = _terminate(srv)
    assert "kept in" in logs, logs[-3000:]
    assert len(_files(folder)) == 1
    return folder, turn, reference


def test_a_restart_answers_from_the_folder_with_the_same_bytes(kept):
    folder, turn, reference = kept
    srv = _server(folder)
    try:
        _, _, other = complete(srv, KEY_B, turn)  # another key: nothing of key A's
        assert other == 0 and _disk(srv)["read"] == 0
        assert complete(srv, KEY_A, turn) == reference  # read back, not decoded again
        assert _disk(srv)["read"] == 1
    finally:
        _terminate(srv)


def test_a_damaged_file_is_refused_and_costs_only_the_decode(kept):
    folder, turn, reference = kept
    for path in _files(folder):  # key A's, and key B's the last server kept too
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF  # one flipped byte inside the blob
        path.write_bytes(bytes(data))
    srv = _server(folder)
    try:
        text, n_prompt, cached = complete(srv, KEY_A, turn)
        assert cached == 0 and n_prompt == reference[1]
        assert _disk(srv)["read_failed"] == 1
        logs = srv.logs()
        assert "refused and deleted" in logs and "checksum" in logs
    finally:
        _terminate(srv)


def test_slot_files_save_erase_and_restore_for_the_operator_only(default_model, tmp_path):
    # in an engine process of its own (the routes' call crosses to it; the tests above run
    # the engine in the web process)
    srv = _server(tmp_path, "on")
    admin = {"Authorization": f"Bearer {ADMIN}"}
    try:
        turn = story(3)
        complete(srv, KEY_A, turn)
        reference = complete(srv, KEY_A, turn)

        def act(action: str, body: dict | None = None, headers: dict = admin) -> requests.Response:
            return requests.post(srv.url(f"/slots/0?action={action}"), json=body or {},
                                 headers=headers, timeout=120)

        assert act("save", {"filename": "s1.bin"},
                   {"Authorization": f"Bearer {KEY_A}"}).status_code == 403
        assert act("save", {"filename": "../s1.bin"}).status_code == 400
        saved = act("save", {"filename": "s1.bin"})
        assert saved.status_code == 200, saved.text
        assert saved.json()["n_saved"] > 300 and saved.json()["n_written"] > 0
        assert len(list(tmp_path.glob("*/slots/s1.bin"))) == 1
        erased = act("erase")
        assert erased.json()["n_erased"] == saved.json()["n_saved"]
        assert act("restore", {"filename": "nothing.bin"}).status_code == 404
        restored = act("restore", {"filename": "s1.bin"})
        assert restored.status_code == 200, restored.text
        assert restored.json()["n_restored"] == saved.json()["n_saved"]
        assert complete(srv, KEY_A, turn) == reference  # the restored cells serve key A ...
        act("erase")
        act("restore", {"filename": "s1.bin"})
        assert complete(srv, KEY_B, turn)[2] == 0  # ... and never key B
    finally:
        logs = _terminate(srv)
    # SIGTERM's drain kept the slot's conversation (key B's now), in the engine's process too
    assert "kept in" in logs and _files(tmp_path), logs[-3000:]


def test_a_conversation_outlives_the_models_sleep(default_model, tmp_path):
    srv = _server(tmp_path, SLEEP_IDLE_SECONDS="2")
    try:
        turn = story(4)
        complete(srv, KEY_A, turn)
        reference = complete(srv, KEY_A, turn)
        wait_for(lambda: _health(srv).get("sleeping"), 60, "the model asleep")
        wait_for(lambda: _files(tmp_path), 60, "the slot's conversation written")
        assert complete(srv, KEY_A, turn) == reference  # woken, and read back
        assert _disk(srv)["read"] == 1
    finally:
        _terminate(srv)
