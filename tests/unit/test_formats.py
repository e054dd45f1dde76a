"""The format registry and the settings its consumers take by name: what must agree, agrees.

The formats' behaviour (replies cut at every character, grammars, histories) is tested in
test_replies.py, test_native_tools.py and test_sampling.py."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from app import engine_config, formats, plan_options
from app.engine.config import EngineConfig
from app.model.gcs_download import DownloadOptions
from app.settings import Settings, from_settings


def test_every_format_is_registered_under_its_name_and_generic_is_the_fallback():
    # the families are added by several hands: the registry's own order is checked where it
    # matters (each family's detection tests); here the first formats keep theirs, generic last
    names = list(formats.FORMATS)
    first = ["qwen3_coder", "hermes", "mistral", "llama3"]
    assert [n for n in names if n in first] == first and names[-1] == "generic"
    assert all(name == f.name for name, f in formats.FORMATS.items())
    assert formats.detect(None).name == formats.detect("no tools here").name == "generic"
    with pytest.raises(ValueError, match="unknown tool format"):
        formats.get("no-such-format")


def test_triggers_are_markers_and_every_marker_is_preserved():
    preserved = set(formats.preserved_tokens())
    for f in formats.FORMATS.values():
        assert set(f.triggers) <= set(f.markers), f.name
        assert set(f.markers) <= preserved, f.name
    assert {formats.THINK.open, formats.THINK.close} <= preserved
    assert len(preserved) == len(formats.preserved_tokens())  # each once


def test_tool_format_setting_lists_the_registry():
    values = typing.get_args(Settings.model_fields["tool_format"].annotation)
    assert values == ("auto", *formats.FORMATS)
    for name in formats.FORMATS:
        assert name in (Settings.model_fields["tool_format"].description or "")


def test_configs_default_to_the_settings_defaults():
    defaults = Settings.model_construct()
    built = engine_config(defaults)
    for f in dataclasses.fields(EngineConfig):
        if f.name in Settings.model_fields and f.name != "chat_template":
            assert getattr(built, f.name) == getattr(defaults, f.name)
    assert built.preserved_tokens == formats.preserved_tokens()
    opts = DownloadOptions(cache_dir=defaults.model_cache_dir)
    assert opts == DownloadOptions.from_settings(defaults)
    assert plan_options(defaults).tool_format == "auto"


def test_settings_are_taken_by_name():
    s = Settings(parallel=3, flash_attn="on", tool_format="mistral", request_timeout=5)
    cfg = engine_config(s)
    assert (cfg.parallel, cfg.flash_attn) == (3, "on")
    opts = plan_options(s)
    assert (opts.tool_format, opts.timeout, opts.slots_per_request) == ("mistral", 5, 1)


def test_a_field_that_is_no_setting_must_be_derived():
    @dataclasses.dataclass
    class Config:
        parallel: int
        shiny: bool = False

    assert from_settings(Config, Settings(parallel=2), shiny=True) == Config(2, True)
    with pytest.raises(TypeError, match="shiny"):
        from_settings(Config, Settings())
