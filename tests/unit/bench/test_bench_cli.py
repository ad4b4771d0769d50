"""`loopstack bench`: every benchmark is a sub-command, and the load test stays a black box."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loopstack.bench import cli

ROOT = Path(__file__).resolve().parents[3]
EVERY = [(s, n, m) for s, (_, scripts) in cli.SCRIPTS.items() for n, (m, _) in scripts.items()]


def test_every_benchmark_module_is_a_sub_command() -> None:
    """No benchmark module is left out of `loopstack bench` (its `main` is what runs)."""
    on_disk = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "loopstack" / "bench").rglob("*.py")
        if "def main(" in p.read_text(encoding="utf-8")
    }
    assert on_disk == {m for _, _, m in EVERY}
    for _, _, module in EVERY:
        assert callable(importlib.import_module(module).main)


@pytest.mark.parametrize(("subject", "name", "module"), EVERY)
def test_help_reaches_the_benchmark_parser(subject: str, name: str, module: str) -> None:
    res = CliRunner().invoke(cli.app, [subject, name, "--help"])
    assert res.exit_code == 0, res.output
    assert f"Usage: loopstack bench {subject} {name} " in res.output, res.output


def test_arguments_reach_the_benchmark_and_its_status_comes_back() -> None:
    res = CliRunner().invoke(cli.app, ["serving", "validity", "--no-such-option"])
    assert res.exit_code == 2 and "No such option: --no-such-option" in res.output
    res = CliRunner().invoke(cli.app, ["golden", "bootstrap", "/nonexistent", "--out", "x.json"])
    assert res.exit_code != 0


def test_the_load_test_imports_neither_serving_nor_agent() -> None:
    """The whiteboard rule: `bench agents|requests|plan` talk HTTP to any URL."""
    code = (
        "import sys, loopstack.bench.cli, loopstack.bench.load.runner, "
        "loopstack.bench.load.requests, loopstack.bench.load.report;"
        "print(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules}"
        " & {'loopstack.serving', 'loopstack.agent', 'loopstack.memory'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_one_argument_parser_system_and_no_argv_swapping() -> None:
    """loopstack/bench/ parses every command line with typer: no module imports argparse (or
    optparse), none assigns ``sys.argv`` (the old way `loopstack bench` ran a module's parser)."""
    import ast

    found = []
    for path in sorted((ROOT / "loopstack" / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(n.split(".")[0] in {"argparse", "optparse"} for n in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {names}")
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for t in node.targets for t in ast.walk(t)]
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = list(ast.walk(node.target))
            if any(ast.unparse(t).startswith("sys.argv") for t in targets):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} assigns sys.argv")
    assert found == []


def test_an_option_of_several_values_takes_them_one_after_the_other(tmp_path: Path) -> None:
    """As argparse's ``nargs="+"``: ``--spread A B`` (docs/benchmarks.md) reaches the command
    as two values, and a following option still parses."""
    from loopstack.bench.commandline import _spread

    assert _spread(["--spread", "a", "b", "--x", "1"], {"--spread"}) == [
        "--spread", "a", "--spread", "b", "--x", "1",
    ]  # fmt: skip
    assert _spread(["--sizes", "10", "-5", "--sizes", "7"], {"--sizes"}) == [
        "--sizes", "10", "--sizes", "-5", "--sizes", "7",
    ]  # fmt: skip
    res = CliRunner().invoke(
        cli.app, ["golden", "run", "--spread", str(tmp_path / "a"), str(tmp_path / "b")]
    )
    assert "No such" not in res.output and "Got unexpected extra argument" not in res.output
