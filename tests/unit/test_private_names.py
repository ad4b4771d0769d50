"""No module imports another module's private names (``from x import _name``): what is shared
is public where it lives. And each wire API of loopstack/serving/http is a front-end of the one
pipeline: its subpackage imports the pipeline, never another front-end."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("loopstack",)
FRONT_ENDS = ("chat", "responses", "messages")


def _from_imports(path: Path) -> list[ast.ImportFrom]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]


def test_no_private_name_is_imported_across_modules() -> None:
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in _from_imports(path):
                assert node.module is not None
                if node.module.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(ROOT)}: {node.module}.{alias.name}")
    assert found == []


def test_each_wire_api_is_a_front_end_of_the_one_pipeline() -> None:
    http = ROOT / "loopstack" / "serving" / "http"
    for api in FRONT_ENDS:
        imported = {
            node.module
            for path in (http / api).glob("*.py")
            for node in _from_imports(path)
            if node.module is not None
        }
        router = {n.module for n in _from_imports(http / api / "router.py")}
        assert "loopstack.serving.http.pipeline" in router, api
        others = [m for m in imported for o in FRONT_ENDS if o != api
                  and m.startswith(f"loopstack.serving.http.{o}")]  # fmt: skip
        assert others == [], (api, others)
