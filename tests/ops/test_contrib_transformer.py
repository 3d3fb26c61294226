"""onnxpy's com.microsoft transformer kernels (ops/contrib/transformer.py) against onnxruntime:
one-node models on random data, numpy oracles where onnxruntime's CPU provider has no kernel,
and a BERT-like model fused by onnxruntime's own transformer optimizer."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from tests.helpers import CONTRIB_ORACLE, CONTRIB_SKIP_REASON, onnxruntime_older_than

pytestmark = pytest.mark.skipif(onnxruntime_older_than(CONTRIB_ORACLE), reason=CONTRIB_SKIP_REASON)

MS = "com.microsoft"
ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
}
TOL = {np.dtype(np.float32): (1e-5, 1e-6), np.dtype(np.float64): (1e-12, 1e-12), np.dtype(np.float16): (2e-3, 2e-3)}


def _model(op_type: str, feeds: dict[str, Any], n_out: int, domain: str, opset: int, attrs: dict[str, Any]) -> bytes:
    names = list(feeds)
    while names and feeds[names[-1]] is None:
        names.pop()
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, [n if feeds[n] is not None else "" for n in names], outs, domain=domain, **attrs)
    vi = [helper.make_tensor_value_info(n, ELEM[v.dtype], list(v.shape)) for n, v in feeds.items() if v is not None]
    ov = [helper.make_empty_tensor_value_info(n) for n in outs]
    graph = helper.make_graph([node], "g", vi, ov)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model.SerializeToString()


def _run(op_type: str, feeds: dict[str, Any], n_out: int = 1, domain: str = MS, opset: int = 17, **attrs: Any) -> Any:
    """(onnxruntime's outputs, onnxpy's outputs) of one node."""
    data = _model(op_type, feeds, n_out, domain, opset, attrs)
    present = {k: v for k, v in feeds.items() if v is not None}
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, present)
    got = onnxpy.InferenceSession(data).run(None, present)
    return want, got


def _ours(op_type: str, feeds: dict[str, Any], n_out: int = 1, domain: str = MS, opset: int = 17, **attrs: Any) -> Any:
    data = _model(op_type, feeds, n_out, domain, opset, attrs)
    return onnxpy.InferenceSession(data).run(None, {k: v for k, v in feeds.items() if v is not None})


def _close(want: list[Any], got: list[Any], tol: tuple[float, float] | None = None) -> None:
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        rtol, atol = tol or TOL.get(w.dtype, (0, 0))
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def _compare(op_type: str, feeds: dict[str, Any], n_out: int = 1, tol: Any = None, **kw: Any) -> None:
    want, got = _run(op_type, feeds, n_out, **kw)
    _close(want, got, tol)


def _rand(rng: np.random.Generator, *shape: int, dtype: Any = np.float32, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# -- activations ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gelu_family(rng: np.random.Generator, dtype: Any) -> None:
    x = _rand(rng, 2, 5, 16, dtype=dtype, scale=3.0)
    bias = _rand(rng, 16, dtype=dtype)
    _compare("Gelu", {"X": x})
    _compare("BiasGelu", {"A": x, "B": bias})
    _compare("FastGelu", {"X": x})
    _compare("FastGelu", {"X": x, "bias": bias})
    _compare("QuickGelu", {"X": x})
    _compare("QuickGelu", {"X": x}, alpha=1.25)


def test_gelu_family_float64(rng: np.random.Generator) -> None:
    x = _rand(rng, 3, 7, dtype=np.float64, scale=3.0)
    _compare("FastGelu", {"X": x, "bias": _rand(rng, 7, dtype=np.float64)})
    _compare("QuickGelu", {"X": x}, alpha=-0.5)
    # onnxruntime has no float64 Gelu kernel here: erf's own values as the oracle.
    want = x * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    np.testing.assert_allclose(_ours("Gelu", {"X": x})[0], want, rtol=1e-12, atol=1e-13)


def test_bias_add_split_gelu_gemm_fast_gelu(rng: np.random.Generator) -> None:
    # onnxruntime's CPU provider has none of these: the documented formulas as the oracle.
    x = _rand(rng, 2, 6, 8)
    bias = _rand(rng, 8)
    skip = _rand(rng, 2, 6, 8)
    np.testing.assert_allclose(_ours("BiasAdd", {"X": x, "bias": bias, "skip": skip})[0], x + bias + skip, rtol=1e-6)
    h = (x + bias).astype(np.float64)
    gelu = h[..., 4:] * 0.5 * (1 + np.vectorize(math.erf)(h[..., 4:] / math.sqrt(2)))
    np.testing.assert_allclose(
        _ours("BiasSplitGelu", {"X": x, "bias": bias})[0], h[..., :4] * gelu, rtol=1e-5, atol=1e-6
    )
    w = _rand(rng, 8, 5)
    b5 = _rand(rng, 5)
    y = x.astype(np.float64) @ w + b5
    fast = 0.5 * y * (1 + np.tanh(0.797885 * y + 0.035677 * y**3))  # the document's constants
    np.testing.assert_allclose(_ours("GemmFastGelu", {"X": x, "W": w, "bias": b5})[0], fast, rtol=1e-5, atol=1e-5)
    half = _ours(
        "BiasAdd", {"X": x.astype(np.float16), "bias": bias.astype(np.float16), "skip": skip.astype(np.float16)}
    )
    assert half[0].dtype == np.float16


# -- normalizations ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_layer_norm_all_outputs(rng: np.random.Generator, dtype: Any) -> None:
    x, skip = _rand(rng, 2, 5, 32, dtype=dtype), _rand(rng, 2, 5, 32, dtype=dtype)
    gamma, beta, bias = (_rand(rng, 32, dtype=dtype) for _ in range(3))
    feeds = {"input": x, "skip": skip, "gamma": gamma, "beta": beta, "bias": bias}
    _compare("SkipLayerNormalization", feeds, 4)
    _compare("SkipLayerNormalization", feeds, 4, epsilon=1e-3)
    _compare("SkipSimplifiedLayerNormalization", {"input": x, "skip": skip, "gamma": gamma, "bias": bias}, 4)


def test_skip_layer_norm_shapes(rng: np.random.Generator) -> None:
    x, gamma = _rand(rng, 3, 4, 16), _rand(rng, 16)
    for skip in (_rand(rng, 1, 4, 16), _rand(rng, 4, 16)):  # skips shared by the batch
        _compare("SkipLayerNormalization", {"input": x, "skip": skip, "gamma": gamma}, 2)
        _compare("SkipSimplifiedLayerNormalization", {"input": x, "skip": skip, "gamma": gamma}, 3)
    _compare("SkipLayerNormalization", {"input": x[0], "skip": x[1], "gamma": gamma, "beta": None, "bias": gamma}, 4)
    _compare("SkipLayerNormalization", {"input": x, "skip": x, "gamma": gamma})


def test_simplified_layer_norm_default_domain(rng: np.random.Generator) -> None:
    x, scale = _rand(rng, 2, 3, 12), _rand(rng, 12)
    for dtype in (np.float32, np.float16):
        xs, ss = x.astype(dtype), scale.astype(dtype)
        _compare("SimplifiedLayerNormalization", {"X": xs, "scale": ss}, 2, domain="")
    _compare("SimplifiedLayerNormalization", {"X": x, "scale": scale[None]}, 2, domain="", axis=1, epsilon=0.1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_embed_layer_norm(rng: np.random.Generator, dtype: Any) -> None:
    b, s, h = 3, 6, 16
    ids = rng.integers(0, 20, (b, s)).astype(np.int32)
    seg = rng.integers(0, 2, (b, s)).astype(np.int32)
    mask = np.ones((b, s), np.int32)
    mask[0, 4:] = 0
    mask[1, 1] = 0
    feeds = {
        "input_ids": ids,
        "segment_ids": seg,
        "word_embedding": _rand(rng, 20, h, dtype=dtype),
        "position_embedding": _rand(rng, 8, h, dtype=dtype),
        "segment_embedding": _rand(rng, 2, h, dtype=dtype),
        "gamma": _rand(rng, h, dtype=dtype),
        "beta": _rand(rng, h, dtype=dtype),
        "mask": mask,
    }
    _compare("EmbedLayerNormalization", feeds, 3)
    feeds.update(segment_ids=None, segment_embedding=None, mask=None)
    feeds["position_ids"] = rng.integers(0, 8, (1, s)).astype(np.int32)
    _compare("EmbedLayerNormalization", feeds, 3, epsilon=1e-5)


# -- FusedMatMul ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "attrs"),
    [
        ((3, 4), (4, 5), {}),
        ((2, 4, 3), (5, 4), {"transA": 1, "transB": 1, "alpha": 0.25}),
        ((2, 3, 4, 5), (3, 4, 5, 6), {"transBatchA": 1}),
        ((2, 3, 4, 5), (6, 3, 4, 2), {"transBatchA": 1, "transA": 1, "transBatchB": 1, "transB": 1, "alpha": 2.0}),
        ((4, 3, 5), (7, 4, 5), {"transBatchB": 1, "transB": 1}),
        ((5,), (2, 3, 5), {"transB": 1}),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_fused_matmul(rng: np.random.Generator, a_shape: Any, b_shape: Any, attrs: Any, dtype: Any) -> None:
    _compare("FusedMatMul", {"A": _rand(rng, *a_shape, dtype=dtype), "B": _rand(rng, *b_shape, dtype=dtype)}, **attrs)


# -- Attention / MultiHeadAttention --------------------------------------------------------------


def _attention_feeds(rng: np.random.Generator, b: int = 2, s: int = 5, hin: int = 12, sizes: Any = (8, 8, 8)) -> Any:
    return {
        "input": _rand(rng, b, s, hin),
        "weights": _rand(rng, hin, sum(sizes), scale=0.5),
        "bias": _rand(rng, sum(sizes)),
    }


def test_attention_masks(rng: np.random.Generator) -> None:
    feeds = _attention_feeds(rng)
    _compare("Attention", feeds, num_heads=2)
    mask2 = np.ones((2, 5), np.int32)
    mask2[0, 3:] = 0
    mask2[1, 0] = 0
    masks = [
        mask2,
        np.zeros((2, 5), np.int32),  # every key masked: mask_filter_value is added, not a -inf
        np.array([3, 5], np.int32),  # lengths of right-padded sequences
        np.array([4, 5, 1, 0], np.int32),  # exclusive ends, then inclusive starts
        rng.integers(0, 2, (2, 5, 5)).astype(np.int32),
    ]
    for mask in masks:
        _compare("Attention", {**feeds, "mask_index": mask}, num_heads=2)
        _compare("Attention", {**feeds, "mask_index": mask}, num_heads=4, mask_filter_value=-3.0, unidirectional=1)
    _compare("Attention", {**feeds, "bias": None}, num_heads=2, scale=0.3, unidirectional=1)


def test_attention_past_bias_and_sizes(rng: np.random.Generator) -> None:
    feeds = _attention_feeds(rng)
    past = _rand(rng, 2, 2, 2, 3, 4)
    mask = np.ones((2, 8), np.int32)
    mask[1, 1] = 0
    _compare("Attention", {**feeds, "mask_index": mask, "past": past}, 2, num_heads=2, unidirectional=1)
    _compare("Attention", {**feeds, "mask_index": None, "past": past}, 2, num_heads=2)
    ab = _rand(rng, 1, 2, 5, 5)
    _compare("Attention", {**feeds, "mask_index": None, "past": None, "attention_bias": ab}, num_heads=2)
    odd = _attention_feeds(rng, sizes=(4, 4, 12))
    _compare("Attention", odd, num_heads=2, qkv_hidden_sizes=[4, 4, 12])


def test_attention_float16(rng: np.random.Generator) -> None:
    feeds = {k: v.astype(np.float16) for k, v in _attention_feeds(rng).items()}
    _compare("Attention", {**feeds, "mask_index": np.array([2, 5], np.int32)}, num_heads=2)


def test_multi_head_attention(rng: np.random.Generator) -> None:
    b, s, kv, d, dv = 2, 3, 5, 8, 12
    feeds = {"query": _rand(rng, b, s, d), "key": _rand(rng, b, kv, d), "value": _rand(rng, b, kv, dv)}
    bias = _rand(rng, 2 * d + dv)
    _compare("MultiHeadAttention", feeds, num_heads=2)
    _compare("MultiHeadAttention", {**feeds, "bias": bias}, 3, num_heads=2, scale=0.2)
    pad = np.ones((b, kv), np.int32)
    pad[0, 3:] = 0
    for mask in (pad, np.array([2, 5], np.int32), rng.integers(0, 2, (b, s, kv)).astype(np.int32)):
        _compare("MultiHeadAttention", {**feeds, "bias": bias, "key_padding_mask": mask}, num_heads=4)
    ab = _rand(rng, b, 1, s, kv)
    _compare("MultiHeadAttention", {**feeds, "bias": None, "key_padding_mask": None, "attention_bias": ab}, num_heads=2)
    # self attention with a past, causal
    self_feeds = {"query": _rand(rng, b, s, d), "key": _rand(rng, b, s, d), "value": _rand(rng, b, s, d)}
    past = {"past_key": _rand(rng, b, 2, 4, 4), "past_value": _rand(rng, b, 2, 4, 4)}
    full = {**self_feeds, "bias": _rand(rng, 3 * d), "key_padding_mask": None, "attention_bias": None, **past}
    _compare("MultiHeadAttention", full, 3, num_heads=2, unidirectional=1)
    # key and value already split into heads: (B, heads, L, size)
    heads = {"query": feeds["query"], "key": _rand(rng, b, 2, kv, 4), "value": _rand(rng, b, 2, kv, 4)}
    _compare("MultiHeadAttention", heads, num_heads=2)
    _compare("MultiHeadAttention", {**heads, "bias": bias[: 3 * d]}, num_heads=2)
    half = {k: v.astype(np.float16) for k, v in feeds.items()}
    _compare("MultiHeadAttention", half, num_heads=2)


def test_multi_head_attention_causal_with_another_key_length(rng: np.random.Generator) -> None:
    # The causal diagonal sits past the cached keys only (none here), and future keys get
    # mask_filter_value: with fewer keys than queries the last rows see them all, not NaN.
    feeds = {"query": _rand(rng, 1, 4, 4), "key": _rand(rng, 1, 2, 4), "value": _rand(rng, 1, 2, 4)}
    want, got = _run("MultiHeadAttention", feeds, num_heads=1, unidirectional=1)
    assert np.isfinite(got[0]).all()
    _close(want, got)
    # More keys than queries: query i sees keys 0..i (read off uniform scores and one-hot
    # values). onnxruntime 1.32 agrees on every row but the last, which it lets see all keys.
    q, k, v = np.zeros((1, 3, 5), np.float32), np.zeros((1, 5, 5), np.float32), np.eye(5, dtype=np.float32)[None]
    (y,) = _ours("MultiHeadAttention", {"query": q, "key": k, "value": v}, num_heads=1, unidirectional=1)
    np.testing.assert_allclose(y[0], np.tril(np.ones((3, 5))) / np.arange(1, 4)[:, None], rtol=1e-6)


def test_attention_refuses_no_heads_and_negative_mask_lengths(rng: np.random.Generator) -> None:
    x, w = _rand(rng, 1, 3, 4), _rand(rng, 4, 12)
    with pytest.raises(onnxpy.RuntimeException, match="num_heads must be positive, got 0"):
        _ours("Attention", {"input": x, "weights": w}, num_heads=0)
    feeds = {"query": x, "key": x, "value": x}
    with pytest.raises(onnxpy.RuntimeException, match="num_heads must be positive, got 0"):
        _ours("MultiHeadAttention", feeds, num_heads=0)
    lengths = np.array([-1], np.int32)  # onnxruntime refuses it; every key was masked silently
    with pytest.raises(onnxpy.RuntimeException, match=r"mask_index holds negative lengths or positions: \[-1\]"):
        _ours("Attention", {"input": x, "weights": w, "bias": None, "mask_index": lengths}, num_heads=2)


def test_multi_head_attention_packed_formats(rng: np.random.Generator) -> None:
    # onnxruntime's CPU provider refuses packed Q/K/V: compare with the unpacked inputs.
    b, s, n, h = 2, 4, 2, 3
    q, k, v = (_rand(rng, b, s, n, h) for _ in range(3))
    flat = {"query": q.reshape(b, s, -1), "key": k.reshape(b, s, -1), "value": v.reshape(b, s, -1)}
    want = _ours("MultiHeadAttention", flat, num_heads=n)[0]
    packed_qkv = _ours("MultiHeadAttention", {"query": np.stack([q, k, v], 3)}, num_heads=n)[0]
    packed_kv = _ours("MultiHeadAttention", {"query": flat["query"], "key": np.stack([k, v], 3)}, num_heads=n)[0]
    np.testing.assert_allclose(packed_qkv, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(packed_kv, want, rtol=1e-6, atol=1e-7)


# -- RotaryEmbedding -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding(rng: np.random.Generator, dtype: Any, interleaved: int) -> None:
    b, s, n, h, max_s = 2, 4, 3, 8, 10
    angles = rng.uniform(0, 6, (max_s, h // 2))
    cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    pos = rng.integers(0, max_s, (b, s)).astype(np.int64)
    x3 = _rand(rng, b, s, n * h, dtype=dtype)
    for ids in (pos, np.array([3], np.int64)):
        feeds = {"input": x3, "position_ids": ids, "cos_cache": cos, "sin_cache": sin}
        _compare("RotaryEmbedding", feeds, interleaved=interleaved)
    x4 = _rand(rng, b, n, s, h, dtype=dtype)
    _compare("RotaryEmbedding", {"input": x4, "position_ids": pos, "cos_cache": cos, "sin_cache": sin})
    # A partial rotation: the caches cover rotary_embedding_dim, num_heads gives the head size.
    part = {"input": x3, "position_ids": pos, "cos_cache": cos[:, :2], "sin_cache": sin[:, :2]}
    _compare("RotaryEmbedding", part, interleaved=interleaved, num_heads=n, rotary_embedding_dim=4)


# -- errors --------------------------------------------------------------------------------------


def test_bad_shapes_raise_value_errors(rng: np.random.Generator) -> None:
    x, g = _rand(rng, 2, 3, 8), _rand(rng, 8)
    cases = [
        ("SkipLayerNormalization", {"input": x, "skip": _rand(rng, 2, 3, 4), "gamma": g}, "skip"),
        ("SkipLayerNormalization", {"input": x, "skip": x, "gamma": _rand(rng, 4)}, "gamma"),
        ("BiasGelu", {"A": x, "B": _rand(rng, 3)}, "B"),
        ("Attention", {"input": x, "weights": _rand(rng, 8, 10)}, "weights"),
        (
            "Attention",
            {"input": x, "weights": _rand(rng, 8, 12), "bias": None, "mask_index": np.ones((2, 7), np.int32)},
            "mask_index",
        ),
        ("MultiHeadAttention", {"query": x, "key": _rand(rng, 2, 5, 6), "value": _rand(rng, 2, 5, 6)}, "key"),
        ("FusedMatMul", {"A": x, "B": _rand(rng, 3, 8)}, "do not chain"),
    ]
    for op_type, feeds, what in cases:
        attrs = {"num_heads": 2} if "Attention" in op_type else {}
        with pytest.raises(RuntimeError, match=what) as info:  # the session's error, from the kernel's
            _ours(op_type, feeds, **attrs)
        assert isinstance(info.value.__cause__, ValueError), repr(info.value.__cause__)


# -- end to end: a BERT-like model fused by onnxruntime's transformer optimizer -------------------


def _bert_like(rng: np.random.Generator, vocab: int, seq: int, hidden: int, heads: int, layers: int) -> onnx.ModelProto:
    """A BERT encoder from standard ops in the layout exporters write (embeddings with
    LayerNormalization, per-head Reshape/Transpose attention with an additive mask, Erf GELU,
    residual Add + LayerNormalization), which the optimizer recognizes and fuses."""
    inits: list[Any] = []
    nodes: list[Any] = []
    hd, ffn = hidden // heads, 2 * hidden

    def w(name: str, *shape: int, scale: float = 0.2) -> str:
        inits.append(numpy_helper.from_array(_rand(rng, *shape, scale=scale), name))
        return name

    def c(name: str, value: Any, dtype: Any = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def n(op_type: str, ins: list[str], out: str, **kw: Any) -> str:
        nodes.append(helper.make_node(op_type, ins, [out], **kw))
        return out

    def ln(x: str, name: str) -> str:
        return n(
            "LayerNormalization", [x, w(name + "_g", hidden, scale=1.0), w(name + "_b", hidden)], name, epsilon=1e-12
        )

    # Embeddings: word + position (a Range over the sequence) + segment, then LayerNorm.
    n("Shape", ["input_ids"], "ids_shape")
    n("Gather", ["ids_shape", c("one_i", 1, np.int64)], "seq_len", axis=0)
    n("Range", [c("zero_i", 0, np.int64), "seq_len", "one_i"], "pos_range")
    n("Unsqueeze", ["pos_range", c("ax0", [0], np.int64)], "pos_ids")
    words = n("Gather", [w("word_emb", vocab, hidden), "input_ids"], "we")
    pos = n("Gather", [w("pos_emb", seq, hidden), "pos_ids"], "pe")
    segs = n("Gather", [w("seg_emb", 2, hidden), "token_type_ids"], "se")
    x = ln(n("Add", [n("Add", [words, pos], "wp"), segs], "emb"), "emb_ln")
    # The additive mask (1 - mask) * -10000 of shape (B, 1, 1, S).
    m = n(
        "Unsqueeze", [n("Unsqueeze", ["attention_mask", c("ax1", [1], np.int64)], "m3"), c("ax2", [2], np.int64)], "m4"
    )
    m = n("Cast", [m], "mf", to=TensorProto.FLOAT)
    madd = n("Mul", [n("Sub", [c("onef", 1.0), m], "inv"), c("neg", -10000.0)], "madd")
    for layer in range(layers):
        p = f"l{layer}_"

        def proj(t: str, perm: list[int], x: str = x, p: str = p) -> str:
            y = n(
                "Add",
                [w(p + t + "_b", hidden), n("MatMul", [x, w(p + t + "_w", hidden, hidden)], p + t + "_mm")],
                p + t,
            )
            y = n("Reshape", [y, c(p + t + "_shape", [0, 0, heads, hd], np.int64)], p + t + "_rs")
            return n("Transpose", [y], p + t + "_tr", perm=perm)

        q, k, v = proj("q", [0, 2, 1, 3]), proj("k", [0, 2, 3, 1]), proj("v", [0, 2, 1, 3])
        scores = n("Div", [n("MatMul", [q, k], p + "qk"), c(p + "sqrt", math.sqrt(hd))], p + "scaled")
        probs = n("Softmax", [n("Add", [scores, madd], p + "masked")], p + "probs", axis=3)
        ctx = n("Transpose", [n("MatMul", [probs, v], p + "ctx")], p + "ctx_t", perm=[0, 2, 1, 3])
        ctx = n("Reshape", [ctx, c(p + "merge", [0, 0, hidden], np.int64)], p + "ctx_r")
        o = n("Add", [w(p + "o_b", hidden), n("MatMul", [ctx, w(p + "o_w", hidden, hidden)], p + "o_mm")], p + "o")
        x1 = ln(n("Add", [o, x], p + "res1"), p + "ln1")
        f = n("Add", [w(p + "f1_b", ffn), n("MatMul", [x1, w(p + "f1_w", hidden, ffn)], p + "f1_mm")], p + "f1")
        g = n("Erf", [n("Div", [f, c(p + "sqrt2", math.sqrt(2.0))], p + "g_div")], p + "g_erf")
        g = n(
            "Mul",
            [n("Mul", [f, n("Add", [g, c(p + "g_one", 1.0)], p + "g_add")], p + "g_mul"), c(p + "half", 0.5)],
            p + "gelu",
        )
        f2 = n("Add", [w(p + "f2_b", hidden), n("MatMul", [g, w(p + "f2_w", ffn, hidden)], p + "f2_mm")], p + "f2")
        x = ln(n("Add", [f2, x1], p + "res2"), p + "ln2")
    n("Identity", [x], "last_hidden_state")
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
        for name in ("input_ids", "token_type_ids", "attention_mask")
    ]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden])]
    graph = helper.make_graph(nodes, "bert_like", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_bert_optimized_by_onnxruntime(tmp_path: Any, rng: np.random.Generator) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    hidden, heads, seq = 32, 4, 12
    plain = tmp_path / "bert.onnx"
    fused = tmp_path / "bert_fused.onnx"
    onnx.save(_bert_like(rng, vocab=40, seq=seq, hidden=hidden, heads=heads, layers=2), plain)
    # opt_level 0: only the Python fusions (the onnxruntime pass before them wants torch).
    optimized = optimize_model(str(plain), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
    optimized.save_model_to_file(str(fused))
    kinds = {node.op_type for node in onnx.load(fused).graph.node if node.domain == MS}
    assert {"Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu"} <= kinds, kinds

    mask = np.ones((3, seq), np.int64)
    mask[0, 7:] = 0
    mask[2, 3:] = 0
    feeds = {
        "input_ids": rng.integers(0, 40, (3, seq)).astype(np.int64),
        "token_type_ids": rng.integers(0, 2, (3, seq)).astype(np.int64),
        "attention_mask": mask,
    }
    want = ort.InferenceSession(str(fused), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = onnxpy.InferenceSession(str(fused)).run(None, feeds)[0]
    unfused = onnxpy.InferenceSession(str(plain)).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(got, unfused, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("opset", [14, 17])
@pytest.mark.parametrize("n_out", [1, 3])
def test_layer_normalization_below_opset_17_runs_as_in_onnxruntime(
    rng: np.random.Generator, opset: int, n_out: int
) -> None:
    # onnxruntime registers its own ai.onnx LayerNormalization-1 and its optimizer writes it into
    # models below opset 17, where onnx has none: onnxpy refused such models.
    x, scale, bias = _rand(rng, 2, 5, 16), _rand(rng, 16), _rand(rng, 16)
    _compare("LayerNormalization", {"x": x, "s": scale, "b": bias}, n_out, domain="", opset=opset, epsilon=1e-6)
