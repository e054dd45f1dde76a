"""Review of the API-key check, fast tier: a key must appear in no log line (docs/security.md).

gunicorn's own access logger is on whenever ``logconfig_dict`` is set (``options()`` sets it),
and its line format (``%(u)s``, ``%(r)s``) writes the user name of an ``Authorization: Basic``
header and the raw request target with its query string. A client that sends its key as
``curl -u "$KEY:"`` does, or as ``?key=...``, gets a 401, and the key lands in the log in
plain text. Run in a subprocess: gunicorn's Logger applies ``dictConfig`` to the whole process.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

KEY = "review-secret-key-0123456789"
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import datetime, sys, types
from gunicorn.config import Config
from gunicorn.glogging import Logger
from app.process.gunicorn_conf import options
from app.settings import Settings

key, auth, target = sys.argv[1:4]
cfg = Config()
for name, value in options(Settings(api_key=key)).items():
    cfg.set(name, value)
log = Logger(cfg)
path, _, query = target.partition("?")
environ = {"REQUEST_METHOD": "GET", "RAW_URI": target, "PATH_INFO": path, "QUERY_STRING": query,
           "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1"}
headers = []
if auth:
    environ["HTTP_AUTHORIZATION"] = auth
    headers.append(("AUTHORIZATION", auth))
resp = types.SimpleNamespace(status="401 UNAUTHORIZED", sent=0, headers=[])
log.access(resp, types.SimpleNamespace(headers=headers), environ,
           datetime.timedelta(milliseconds=1))
print("logged", file=sys.stderr)
"""


@pytest.mark.parametrize(
    "auth, target",
    [
        ("Basic " + base64.b64encode(f"{KEY}:".encode()).decode(), "/v1/models"),  # curl -u "$KEY:"
        ("", f"/v1/models?key={KEY}"),
    ],
    ids=["basic-user", "query-string"],
)
def test_a_key_sent_the_wrong_way_is_not_logged_by_gunicorn(auth, target):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, KEY, auth, target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    logged = out.stdout + out.stderr
    assert out.returncode == 0 and "logged" in logged, logged
    assert KEY not in logged, logged
