"""Models in Google Cloud Storage: which objects a ``gs://`` URI names, and small reads.

- ``gs://bucket/x.gguf`` is that object; ``gs://bucket/dir`` (what AIP_STORAGE_URI gives) is the
  one GGUF in that directory (``model_file`` picks among several); a split GGUF
  (``name-00001-of-00003.gguf``...) comes whole, every shard next to the first.
- A small object (an image a request names) is read in one call with a shared client.

Downloading, verifying and caching the model's objects is :mod:`app.model.gcs_download`.
"""

from __future__ import annotations

import fnmatch
import re
import threading
import time
from dataclasses import dataclass

from app.base.errors import ModelLoadError
from app.base.gcs_client import make_client, split_uri

SHARD_RE = re.compile(r"^(?P<base>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class GcsError(ModelLoadError):
    """A model could not be fetched; the message names the URI and the cause."""


@dataclass(frozen=True)
class GcsObject:
    bucket: str
    name: str
    size: int
    generation: int
    crc32c: str  # base64 of the big-endian CRC32C, as GCS reports it
    md5: str = ""  # base64 MD5, when GCS has one (not for composite objects)

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.name}"

    @property
    def basename(self) -> str:
        return self.name.rsplit("/", 1)[-1]


def parse_uri(uri: str) -> tuple[str, str]:
    parts = split_uri(uri)
    if parts is None:
        raise GcsError(f"model {uri}: not a valid gs:// URI (gs://BUCKET/PATH)")
    return parts


def import_client_library() -> None:
    """The Cloud Storage client library, imported now (at start, when a model comes from
    ``gs://``): imported by the first ``gs://`` load instead, on a thread of the web process,
    its 0.14 s import held the interpreter lock and stalled every stream the web process
    relays (a 120 ms gap in another model's stream)."""
    import google.cloud.storage  # noqa: F401


def names_gcs(*sources: str | None) -> bool:
    """Whether any of ``sources`` (a model, a projector, LORA_ADAPTERS' list...) is on
    Cloud Storage."""
    return any(s is not None and "gs://" in s for s in sources)


_clients: dict[str | None, object] = {}
_clients_lock = threading.Lock()


def shared_client(emulator_host: str | None):
    """One client per process (per emulator host) for small reads on requests' behalf: making
    one looks up credentials, too slow to repeat per request."""
    with _clients_lock:
        client = _clients.get(emulator_host)
        if client is None:
            client = _clients[emulator_host] = make_client(emulator_host)
        return client


def read_object(uri: str, max_bytes: int, emulator_host: str | None,
                deadline: float | None = None) -> bytes:
    """A small object's bytes, read with the server's own credentials: LookupError when it
    does not exist (or cannot be seen), ValueError when it holds more than ``max_bytes``,
    GcsError for anything else, the ``deadline`` (time.monotonic()) passing included: each
    call and its retries get only the time left."""
    bucket_name, path = parse_uri(uri)
    if not path or path.endswith("/"):
        raise LookupError(f"{uri} names no object")

    def within() -> dict:
        if deadline is None:
            return {}
        from google.cloud.storage.retry import DEFAULT_RETRY

        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed")
        return {"timeout": left, "retry": DEFAULT_RETRY.with_timeout(left)}

    try:
        blob = shared_client(emulator_host).bucket(bucket_name).get_blob(path, **within())
        if blob is None:
            raise LookupError(f"{uri}: no such object (or no such bucket)")
        if blob.size is not None and int(blob.size) > max_bytes:
            raise ValueError(f"{uri} is {blob.size} bytes, over {max_bytes}")
        # end is inclusive: one byte over shows
        data = blob.download_as_bytes(end=max_bytes, **within())
        within()  # a read that ended after the deadline is too late all the same
    except (LookupError, ValueError):
        raise
    except Exception as exc:  # noqa: BLE001 - every cause ends in one clear message
        if is_permanent(exc) and getattr(exc, "code", None) in (403, 404):
            raise LookupError(f"{uri}: not found or not readable by this server") from None
        raise GcsError(describe(uri, exc).replace("model ", "", 1)) from None
    if len(data) > max_bytes:
        raise ValueError(f"{uri} is over {max_bytes} bytes")
    return data


def is_permanent(exc: BaseException) -> bool:
    """An error no retry can cure (missing, forbidden, malformed): fail at once."""
    from google.api_core import exceptions as gexc

    return isinstance(exc, gexc.NotFound | gexc.Forbidden | gexc.Unauthorized | gexc.BadRequest)


def describe(uri: str, exc: BaseException) -> str:
    """One line naming the URI and the cause, whatever raised it."""
    code = getattr(exc, "code", None)
    msg = getattr(exc, "message", None) or str(exc)
    return f"model {uri}: {type(exc).__name__}{f' ({code})' if code else ''}: {msg}"


def _to_object(blob) -> GcsObject:
    return GcsObject(blob.bucket.name, blob.name, int(blob.size), int(blob.generation),
                     blob.crc32c or "", blob.md5_hash or "")


def list_models(client, uri: str, model_file: str | None) -> list[GcsObject]:
    """The objects making up the model at ``uri``: one file, or every shard (first one first)."""
    bucket_name, path = parse_uri(uri)
    try:
        if path.lower().endswith(".gguf"):
            blob = client.bucket(bucket_name).get_blob(path)
            if blob is None:
                raise GcsError(f"model {uri}: no such object (or no such bucket)")
            obj = _to_object(blob)
            if SHARD_RE.match(obj.basename):
                prefix = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
                siblings = _list_dir(client, bucket_name, prefix)
                return _shard_set(siblings, SHARD_RE.match(obj.basename).group("base"), uri)
            return [obj]
        prefix = path.rstrip("/") + "/" if path else ""
        objects = _list_dir(client, bucket_name, prefix)
    except GcsError:
        raise
    except Exception as exc:  # noqa: BLE001 - every cause ends in one clear message
        raise GcsError(describe(uri, exc)) from exc
    return pick_model(objects, model_file, uri)


def _list_dir(client, bucket: str, prefix: str) -> list[GcsObject]:
    blobs = client.list_blobs(bucket, prefix=prefix, delimiter="/")
    return [_to_object(b) for b in blobs if b.name.lower().endswith(".gguf")]


def _models_in(objects: list[GcsObject]) -> dict[str, list[GcsObject]]:
    """Group GGUF objects into models: a single file, or a split set keyed by its base name."""
    models: dict[str, list[GcsObject]] = {}
    for obj in objects:
        m = SHARD_RE.match(obj.basename)
        key = f"{m.group('base')}-*-of-{m.group('count')}.gguf" if m else obj.basename
        models.setdefault(key, []).append(obj)
    return models


def _shard_set(objects: list[GcsObject], base: str, uri: str) -> list[GcsObject]:
    shards = [o for o in objects if (m := SHARD_RE.match(o.basename)) and m.group("base") == base]
    count = int(SHARD_RE.match(shards[0].basename).group("count"))
    by_no = {int(SHARD_RE.match(o.basename).group("no")): o for o in shards}
    missing = [n for n in range(1, count + 1) if n not in by_no]
    if missing:
        raise GcsError(
            f"model {uri}: split GGUF {base} has {count} shards but "
            f"{', '.join(f'{n:05d}' for n in missing)} missing"
        )
    return [by_no[n] for n in range(1, count + 1)]


def is_projector(name: str) -> bool:
    """A vision projector's GGUF (llama.cpp's converter names them mmproj-*.gguf): it pairs
    with the model beside it, and is never the model."""
    return "mmproj" in name.lower()


def pick_projector(objects: list[GcsObject], uri: str) -> GcsObject | None:
    """The one projector in a model's directory, if any."""
    found = [o for o in objects if is_projector(o.basename)]
    if len(found) > 1:
        raise GcsError(f"model {uri}: {len(found)} projectors in this directory "
                       f"({', '.join(sorted(o.basename for o in found))}); set MMPROJ to one")
    return found[0] if found else None


def find_projector(uri: str, emulator_host: str | None) -> str | None:
    """The gs:// URI of the projector in the model directory ``uri`` (None: it has none, or
    ``uri`` names a file)."""
    bucket_name, path = parse_uri(uri)
    if path.lower().endswith(".gguf"):
        return None
    try:
        objects = _list_dir(make_client(emulator_host), bucket_name,
                            path.rstrip("/") + "/" if path else "")
    except Exception as exc:  # noqa: BLE001 - every cause ends in one clear message
        raise GcsError(describe(uri, exc)) from exc
    found = pick_projector(objects, uri)
    return f"gs://{bucket_name}/{found.name}" if found else None


def pick_model(objects: list[GcsObject], model_file: str | None, uri: str) -> list[GcsObject]:
    objects = [o for o in objects if not is_projector(o.basename)]
    models = _models_in(objects)
    names = sorted(o.basename for o in objects)
    if not models:
        raise GcsError(f"model {uri}: no .gguf file in this directory")
    if model_file:
        chosen = {
            key: objs
            for key, objs in models.items()
            if any(fnmatch.fnmatchcase(o.basename, model_file) for o in objs)
        }
        if len(chosen) != 1:
            raise GcsError(
                f"model {uri}: MODEL_FILE {model_file!r} matches {len(chosen)} models "
                f"(files here: {', '.join(names)})"
            )
        models = chosen
    if len(models) > 1:
        raise GcsError(
            f"model {uri}: {len(models)} models in this directory ({', '.join(names)}); "
            "set MODEL_FILE (a file name or glob) to pick one"
        )
    objs = next(iter(models.values()))
    if len(objs) == 1 and not SHARD_RE.match(objs[0].basename):
        return objs
    return _shard_set(objs, SHARD_RE.match(objs[0].basename).group("base"), uri)
