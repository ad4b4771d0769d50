"""The GPU `vllm` wheel's Python sources, fetched by version and kept in a cache.

    python -m tests.gpu_engine.wheel      # fetch (if not cached) and print the folder

The version is the one ``requirements/engine-gpu.txt`` pins. ``pip download --no-deps`` takes
the wheel from the registry (about 340 MB: mostly CUDA kernels, which nothing here can load);
only its ``.py`` files and its ``.dist-info`` are kept (about 60 MB), under
``~/.cache/loopstack/gpu-engine/vllm-<version>/`` (``LOOPSTACK_GPU_CHECK_CACHE``), and the
wheel is deleted. A file lock makes concurrent callers (`make test`'s prefetch, the tests)
fetch it once; a finished folder carries ``.complete`` and is never fetched again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from tests.gpu_engine.lock import ENGINE, cache_dir

DONE = ".complete"


def pinned_version(path: Path = ENGINE) -> str:
    """The ``vllm==X`` of engine-gpu.txt."""
    for line in path.read_text().splitlines():
        m = re.match(r"^vllm==(\S+)$", line.strip())
        if m:
            return m.group(1)
    raise ValueError(f"{path} pins no vllm version (vllm==X)")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _download(version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--quiet"]
    cmd += ["--disable-pip-version-check", "--only-binary", ":all:", "--dest", str(dest)]
    # the Linux x86_64 wheel whatever machine asks: it is the one a GPU box installs
    cmd += ["--platform", "manylinux_2_28_x86_64", "--python-version", "3.11"]
    if os.environ.get("PIP_INDEX_URL"):
        cmd += ["--index-url", os.environ["PIP_INDEX_URL"]]
    if os.environ.get("PIP_CERT"):
        cmd += ["--cert", os.environ["PIP_CERT"]]
    out = subprocess.run([*cmd, f"vllm=={version}"], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"pip download vllm=={version} failed:\n{out.stderr[-3000:]}")
    wheels = list(dest.glob("vllm-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip download left {wheels} in {dest}")
    return wheels[0]


def _extract(wheel: Path, target: Path) -> None:
    """The ``.py`` files and the ``.dist-info``; the compiled modules' names in
    ``native-modules.txt`` (`tests.gpu_engine.probe` stands empty modules in for them)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(target, [n for n in names if n.endswith(".py") or ".dist-info/" in n])
    natives = sorted(
        n.split(".", 1)[0].replace("/", ".") for n in names if n.endswith(".so") and "/" in n
    )
    (target / "native-modules.txt").write_text("\n".join(natives) + "\n")


def ensure(version: str | None = None) -> Path:
    """The folder holding the GPU vllm's sources (``vllm/``) and its ``.dist-info``."""
    version = version or pinned_version()
    root = cache_dir() / f"vllm-{version}"
    if (root / DONE).exists():
        return root
    with _locked(cache_dir() / f"vllm-{version}.lock"):
        if (root / DONE).exists():
            return root
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            wheel = _download(version, Path(tmp) / "wheel")
            staging = Path(tmp) / "src"
            _extract(wheel, staging)
            wheel.unlink()
            if not (staging / f"vllm-{version}.dist-info" / "METADATA").is_file():
                raise RuntimeError(f"{wheel.name} has no vllm-{version}.dist-info/METADATA")
            shutil.rmtree(root, ignore_errors=True)
            staging.rename(root)
        (root / DONE).write_text(f"vllm=={version}\n")
    return root


def metadata(root: Path) -> str:
    """The wheel's METADATA (its Requires-Dist lines are what the GPU install resolves)."""
    (info,) = root.glob("vllm-*.dist-info")
    return (info / "METADATA").read_text()


if __name__ == "__main__":
    print(ensure())
