"""The GPU box's engine command and start, on CPU: tensor parallelism that vLLM accepts, the
context length from the model's config, an early driver check, and a grammar checker that
reads tokenizer.json (no transformers, no torch) and stays under its memory limit."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from loopstack.serving.config import GPU_DEFAULT, ServerSettings
from loopstack.serving.constraint.backend import TurnSpec
from loopstack.serving.constraint.factory import make_backend
from loopstack.serving.constraint.sandbox import COMPILE_BUDGET, worker_facts
from loopstack.serving.engine.hardware import (
    CudaDriverTooOld,
    Hardware,
    check_cuda_driver,
    driver_cuda_version,
    tensor_parallel_size,
    torch_cuda_version,
    vllm_launch,
)
from loopstack.serving.engine.model_files import (
    ModelFacts,
    facts_from_config,
    read_facts,
    tokenizer_folder,
)

# Qwen2.5-7B-Instruct's config.json, the fields that matter here
QWEN_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "vocab_size": 152064,
}
QWEN_VOCAB = 151_936  # the 0.5B's (and Qwen2.5's) vocabulary size, as the tokenizer rounds it
SMI = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
"""


def model_folder(tmp: Path, config: dict[str, Any]) -> Path:
    (tmp / "config.json").write_text(json.dumps(config))
    return tmp


def gpu(n: int) -> Hardware:
    return Hardware("cuda", n, 64, 512.0)


def arg(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


# --------------------------------------------------------------------------- tensor parallel
@pytest.mark.parametrize(
    ("gpus", "tp"), [(1, 1), (2, 2), (3, 2), (4, 4), (5, 4), (6, 4), (7, 4), (8, 4)]
)
def test_tensor_parallel_divides_the_heads_of_a_7b_class_model(gpus: int, tp: int) -> None:
    """28 heads, 4 KV heads: 7 divides the heads but not the KV heads, so 8 GPUs give 4."""
    assert tensor_parallel_size(gpus, facts_from_config(QWEN_7B), default_model=False) == tp


def test_tensor_parallel_is_1_for_the_default_model_and_for_unknown_heads() -> None:
    facts = facts_from_config(QWEN_7B)
    assert tensor_parallel_size(8, facts, default_model=True) == 1
    assert tensor_parallel_size(8, ModelFacts(), default_model=False) == 1
    # KV heads fewer than the GPUs: vLLM replicates them when the TP is a multiple of them
    mqa = ModelFacts(attention_heads=32, kv_heads=2)
    assert tensor_parallel_size(8, mqa, default_model=False) == 8
    gqa = ModelFacts(attention_heads=40, kv_heads=8)  # 5 divides the heads, not the KV heads
    assert tensor_parallel_size(6, gqa, default_model=False) == 4


def test_gpu_launch_reads_heads_and_context_from_the_models_config(tmp_path: Path) -> None:
    folder = str(model_folder(tmp_path, QWEN_7B))
    launch = vllm_launch(ServerSettings(), gpu(8), folder, "m")
    assert arg(launch.argv, "--tensor-parallel-size") == "4"
    assert arg(launch.argv, "--max-model-len") == "32768" and launch.max_model_len == 32768
    # the default model on 8 GPUs: one GPU each (its config comes from the hub or HF cache)
    default = vllm_launch(ServerSettings(), gpu(8), GPU_DEFAULT, "m", facts_from_config(QWEN_7B))
    assert arg(default.argv, "--tensor-parallel-size") == "1"
    assert default.max_model_len == 32768
    # what the settings say wins
    set_ = ServerSettings(tensor_parallel_size=2, max_model_len=8192)
    launch = vllm_launch(set_, gpu(8), folder, "m")
    assert arg(launch.argv, "--tensor-parallel-size") == "2"
    assert arg(launch.argv, "--max-model-len") == "8192" and launch.max_model_len == 8192


def test_gpu_launch_without_a_readable_config_has_tp_1_and_no_context(tmp_path: Path) -> None:
    launch = vllm_launch(ServerSettings(), gpu(4), str(tmp_path), "m")
    assert arg(launch.argv, "--tensor-parallel-size") == "1"
    assert "--max-model-len" not in launch.argv and launch.max_model_len is None


def test_context_length_is_the_smallest_key_vllm_reads() -> None:
    text = {"max_position_embeddings": 8192, "seq_length": 4096, "num_attention_heads": 8}
    facts = facts_from_config({"text_config": text})
    assert facts == ModelFacts(attention_heads=8, kv_heads=8, context_len=4096, vocab_size=None)


def test_model_files_read_a_local_folder_and_never_a_file(tmp_path: Path) -> None:
    model_folder(tmp_path, QWEN_7B)
    assert read_facts(str(tmp_path)).attention_heads == 28
    assert read_facts(str(tmp_path / "config.json")) == ModelFacts()
    assert tokenizer_folder(str(tmp_path)) == str(tmp_path)  # no tokenizer.json: as given


def test_hub_ids_are_read_from_the_hf_cache_and_not_fetched_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snap = tmp_path / "hub" / "models--Org--M" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (tmp_path / "hub" / "models--Org--M" / "refs").mkdir()
    (tmp_path / "hub" / "models--Org--M" / "refs" / "main").write_text("0" * 40)
    assert read_facts("Org/M") == ModelFacts()  # not cached, offline: unknown, no fetch
    model_folder(snap, QWEN_7B)
    (snap / "tokenizer.json").write_text("{}")
    assert read_facts("Org/M").context_len == 32768
    assert tokenizer_folder("Org/M") == str(snap)


# --------------------------------------------------------------------------- the driver
def test_the_driver_check_refuses_a_driver_older_than_torchs_cuda() -> None:
    old = SMI.format(driver="550.54.15", cuda="12.4")
    with pytest.raises(CudaDriverTooOld, match=r"driver 550\.54\.15 runs CUDA up to 12\.4.*"
                       r"built for CUDA 13\.0: install NVIDIA driver 580\.65\.06"):  # fmt: skip
        check_cuda_driver(old, torch_cuda="13.0")
    check_cuda_driver(SMI.format(driver="580.82.07", cuda="13.0"), torch_cuda="13.0")
    check_cuda_driver(SMI.format(driver="590.10", cuda="13.1"), torch_cuda="13.0")
    check_cuda_driver(old, torch_cuda="12.8")  # minor-version compatibility within 12.x
    check_cuda_driver("garbled", torch_cuda="13.0")  # unreadable: a warning, vLLM decides
    with pytest.raises(CudaDriverTooOld, match="not a CUDA build"):
        check_cuda_driver(old, torch_cuda=None)


def test_driver_banner_and_torch_cuda_are_read_without_importing_torch() -> None:
    import sys

    assert driver_cuda_version(SMI.format(driver="580.82.07", cuda="13.0")) == (
        "580.82.07",
        "13.0",
    )
    had_torch = "torch" in sys.modules
    assert torch_cuda_version() is None  # this venv's torch is the CPU build
    assert ("torch" in sys.modules) == had_torch


# --------------------------------------------------------------------------- the checker
def qwen_like_tokenizer(folder: Path) -> Path:
    """A byte-level BPE tokenizer.json with Qwen2.5's vocabulary size and its special tokens:
    what the checker loads on a GPU box, at full size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
    vocab = {c: i for i, c in enumerate(alphabet)}
    n = len(alphabet)
    while len(vocab) < QWEN_VOCAB - len(specials):
        word = "Ġ" + alphabet[n % 256] + alphabet[(n // 256) % 256] + alphabet[n // 65536]
        vocab.setdefault(word, len(vocab))
        n += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def turn() -> TurnSpec:
    return TurnSpec("required", {"get_weather": QWEN_7B_TOOL}, parallel=False)


QWEN_7B_TOOL = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}},
    "required": ["city"],
}


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
def test_the_checker_reads_tokenizer_json_and_stays_under_its_limit(
    tmp_path: Path, backend: str
) -> None:
    """The worker process the server starts, on a full-size vocabulary from tokenizer.json:
    guidance imports neither transformers nor torch (on a GPU box: the CUDA torch); both
    compile a tool turn with their address space under the limit, which leaves the whole
    compile budget above what the libraries and the vocabulary take."""
    folder = qwen_like_tokenizer(tmp_path / "model")
    grammar: Any = make_backend(backend, str(folder), timeout_s=60.0, mode="process")  # type: ignore[arg-type]

    async def compile_then_ask() -> dict[str, Any]:
        await grammar.constraint(turn(), what="tools")  # in the sandbox's worker
        facts: dict[str, Any] = await grammar.pool.run(worker_facts, what="facts", timeout_s=60)
        return facts

    try:
        facts = asyncio.run(compile_then_ask())
    finally:
        grammar.close()
    assert facts["limit"] is not None and facts["peak"] < facts["limit"], facts
    assert facts["limit"] - facts["size"] > COMPILE_BUDGET * 0.9, facts
    if backend == "guidance":
        assert facts["imported"] == [], facts  # no transformers, no torch
        assert facts["peak"] < 4 << 30, facts  # the old absolute limit, with room


# Qwen3-8B's config.json, the fields that matter here (its config says 40,960 positions)
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 40960,
}


def test_the_gpu_default_runs_without_thinking_at_its_native_context() -> None:
    from loopstack.serving.config import GPU_DEFAULT_ARCHITECTURE

    assert GPU_DEFAULT == "Qwen/Qwen3-8B" and GPU_DEFAULT_ARCHITECTURE in QWEN3_8B["architectures"]
    launch = vllm_launch(ServerSettings(), gpu(1), GPU_DEFAULT, "m", facts_from_config(QWEN3_8B))
    assert arg(launch.argv, "--tool-call-parser") == "hermes"
    assert arg(launch.argv, "--reasoning-parser") == "qwen3"
    assert json.loads(arg(launch.argv, "--default-chat-template-kwargs") or "") == {
        "enable_thinking": False
    }
    assert launch.max_model_len == 32768  # native; not the config's 40,960
    # any other model: no reasoning parser (a non-thinking model has no <think> tokens)
    other = vllm_launch(ServerSettings(), gpu(1), "Qwen/Qwen2.5-7B-Instruct", "m",
                        facts_from_config(QWEN_7B))  # fmt: skip
    assert "--reasoning-parser" not in other.argv
    assert "--default-chat-template-kwargs" not in other.argv


class _Template:
    def __init__(self, template: str) -> None:
        self.chat_template = template
        self.kwargs: dict[str, Any] = {}

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
        self.kwargs = kwargs
        return "prompt"


def test_tool_turn_prompts_turn_thinking_off_where_the_template_can_think() -> None:
    from loopstack.serving.prompt import PromptBuilder

    thinking = _Template("{% if enable_thinking is false %}<think>\n\n</think>{% endif %}")
    PromptBuilder(thinking).render([{"role": "user", "content": "hi"}], None)
    assert thinking.kwargs["enable_thinking"] is False
    plain = _Template("{{ messages }}")  # Qwen2.5's: no switch, nothing passed
    PromptBuilder(plain).render([{"role": "user", "content": "hi"}], None)
    assert "enable_thinking" not in plain.kwargs
