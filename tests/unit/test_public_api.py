"""The public API: what the README shows is importable from `loopstack` alone, each name is
the object it stands for, ``import loopstack`` loads none of the stack until a name is used,
and no Python example in the README or docs imports an internal module path."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import loopstack

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = re.compile(r"^\s*(?:from|import) (?:loopstack\.)?(?:agent|memory|serving|bench)\b", re.M)
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def test_every_public_name_resolves_to_its_object() -> None:
    from loopstack.agent.run.loop import Agent
    from loopstack.agent.tools.registry import tool
    from loopstack.memory import MemoryStore

    assert set(loopstack.__all__) <= set(dir(loopstack))
    for name in loopstack.__all__:
        assert getattr(loopstack, name) is not None, name
    assert loopstack.Agent is Agent and loopstack.tool is tool
    assert loopstack.MemoryStore is MemoryStore


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        loopstack.nothing_here  # noqa: B018
    except AttributeError as exc:
        assert "nothing_here" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_import_loopstack_loads_nothing_of_the_stack() -> None:
    stack = "('loopstack.agent', 'loopstack.memory', 'loopstack.serving', 'loopstack.bench')"
    code = f"import sys, loopstack; print(sorted(m for m in {stack} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_internal_pattern_sees_internal_imports() -> None:
    assert INTERNAL.search("from loopstack.memory.store import MemoryStore")
    assert INTERNAL.search("import loopstack.agent")
    assert not INTERNAL.search("from loopstack import Agent, MemoryStore")


def test_the_docs_python_examples_use_public_imports_only() -> None:
    found = []
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for block in PYTHON_BLOCK.findall(doc.read_text(encoding="utf-8")):
            found += [f"{doc.name}: {m.group(0).strip()}" for m in INTERNAL.finditer(block)]
    assert found == []
