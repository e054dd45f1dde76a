"""What /props, /slots and /health say of each model of a pool (app/api/introspect.py,
app/edge/pool_routes.py): the settings of the model ``?model=`` names, from its own preset (the
default model's without it), never the server's; and safe mode after a worker died while
loading (app.process.crash_guard) applied to every model's own settings, which its engine
process starts from, and said per model. A single-model server's /props:
tests/app/test_introspection.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app import create_app
from app.base.boot import Boot
from app.model.catalog import Catalog, ModelSpec
from app.process.crash_guard import apply_safe_mode, apply_safe_mode_to_models
from app.settings import Settings
from tests.support.pooled_app import Engine, chat, wait_for

# each model's own preset values, none of them the server's (the base: every default)
OWN = {
    "alpha": {"ctx_size": 1024, "parallel": 2, "gpu_layers": 0, "tool_format": "hermes",
              "reasoning_format": "inline", "default_temperature": 0.3,
              "default_max_tokens": 100},
    "beta": {"ctx_size": 2048, "parallel": 3, "gpu_layers": 7, "tool_format": "mistral",
             "reasoning_format": "parsed", "default_temperature": 0.9,
             "default_max_tokens": 200, "flash_attn": "on"},
}
SAFE_REASON = "the worker died while loading (SIGSEGV)"


def specs() -> tuple[ModelSpec, ...]:
    return tuple(ModelSpec(name=n, source=f"/models/{n}.gguf", origin="MODELS_PRESET",
                           settings=Settings(served_model_name=n, **own), size=1000,
                           preload=n == "alpha") for n, own in OWN.items())


def serve(boot: Boot | None = None) -> tuple[Any, Any, list[Settings]]:
    """A pool of alpha (the default, preloaded) and beta, as the worker builds it: the
    catalog and the base settings put in safe mode when ``boot`` says so."""
    boot = boot or Boot()
    base = Settings()
    catalog = apply_safe_mode_to_models(
        Catalog(base=base, models=specs(), default="alpha", max_loaded=0, keep_alive=300.0),
        boot)
    made: list[Settings] = []

    def engine(settings: Settings, on_fatal: Any) -> Engine:
        made.append(settings)
        return Engine(settings, on_fatal)

    app = create_app(apply_safe_mode(base, boot), catalog=catalog, make_engine=engine,
                     boot=boot)
    app.testing = True
    client = app.test_client()
    wait_for(lambda: client.get("/health").status_code == 200)
    return client, app.extensions["vertex_gguf_pool"], made


@pytest.fixture
def served() -> Iterator[tuple[Any, Any, list[Settings]]]:
    client, pool, made = serve()
    yield client, pool, made
    pool.shutdown()


@pytest.mark.parametrize(("query", "name"), [("", "alpha"), ("?model=alpha", "alpha"),
                                             ("?model=beta", "beta")])
def test_props_shows_the_named_models_own_settings(served, query, name):
    client, _, _ = served
    chat(client, "beta")  # loaded: /props never loads a model
    props = client.get(f"/props{query}").get_json()
    own = OWN[name]
    for key, value in own.items():
        assert props["settings"][key] == value, key
    assert props["model_alias"] == name
    assert props["default_generation_settings"]["params"]["temperature"] == own[
        "default_temperature"]
    assert props["meta"]["max_tokens_default"] == own["default_max_tokens"]
    assert props["formats"]["tool_format"] == own["tool_format"]
    assert "safe_mode" not in props


def test_slots_is_the_named_models(served):
    client, _, _ = served
    chat(client, "beta")
    assert client.get("/slots?model=beta").status_code == 200
    assert client.get("/slots?model=nope").status_code == 404


def test_safe_mode_changes_each_models_own_settings_where_it_left_them_at_auto():
    boot = Boot(safe_mode={"flash_attn": "off", "cpu_extra_buffers": "off"},
                safe_reason=SAFE_REASON)
    client, pool, made = serve(boot)
    try:
        chat(client, "beta")
        engines = {s.served_model_name: s for s in made}
        # alpha left both at auto: both off; beta's preset set flash attention on: kept
        assert (engines["alpha"].flash_attn, engines["alpha"].cpu_extra_buffers) == (
            "off", "off")
        assert (engines["beta"].flash_attn, engines["beta"].cpu_extra_buffers) == (
            "on", "off")
        alpha = client.get("/props").get_json()
        assert alpha["settings"]["flash_attn"] == "off"
        assert alpha["safe_mode"] == {"reason": SAFE_REASON, "changed": {
            "cpu_extra_buffers": "off", "flash_attn": "off"}}
        beta = client.get("/props?model=beta").get_json()
        assert beta["settings"]["flash_attn"] == "on"
        assert beta["safe_mode"] == {"reason": SAFE_REASON,
                                     "changed": {"cpu_extra_buffers": "off"}}
        health = client.get("/health").get_json()
        assert health["safe_mode"]["reason"] == SAFE_REASON  # the worker's, as before
        assert health["models"]["beta"]["safe_mode"] == beta["safe_mode"]
        assert health["models"]["alpha"]["safe_mode"] == alpha["safe_mode"]
    finally:
        pool.shutdown()


def test_outside_safe_mode_the_catalog_is_untouched():
    catalog = Catalog(base=Settings(), models=specs(), default="alpha", max_loaded=0,
                      keep_alive=300.0)
    assert apply_safe_mode_to_models(catalog, Boot()) is catalog
    safe = apply_safe_mode_to_models(catalog, Boot(safe_mode={"flash_attn": "off"},
                                                   safe_reason=SAFE_REASON))
    assert safe.get("beta").settings.flash_attn == "on"  # looked up anew: the safe spec
    assert safe.get("alpha").settings.flash_attn == "off"
    assert catalog.get("alpha").settings.flash_attn == "auto"  # the original is unchanged
    assert safe.get("alpha") is not catalog.get("alpha")


def test_a_quantized_v_cache_keeps_flash_attention_in_safe_mode():
    """safe_changes' own rule, per model: a quantized V cache cannot load without it."""
    spec = ModelSpec(name="q", source="/models/q.gguf", origin="MODELS",
                     settings=Settings(kv_cache_type_v="q8_0"))
    catalog = Catalog(base=Settings(), models=(spec,), default="q", max_loaded=0,
                      keep_alive=300.0)
    safe = apply_safe_mode_to_models(catalog, Boot(safe_mode={"flash_attn": "off"},
                                                   safe_reason=SAFE_REASON))
    assert safe.get("q").settings.flash_attn == "auto"
    assert safe.get("q").safe_mode == {"cpu_extra_buffers": "off"}
