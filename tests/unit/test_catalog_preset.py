"""MODELS_PRESET (app/model/catalog/preset.py): llama-server's INI presets with this server's
setting names; each model's settings validated by Settings; every error names the file, the
section and the key."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.model.catalog import CatalogError, build
from app.settings import Settings


@pytest.fixture
def models(tmp_path) -> Path:
    for name in ("chat.gguf", "embed.gguf", "rr.gguf", "draft.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    return tmp_path


def preset(root: Path, text: str, **kw):
    path = root / "models.ini"
    path.write_text(text)
    return build(Settings(models_preset=path, **kw))


EXAMPLE = """\
version = 1
; every model first
[*]
CTX_SIZE = 8192
parallel = 4          ; slots

[chat]
model = {d}/chat.gguf
aliases = qwen, qwen3:8b
ctx-size = 16384
gpu_layers = 99
draft-model = {d}/draft.gguf
spec_ngram = true
pin = true
preload = on
keep_alive = -1

[embed]
model = {d}/embed.gguf
embeddings = only
no-embedding-normalize = true
keep-alive = 10m

# llama-server's own names for the same settings
[rr]
m = {d}/rr.gguf
pooling = rank
c = 512
np = 2
temp = 0.2
load-on-startup = false
"""


def test_a_preset_defines_models_and_their_settings(models):
    cat = preset(models, EXAMPLE.format(d=models), models_preload="*")
    assert cat.names == ("chat", "embed", "rr")
    chat, embed, rr = cat.models
    assert chat.origin == f"MODELS_PRESET {models / 'models.ini'}"
    assert (chat.settings.ctx_size, chat.settings.parallel, chat.settings.gpu_layers) == (
        16384, 4, 99)
    assert chat.settings.draft_model == f"{models}/draft.gguf" and chat.settings.spec_ngram
    assert chat.aliases == ("qwen", "qwen3:8b") and cat.get("qwen3:8b") is chat
    assert chat.settings.served_model_name == "chat,qwen,qwen3:8b"
    assert chat.pin and chat.preload and chat.keep_alive == math.inf
    assert (embed.settings.ctx_size, embed.settings.embeddings) == (8192, "only")
    assert embed.settings.embedding_normalize is False and embed.keep_alive == 600
    assert embed.role == "embeddings" and not embed.pin
    assert (rr.settings.ctx_size, rr.settings.parallel, rr.settings.default_temperature) == (
        512, 2, 0.2)
    assert rr.role == "rerank" and not rr.preload  # its section wins over MODELS_PRELOAD=*
    assert "ctx-size" in chat.preset_keys and "CTX_SIZE" in chat.preset_keys


def test_star_gives_every_model_its_defaults_env_vars_lie_below_flags_above(models, monkeypatch):
    text = f"[*]\nctx_size = 1024\nthreads = 3\n[chat]\nmodel = {models}/chat.gguf\n"
    monkeypatch.setenv("THREADS", "7")
    monkeypatch.setenv("PARALLEL", "5")
    path = models / "models.ini"
    path.write_text(text)
    s = Settings(models_preset=path, ctx_size=2048)  # as if --ctx-size 2048 was given
    cat = build(s, flags=["ctx_size"])
    chat = cat.get("chat").settings
    assert (chat.ctx_size, chat.threads, chat.parallel) == (2048, 3, 5)
    assert build(s).get("chat").settings.ctx_size == 1024  # given as an env var: the preset wins


def test_a_section_adds_settings_to_a_model_named_elsewhere(models):
    (models / "dir").mkdir()
    (models / "dir" / "a.gguf").write_bytes(b"GGUF")
    cat = preset(models, "[a]\nctx_size = 777\naliases = alpha\n[chat]\nctx_size = 555\n",
                 models_dir=str(models / "dir"), model=str(models / "chat.gguf"))
    assert cat.get("a").settings.ctx_size == 777 and cat.get("alpha").name == "a"
    assert cat.get("chat").settings.ctx_size == 555 and cat.get("chat").origin == "MODEL"


def where(models: Path, section: str, key: str, line: int) -> str:
    return (f"MODELS_PRESET {models / 'models.ini'}, section [{section}], key {key} "
            f"(line {line})")


@pytest.mark.parametrize("body, section, key, line, needle", [
    ("ctx_sise = 1", "chat", "ctx_sise", 3, "unknown: not a setting of this server"),
    ("jinja = true", "chat", "jinja", 3, "unknown"),
    ("ctx_size = -5", "chat", "ctx_size", 3, "'-5': Input should be greater than or equal to 0"),
    ("c = lots", "chat", "c", 3, "'lots': Input should be a valid integer"),
    ("PARALLEL = 1000", "chat", "PARALLEL", 3, "less than or equal to 256"),
    ("flash-attn = maybe", "chat", "flash-attn", 3, "Input should be 'auto', 'on' or 'off'"),
    ("spec_ngram = perhaps", "chat", "spec_ngram", 3, "'perhaps' is not true or false"),
    ("pin = 2", "chat", "pin", 3, "not true or false"),
    ("keep_alive = 1d", "chat", "keep_alive", 3, "neither a duration"),
    ("port = 9000", "chat", "port", 3, "cannot differ per model: it is the HTTP server's"),
    ("API_KEY = secret", "chat", "API_KEY", 3, "cannot differ per model"),
    ("models_max = 2", "chat", "models_max", 3, "the catalog's own"),
    ("model_cache_dir = /x", "chat", "model_cache_dir", 3, "the download cache's"),
    ("image_url_hosts = a.com", "chat", "image_url_hosts", 3, "where images may come from"),
    ("slots-per-request = 2", "chat", "slots-per-request", 3,
     "read before a request's model is known (a Vertex envelope's instances"),
    ("served_model_name = x", "chat", "served_model_name", 3, "its aliases key"),
    ("ctx_size = 1\nc = 2", "chat", "c", 4, "sets what key ctx_size (line 3) already set"),
    ("aliases = a,,b", "chat", "aliases", 3, "an empty name"),
    ("model = /elsewhere.gguf", "chat", "model", 3, "already has a source"),
])
def test_every_preset_error_names_file_section_and_key(models, body, section, key, line, needle):
    text = f"[chat]\nmodel = {models}/chat.gguf\n{body}\n"
    if "already has a source" in needle:
        text = f"[chat]\n{body}\n"
        line = 2
    with pytest.raises(CatalogError) as exc:
        preset(models, text, models=f"other={models}/embed.gguf",
               **({"model": str(models / "chat.gguf")} if "already" in needle else {}))
    message = str(exc.value)
    assert message.startswith(where(models, section, key, line)), message
    assert needle in message, message


def test_a_rule_over_several_settings_names_the_section(models):
    with pytest.raises(CatalogError, match=r"section \[chat\]: .*KV_CACHE_TYPE_V=q8_0 needs "
                                           "flash attention"):
        preset(models, f"[chat]\nmodel = {models}/chat.gguf\ncache-type-v = q8_0\n"
                       "flash_attn = off\n")
    with pytest.raises(CatalogError, match=r"section \[chat\]: model chat: DEFAULT_MAX_TOKENS "
                                           r"\(20\) is larger than MAX_TOKENS_LIMIT \(10\)"):
        preset(models, f"[chat]\nmodel = {models}/chat.gguf\nmax_tokens_limit = 10\n"
                       "default_max_tokens = 20\n")


@pytest.mark.parametrize("text, needle", [
    ("[chat]\nmodel = {d}/chat.gguf\nthis is not ini\n", "line 3: neither [section]"),
    ("ctx_size = 4\n[chat]\nmodel = {d}/chat.gguf\n", "line 1: key ctx_size before any"),
    ("[chat]\nmodel = {d}/chat.gguf\n[chat]\n", "line 3: section [chat] again (first on line 1)"),
    ("[ghost]\nctx_size = 4\n", "section [ghost]: names no model and gives no model key"),
    ("[*]\nmodel = {d}/chat.gguf\n", "section [*], key model (line 2): [*] cannot give a source"),
    ("[*]\naliases = x\n", "[*] cannot give aliases"),
    ("[bad name]\nmodel = {d}/chat.gguf\n", "'bad name' is not a valid model name"),
    ("[a]\nmodel = {d}/chat.gguf\naliases = b\n[b]\nmodel = {d}/embed.gguf\n",
     "'b' names two models"),
])
def test_preset_file_errors(models, text, needle):
    with pytest.raises(CatalogError) as exc:
        preset(models, text.format(d=models))
    assert f"MODELS_PRESET {models / 'models.ini'}" in str(exc.value)
    assert needle in str(exc.value), str(exc.value)


def test_a_missing_preset_file(tmp_path):
    with pytest.raises(CatalogError, match="MODELS_PRESET .*nope.ini: no such file"):
        build(Settings(models_preset=tmp_path / "nope.ini"))


def test_ini_details_as_llama_cpp_reads_them(models):
    text = (f"version = 1\n  # comment\n\n[ chat ]   ; trailing\nmodel = {models}/chat.gguf\n"
            "chat_template = t.jinja#x\nmodel_tags = a , b;c\nmodel_file=x.gguf  # y\n"
            "version = 2\n")
    spec = preset(models, text).get("chat")
    # a ; or # ends the value wherever it stands (llama.cpp's grammar: a value cannot hold one)
    assert spec.settings.chat_template == "t.jinja"
    assert spec.settings.model_tags == "a,b" and spec.settings.model_file == "x.gguf"


def test_a_section_for_an_alias_is_pointed_to_the_name(models):
    with pytest.raises(CatalogError, match=r"did you mean \[chat\]"):
        preset(models, "[CHAT]\nctx_size = 1\n", models=f"chat={models}/chat.gguf")
