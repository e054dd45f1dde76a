"""gcp-storage-emulator on a loopback port, for Cloud Storage tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.server import free_port


class Emulator:
    def __init__(self, nice: int = 0) -> None:
        """``nice``: its CPU priority (a benchmark's stand-in for Cloud Storage, another
        machine's work, at 19: its CPU is not the server's)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).with_name("gcp-storage-emulator")
        self.proc = subprocess.Popen(
            ["nice", "-n", str(nice), str(exe), "start", "--host", "127.0.0.1", "--port", str(self.port), "--in-memory", "-q"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError("storage emulator did not start")
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        self.client = storage.Client(
            credentials=AnonymousCredentials(), project="test", client_options={"api_endpoint": self.url}
        )

    def upload(self, bucket: str, name: str, path: Path | None = None, data: bytes | None = None):
        b = self.client.lookup_bucket(bucket) or self.client.create_bucket(bucket)
        blob = b.blob(name)
        if path is not None:
            blob.upload_from_filename(str(path))
        else:
            blob.upload_from_string(data or b"")
        return b.get_blob(name)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(10)
