"""`loopstack serve` tells a CPU box's user which features were found and what follows."""

from loopstack.serving.engine.cpu_report import cpu_report

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
BF16 = AVX2 | {"avx512f", "avx512_bf16", "avx512_vnni"}


def test_an_avx2_box_is_told_it_runs_float32_and_why() -> None:
    rep = cpu_report(AVX2, "float32", "qwen2.5-coder-0.5b-instruct", requested="auto")
    lines = rep.lines("qwen2.5-coder-0.5b-instruct")
    assert rep.features == ("avx2",)
    assert "no AVX512-BF16 or AMX" in lines[1] and "float32" in lines[1]
    assert "150-170 tokens/s" in lines[2]


def test_a_bf16_box_is_told_it_has_the_fast_path() -> None:
    rep = cpu_report(BF16, "bfloat16", "qwen2.5-coder-0.5b-instruct", requested="auto")
    assert rep.features == ("avx2", "avx512f", "avx512_bf16", "avx512_vnni")
    assert "native bf16" in rep.why


def test_forcing_bf16_without_native_math_is_warned() -> None:
    rep = cpu_report(AVX2, "bfloat16", "m-0.5b", requested="bfloat16")
    assert "emulates" in rep.why


def test_an_unmeasured_model_says_so_instead_of_guessing() -> None:
    rep = cpu_report(AVX2, "float32", "my-own-7b", requested="auto")
    assert rep.prompt_rate is None
    assert "not measured" in rep.lines("my-own-7b")[2]
