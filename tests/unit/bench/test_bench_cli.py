"""`loopstack bench`: every benchmark is a sub-command, and the load test stays a black box."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench import cli

ROOT = Path(__file__).resolve().parents[3]
EVERY = [(s, n, m) for s, (_, scripts) in cli.SCRIPTS.items() for n, (m, _) in scripts.items()]


def test_every_benchmark_module_is_a_sub_command() -> None:
    """No benchmark module is left out of `loopstack bench` (its `main` is what runs)."""
    on_disk = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "bench").rglob("*.py")
        if "def main(" in p.read_text(encoding="utf-8")
    }
    assert on_disk == {m for _, _, m in EVERY}
    for _, _, module in EVERY:
        assert callable(importlib.import_module(module).main)


@pytest.mark.parametrize(("subject", "name", "module"), EVERY)
def test_help_reaches_the_benchmark_parser(subject: str, name: str, module: str) -> None:
    res = CliRunner().invoke(cli.app, [subject, name, "--help"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"usage: loopstack bench {subject} {name} [-h]")


def test_arguments_reach_the_benchmark_and_its_status_comes_back() -> None:
    res = CliRunner().invoke(cli.app, ["serving", "validity", "--no-such-option"])
    assert res.exit_code == 2 and "unrecognized arguments: --no-such-option" in res.output
    res = CliRunner().invoke(cli.app, ["golden", "bootstrap", "/nonexistent", "--out", "x.json"])
    assert res.exit_code != 0


def test_the_load_test_imports_neither_serving_nor_agent() -> None:
    """The whiteboard rule: `bench agents|requests|plan` talk HTTP to any URL."""
    code = (
        "import sys, bench.cli, bench.load.runner, bench.load.requests, bench.load.report;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'serving', 'agent', 'memory'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
