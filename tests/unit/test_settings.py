"""Settings naming, precedence and bounds; the CLI; the settings table in docs/configuration.md."""

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.process.cli import build_parser, load_settings
from app.settings import Settings
from app.settings_doc import flag_name, settings_table


def _root() -> Path:
    """The repository root, wherever under tests/ this file sits."""
    here = Path(__file__).resolve().parent
    while not (here / "pyproject.toml").is_file():
        here = here.parent
    return here


CONFIGURATION = _root() / "docs" / "configuration.md"  # the settings table, between its markers


def clear_env(monkeypatch):
    for name in ("PORT", "AIP_HTTP_PORT", "AIP_HEALTH_ROUTE", "AIP_PREDICT_ROUTE", "MODEL",
                 "AIP_STORAGE_URI", "CTX_SIZE", "HEALTH_ROUTE", "PREDICT_ROUTE"):
        monkeypatch.delenv(name, raising=False)


def test_defaults(monkeypatch):
    clear_env(monkeypatch)
    s = Settings()
    assert (s.port, s.host, s.health_route, s.predict_route) == (8080, "0.0.0.0", "/health", "/predict")
    assert s.model is None and s.max_instances == 64 and s.max_body_bytes == 10 * 1024 * 1024


def test_port_precedence(monkeypatch):
    clear_env(monkeypatch)
    monkeypatch.setenv("PORT", "9000")
    assert Settings().port == 9000
    monkeypatch.setenv("AIP_HTTP_PORT", "7000")
    assert Settings().port == 7000
    _, s, _ = load_settings(["--port", "6000"])
    assert s.port == 6000


def test_vertex_routes_and_model_from_platform_names(monkeypatch):
    clear_env(monkeypatch)
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/v1/endpoints/1/deployedModels/2")
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/v1/endpoints/1/deployedModels/2:predict")
    monkeypatch.setenv("AIP_STORAGE_URI", "gs://bucket/model")
    s = Settings()
    assert s.health_route == "/v1/endpoints/1/deployedModels/2"
    assert s.predict_route.endswith(":predict")
    assert s.model == "gs://bucket/model"
    monkeypatch.setenv("MODEL", "/models/x.gguf")
    assert Settings().model == "/models/x.gguf"


def test_every_setting_is_a_flag_and_an_env_var(monkeypatch):
    clear_env(monkeypatch)
    monkeypatch.setenv("CTX_SIZE", "1024")
    assert Settings().ctx_size == 1024
    _, s, _ = load_settings(["--ctx-size", "2048"])  # flag wins over env
    assert s.ctx_size == 2048
    help_text = build_parser().format_help()
    for name in Settings.model_fields:
        assert flag_name(name) in help_text, name


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--ctx-size", "-5"], "--ctx-size"),
        (["--port", "70000"], "--port"),
        (["--flash-attn", "maybe"], "--flash-attn"),
        (["--predict-route", "predict"], "--predict-route"),
    ],
)
def test_out_of_bounds_is_a_clear_error(argv, needle):
    with pytest.raises(SystemExit) as exc:
        load_settings(argv)
    assert needle in str(exc.value)


def test_settings_are_frozen():
    s = Settings()
    with pytest.raises(ValidationError):
        s.port = 1  # type: ignore[misc]


def test_docs_settings_table_matches_the_code():
    text = CONFIGURATION.read_text()
    m = re.search(r"<!-- settings:start -->\n(.*?)\n<!-- settings:end -->", text, re.S)
    assert m, "docs/configuration.md lacks the settings table markers"
    assert m.group(1).strip() == settings_table().strip(), (
        "the settings table in docs/configuration.md is stale: regenerate it with "
        "`vertex-gguf settings-table` and paste it between the markers"
    )


@pytest.mark.parametrize("value", ["0,0", "a,b", "1,,2", "-1,2", ""])
def test_tensor_split_takes_proportions_with_one_above_zero(value):
    with pytest.raises(ValidationError):
        Settings(tensor_split=value)


def test_split_settings_reach_the_engine_config():
    from app import engine_config

    cfg = engine_config(Settings(split_mode="row", tensor_split="3, 1", main_gpu=1))
    assert (cfg.split_mode, cfg.tensor_split, cfg.main_gpu) == ("row", "3, 1", 1)


@pytest.mark.parametrize("value", ["blk.(=CPU", "=CPU", "ffn_up", "ffn_up=", "a=CPU,,b=CPU"])
def test_override_tensor_takes_valid_pattern_pairs(value):
    with pytest.raises(ValidationError):
        Settings(override_tensor=value)


def test_a_quantized_v_cache_needs_flash_attention():
    with pytest.raises(ValidationError, match="needs flash attention"):
        Settings(kv_cache_type_v="q8_0", flash_attn="off")
    Settings(kv_cache_type_v="q8_0", flash_attn="auto")
    Settings(kv_cache_type_k="q4_0", flash_attn="off")  # a quantized K cache alone loads


def test_placement_settings_reach_the_engine_config():
    from app import engine_config
    from app.engine.placement import EXPERTS, Rule, rules

    s = Settings(kv_cache_type_k="q8_0", kv_cache_type_v="q4_0", n_ubatch=128, cpu_moe=True,
                 n_cpu_moe=2, override_tensor=r"token_embd=CPU, blk\.0\.attn=CUDA0")
    cfg = engine_config(s)
    assert (cfg.kv_cache_type_k, cfg.kv_cache_type_v, cfg.n_ubatch) == ("q8_0", "q4_0", 128)
    # llama-server's order: -ot pairs first (the first match wins), then --cpu-moe, --n-cpu-moe
    assert rules(cfg.override_tensor, cfg.cpu_moe, cfg.n_cpu_moe) == [
        Rule("token_embd", "CPU"), Rule(r"blk\.0\.attn", "CUDA0"), Rule(EXPERTS, "CPU"),
        Rule(r"blk\.0" + EXPERTS, "CPU"), Rule(r"blk\.1" + EXPERTS, "CPU")]


def test_lora_adapters_parse_names_sources_and_scales():
    from app.settings import lora_entries

    assert lora_entries(None) == [] and lora_entries("") == []
    assert lora_entries("a=/x/y.gguf, b=gs://bk/z.gguf:0.5,c=file:///q.gguf:2") == [
        ("a", "/x/y.gguf", 1.0), ("b", "gs://bk/z.gguf", 0.5), ("c", "file:///q.gguf", 2.0)]
    for bad in ("a", "a=", "a=x,a=y", "a b=x", "a=x:99", "a=x,,b=y"):
        with pytest.raises(ValidationError):
            Settings(lora_adapters=bad)
