"""agent/'s import graph: no module imports in a circle, and imports only run down the layers
(exceptions, protocols, examples, scripted < tools < core < observe < run < cli). Read from the
source (module-level and function-level imports; those under ``if TYPE_CHECKING:`` are for the
type checker only). memory/ and serving/ never import agent."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.import_cycles import cycles

ROOT = Path(__file__).resolve().parents[3]
AGENT = ROOT / "agent"
LAYERS = [
    {"agent.exceptions", "agent.protocols", "agent.examples", "agent.scripted", "agent"},
    {"agent.tools"},
    {"agent.core"},
    {"agent.observe"},
    {"agent.run"},
    {"agent.cli"},
]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The subpackage (``agent.run``) or top-level module a module belongs to."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _imports(package: Path, prefix: str = "agent") -> dict[str, set[str]]:
    modules = {_module(p) for p in AGENT.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == prefix:
                assert node.module is not None
                for alias in node.names:  # `from agent.run import plan`
                    sub = f"{node.module}.{alias.name}"
                    graph[_module(path)].add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[_module(path)] |= {
                    a.name for a in node.names if a.name.split(".")[0] == prefix
                }
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
        assert not any(_imports(ROOT / package).values()), package
