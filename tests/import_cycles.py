"""The import circles of a module graph (module -> modules it imports), for the packages'
import-graph tests (tests/unit/serving, tests/unit/agent)."""

from __future__ import annotations

from collections.abc import Mapping


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Every circle a depth-first walk finds, each as the path that closes it."""
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for nxt in sorted(graph.get(module, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found
