"""The Cloud Storage client, made one way for every caller: the model's download and listing
(app.model) and the prompt files (app.engine.prompt_store), which sit in layers that may not
import one another. Credentials (Application Default Credentials, anonymous only with the
emulator), a download's body read 1 MiB at a time, a client per OS thread where threads share
nothing, and the ``gs://BUCKET/PATH`` rule."""

from __future__ import annotations

import importlib
import re
from typing import Any

from app.base.threads import allocate_lock, thread_local

BUCKET_URI = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(?:/(.*))?$")
READ_BYTES = 1 << 20  # what a download's body is read by (see raise_read_size)
# google-cloud-storage's module (3.x), and google-resumable-media's (what 2.x downloads through)
_READ_SIZE_MODULES = ("google.cloud.storage._media.requests._request_helpers",
                      "google.resumable_media.requests._request_helpers")

_lock = allocate_lock()
_credentials: dict[str | None, tuple[Any, str | None]] = {}
_per_thread = thread_local()  # this OS thread's clients, by emulator host
_read_size_raised = False


def split_uri(uri: str) -> tuple[str, str] | None:
    """``gs://BUCKET/PATH`` as (bucket, path); None when it is not one."""
    m = BUCKET_URI.match(uri)
    return (m.group(1), m.group(2) or "") if m else None


def raise_read_size(size: int = READ_BYTES) -> list[str]:
    """Have the client read a download's body ``size`` bytes at a time; the modules changed.
    It streams a ranged download 8 KiB at a time (its private ``_SINGLE_GET_CHUNK_SIZE``), each
    read one turn of a Python loop on the slice's thread: that loop, not the network, bounded
    the download (4.66 GB from the storage emulator on loopback in 19.7 s, against 6.4 s at
    1 MiB and the client's own single stream's 12.2 s; bench/RESULTS.md). Never lowered; a
    release without the constant keeps its own size."""
    changed = []
    for name in _READ_SIZE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "_SINGLE_GET_CHUNK_SIZE", size) < size:
            module._SINGLE_GET_CHUNK_SIZE = size
            changed.append(name)
    return changed


def _prepare() -> None:
    """Once per process, before the first client: the read size raised."""
    global _read_size_raised
    if not _read_size_raised:
        raise_read_size()
        _read_size_raised = True


def make_client(emulator_host: str | None) -> Any:
    """A new client (Application Default Credentials looked up; anonymous with the emulator)."""
    from google.cloud import storage

    _prepare()
    if emulator_host:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            credentials=AnonymousCredentials(),
            project="emulator",
            client_options={"api_endpoint": emulator_host},
        )
    return storage.Client()  # Application Default Credentials


def thread_client(emulator_host: str | None) -> Any:
    """This OS thread's client. One per thread: a client's pooled connections are sockets that,
    in a gevent-patched process, belong to the hub of the thread that opened them (another
    thread's use raises "cannot switch to a different thread"). The credentials are looked up
    once per process."""
    clients = getattr(_per_thread, "clients", None)
    if clients is None:
        clients = _per_thread.clients = {}
    if emulator_host in clients:
        return clients[emulator_host]
    from google.cloud import storage

    _prepare()
    with _lock:
        if emulator_host not in _credentials:
            if emulator_host:
                from google.auth.credentials import AnonymousCredentials

                _credentials[emulator_host] = (AnonymousCredentials(), "emulator")
            else:
                import google.auth

                _credentials[emulator_host] = google.auth.default()  # ADC
        creds, project = _credentials[emulator_host]
    opts = {"api_endpoint": emulator_host} if emulator_host else None
    clients[emulator_host] = storage.Client(credentials=creds, project=project,
                                            client_options=opts)
    return clients[emulator_host]
