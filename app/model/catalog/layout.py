"""Which models a folder holds (MODELS_DIR), and which files a model's source names: listed on
the disk or in Cloud Storage, never downloaded.

MODELS_DIR follows llama-server's --models-dir (common/preset.cpp, load_from_models_dir):

- a ``.gguf`` file at the top is a model named by its file name without ``.gguf``;
- a sub-folder is one model named by the folder: its GGUF (or the shards of a split one,
  ``-00001-of-0000N.gguf``), with an ``mmproj*.gguf`` beside it as its projector;
- sub-folders are not searched deeper, other files are ignored.

Where llama-server guesses, this says so instead: a split model's shards at the top are one
model named by their common stem (llama-server lists each shard as a model that cannot load); a
projector at the top pairs with nothing, a sub-folder with two models or two projectors, a
shard missing, are errors (llama-server keeps whichever it lists last). Files and sub-folders
at the top whose names start with ``.`` are skipped (editors', downloads' and volume mounts'
scratch: ``..data``, ``.x.part``); inside a sub-folder the files are listed as a MODEL folder's
are, since the sub-folder is the model's source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.model import gcs
from app.model.catalog.spec import CatalogError
from app.settings.models import NAME_RE, NAME_RULE


@dataclass(frozen=True)
class Found:
    """A model a folder holds: its name, its source as MODEL takes it, and where it was."""

    name: str
    source: str
    where: str


@dataclass(frozen=True)
class Files:
    """What a source resolves to: the GGUF files (the first shard first), the projector."""

    files: tuple[str, ...]
    projector: str | None
    size: int | None


def local_path(source: str) -> Path:
    return Path(source[len("file://"):] if source.startswith("file://") else source)


def _gguf(name: str) -> bool:
    return name.lower().endswith(".gguf") and not name.startswith(".")


def _stem(name: str) -> str:
    return name[: -len(".gguf")]


def _named(name: str, where: str, root: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise CatalogError(f"MODELS_DIR {root}: {where} would be a model named {name!r}, not a "
                           f"valid model name ({NAME_RULE}): rename it, or name it in MODELS")
    return name


def _objects(names: list[str]) -> list[gcs.GcsObject]:
    return [gcs.GcsObject("dir", n, 0, 0, "") for n in names]


def _top_level(names: list[str], join, root: str) -> list[Found]:
    """The models among the GGUFs at the top of MODELS_DIR: single files, and split sets."""
    out: list[Found] = []
    sets: dict[str, list[str]] = {}
    for name in sorted(names):
        if gcs.is_projector(name):
            raise CatalogError(f"MODELS_DIR {root}: the projector {name} at the top pairs with "
                               "no model: put it in a sub-folder beside its model")
        m = gcs.SHARD_RE.match(name)
        if m:
            sets.setdefault(f"{m.group('base')}\0{m.group('count')}", []).append(name)
            continue
        out.append(Found(_named(_stem(name), name, root), join(name), join(name)))
    for key, shards in sets.items():
        base = key.split("\0")[0]
        try:
            first = gcs.pick_model(_objects(shards), None, f"{root} ({base})")[0].name
        except gcs.GcsError as exc:
            raise CatalogError(f"MODELS_DIR {exc}") from None
        out.append(Found(_named(base, first, root), join(first), join(first)))
    return out


def _sub_folder(folder: str, names: list[str], source: str, root: str) -> Found | None:
    """A sub-folder is one model when it holds a GGUF that is not a projector."""
    models = [n for n in names if not gcs.is_projector(n)]
    if not models:
        if names:
            raise CatalogError(f"MODELS_DIR {root}: sub-folder {folder} holds a projector "
                               f"({', '.join(sorted(names))}) but no model")
        return None
    return Found(_named(folder, f"sub-folder {folder}", root), source, source)


def scan(root: str, client_for) -> list[Found]:
    """The models in MODELS_DIR, sorted by name (as llama-server's map of them)."""
    if root.startswith("gs://"):
        found = _scan_gcs(root, client_for())
    else:
        found = _scan_local(local_path(root), root)
    return sorted(found, key=lambda f: f.name)


def _scan_local(path: Path, root: str) -> list[Found]:
    if not path.is_dir():
        raise CatalogError(f"MODELS_DIR {root}: no such folder")
    top: list[str] = []
    found: list[Found] = []
    for entry in sorted(path.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            names = [o.name for o in _local_objects(entry)]  # as the load will list it
            sub = _sub_folder(entry.name, names, str(entry), root)
            if sub:
                found.append(sub)
        elif entry.is_file() and _gguf(entry.name):
            top.append(entry.name)
    return _top_level(top, lambda n: str(path / n), root) + found


def _scan_gcs(root: str, client) -> list[Found]:
    bucket, path = gcs.parse_uri(root)
    prefix = path.rstrip("/") + "/" if path else ""
    try:
        blobs = [b.name for b in client.list_blobs(bucket, prefix=prefix)]
    except Exception as exc:  # noqa: BLE001 - every cause ends in one clear message
        raise CatalogError(f"MODELS_DIR {gcs.describe(root, exc).removeprefix('model ')}") from None
    top: list[str] = []
    subs: dict[str, list[str]] = {}
    for name in blobs:
        parts = name[len(prefix):].split("/")
        if parts[0].startswith(".") or not parts[-1].lower().endswith(".gguf"):
            continue
        if len(parts) == 1:
            top.append(parts[0])
        elif len(parts) == 2:  # listed as app.model.gcs lists a MODEL folder
            subs.setdefault(parts[0], []).append(parts[1])
    base = f"gs://{bucket}/{prefix}"
    found = _top_level(top, lambda n: base + n, root)
    for folder, names in sorted(subs.items()):
        sub = _sub_folder(folder, names, f"{base}{folder}/", root)
        if sub:
            found.append(sub)
    return found


# ---- a source's files ----------------------------------------------------------------------


def describe(source: str, model_file: str | None, mmproj: str | None, client_for,
             emulator_host: str | None) -> Files:
    """The files ``source`` names as the server would load them (the rules of MODEL, with the
    listings of app.model.source and app.model.gcs), and its projector: MMPROJ, else the one
    ``mmproj*.gguf`` in a folder source. Raises gcs.GcsError or CatalogError with the cause."""
    paired: str | None = None
    if source.startswith("gs://"):
        objs = gcs.list_models(client_for(), source, model_file)
        files = tuple(o.uri for o in objs)
        size = sum(o.size for o in objs)
        if mmproj is None:
            paired = gcs.find_projector(source, emulator_host)
    else:
        path = local_path(source)
        if path.is_dir():
            objs = _local_objects(path)
            chosen = gcs.pick_model(objs, model_file, source)
            found = gcs.pick_projector(objs, source) if mmproj is None else None
            paired = str(path / found.name) if found else None
        elif path.is_file():
            m = gcs.SHARD_RE.match(path.name)
            if m:  # llama.cpp finds the other shards beside the first
                same = [o for o in _local_objects(path.parent)
                        if (s := gcs.SHARD_RE.match(o.name)) and s.group("base") == m.group("base")]
                chosen = gcs.pick_model(same, None, source)
            else:
                chosen = [gcs.GcsObject("local", path.name, path.stat().st_size, 0, "")]
            path = path.parent
        else:
            raise CatalogError(f"{source}: no such file or folder")
        files = tuple(str(path / o.name) for o in chosen)
        size = sum(o.size for o in chosen)
    projector = paired if mmproj is None else (None if mmproj == "none" else mmproj)
    if projector and mmproj and not projector.startswith("gs://") \
            and not local_path(projector).is_file():
        raise CatalogError(f"MMPROJ {projector}: file not found")
    return Files(files, projector, size)


def _local_objects(folder: Path) -> list[gcs.GcsObject]:
    """A local folder's GGUFs, listed as app.model.source lists a MODEL folder."""
    return [gcs.GcsObject("local", p.name, p.stat().st_size, 0, "")
            for p in sorted(folder.glob("*.gguf")) if p.is_file()]
