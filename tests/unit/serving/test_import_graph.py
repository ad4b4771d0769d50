"""loopstack/serving/'s import graph: no module imports in a circle, and no subpackage (or shared
module) imports a sibling that imports it back - imports only run down the layers
(leaves < engine < constraint < prompt, embeddings, selection < http < server). Read from
the source (module-level imports; those under ``if TYPE_CHECKING:`` are for the type
checker only)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.import_cycles import cycles

SERVING = Path(__file__).resolve().parents[3] / "loopstack" / "serving"
LEAVES = {
    "loopstack.serving.config",
    "loopstack.serving.exceptions",
    "loopstack.serving.metrics",
    "loopstack.serving.protocol",
}


def _module(path: Path) -> str:
    parts = path.relative_to(SERVING.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The subpackage (``loopstack.serving.http``) or top-level module a module belongs to."""
    parts = module.split(".")
    if len(parts) > 3 or (len(parts) == 3 and (SERVING / parts[2]).is_dir()):
        return ".".join(parts[:3])
    return module


def _imports() -> dict[str, set[str]]:
    modules = {_module(p) for p in SERVING.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for path in SERVING.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "loopstack.serving"
            ):
                assert node.module is not None
                for alias in node.names:  # `from loopstack.serving.constraint import envelope`
                    sub = f"{node.module}.{alias.name}"
                    graph[_module(path)].add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[_module(path)] |= {
                    a.name for a in node.names if a.name.startswith("loopstack.serving")
                }
    return graph


def test_no_module_imports_in_a_circle() -> None:
    assert cycles(_imports()) == []


def test_imports_only_run_down_the_layers() -> None:
    units: dict[str, set[str]] = defaultdict(set)
    for module, targets in _imports().items():
        for target in targets:
            if _unit(target) != _unit(module):
                units[_unit(module)].add(_unit(target))
    back = sorted((a, b) for a in units for b in units[a] if a in units.get(b, set()))
    assert back == []
    for leaf in LEAVES:
        assert not units.get(leaf), (leaf, units.get(leaf))
    assert units["loopstack.serving.engine"] <= LEAVES  # the engine knows nothing above it
    assert "loopstack.serving.http" not in set().union(
        *(units[u] for u in units if u != "loopstack.serving.server")
    )
    assert {
        "loopstack.serving.http",
        "loopstack.serving.engine",
        "loopstack.serving.constraint",
        "loopstack.serving.selection",
    } <= set(units)
