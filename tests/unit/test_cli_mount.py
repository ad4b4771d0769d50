"""`loopstack` sub-commands: a missing part of the stack is skipped, a broken one is not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from loopstack import cli


def _package(tmp_path: Path, name: str, body: str) -> None:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(body)


@pytest.fixture
def fresh_app(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> typer.Typer:
    app = typer.Typer()
    app.command("serve")(lambda: typer.echo("serving"))
    monkeypatch.setattr(cli, "app", app)
    monkeypatch.syspath_prepend(str(tmp_path))
    return app


def test_a_missing_sub_package_is_skipped(fresh_app: typer.Typer) -> None:
    cli._mount("no_such_part_xyz.cli", "nothing")
    assert fresh_app.registered_groups == [] and len(fresh_app.registered_commands) == 1


def test_a_present_sub_package_is_mounted(fresh_app: typer.Typer, tmp_path: Path) -> None:
    _package(tmp_path, "okpart_xyz", "import typer\napp = typer.Typer()\n")
    cli._mount("okpart_xyz.cli", "ok")
    assert [g.name for g in fresh_app.registered_groups] == ["ok"]


@pytest.mark.parametrize(
    "body,error",
    [
        ("import a_dependency_that_is_not_installed_xyz\n", ModuleNotFoundError),
        ("from typer import NoSuchName\n", ImportError),
        ("x = 1\n", AttributeError),  # no `app`: a bug, not an absent part
    ],
)
def test_a_broken_sub_package_is_not_hidden(
    fresh_app: typer.Typer, tmp_path: Path, body: str, error: type[Exception]
) -> None:
    name = f"brokenpart_{error.__name__.lower()}"
    _package(tmp_path, name, body)
    try:
        cli._mount(f"{name}.cli", "broken")
    finally:
        sys.modules.pop(f"{name}.cli", None)
        sys.modules.pop(name, None)
    runner = CliRunner()
    result = runner.invoke(fresh_app, ["broken", "run", "--flag", "x"])
    assert result.exit_code != 0 and isinstance(result.exception, error), result.output
    ok = runner.invoke(fresh_app, ["serve"])  # the rest of the CLI still works
    assert ok.exit_code == 0 and "serving" in ok.output
