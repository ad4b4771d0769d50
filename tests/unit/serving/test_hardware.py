"""The vLLM command line for a CPU box: the dtype follows what the CPU computes natively;
the KV cache is sized from RAM, the context from the KV cache."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from loopstack.serving.config import ServerSettings
from loopstack.serving.engine.hardware import (
    Hardware,
    cpu_context,
    cpu_dtype,
    cpu_kv,
    cpu_layout,
    usable_cores,
    vllm_launch,
)
from loopstack.serving.engine.model_files import ModelFacts


def _cpu(*flags: str) -> Hardware:
    return Hardware("cpu", 0, 2, 24.0, frozenset(flags))


def _dtype(argv: list[str]) -> str:
    return argv[argv.index("--dtype") + 1]


def test_auto_dtype_is_float32_without_native_bf16() -> None:
    assert cpu_dtype("auto", _cpu("avx2", "fma")) == "float32"
    assert cpu_dtype("auto", _cpu("avx2", "avx512f", "avx512_bf16")) == "bfloat16"
    assert cpu_dtype("auto", _cpu("amx_bf16", "amx_tile")) == "bfloat16"


def test_explicit_dtype_wins_and_reaches_the_command_line() -> None:
    settings = ServerSettings(cpu_dtype="bfloat16")
    assert _dtype(vllm_launch(settings, _cpu("avx2"), "m", "m").argv) == "bfloat16"
    assert _dtype(vllm_launch(ServerSettings(), _cpu("avx2"), "m", "m").argv) == "float32"


def test_gpu_launch_has_no_cpu_dtype() -> None:
    argv = vllm_launch(ServerSettings(), Hardware("cuda", 1, 8, 64.0), "m", "m").argv
    assert "--dtype" not in argv


def test_cpu_kv_cache_is_a_sixth_of_ram_within_1_to_8_gib_unless_set() -> None:
    def kv(mem_gib: float, **kw: object) -> str:
        hw = Hardware("cpu", 0, 2, mem_gib, frozenset())
        return vllm_launch(ServerSettings(**kw), hw, "m", "m").env["VLLM_CPU_KVCACHE_SPACE"]  # type: ignore[arg-type]

    assert [kv(4.0), kv(23.5), kv(200.0)] == ["1", "3", "8"]
    assert kv(23.5, cpu_kv_cache_gib=1) == "1"


def test_the_engine_gets_the_constraint_backend_of_the_settings() -> None:
    def backend(**kw: object) -> str:
        argv = vllm_launch(ServerSettings(**kw), _cpu(), "m", "m").argv  # type: ignore[arg-type]
        return argv[argv.index("--structured-outputs-config.backend") + 1]

    assert backend() == "guidance"
    assert backend(constraint_backend="xgrammar") == "xgrammar"
    assert backend(constraint_backend="outlines") == "outlines"


def test_cpu_block_size_is_32_unless_set_and_gpu_keeps_vllms() -> None:
    argv = vllm_launch(ServerSettings(), _cpu(), "m", "m").argv
    assert argv[argv.index("--block-size") + 1] == "32"
    argv = vllm_launch(ServerSettings(cpu_block_size=128), _cpu(), "m", "m").argv
    assert argv[argv.index("--block-size") + 1] == "128"
    gpu = vllm_launch(ServerSettings(), Hardware("cuda", 1, 8, 64.0), "m", "m").argv
    assert "--block-size" not in gpu


QWEN_05B = ModelFacts(attention_heads=14, kv_heads=2, context_len=32768, layers=24, head_dim=64)


def test_cpu_context_is_32k_where_the_kv_cache_holds_two_sequences() -> None:
    assert QWEN_05B.kv_bytes_per_token(4) == 24 * 1024  # 2 x 24 layers x 2 heads x 64 x 4 B
    assert cpu_context(QWEN_05B, 2, "float32") == 32768  # 2 x 768 MiB <= 2 GiB
    assert cpu_context(QWEN_05B, 1, "float32") == 16384
    assert cpu_context(QWEN_05B, 1, "bfloat16") == 32768  # 12 KiB a token
    short = ModelFacts(kv_heads=2, context_len=16384, layers=24, head_dim=64)
    assert cpu_context(short, 8, "float32") == 16384  # never beyond the model's own
    assert cpu_context(ModelFacts(), 8, "float32") == 8192  # unknown KV size: the floor


def test_cpu_launch_sizes_the_context_from_ram_and_the_model(tmp_path: Path) -> None:
    config = {"num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
              "hidden_size": 896, "max_position_embeddings": 32768}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    big = Hardware("cpu", 0, 2, 23.0)  # this box: a 3 GiB KV cache
    launch = vllm_launch(ServerSettings(), big, str(tmp_path), "m")
    assert launch.max_model_len == 32768
    assert launch.argv[launch.argv.index("--max-model-len") + 1] == "32768"
    small = Hardware("cpu", 0, 2, 8.0)  # 1 GiB of KV cache, float32
    assert vllm_launch(ServerSettings(), small, str(tmp_path), "m").max_model_len == 16384
    set_ = vllm_launch(ServerSettings(max_model_len=4096), big, str(tmp_path), "m")
    assert set_.max_model_len == 4096


# -------------------------------------------------------------------- the engine's layout
def _env(settings: ServerSettings, cores: int = 2, device: str = "cpu") -> dict[str, str]:
    hw = Hardware(device, 0 if device == "cpu" else 1, cores, 24.0, frozenset({"avx2"}))
    return vllm_launch(settings, hw, "m", "m").env


def test_a_small_cpu_box_runs_the_worker_inside_the_engine_core_on_every_core() -> None:
    env = _env(ServerSettings())
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["OMP_NUM_THREADS"] == "2"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert _env(ServerSettings(), cores=4)["OMP_NUM_THREADS"] == "4"


def test_a_big_cpu_box_keeps_vllms_own_layout_unless_told() -> None:
    env = _env(ServerSettings(), cores=16)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env and "OMP_NUM_THREADS" not in env
    told = _env(ServerSettings(cpu_executor="uni", cpu_threads=12), cores=16)
    assert told["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and told["OMP_NUM_THREADS"] == "12"


def test_mp_is_vllms_layout_and_the_gpu_gets_neither() -> None:
    env = _env(ServerSettings(cpu_executor="mp"))
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env and "OMP_NUM_THREADS" not in env
    gpu = _env(ServerSettings(cpu_executor="uni"), device="cuda")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in gpu and "OMP_NUM_THREADS" not in gpu


def test_the_layout_comes_from_the_environment_and_says_what_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOOPSTACK_CPU_EXECUTOR", "uni")
    monkeypatch.setenv("LOOPSTACK_CPU_THREADS", "3")
    layout = cpu_layout(ServerSettings(), Hardware("cpu", 0, 8, 24.0))
    assert (layout.executor, layout.threads) == ("uni", 3)
    assert "3 thread(s)" in layout.describe() and "uni" in layout.describe()
    assert "mp" in cpu_layout(ServerSettings(cpu_executor="mp"), _cpu()).describe()
    monkeypatch.setenv("LOOPSTACK_CPU_EXECUTOR", "threads")
    with pytest.raises(ValueError):
        ServerSettings()


def test_usable_cores_is_this_process_cpuset() -> None:
    assert usable_cores() == len(os.sched_getaffinity(0))


# Qwen2.5-Coder-1.5B-Instruct's config.json (28 layers, 12 heads, 2 KV heads of 128)
QWEN_15B = ModelFacts(
    attention_heads=12, kv_heads=2, context_len=32768, vocab_size=151936, layers=28,
    head_dim=128, hidden_size=1536, intermediate_size=8960, tied_embeddings=True,
)  # fmt: skip


def test_parameters_from_the_config_match_the_model_card() -> None:
    assert round(QWEN_15B.parameters() / 1e9, 2) == 1.54  # type: ignore[operator]
    assert ModelFacts(layers=2).parameters() is None


@pytest.mark.parametrize(("mem_gib", "dtype"), [(15.6, "float32"), (23.4, "float32"),
                                                 (15.6, "bfloat16")])  # fmt: skip
def test_the_15b_gets_32k_on_a_16_and_a_24_gib_box(mem_gib: float, dtype: str) -> None:
    """Claude Code's first request (18,854 tokens) was refused at 16,384: the 32k context
    takes 2 x 32768 x 56 KiB = 3.5 GiB of KV in float32, beside 5.7 GiB of weights."""
    sized = cpu_kv(QWEN_15B, mem_gib, dtype)
    assert sized.per_token == 28 * 2 * 128 * 2 * (4 if dtype == "float32" else 2)
    assert sized.context == 32768
    assert sized.kv_gib * 2**30 >= 32768 * sized.per_token  # the cache holds a whole one
    assert sized.kv_gib + (sized.weights_gib or 0) + 5 <= mem_gib  # and the box holds it
    # as converted from its GGUF the output embeddings are untied: 1.77B, 6.6 GiB in float32
    untied = dataclasses.replace(QWEN_15B, tied_embeddings=False)
    assert cpu_kv(untied, mem_gib, dtype).context == 32768


def test_a_small_box_gets_a_shorter_context_not_a_cache_it_cannot_hold() -> None:
    sized = cpu_kv(QWEN_15B, 12.0, "float32")  # 12 - 5 - 5.7 = 1.3 GiB for the cache
    assert sized.context == 16384 and sized.kv_gib == 1  # one 16k sequence (0.9 GiB)
    assert cpu_kv(QWEN_15B, 11.0, "float32").context == 8192  # 0.3 GiB: the floor
    assert cpu_kv(ModelFacts(), 24.0, "float32").context == 8192  # unknown: the floor
