"""What one accelerator offers the replica model: peak dense FLOPs per dtype, memory bandwidth,
memory, and the link tensor parallelism talks over.

Every figure is the vendor's published specification (dense, i.e. without the 2:4 sparsity
that datasheets often quote first), never a measurement of ours: no GPU has run loopstack.
The replica model (`loopstack.bench.load.roofline`) scales them by fitted efficiencies; the plan
says "modelled" on every GPU figure it prints.

``PROFILES`` is keyed by the short names the CLI takes (``--hardware h100``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from loopstack.bench.load import BenchError

Dtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "fp4"]

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class Hardware:
    """One accelerator (per GPU figures; a replica with ``--tp N`` holds N of them)."""

    name: str
    flops: dict[str, float]  # dtype -> peak dense FLOP/s (tensor cores)
    mem_bw: float  # bytes/s of HBM/GDDR
    mem_bytes: float
    link_bw: float  # bytes/s one GPU sends to its peers for tensor parallelism (one way)
    link: str
    source: str
    aliases: tuple[str, ...] = field(default_factory=tuple)

    def peak(self, dtype: str) -> tuple[float, str]:
        """Peak dense FLOP/s for GEMMs with ``dtype`` operands and the dtype it really runs
        in: a card without FP8 tensor cores (A100) runs FP8 weights as bf16 GEMMs (vLLM's
        weight-only Marlin kernels), so the FLOPs are bf16's while the bytes stay FP8's."""
        if dtype in self.flops:
            return self.flops[dtype], dtype
        for fallback in ("bf16", "fp16"):
            if fallback in self.flops:
                return self.flops[fallback], fallback
        raise BenchError(f"{self.name} has no tensor-core figure for {dtype}")


# Sources: vendor datasheets, dense (non-sparse) tensor-core figures.
PROFILES: dict[str, Hardware] = {
    "h100": Hardware(
        name="NVIDIA H100 SXM5 80GB",
        # NVIDIA H100 Tensor Core GPU datasheet (SXM column): BF16 1,979 / FP8 3,958 TFLOPS
        # "with sparsity" -> 989.4 / 1,978.9 dense; HBM3 3.35 TB/s; 80 GB; NVLink 900 GB/s
        # (both directions together -> 450 GB/s one way).
        flops={
            "bf16": 989.4 * TERA,
            "fp16": 989.4 * TERA,
            "fp8": 1978.9 * TERA,
            "int8": 1978.9 * TERA,
        },
        mem_bw=3.35 * TERA,
        mem_bytes=80 * GIGA,
        link_bw=450 * GIGA,
        link="NVLink 4 (900 GB/s bidirectional)",
        source="NVIDIA H100 Tensor Core GPU datasheet, SXM5",
        aliases=("h100-sxm", "h100-80gb", "h100-sxm5"),
    ),
    "h200": Hardware(
        name="NVIDIA H200 SXM 141GB",
        # NVIDIA H200 Tensor Core GPU datasheet (SXM): the H100's tensor cores (BF16 989 /
        # FP8 1,979 TFLOPS dense), HBM3e 4.8 TB/s, 141 GB, NVLink 900 GB/s.
        flops={
            "bf16": 989.4 * TERA,
            "fp16": 989.4 * TERA,
            "fp8": 1978.9 * TERA,
            "int8": 1978.9 * TERA,
        },
        mem_bw=4.8 * TERA,
        mem_bytes=141 * GIGA,
        link_bw=450 * GIGA,
        link="NVLink 4 (900 GB/s bidirectional)",
        source="NVIDIA H200 Tensor Core GPU datasheet, SXM",
        aliases=("h200-sxm",),
    ),
    "a100": Hardware(
        name="NVIDIA A100 SXM4 80GB",
        # NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16 312 TFLOPS dense, INT8 624
        # TOPS, no FP8; HBM2e 2,039 GB/s; 80 GB; NVLink 3 600 GB/s bidirectional.
        flops={"bf16": 312 * TERA, "fp16": 312 * TERA, "int8": 624 * TERA},
        mem_bw=2.039 * TERA,
        mem_bytes=80 * GIGA,
        link_bw=300 * GIGA,
        link="NVLink 3 (600 GB/s bidirectional)",
        source="NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM",
        aliases=("a100-80gb", "a100-sxm", "a100-80"),
    ),
    "a100-40gb": Hardware(
        name="NVIDIA A100 SXM4 40GB",
        # the same datasheet, 40GB SXM column: HBM2 1,555 GB/s, 40 GB.
        flops={"bf16": 312 * TERA, "fp16": 312 * TERA, "int8": 624 * TERA},
        mem_bw=1.555 * TERA,
        mem_bytes=40 * GIGA,
        link_bw=300 * GIGA,
        link="NVLink 3 (600 GB/s bidirectional)",
        source="NVIDIA A100 Tensor Core GPU datasheet, 40GB SXM",
        aliases=("a100-40",),
    ),
    "l40s": Hardware(
        name="NVIDIA L40S 48GB",
        # NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 with sparsity), FP8 733 dense
        # (1,466 with sparsity); GDDR6 864 GB/s; 48 GB; no NVLink: PCIe Gen4 x16, 64 GB/s
        # bidirectional -> 32 GB/s one way.
        flops={"bf16": 362.05 * TERA, "fp16": 362.05 * TERA, "fp8": 733 * TERA, "int8": 733 * TERA},
        mem_bw=864 * GIGA,
        mem_bytes=48 * GIGA,
        link_bw=32 * GIGA,
        link="PCIe Gen4 x16",
        source="NVIDIA L40S datasheet",
    ),
    "b200": Hardware(
        name="NVIDIA B200 180GB (HGX)",
        # NVIDIA HGX B200 specifications, per GPU (the 8-GPU board's figures / 8): FP8 72 PFLOPS
        # with sparsity -> 4.5 PFLOPS dense per GPU, BF16 2.25 PFLOPS dense, FP4 9 dense; HBM3e
        # 8 TB/s, 180 GB (1,440 GB per board); NVLink 5 1.8 TB/s bidirectional.
        flops={
            "bf16": 2250 * TERA,
            "fp16": 2250 * TERA,
            "fp8": 4500 * TERA,
            "int8": 4500 * TERA,
            "fp4": 9000 * TERA,
        },
        mem_bw=8.0 * TERA,
        mem_bytes=180 * GIGA,
        link_bw=900 * GIGA,
        link="NVLink 5 (1.8 TB/s bidirectional)",
        source="NVIDIA HGX B200 specifications (per-GPU share)",
        aliases=("b200-sxm", "hgx-b200"),
    ),
    "rtx4090": Hardware(
        name="NVIDIA GeForce RTX 4090 24GB",
        # NVIDIA Ada Lovelace GPU architecture whitepaper (v2.1), GeForce RTX 4090: peak
        # FP16/BF16 tensor TFLOPS with FP32 accumulate 165.2 (dense), FP8 330.3 (FP32
        # accumulate, dense); GDDR6X 1,008 GB/s; 24 GB; PCIe Gen4 x16.
        flops={"bf16": 165.2 * TERA, "fp16": 165.2 * TERA, "fp8": 330.3 * TERA},
        mem_bw=1008 * GIGA,
        mem_bytes=24 * GIGA,
        link_bw=32 * GIGA,
        link="PCIe Gen4 x16",
        source="NVIDIA Ada Lovelace architecture whitepaper, RTX 4090",
        aliases=("4090", "rtx-4090"),
    ),
}


def get_hardware(name: str) -> Hardware:
    key = name.strip().lower()
    if key in PROFILES:
        return PROFILES[key]
    for k, hw in PROFILES.items():
        if key in hw.aliases:
            return PROFILES[k]
    raise BenchError(f"unknown hardware {name!r}: one of {', '.join(sorted(PROFILES))}")


def dtype_bytes(dtype: str) -> float:
    sizes = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5,
             "int4": 0.5}  # fmt: skip
    try:
        return sizes[dtype]
    except KeyError:
        raise BenchError(f"unknown dtype {dtype!r}: one of {', '.join(sizes)}") from None
