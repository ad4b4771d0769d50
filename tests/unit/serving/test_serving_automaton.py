"""loopstack.serving.constraint.regexes.AutomatonProbe (sandboxed worker processes) and its use by
RegexSchemas (the outlines backend's regex pipeline)."""

from __future__ import annotations

import pytest

from loopstack.serving.constraint.regexes import AutomatonProbe, RegexSchemas, count_states
from loopstack.serving.constraint.schema_regex import compile_schema
from loopstack.serving.exceptions import InvalidRequest

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}


async def test_probe_counts_states_in_a_child_process() -> None:
    regex = compile_schema(WEATHER).regex
    assert await AutomatonProbe().check(regex) == count_states(regex) > 5


async def test_probe_reads_unicode_whatever_the_locale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_ALL", "C")
    monkeypatch.setenv("PYTHONIOENCODING", "ascii")
    assert await AutomatonProbe().check('"(städte|日本語)"') > 5


async def test_probe_refuses_past_the_limit() -> None:
    with pytest.raises(InvalidRequest) as err:
        await AutomatonProbe(max_states=5).check("[a-z]{10}", what="tools[1].function.parameters")
    assert err.value.code == "schema_too_complex"
    assert err.value.param == "tools[1].function.parameters"
    assert "limit 5" in err.value.message


async def test_probe_refuses_what_it_cannot_build() -> None:
    with pytest.raises(InvalidRequest, match="could not be built"):
        await AutomatonProbe().check("a\\000b")  # octal: vLLM's engine cannot build it either
    with pytest.raises(InvalidRequest, match="could not be built"):
        await AutomatonProbe(timeout_s=0.01).check("[a-z]+")


class CountingProbe(AutomatonProbe):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.calls = 0

    async def check(
        self, regex: str, *, what: str = "schema", max_states: int | None = None
    ) -> int:
        self.calls += 1
        return await super().check(regex, what=what, max_states=max_states)


async def test_cache_probes_each_schema_once_and_remembers_refusals() -> None:
    probe = CountingProbe(max_states=10)
    cache = RegexSchemas(probe=probe)
    small = {"type": "boolean"}
    assert (await cache.get(small)).regex == (await cache.get(small)).regex
    for what in ("tools[0].function.parameters", "tools[2].function.parameters"):
        with pytest.raises(InvalidRequest) as err:
            await cache.get(WEATHER, what=what)
        assert err.value.param == what and what in err.value.message
        assert err.value.code == "schema_too_complex"
    assert probe.calls == 3  # the small schema once, the other at both counting limits


async def test_cache_keeps_counted_repetition_when_the_automaton_affords_it() -> None:
    hex_id = {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "farm-[0-9a-f]{32}"}},
        "required": ["id"],
    }
    compiled = await RegexSchemas(probe=AutomatonProbe()).get(hex_id)
    assert "{32}" in compiled.regex and compiled.exact
    assert "{32}" not in compile_schema(hex_id).regex  # the fallback: checked afterwards


async def test_cache_falls_back_to_less_counting_when_the_automaton_is_too_big() -> None:
    name = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 60}},
        "required": ["name"],
    }
    probe = CountingProbe(max_states=40)
    compiled = await RegexSchemas(probe=probe).get(name)
    assert probe.calls == 2
    assert "60" not in compiled.regex and not compiled.exact
    assert compiled.errors({"name": "x" * 61}) and not compiled.errors({"name": "x"})
