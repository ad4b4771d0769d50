"""`AgentSettings` derives its limits from `Limits`: each limit's default (and bounds) declared
once, in `Limits`; the environment sets them; a changed `Limits` default is what the settings
report."""

from __future__ import annotations

import re
import sys
import types
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
from pydantic import ValidationError

import loopstack.agent.core.settings as settings_module
from loopstack.agent.core.settings import AgentSettings, Limits

SOURCE = Path(settings_module.__file__).read_text()


def test_every_limit_is_a_setting_with_its_default() -> None:
    settings = AgentSettings()
    for f in fields(Limits):
        assert f.default is not MISSING
        assert f.name in AgentSettings.model_fields, f.name
        assert getattr(settings, f.name) == f.default, f.name
    assert settings.limits() == Limits()


def test_a_changed_limits_default_is_what_the_settings_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the source with Limits.max_steps' default changed, and nothing else
    changed, n = re.subn(r"(max_steps: int = [^\n]*?)\b8\b", r"\g<1>11", SOURCE, count=1)
    assert n == 1
    module = types.ModuleType("settings_changed")
    monkeypatch.setitem(sys.modules, "settings_changed", module)  # for the dataclasses
    exec(compile(changed, "settings_changed.py", "exec"), module.__dict__)
    assert module.Limits().max_steps == 11
    assert module.AgentSettings().max_steps == 11
    assert module.AgentSettings().limits().max_steps == 11


def test_each_limit_default_is_written_once() -> None:
    for f in fields(Limits):
        declared = re.findall(rf"^\s+{f.name}: [^=\n]+=", SOURCE, flags=re.M)
        assert len(declared) == 1, (f.name, declared)


def test_the_environment_and_bounds_apply_to_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSTACK_AGENT_MAX_STEPS", "5")
    monkeypatch.setenv("LOOPSTACK_AGENT_WALL_CLOCK_S", "12.5")
    limits = AgentSettings().limits(max_tool_calls=3)
    assert (limits.max_steps, limits.wall_clock_s, limits.max_tool_calls) == (5, 12.5, 3)
    monkeypatch.setenv("LOOPSTACK_AGENT_MAX_STEPS", "0")  # ge=1, declared on Limits.max_steps
    with pytest.raises(ValidationError):
        AgentSettings()
    assert "token budget" in (AgentSettings.model_fields["max_tokens"].description or "")
