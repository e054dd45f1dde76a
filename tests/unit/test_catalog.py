"""The catalog (app/model/catalog): which models MODEL, MODELS and MODELS_DIR name, as
llama-server's --models-dir names them; the models' own settings, each validated by Settings;
the default, what loads at start, MODELS_MAX. Folders are built in tmp dirs with tiny fake
GGUFs (nothing is loaded: only names and sizes matter). Presets: tests/unit/test_catalog_preset.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.model.catalog import CatalogError, build
from app.settings import Settings


def touch(root: Path, *names: str, data: bytes = b"GGUF") -> Path:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def catalog(**kw):
    return build(Settings(**kw))


def summary(cat) -> dict[str, tuple]:
    return {s.name: (Path(s.source).name, tuple(Path(f).name for f in s.files),
                     Path(s.projector).name if s.projector else None) for s in cat.models}


# ---- MODEL alone: today's server ---------------------------------------------------------


def test_model_alone_is_a_single_model_served_as_before(tmp_path):
    touch(tmp_path, "qwen.gguf")
    cat = catalog(model=str(tmp_path / "qwen.gguf"))
    assert cat.single and cat.names == ("qwen",) and cat.default == "qwen"
    (spec,) = cat.models
    assert spec.settings == cat.base  # the very settings the server runs with today
    assert spec.preload and spec.pin and spec.keep_alive == math.inf


def test_model_alone_names_itself_as_today(tmp_path):
    touch(tmp_path, "dir/x-00001-of-00002.gguf", "dir/x-00002-of-00002.gguf", "dir/mmproj-x.gguf")
    cat = catalog(model=str(tmp_path / "dir"))
    (spec,) = cat.models
    # the id the engine gives a split model today: its first shard's file name
    assert spec.name == "x-00001-of-00002" and len(spec.files) == 2
    assert Path(spec.projector).name == "mmproj-x.gguf"
    cat = catalog(model=str(tmp_path / "dir"), served_model_name="a,b")
    assert cat.models[0].names == ("a", "b")


# ---- MODELS --------------------------------------------------------------------------------


def test_models_name_their_sources(tmp_path):
    touch(tmp_path, "a.gguf", "b/m.gguf", "b/mmproj-f16.gguf")
    cat = catalog(models=f"chat={tmp_path / 'a.gguf'}\nvision=file://{tmp_path / 'b'}")
    assert not cat.single and cat.names == ("chat", "vision") and cat.default == "chat"
    assert summary(cat) == {"chat": ("a.gguf", ("a.gguf",), None),
                            "vision": ("b", ("m.gguf",), "mmproj-f16.gguf")}
    chat = cat.get("chat")
    assert chat.settings.model == str(tmp_path / "a.gguf")
    assert chat.settings.served_model_name == "chat"
    assert cat.get(None) is chat and cat.get("CHAT") is chat and cat.get("nope") is None


def test_a_missing_source_is_an_error_naming_the_model(tmp_path):
    with pytest.raises(CatalogError, match=r"model gone \(MODELS\): .*no such file or folder"):
        catalog(models=f"gone={tmp_path / 'gone.gguf'}")


def test_model_joins_models_under_its_own_name(tmp_path):
    touch(tmp_path, "qwen.gguf", "e.gguf")
    cat = catalog(model=str(tmp_path / "qwen.gguf"), models=f"embed={tmp_path / 'e.gguf'}")
    assert cat.names == ("qwen", "embed") and cat.default == "qwen"
    assert cat.get("qwen").origin == "MODEL" and cat.get("qwen").preload
    assert not cat.get("embed").preload  # MODELS_PRELOAD unset: the default model only
    named = catalog(model=str(tmp_path / "qwen.gguf"), served_model_name="chat,qwen3",
                    models=f"embed={tmp_path / 'e.gguf'}")
    assert named.names == ("chat", "embed") and named.get("qwen3").name == "chat"


def test_model_and_models_may_not_share_a_name(tmp_path):
    touch(tmp_path, "qwen.gguf")
    with pytest.raises(CatalogError, match="'qwen' comes twice: MODEL .* and MODELS"):
        catalog(model=str(tmp_path / "qwen.gguf"), models=f"qwen={tmp_path / 'qwen.gguf'}")


def test_models_own_files_are_not_inherited(tmp_path):
    touch(tmp_path, "a.gguf", "b.gguf", "draft.gguf")
    cat = catalog(model=str(tmp_path / "a.gguf"), draft_model=str(tmp_path / "draft.gguf"),
                  ctx_size=2048, models=f"b={tmp_path / 'b.gguf'}")
    assert cat.get("a").settings.draft_model == str(tmp_path / "draft.gguf")
    assert cat.get("b").settings.draft_model is None  # one vocabulary's draft
    assert cat.get("b").settings.ctx_size == 2048  # the rest is every model's default
    with pytest.raises(CatalogError, match="DRAFT_MODEL describes MODEL's model"):
        catalog(draft_model=str(tmp_path / "draft.gguf"), models=f"b={tmp_path / 'b.gguf'}")


# ---- MODELS_DIR: llama-server's --models-dir rules -----------------------------------------


def test_models_dir_layouts(tmp_path):
    touch(tmp_path, "llama-3.2-1b-Q4_K_M.gguf", "Qwen3-8B-Q4_K_M.gguf",
          "gemma-3-4b-it/gemma-3-4b-it-Q8_0.gguf", "gemma-3-4b-it/mmproj-F16.gguf",
          "kimi/kimi-00001-of-00003.gguf", "kimi/kimi-00002-of-00003.gguf",
          "kimi/kimi-00003-of-00003.gguf", "README.md", "notes.txt", "docs/index.html",
          "deep/er/hidden-away.gguf", "top-00001-of-00002.gguf", "top-00002-of-00002.gguf",
          ".part.gguf", ".cache/x.gguf", "..data/y.gguf")
    cat = catalog(models_dir=str(tmp_path))
    assert summary(cat) == {
        "Qwen3-8B-Q4_K_M": ("Qwen3-8B-Q4_K_M.gguf", ("Qwen3-8B-Q4_K_M.gguf",), None),
        "gemma-3-4b-it": ("gemma-3-4b-it", ("gemma-3-4b-it-Q8_0.gguf",), "mmproj-F16.gguf"),
        "kimi": ("kimi", tuple(f"kimi-0000{i}-of-00003.gguf" for i in (1, 2, 3)), None),
        "llama-3.2-1b-Q4_K_M": ("llama-3.2-1b-Q4_K_M.gguf", ("llama-3.2-1b-Q4_K_M.gguf",), None),
        # a split set at the top is one model, named by its stem
        "top": ("top-00001-of-00002.gguf", ("top-00001-of-00002.gguf",
                                            "top-00002-of-00002.gguf"), None),
    }
    assert cat.names == tuple(sorted(cat.names))  # sorted by name, as llama-server lists them
    assert {s.origin for s in cat.models} == {f"MODELS_DIR {tmp_path}"}
    assert cat.get("kimi").size == 12


def test_models_dir_as_a_file_uri(tmp_path):
    touch(tmp_path, "a.gguf")
    assert catalog(models_dir=f"file://{tmp_path}").names == ("a",)


@pytest.mark.parametrize("files, needle", [
    (["a.gguf", "a/m.gguf"], "'a' comes twice"),
    (["Chat.gguf", "chat/m.gguf"], "'chat' comes twice"),
    (["mmproj-f16.gguf", "a.gguf"], "projector mmproj-f16.gguf at the top pairs with no model"),
    (["v/mmproj-f16.gguf"], "sub-folder v holds a projector .* but no model"),
    (["v/a.gguf", "v/b.gguf"], "2 models in this directory"),
    (["v/a.gguf", "v/mmproj-1.gguf", "v/mmproj-2.gguf"], "2 projectors"),
    (["x-00001-of-00003.gguf", "x-00003-of-00003.gguf"], "00002 missing"),
    (["v/x-00001-of-00002.gguf"], "00002 missing"),
    (["bad name.gguf"], "a model named 'bad name', not a valid model name"),
])
def test_models_dir_refuses_what_llama_server_would_guess(tmp_path, files, needle):
    touch(tmp_path, *files)
    with pytest.raises(CatalogError, match=needle):
        catalog(models_dir=str(tmp_path))


def test_an_empty_or_missing_models_dir(tmp_path):
    with pytest.raises(CatalogError, match="no models"):
        catalog(models_dir=str(tmp_path))
    with pytest.raises(CatalogError, match="MODELS_DIR .*: no such folder"):
        catalog(models_dir=str(tmp_path / "nope"))


def test_models_dir_beside_models(tmp_path):
    touch(tmp_path, "dir/a.gguf", "b.gguf")
    cat = catalog(models=f"b={tmp_path / 'b.gguf'}", models_dir=str(tmp_path / "dir"))
    assert cat.names == ("b", "a") and cat.get("a").origin.startswith("MODELS_DIR")
    with pytest.raises(CatalogError, match="'a' comes twice: MODELS .* and MODELS_DIR"):
        catalog(models=f"a={tmp_path / 'b.gguf'}", models_dir=str(tmp_path / "dir"))


# ---- the default, preloading, MODELS_MAX, the cache bound -----------------------------------


@pytest.fixture
def three(tmp_path) -> Path:
    return touch(tmp_path, "a.gguf", "b.gguf", "c.gguf")


def test_the_default_and_preloads(three):
    cat = catalog(models_dir=str(three))
    assert cat.default == "a" and [s.name for s in cat.models if s.preload] == ["a"]
    cat = catalog(models_dir=str(three), models_default="c", models_preload="*")
    assert cat.default == "c" and all(s.preload for s in cat.models)
    cat = catalog(models_dir=str(three), models_preload="none")
    assert not any(s.preload for s in cat.models)
    cat = catalog(models_dir=str(three), models_preload="b, C")  # names compare ignoring case
    assert [s.name for s in cat.models if s.preload] == ["b", "c"]


@pytest.mark.parametrize("kw, needle", [
    ({"models_default": "d"}, "MODELS_DEFAULT names d, which is no model here: the models "
                              "are a, b, c"),
    ({"models_preload": "a,zz"}, "MODELS_PRELOAD names zz, which is no model here: the models "
                                 "are a, b, c"),
    ({"models_preload": "*", "models_max": 2}, "3 models are loaded at start but MODELS_MAX is 2"),
])
def test_unknown_names_and_too_many_preloads(three, kw, needle):
    with pytest.raises(CatalogError, match=needle):
        catalog(models_dir=str(three), **kw)


def test_models_max_zero_is_no_limit_and_keep_alive_is_every_models_default(three):
    cat = catalog(models_dir=str(three), models_preload="*", models_max=0, keep_alive="-1")
    assert cat.max_loaded == 0 and cat.keep_alive == math.inf
    assert {s.keep_alive for s in cat.models} == {math.inf}
    assert catalog(models_dir=str(three)).max_loaded == 4  # llama-server's default


def test_roles_come_from_each_models_settings(three):
    cat = catalog(models_dir=str(three))
    assert {s.role for s in cat.models} == {"auto"}
    assert catalog(models_dir=str(three), embeddings="only").models[0].role == "embeddings"
    assert catalog(models_dir=str(three), embedding_pooling="rank").models[0].role == "rerank"
