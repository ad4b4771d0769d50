"""requirements/constraints-gpu.txt, offline: written by its script from today's inputs, and
pinning everything the GPU install shares with the CPU one. (`make test` also resolves under
it against the registry: `python -m tests.gpu_engine.lock --check`, remembered per content.)"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tests.gpu_engine import lock
from tests.gpu_engine.wheel import pinned_version

TEXT = lock.CONSTRAINTS.read_text()
PINS = lock.parse_pins(TEXT)
# What differed from the CPU pins CI tests when the GPU file was empty, and the engine's own
SHARED = ("vllm", "torch", "transformers", "tokenizers", "llguidance", "xgrammar",
          "outlines-core", "httpx", "uvicorn", "fastapi", "pydantic", "openai",
          "sentence-transformers", "accelerate", "huggingface-hub", "numpy")  # fmt: skip


def test_the_file_was_written_from_the_current_inputs() -> None:
    assert lock.file_digest(TEXT) == lock.inputs_digest(), (
        "constraints-gpu.txt is stale: engine-gpu.txt or pyproject's dependencies changed; "
        "run `make constraints-gpu`"
    )


def test_the_file_is_in_the_form_the_script_writes() -> None:
    head = [line for line in TEXT.splitlines() if line.startswith("#")]
    body = lock.render(
        {line.split("==")[0]: line.split("==")[1] for line in TEXT.splitlines()
         if "==" in line and not line.startswith("#")},
        digest=lock.inputs_digest(), pip="x",
    ).splitlines()[len(head):]  # fmt: skip
    assert TEXT.splitlines()[len(head) :] == body
    assert len(PINS) > 200 and all(not line.strip() or "==" in line or line.startswith("#")
                                   for line in TEXT.splitlines())  # fmt: skip


def test_the_shared_libraries_and_every_dependency_are_pinned_within_range() -> None:
    assert PINS["vllm"] == pinned_version()
    missing = [name for name in SHARED if name not in PINS]
    assert not missing, f"constraints-gpu.txt does not pin {missing}"
    project = tomllib.loads((lock.ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [
        dep for extra in lock.EXTRAS.split(",") for dep in project["optional-dependencies"][extra]
    ]
    for dep in declared:
        req = Requirement(dep)
        name = lock.canonical(req.name)
        assert name in PINS, f"{name} ({dep}) is not pinned"
        assert req.specifier.contains(PINS[name], prereleases=True), f"{name}=={PINS[name]} ∉ {dep}"


def test_an_edited_dependency_makes_the_file_stale(tmp_path: Path) -> None:
    (tmp_path / "requirements").mkdir()
    shutil.copy(lock.ENGINE, tmp_path / "requirements" / "engine-gpu.txt")
    pyproject = (lock.ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(pyproject)
    assert lock.inputs_digest(tmp_path) == lock.inputs_digest()
    (tmp_path / "pyproject.toml").write_text(pyproject.replace('"httpx>=0.27"', '"httpx>=0.28"'))
    assert lock.inputs_digest(tmp_path) != lock.inputs_digest()
    (tmp_path / "pyproject.toml").write_text(pyproject.replace("line-length = 100", "x = 1"))
    assert lock.inputs_digest(tmp_path) == lock.inputs_digest()  # only dependencies count


def test_a_resolve_with_an_unpinned_or_moved_package_is_reported() -> None:
    assert lock.problems({"a": "1"}, {"A": "1"}) == []
    assert lock.problems({"a": "1"}, {"A": "2", "b": "3"}) == [
        "A: pinned 1, resolved 2",
        "b==3 is installed but not pinned",
    ]
