"""The GGUF conversion parses each file once, not once per transformers loader (tokenizer,
config, weights: ~22 s apiece for the offline model's vocabulary)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from loopstack.serving.engine.model_store import _gguf_parsed_once


def _tiny_gguf(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_string("general.name", "tiny")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    writer.add_tensor("token_embd.weight", np.ones((3, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_one_reader_per_file_inside_and_the_real_class_after(tmp_path: Path) -> None:
    path = _tiny_gguf(tmp_path / "tiny.gguf")
    original = gguf.GGUFReader
    with _gguf_parsed_once():
        first = gguf.GGUFReader(path)
        again = gguf.GGUFReader(str(tmp_path / "." / "tiny.gguf"))  # the same file, spelled apart
        assert again is first
        assert first.fields["general.name"].contents() == "tiny"
        assert again.tensors[0].data.shape == (3, 4)
        other = gguf.GGUFReader(_tiny_gguf(tmp_path / "other.gguf"))
        assert other is not first
    assert gguf.GGUFReader is original
    assert gguf.GGUFReader(path) is not first
