"""The import contract: imports under app/ form no circle, and none points up a layer.

Every import counts, at module level, inside a function or under ``TYPE_CHECKING``: a circle
broken with a lazy import is still a circle to whoever reads the code. The layers run from the
process at the top to the shared base at the bottom; a module imports from its own layer or
below. A change that needs an upward arrow is a change to the layering itself: move the code
(or this table) instead of importing around it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"

# top to bottom; a module belongs to the first entry that is it or a package above it
LAYERS: list[tuple[str, ...]] = [
    ("app.__main__", "app.process.cli"),  # the command line
    ("app.settings_doc",),  # the settings rendered for people (help, the docs' table)
    ("app.process.server", "app.process.wsgi"),  # the process under gunicorn
    ("app",),  # the composition root (app/__init__.py: create_app)
    ("app.edge.routes", "app.edge.pool_routes", "app.edge.auth", "app.process.gunicorn_conf",
     "app.model.source", "app.model.catalog"),  # the HTTP edge; where the models come from
    ("app.api",),  # one module per wire API
    ("app.core", "app.edge.logs", "app.model.gcs_download", "app.model.gcs_cache",
     "app.model.gcs", "app.model.remote",
     "app.model.http_get"),  # the protocol-neutral middle; logs; download; images named by URL
    ("app.protocol", "app.settings"),  # wire shapes; the settings table
    ("app.formats",),  # the model's text: tool-call and reasoning formats, reply parsing
    ("app.grammar", "app.engine"),  # the grammar gate and converter; llama.cpp behind the engine
    ("app.base.metrics", "app.streams", "app.base.bridge"),  # shared services
    ("app.process.crash_guard", "app.base.reqctx", "app.base.errors", "app.process.worker",
     "app.base.state", "app.base.boot", "app.model.default", "app.model.gguf_header",
     "app.base.cxx_runtime", "app.base.threads",
     "app.base.gcs_client"),  # the base: imports nothing above
    # the folders' own __init__ modules: a docstring, no imports
    ("app.process", "app.edge", "app.model", "app.base"),
]


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_of(p): p for p in APP.rglob("*.py")}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The app modules ``path`` imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from app.x import y`: y is a module when app/x/y.py exists, else a name in app.x
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]
        else:
            continue
        out |= {n for n in names if n in known}
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(p, known) - {m} for m, p in known.items()}


def layer_of(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if any(module == top or (top != "app" and module.startswith(top + "."))
               for top in layer):
            return i
    raise AssertionError(f"{module} is in no layer of tests/unit/test_imports.py: add it")


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    assert cycles(graph()) == []


def test_no_import_points_up_a_layer():
    up = [f"{m} -> {d}" for m, deps in sorted(graph().items()) for d in sorted(deps)
          if layer_of(d) < layer_of(m)]
    assert up == []


def test_the_checks_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert layer_of("app.api.openai") < layer_of("app.core.plan") < layer_of("app.base.errors")


def test_tests_import_shared_code_only_from_support():
    """A test module imports no other test module and not conftest: what tests share lives in
    tests/support/ (conftest holds fixtures, which pytest hands out by name)."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names
                    if n.startswith("tests.") and not n.startswith("tests.support")]
    assert bad == []
