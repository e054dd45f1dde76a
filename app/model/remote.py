"""Images a request names by URL instead of sending them, fetched only where the operator
allows: ``gs://`` objects in the buckets IMAGE_BUCKETS names (read with the server's own
credentials, as the model is), and ``http(s)`` URLs on the hosts IMAGE_URL_HOSTS names. By
default both lists are empty and every such URL is refused: a server that fetches what a
caller names can be made to read what the caller could not (another tenant's bucket, the
metadata server, the VPC).

An http(s) URL is parsed once, strictly, by this module alone: printable ASCII, no ``\\``, no
userinfo, nothing another parser could read as a different host. Its host and port must be
listed; a listed name must resolve to public addresses only (or to IMAGE_URL_NETWORKS), and
the connection goes to an address that was checked, with a request written from the checked
parts (app.model.http_get). Each fetch is bounded: IMAGE_MAX_BYTES (an object's size is read
before its bytes, an http body is read no further), IMAGE_FETCH_TIMEOUT seconds as a deadline
on the whole read, and the caller's own deadline (PREPARE_TIMEOUT), no redirects. Every
failure to read gives the caller one message: the errors tell nothing of what lies behind the
allowed hosts (which ports answer, with what status); the cause goes to the server's log.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import ssl
import time
from dataclasses import dataclass, field

from app.base import bridge
from app.base.errors import BadRequest, PayloadTooLarge
from app.model import gcs
from app.model.http_get import Address, FetchFailed, Target, TooLarge, get
from app.settings import Settings
from app.settings.inputs import HostEntry, url_host, url_hosts, url_networks

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_URL = re.compile(r"(https?)://(\[[0-9a-z:.]*\]|[0-9a-z.-]*)(?::([0-9]{1,5}))?([/?].*)?",
                  re.IGNORECASE | re.ASCII | re.DOTALL)
_UNREADABLE = ("the image could not be read from its URL: it must answer 200 with the image, "
               "without a redirect, within IMAGE_FETCH_TIMEOUT")


@dataclass(frozen=True)
class Fetcher:
    """``fetcher(url, param)``: the image's bytes, or the request's error."""

    buckets: frozenset[str]
    hosts: frozenset[HostEntry]
    max_bytes: int
    timeout: float
    emulator_host: str | None
    networks: tuple[Network, ...] = ()
    tls: ssl.SSLContext | None = field(default=None, compare=False)  # None: the system's
    limit_name: str = "IMAGE_MAX_BYTES"  # the setting max_bytes is (a video's: VIDEO_MAX_BYTES)

    @classmethod
    def from_settings(cls, settings: Settings) -> Fetcher:
        buckets = frozenset(b.strip().lower() for b in (settings.image_buckets or "").split(",")
                            if b.strip())
        return cls(buckets, url_hosts(settings.image_url_hosts), settings.image_max_bytes,
                   settings.image_fetch_timeout, settings.storage_emulator_host,
                   url_networks(settings.image_url_networks))

    def __call__(self, url: str, param: str) -> bytes:
        if url.startswith("gs://"):
            return self._gcs(url, param)
        return self._http(url, param)

    def _deadline(self) -> float:
        """IMAGE_FETCH_TIMEOUT from now, or sooner when the caller gives up sooner (its
        PREPARE_TIMEOUT): a read nobody waits for is not finished."""
        deadline = time.monotonic() + self.timeout
        left = bridge.time_left()
        return deadline if left is None else min(deadline, time.monotonic() + left)

    def _gcs(self, url: str, param: str) -> bytes:
        bucket = url[5:].split("/", 1)[0]  # as written: bucket names are lower-case
        if bucket not in self.buckets:
            raise BadRequest(
                f"images are not read from bucket {bucket[:100]!r}: this server reads gs:// "
                "images only from the buckets its operator lists (IMAGE_BUCKETS); send the "
                "image inline as a data: URL", param=param, code="image_url_not_allowed")
        try:
            return gcs.read_object(url, self.max_bytes, self.emulator_host, self._deadline())
        except LookupError as exc:
            raise BadRequest(str(exc), param=param, code="image_not_found") from None
        except ValueError as exc:
            raise PayloadTooLarge(f"{exc} ({self.limit_name})", param=param) from None
        except gcs.GcsError as exc:
            bridge.log_on_hub(log, logging.INFO, "image %r not read: %s", url[:200], exc)
            raise BadRequest("the image could not be read from Cloud Storage within "
                             "IMAGE_FETCH_TIMEOUT", param=param, code="image_not_found") from None

    def _http(self, url: str, param: str) -> bytes:
        target = self._allowed(url, param)
        deadline = self._deadline()
        addresses = self._addresses(target, param)
        try:
            return get(target, addresses, deadline, self.max_bytes, self.tls)
        except TooLarge as exc:
            raise PayloadTooLarge(f"{exc} ({self.limit_name})", param=param) from None
        except FetchFailed as exc:
            bridge.log_on_hub(log, logging.INFO, "image %s not read: %s", _shown(target), exc)
            raise BadRequest(_UNREADABLE, param=param, code="image_not_found") from None

    def _allowed(self, url: str, param: str) -> Target:
        """The URL parsed once, strictly; its host and port on the list. Nothing is looked
        up or connected to before this passes."""
        target = parse_url(url)
        if target is None:
            raise BadRequest(
                "an image URL is http(s)://host[:port]/path in printable ASCII, without "
                "spaces, backslashes or user info: percent-encode the path, or send the image "
                "inline as a data: URL", param=param, code="image_url_not_allowed")
        if (target.host, target.port) not in self.hosts and not (
                target.port == target.default_port and (target.host, None) in self.hosts):
            raise BadRequest(
                "image URLs are not fetched from this host and port (only from the hosts its "
                "operator lists in IMAGE_URL_HOSTS): send the image inline as a data: URL",
                param=param, code="image_url_not_allowed")
        return target

    def _addresses(self, target: Target, param: str) -> list[Address]:
        """The addresses to connect to, each checked, from one lookup (none for a listed
        address). A name must resolve to public addresses only, or to IMAGE_URL_NETWORKS: a
        public name may point at the metadata server or the VPC."""
        literal = _is_address(target.host)
        try:
            found = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_NUMERICHOST if literal else 0)
        except (OSError, UnicodeError) as exc:
            bridge.log_on_hub(log, logging.INFO, "image host %s not resolved: %s", target.host,
                              exc)
            raise BadRequest(_UNREADABLE, param=param, code="image_not_found") from None
        out = [(family, sockaddr) for family, _, _, _, sockaddr in found
               if family in (socket.AF_INET, socket.AF_INET6)]
        refused = [a for _, (a, *_) in out if not literal and not self._public_or_listed(a)]
        if refused or not out:
            bridge.log_on_hub(log, logging.INFO, "image host %s resolves to %s, outside "
                              "IMAGE_URL_NETWORKS", target.host, ", ".join(refused))
            raise BadRequest(
                "the image's host resolves to an address that is not public; its operator "
                "lists such ranges in IMAGE_URL_NETWORKS", param=param,
                code="image_url_not_allowed")
        return out

    def _public_or_listed(self, text: str) -> bool:
        addr = ipaddress.ip_address(text.split("%", 1)[0])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if any(addr in net for net in self.networks):
            return True
        return addr.is_global and not addr.is_multicast


def parse_url(url: str) -> Target | None:
    """An http(s) URL as the fetch will use it, or None for anything this module will not
    read unambiguously: non-ASCII, spaces or control characters, ``\\`` anywhere, userinfo
    (``@`` before the path), a host that is neither a plain name nor an address, port 0. The
    fragment is dropped (it is never sent)."""
    if "\\" in url or not url.isascii() or not url.isprintable() or " " in url:
        return None
    m = _URL.fullmatch(url.split("#", 1)[0])
    if m is None:
        return None
    scheme, host_text, port_text, path = m.groups()
    host = url_host(host_text)
    port = int(port_text) if port_text else (443 if scheme.lower() == "https" else 80)
    if host is None or not 0 < port < 65536:
        return None
    path = path or "/"
    return Target(scheme.lower(), host, port, path if path.startswith("/") else "/" + path)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _shown(target: Target) -> str:
    """The URL as the log shows it (the path cut short)."""
    return f"{target.scheme}://{target.authority}{target.path[:200]}"
