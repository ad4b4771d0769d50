"""The distribution (issue #56): the wheel installs the one package `loopstack` (serving, agent,
memory and bench inside it) and nothing else at the top of site-packages, so `import loopstack`
works and `import agent` / `memory` / `serving` / `bench` fail. Built here from the tree with
the venv's setuptools (no network, no build isolation), unpacked, and imported with no site
directories (the dependencies are not needed: `import loopstack` loads none of them)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*cmd, "-w", str(out), str(ROOT)], check=True, capture_output=True)
    (found,) = out.glob("loopstack-*.whl")
    return found


def test_the_wheel_holds_only_loopstack(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"loopstack"}
    for package in ("serving", "agent", "memory", "bench"):
        assert f"loopstack/{package}/__init__.py" in names
    # data the code reads from beside itself ships too
    assert "loopstack/memory/e5_center.json" in names
    assert "loopstack/bench/corpus/tool_schemas.jsonl" in names


def test_installed_only_loopstack_imports(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import importlib, sys\n"
        f"sys.path[:] = [{str(site)!r}, *(p for p in sys.path if 'lib/python' in p"
        " and 'site-packages' not in p)]\n"
        "import loopstack, loopstack.text\n"
        "print(loopstack.__file__)\n"
        "for name in ('agent', 'memory', 'serving', 'bench'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "        print('imported', name)\n"
        "    except ModuleNotFoundError:\n"
        "        print('absent', name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    lines = out.stdout.split()
    assert Path(out.stdout.splitlines()[0]).is_relative_to(site)
    assert [w for w in lines if w in ("imported", "absent")] == ["absent"] * 4, out.stdout
