"""``requirements/constraints-gpu.txt`` from a resolver dry run, and the check that it still is.

    python -m tests.gpu_engine.lock          # resolve, (re)write the file: make constraints-gpu
    python -m tests.gpu_engine.lock --check  # resolve *under* the file: it must be complete

What `make install ENGINE=gpu` installs is ``requirements/engine-gpu.txt`` and then the project
with its ``dev`` and ``bench`` extras, both under the constraints file. This module asks pip
for exactly that (``pip install --dry-run --ignore-installed --report``) and pins every
package of the answer. The resolve is `--isolated` from this machine's pip configuration
(its find-links carry a CPU torch, its global constraints a torch cap): only the registry
(``PIP_INDEX_URL``, else PyPI) and ``PIP_CERT`` are honoured. The interpreter running this is
the one whose markers count (CPython 3.11 here; the header says which).

``--check`` resolves again with the file as constraints, so pip has no choice left: it fails
when the pins conflict, and the check fails when the answer holds a package the file does not
pin, or another version. It needs the registry (about a minute); a passing check is remembered
per content of the file and its inputs, so `make test` pays it once per change. The header
carries a digest of the inputs (engine-gpu.txt, pyproject's dependencies): the unit tests
compare it offline, so a dependency edited without regenerating the file fails at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "requirements" / "engine-gpu.txt"
CONSTRAINTS = ROOT / "requirements" / "constraints-gpu.txt"
EXTRAS = "dev,bench"  # what the Makefile installs: -e '.[dev,bench]'
DIGEST = re.compile(r"^# inputs-sha256: ([0-9a-f]{64})$", re.M)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def cache_dir() -> Path:
    """Where the GPU checks keep what they fetched (``LOOPSTACK_GPU_CHECK_CACHE``)."""
    env = os.environ.get("LOOPSTACK_GPU_CHECK_CACHE")
    return Path(env) if env else Path("~/.cache/loopstack/gpu-engine").expanduser()


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def inputs_digest(root: Path = ROOT) -> str:
    """sha256 of what the resolve depends on: engine-gpu.txt and pyproject's dependencies."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    inputs = {
        "engine-gpu.txt": (root / "requirements" / "engine-gpu.txt").read_text(),
        "dependencies": project.get("dependencies", []),
        "extras": {k: project["optional-dependencies"][k] for k in EXTRAS.split(",")},
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def parse_pins(text: str) -> dict[str, str]:
    """{canonical name: version} of a constraints file's ``name==version`` lines."""
    pins = {}
    for line in text.splitlines():
        m = PIN.match(line.strip())
        if m:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def file_digest(text: str) -> str | None:
    m = DIGEST.search(text)
    return m.group(1) if m else None


def _pip_command(report: Path, constraints: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run"]
    cmd += ["--ignore-installed", "--quiet", "--disable-pip-version-check", "--report", str(report)]
    if os.environ.get("PIP_INDEX_URL"):
        cmd += ["--index-url", os.environ["PIP_INDEX_URL"]]
    if os.environ.get("PIP_CERT"):
        cmd += ["--cert", os.environ["PIP_CERT"]]
    if constraints is not None:
        cmd += ["-c", str(constraints)]
    return [*cmd, "-r", str(ENGINE), f"{ROOT}[{EXTRAS}]"]


def resolve(constraints: Path | None = None) -> dict[str, str]:
    """{name: version} pip would install for engine-gpu.txt + the project, this project left out."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = _pip_command(report, constraints)
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
        if out.returncode != 0:
            raise SystemExit(f"the resolve failed ({' '.join(cmd)}):\n{out.stderr[-4000:]}")
        data: dict[str, Any] = json.loads(report.read_text())
    found = {i["metadata"]["name"]: i["metadata"]["version"] for i in data["install"]}
    return {k: v for k, v in found.items() if canonical(k) != "loopstack"}


def pip_version() -> str:
    out = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout.split()[1]


def render(pins: dict[str, str], *, digest: str, pip: str) -> str:
    impl = f"{platform.python_implementation()} {platform.python_version()}"
    head = [
        "# GPU pins: written by `make constraints-gpu` (python -m tests.gpu_engine.lock) from a",
        "# resolver dry run of requirements/engine-gpu.txt + '.[dev,bench]' against the registry",
        f"# (pip {pip}, {impl}, {platform.system()} {platform.machine()}). Do not edit by hand:",
        "# change engine-gpu.txt or pyproject.toml and run `make constraints-gpu` again.",
        f"# inputs-sha256: {digest}",
    ]
    body = [f"{name}=={pins[name]}" for name in sorted(pins, key=canonical)]
    return "\n".join(head + body) + "\n"


def problems(pinned: dict[str, str], resolved: dict[str, str]) -> list[str]:
    """What makes `resolved` (pip's answer under the pins) differ from the pins."""
    out = []
    for name, version in sorted(resolved.items()):
        want = pinned.get(canonical(name))
        if want is None:
            out.append(f"{name}=={version} is installed but not pinned")
        elif want != version:
            out.append(f"{name}: pinned {want}, resolved {version}")
    return out


def stamp_path(text: str) -> Path:
    key = hashlib.sha256((text + inputs_digest()).encode()).hexdigest()[:24]
    return cache_dir() / f"pins-ok-{key}"


def check() -> int:
    text = CONSTRAINTS.read_text()
    stamp = stamp_path(text)
    if stamp.exists():
        print(f"constraints-gpu.txt: resolved complete before ({stamp.name})")
        return 0
    if file_digest(text) != inputs_digest():
        print("constraints-gpu.txt is stale: engine-gpu.txt or pyproject's dependencies changed "
              "since it was written; run `make constraints-gpu`", file=sys.stderr)  # fmt: skip
        return 1
    found = problems(parse_pins(text), resolve(CONSTRAINTS))
    for line in found:
        print(f"constraints-gpu.txt: {line}", file=sys.stderr)
    if found:
        print("run `make constraints-gpu`", file=sys.stderr)
        return 1
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(text)
    print("constraints-gpu.txt: the pins resolve, and pin everything they resolve to")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.gpu_engine.lock", description=__doc__)
    ap.add_argument("--check", action="store_true", help="resolve under the file; no writing")
    args = ap.parse_args(argv)
    if args.check:
        return check()
    pins = resolve()
    CONSTRAINTS.write_text(render(pins, digest=inputs_digest(), pip=pip_version()))
    print(f"wrote {CONSTRAINTS.relative_to(ROOT)}: {len(pins)} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
