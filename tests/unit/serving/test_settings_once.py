"""Serving's settings are declared once (`ServerSettings`) and unpacked by name: the
dataclasses they fill take their defaults from there and are built field by field from the
settings of the same names - a setting added to one and not the other fails here."""

from __future__ import annotations

import dataclasses

from loopstack.serving.config import ServerSettings, unpack
from loopstack.serving.constraint.schema_limits import SETTINGS, SchemaLimits
from loopstack.serving.http.limits import Limits


def test_limits_are_the_settings_of_the_same_names() -> None:
    settings = ServerSettings(max_tools=3, max_stop=2, max_request_bytes=4096)
    limits = unpack(Limits, settings)
    assert (limits.max_tools, limits.max_stop, limits.max_request_bytes) == (3, 2, 4096)
    defaults = ServerSettings()
    for field in dataclasses.fields(Limits):  # one default, in ServerSettings
        assert getattr(Limits(), field.name) == getattr(defaults, field.name), field.name


def test_schema_limits_are_the_max_schema_settings() -> None:
    assert set(SETTINGS) == {f.name for f in dataclasses.fields(SchemaLimits)}
    limits = unpack(SchemaLimits, ServerSettings(max_schema_depth=7), **SETTINGS)
    assert limits.max_depth == 7
    defaults = ServerSettings()
    for field, setting in SETTINGS.items():
        assert getattr(SchemaLimits(), field) == getattr(defaults, setting)
