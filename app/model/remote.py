"""Images a request names by URL instead of sending them, fetched only where the operator
allows: ``gs://`` objects in the buckets IMAGE_BUCKETS names (read with the server's own
credentials, as the model is), and ``http(s)`` URLs on the hosts IMAGE_URL_HOSTS names. By
default both lists are empty and every such URL is refused: a server that fetches what a
caller names can be made to read what the caller could not (another tenant's bucket, the
metadata server, the VPC).

Each fetch is bounded: IMAGE_MAX_BYTES (the object's size is read before its bytes, an
http body is read no further), IMAGE_FETCH_TIMEOUT seconds, no redirects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.base.errors import BadRequest, PayloadTooLarge, Unavailable
from app.model import gcs
from app.settings import Settings


@dataclass(frozen=True)
class Fetcher:
    """``fetcher(url, param)``: the image's bytes, or the request's error."""

    buckets: frozenset[str]
    hosts: frozenset[str]
    max_bytes: int
    timeout: float
    emulator_host: str | None

    @classmethod
    def from_settings(cls, settings: Settings) -> Fetcher:
        def names(value: str | None) -> frozenset[str]:
            return frozenset(v.strip().lower() for v in (value or "").split(",") if v.strip())

        return cls(names(settings.image_buckets), names(settings.image_url_hosts),
                   settings.image_max_bytes, settings.image_fetch_timeout,
                   settings.storage_emulator_host)

    def __call__(self, url: str, param: str) -> bytes:
        if url.startswith("gs://"):
            return self._gcs(url, param)
        return self._http(url, param)

    def _gcs(self, url: str, param: str) -> bytes:
        bucket = url[5:].split("/", 1)[0].lower()
        if bucket not in self.buckets:
            raise BadRequest(
                f"images are not read from bucket {bucket!r}: this server reads gs:// images "
                "only from the buckets its operator lists (IMAGE_BUCKETS); send the image "
                "inline as a data: URL", param=param, code="image_url_not_allowed")
        try:
            return gcs.read_object(url, self.max_bytes, self.emulator_host)
        except LookupError as exc:
            raise BadRequest(str(exc), param=param, code="image_not_found") from None
        except ValueError as exc:
            raise PayloadTooLarge(f"{exc} (IMAGE_MAX_BYTES)", param=param) from None
        except gcs.GcsError as exc:
            raise Unavailable(f"the image could not be read: {exc}", param=param) from None

    def _http(self, url: str, param: str) -> bytes:
        import requests  # a request naming an http image is rare: import on first use

        host = (urlsplit(url).hostname or "").lower()
        if host not in self.hosts:
            raise BadRequest(
                "image URLs are not fetched by this server (only from the hosts its operator "
                "lists in IMAGE_URL_HOSTS): send the image inline as a data: URL",
                param=param, code="image_url_not_allowed")
        try:
            with requests.get(url, timeout=self.timeout, stream=True,
                              allow_redirects=False) as resp:
                if resp.status_code != 200:
                    raise BadRequest(f"the image URL answered {resp.status_code}", param=param,
                                     code="image_not_found")
                declared = resp.headers.get("Content-Length")
                if declared and declared.isdigit() and int(declared) > self.max_bytes:
                    raise PayloadTooLarge(f"the image is {declared} bytes, over "
                                          f"{self.max_bytes} (IMAGE_MAX_BYTES)", param=param)
                data = bytearray()
                deadline = time.monotonic() + self.timeout  # the whole body, not each read
                for piece in resp.iter_content(64 * 1024):
                    data += piece
                    if time.monotonic() > deadline:
                        raise BadRequest(f"the image URL took over {self.timeout:g} s "
                                         "(IMAGE_FETCH_TIMEOUT)", param=param,
                                         code="image_not_found")
                    if len(data) > self.max_bytes:
                        raise PayloadTooLarge(f"the image is over {self.max_bytes} bytes "
                                              "(IMAGE_MAX_BYTES)", param=param)
                return bytes(data)
        except requests.RequestException as exc:
            raise BadRequest(f"the image URL could not be read: {type(exc).__name__}",
                             param=param, code="image_not_found") from None
