"""loopstack/agent/'s import graph: no module imports in a circle, and imports only run down the
layers (exceptions, protocols, examples, scripted < tools < core < observe < run < cli). Read from
the source (module-level and function-level imports; those under ``if TYPE_CHECKING:`` are for the
type checker only). loopstack/memory/ and loopstack/serving/ never import agent."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.import_cycles import cycles

ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "loopstack" / "agent"
LAYERS = [
    {
        "loopstack.agent.exceptions",
        "loopstack.agent.protocols",
        "loopstack.agent.examples",
        "loopstack.agent.scripted",
        "loopstack.agent",
    },
    {"loopstack.agent.tools"},
    {"loopstack.agent.core"},
    {"loopstack.agent.observe"},
    {"loopstack.agent.run"},
    {"loopstack.agent.cli"},
]


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path(path.name)
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The subpackage (``loopstack.agent.run``) or top-level module a module belongs to."""
    parts = module.split(".")
    return ".".join(parts[:3])


def _top(module: str) -> str:
    """``loopstack.agent`` for ``loopstack.agent.run.loop``: the stack package it is in."""
    return ".".join(module.split(".")[:2])


def _imports(package: Path, prefix: str = "loopstack.agent") -> dict[str, set[str]]:
    modules = {_module(p) for p in AGENT.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _top(node.module or "") == prefix:
                assert node.module is not None
                for alias in node.names:  # `from loopstack.agent.run import plan`
                    sub = f"{node.module}.{alias.name}"
                    graph[_module(path)].add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[_module(path)] |= {a.name for a in node.names if _top(a.name) == prefix}
    return graph


def test_agent_is_in_subpackages() -> None:
    flat = {p.stem for p in AGENT.glob("*.py")}
    assert flat == {"__init__", "cli", "examples", "exceptions", "protocols", "scripted"}
    assert {p.name for p in AGENT.iterdir() if (p / "__init__.py").exists()} == {
        "core",
        "observe",
        "run",
        "tools",
    }


def test_no_module_imports_in_a_circle() -> None:
    assert cycles(_imports(AGENT)) == []


def test_imports_only_run_down_the_layers() -> None:
    rank = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
    up = []
    for module, targets in _imports(AGENT).items():
        for target in targets:
            a, b = _unit(module), _unit(target)
            assert a in rank and b in rank, (module, target)  # a new unit needs a layer
            if a != b and rank[b] >= rank[a] and not (rank[a] == 0 and rank[b] == 0):
                up.append((module, target))
    assert up == []


def test_memory_and_serving_never_import_agent() -> None:
    for package in ("memory", "serving"):
        assert not any(_imports(ROOT / "loopstack" / package).values()), package


def test_the_walk_sees_an_agent_import(tmp_path: Path) -> None:
    """The check above cannot pass for want of looking: it sees each way of importing agent."""
    (tmp_path / "m.py").write_text(
        "from loopstack.agent.run.loop import Agent\nimport loopstack.agent.tools\n"
        "import agentic\nfrom loopstack.agentic import x\n"
    )
    assert set(_imports(tmp_path)) and set().union(*_imports(tmp_path).values()) == {
        "loopstack.agent.run.loop",
        "loopstack.agent.tools",
    }


def _public(package: Path) -> set[str]:
    """A package's ``__all__``, read from its ``__init__.py`` without importing it."""
    tree = ast.parse((package / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{package} has no __all__")


def _memory_imports(package: Path) -> list[tuple[str, str]]:
    """(file, what) for every import of memory in ``package``: ``loopstack.memory.x`` for a
    submodule, ``memory:Name`` for a name taken from the package."""
    found = []
    for path in package.rglob("*.py"):
        name = str(path.relative_to(package.parent))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == "loopstack.memory":
                    found += [(name, f"memory:{a.name}") for a in node.names]
                elif node.module.startswith("loopstack.memory."):
                    found.append((name, node.module))
            elif isinstance(node, ast.Import):
                found += [(name, a.name) for a in node.names if _top(a.name) == "loopstack.memory"]
    return found


def test_agent_imports_only_memorys_public_api() -> None:
    """loopstack/agent/ takes from memory only the names in ``loopstack.memory.__all__``: no
    ``loopstack.memory.<submodule>`` import (the shared text utilities are in the leaf
    ``loopstack.text``)."""
    public = _public(ROOT / "loopstack" / "memory")
    found = _memory_imports(AGENT)
    assert found, "agent uses memory: the walk must see its imports"
    outside = [
        (module, what)
        for module, what in found
        if not (what.startswith("memory:") and what.split(":")[1] in public)
    ]
    assert outside == []


def test_the_walk_sees_a_submodule_import(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from loopstack.memory.language import estimate_tokens\nimport loopstack.memory.store\n"
        "from loopstack.memory import x\n"
    )
    whats = sorted(what for _, what in _memory_imports(tmp_path))
    assert whats == ["loopstack.memory.language", "loopstack.memory.store", "memory:x"]


def test_the_text_leaf_imports_no_package_of_the_stack() -> None:
    """``loopstack.text`` is shared by memory and agent: importing it (and the ``loopstack``
    package above it) loads nothing of agent, memory, serving or bench, so neither side
    reaches into the other through it and no import circle can form."""
    import subprocess
    import sys

    code = (
        "import sys, loopstack.text; "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in {'agent', 'memory', 'serving', 'bench'} "
        "or m.split('.')[:2] in (['loopstack', p] for p in ('agent', 'memory', 'serving', "
        "'bench'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
