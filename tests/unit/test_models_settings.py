"""The several-models settings (app/settings/models.py): MODELS, MODELS_PRELOAD, MODELS_DEFAULT
and KEEP_ALIVE read as Ollama reads OLLAMA_KEEP_ALIVE; and the server refusing what of serving
several models is not built yet."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.process.cli import load_settings, main
from app.settings import Settings
from app.settings.models import (
    catalog_settings_set,
    go_duration_ns,
    keep_alive_seconds,
    keep_alive_text,
    model_entries,
    not_served_yet,
    preload_names,
)


def test_models_are_name_source_pairs_comma_or_newline_separated():
    assert model_entries("chat=/m/a.gguf, embed=gs://b/e/\n\n  org/rr:q8=file:///r.gguf\n") == [
        ("chat", "/m/a.gguf"), ("embed", "gs://b/e/"), ("org/rr:q8", "file:///r.gguf")]
    assert model_entries(None) == []


@pytest.mark.parametrize("value, needle", [
    ("chat", "name=source"), ("=/a.gguf", "name=source"), ("chat=", "name=source"),
    ("a=/x.gguf,,b=/y.gguf", "empty entry"), ("a b=/x.gguf", "not a valid model name"),
    ("-a=/x.gguf", "not a valid model name"), ("a?=/x.gguf", "not a valid model name"),
    ("a=/x.gguf,a=/y.gguf", "must differ"), ("Chat=/x.gguf\nchat=/y.gguf", "also in case"),
])
def test_a_bad_models_entry_is_refused_naming_it(value, needle):
    with pytest.raises(ValidationError, match=needle):
        Settings(models=value)


def test_preload_takes_names_star_or_none():
    assert preload_names(None) is None
    assert preload_names("*") == ["*"] and preload_names("none") == []
    assert preload_names("a, b,a") == ["a", "b"]
    for bad in ("a,*", "none,a", "a b"):
        with pytest.raises(ValidationError):
            Settings(models_preload=bad)
    with pytest.raises(ValidationError, match="MODELS_DEFAULT"):
        Settings(models_default="no spaces")


@pytest.mark.parametrize("value, seconds", [
    # ollama envconfig's TestKeepAlive, case by case
    ("1s", 1), ("1m", 60), ("1h", 3600), ("5m0s", 300), ("1h2m3s", 3723), ("0", 0),
    ("60", 60), ("120", 120), ("3600", 3600), ("-0", 0), ("-1", math.inf), ("-1m", math.inf),
    (" ", 300), (None, 300),
    # the spaces then the quotes trimmed (envconfig.Var), Go's fractions and units
    (' "10m" ', 600), ("'-5'", math.inf), ("1.5h", 5400), (".5s", 0.5), ("1.s", 1),
    ("+2m", 120), ("300ms", 0.3), ("1500us", 0.0015), ("2\u00b5s", 2e-6), ("7ns", 7e-9),
    ("1h30m", 5400), ("0s", 0), ("-0s", 0),
])
def test_keep_alive_parses_as_ollama_does(value, seconds):
    assert keep_alive_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [
    # Ollama quietly keeps 5m for these; here they are errors
    "???", "1d", "1y", "1w", "5M", "1.5", "5 m", ".s", "-", "1e3s", "99999999999999999999",
    "2562048h", "9223372037",
])
def test_an_unreadable_keep_alive_is_an_error(value):
    with pytest.raises(ValueError, match="KEEP_ALIVE"):
        keep_alive_seconds(value)
    with pytest.raises(ValidationError):
        Settings(keep_alive=value)


def test_go_duration_limits_match_go():
    assert go_duration_ns("2562047h47m16.854775807s") == (1 << 63) - 1  # Go's MaxInt64
    assert go_duration_ns("-2562047h47m16.854775808s") == -(1 << 63)
    with pytest.raises(ValueError):
        go_duration_ns("2562047h47m16.854775808s")
    assert go_duration_ns("0.1234567891s") == 123456789  # digits past ns are dropped


def test_keep_alive_for_people():
    assert keep_alive_text(300) == "5m0s" and keep_alive_text(5400) == "1h30m0s"
    assert keep_alive_text(2.5) == "2.5s" and keep_alive_text(math.inf) == "forever"
    assert keep_alive_text(0).startswith("0")


def test_which_settings_make_a_catalog():
    assert catalog_settings_set(Settings()) == [] and not_served_yet(Settings()) is None
    s = Settings(models="a=/x.gguf", keep_alive="10m", models_max=0)
    assert catalog_settings_set(s) == ["MODELS", "MODELS_MAX", "KEEP_ALIVE"]
    assert not_served_yet(s) is None  # served (app/model/catalog/pooled.py)
    bounded = Settings(model="/x.gguf", model_cache_max_gb=10)
    assert catalog_settings_set(bounded) == ["MODEL_CACHE_MAX_GB"]
    assert not_served_yet(bounded) is None  # served (app/model/gcs_cache.py)


def test_serve_refuses_several_models_in_one_process(monkeypatch):
    monkeypatch.setenv("MODELS", "a=/x.gguf")
    monkeypatch.setenv("ENGINE_PROCESS", "off")
    with pytest.raises(SystemExit) as exc:
        main(["serve"])
    message = str(exc.value)
    assert "ENGINE_PROCESS=off with MODELS" in message
    assert "engine process of their own" in message


def test_serve_stops_on_a_bad_catalog_before_it_binds(monkeypatch):
    monkeypatch.setenv("MODELS", "a=/nowhere/x.gguf")
    with pytest.raises(SystemExit) as exc:
        main(["serve"])
    assert str(exc.value) == "vertex-gguf: model a (MODELS): /nowhere/x.gguf: no such file or folder"


def test_the_catalog_settings_are_flags_too():
    _, s, _ = load_settings(["models", "--models", "a=/x.gguf", "--keep-alive", "-1",
                             "--models-max", "0"])
    assert (s.models, s.keep_alive, s.models_max) == ("a=/x.gguf", "-1", 0)


def test_a_gunicorn_of_ones_own_refuses_them_too(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "MODELS_DIR": str(tmp_path),
           "ENGINE_PROCESS": "off"}
    done = subprocess.run([sys.executable, "-c", "import app.process.wsgi"], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "vertex-gguf: ENGINE_PROCESS=off with MODELS_DIR" in (
        done.stderr), done.stderr
    env.pop("ENGINE_PROCESS")  # an empty folder: the catalog's own error
    done = subprocess.run([sys.executable, "-c", "import app.process.wsgi"], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "vertex-gguf: " in done.stderr and "no models" in (
        done.stderr), done.stderr
