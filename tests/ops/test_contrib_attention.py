"""onnxpy's com.microsoft quantized and generative attention kernels (ops/contrib/attention.py)
against onnxruntime: one-node models on random data, and a BERT-like model fused by onnxruntime's
transformer optimizer then quantized by its quantize_dynamic (QAttention, QEmbedLayerNormalization).

Where the documentation calls a value unspecified (GroupQueryAttention's cache rows past a
sequence's length) onnxpy writes what onnxruntime does, so whole outputs are compared."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from tests.helpers import CONTRIB_ORACLE, CONTRIB_SKIP_REASON, onnxruntime_older_than
from tests.ops.test_contrib_transformer import _bert_like

pytestmark = pytest.mark.skipif(onnxruntime_older_than(CONTRIB_ORACLE), reason=CONTRIB_SKIP_REASON)

MS = "com.microsoft"
ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
}
TOL = {np.dtype(np.float32): (1e-5, 2e-6), np.dtype(np.float16): (2e-3, 2e-3)}


def _model(op_type: str, feeds: dict[str, Any], n_out: int, attrs: dict[str, Any]) -> bytes:
    names = list(feeds)
    while names and feeds[names[-1]] is None:
        names.pop()
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, [n if feeds[n] is not None else "" for n in names], outs, domain=MS, **attrs)
    vi = [helper.make_tensor_value_info(n, ELEM[v.dtype], list(v.shape)) for n, v in feeds.items() if v is not None]
    graph = helper.make_graph([node], "g", vi, [helper.make_empty_tensor_value_info(n) for n in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model.SerializeToString()


def _compare(op_type: str, feeds: dict[str, Any], n_out: int = 1, tol: Any = None, **attrs: Any) -> list[Any]:
    data = _model(op_type, feeds, n_out, attrs)
    present = {k: v for k, v in feeds.items() if v is not None}
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, present)
    got = onnxpy.InferenceSession(data).run(None, present)
    assert len(want) == len(got) == n_out
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        rtol, atol = tol or TOL.get(w.dtype, (0, 0))
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
    return got


def _ours(op_type: str, feeds: dict[str, Any], n_out: int = 1, **attrs: Any) -> Any:
    data = _model(op_type, feeds, n_out, attrs)
    return onnxpy.InferenceSession(data).run(None, {k: v for k, v in feeds.items() if v is not None})


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(2024)


def _ints(rng: np.random.Generator, dtype: Any, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


# -- QAttention ----------------------------------------------------------------------------------


def _q_attention_feeds(
    rng: np.random.Generator, w_dtype: Any, per_column: bool, b: int = 2, s: int = 4, hin: int = 12, d: int = 8
) -> dict[str, Any]:
    ws = rng.uniform(1e-3, 1e-2, 3 * d).astype(np.float32) if per_column else np.array(0.004, np.float32)
    return {
        "input": _ints(rng, np.uint8, b, s, hin),
        "weight": _ints(rng, w_dtype, hin, 3 * d),
        "bias": rng.standard_normal(3 * d).astype(np.float32),
        "input_scale": np.array(0.02, np.float32),
        "weight_scale": ws,
        "mask_index": None,
        "input_zero_point": np.array(131, np.uint8),
        "weight_zero_point": _ints(rng, w_dtype, *ws.shape),
    }


# Masks of batch 2 and sequence 4: right-padding lengths, ends and starts, key masks, 3-D masks.
MASKS = [
    None,
    np.array([3, 2], np.int32),
    np.array([3, 4, 1, 0], np.int32),
    np.array([[1, 1, 0, 1], [1, 0, 1, 1]], np.int32),
    np.array([[[1, 0, 1, 1], [1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 0]]] * 2, np.int32),
]


@pytest.mark.parametrize("w_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("mask", range(len(MASKS)))
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_q_attention(rng: np.random.Generator, w_dtype: Any, per_column: bool, mask: int, unidirectional: int) -> None:
    feeds = _q_attention_feeds(rng, w_dtype, per_column)
    feeds["mask_index"] = MASKS[mask]
    _compare("QAttention", feeds, num_heads=2, unidirectional=unidirectional)


@pytest.mark.parametrize("past_len", [0, 3])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_q_attention_past_present(rng: np.random.Generator, past_len: int, unidirectional: int) -> None:
    feeds = _q_attention_feeds(rng, np.int8, True)
    feeds["mask_index"] = np.ones((2, 4 + past_len), np.int32)
    feeds["mask_index"][1, :2] = 0
    feeds["past"] = rng.standard_normal((2, 2, 2, past_len, 4)).astype(np.float32)
    _compare("QAttention", feeds, 2, num_heads=2, unidirectional=unidirectional)
    # No zero points (0 of the input's types), a custom scale, no mask.
    feeds.update(mask_index=None, input_zero_point=None, weight_zero_point=None)
    _compare("QAttention", feeds, 2, num_heads=2, unidirectional=unidirectional, scale=0.3)


def test_q_attention_float16(rng: np.random.Generator) -> None:
    feeds = _q_attention_feeds(rng, np.uint8, False)
    for name in ("bias", "input_scale", "weight_scale"):
        feeds[name] = feeds[name].astype(np.float16)
    feeds["mask_index"] = np.array([4, 2], np.int32)
    _compare("QAttention", feeds, num_heads=4)


# -- QEmbedLayerNormalization ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("segments", [True, False])
def test_q_embed_layer_norm(rng: np.random.Generator, dtype: Any, segments: bool) -> None:
    vocab, hidden, b, s = 11, 8, 2, 5
    zp = np.array(7, dtype)
    feeds = {
        "input_ids": rng.integers(0, vocab, (b, s)).astype(np.int32),
        "segment_ids": rng.integers(0, 2, (b, s)).astype(np.int32),
        "word_embedding_quant": _ints(rng, dtype, vocab, hidden),
        "position_embedding_quant": _ints(rng, dtype, 7, hidden),
        "segment_embedding": _ints(rng, dtype, 2, hidden),
        "gamma_quant": _ints(rng, dtype, hidden),
        "beta_quant": _ints(rng, dtype, hidden),
        # A mask with a hole: mask_index counts the ones (3), not the first zero.
        "mask": np.array([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1]], np.int32),
        "word_embedding_scale": np.array(0.01, np.float32),
        "position_embedding_scale": np.array(0.02, np.float32),
        "segment_embedding_scale": np.array(0.03, np.float32),
        "gamma_scale": np.array(0.01, np.float32),
        "beta_scale": np.array(0.005, np.float32),
        "word_embedding_zero_point": zp,
        "position_embedding_zero_point": np.array(-3 if dtype == np.int8 else 100, dtype),
        "segment_embedding_zero_point": zp,
        "gamma_zero_point": np.array(0, dtype),
        "beta_zero_point": zp,
    }
    if not segments:
        for name in ("segment_ids", "segment_embedding", "segment_embedding_scale", "segment_embedding_zero_point"):
            feeds[name] = None
        feeds["mask"] = None
    got = _compare("QEmbedLayerNormalization", feeds, 2, epsilon=1e-5)
    assert got[1].tolist() == ([3, 5] if segments else [0, 0])


# -- GroupQueryAttention -------------------------------------------------------------------------


def _gqa_feeds(
    rng: np.random.Generator,
    b: int,
    s: int,
    past: int | None,
    seqlens: list[int],
    total: int,
    *,
    heads: tuple[int, int] = (4, 2),
    hd: int = 8,
    packed: bool = False,
    rotary: bool = False,
    position_ids: Any = None,
    bias: bool = False,
    sink: bool = False,
    dtype: Any = np.float32,
) -> dict[str, Any]:
    n, n_kv = heads

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    q, k, v = r(b, s, n * hd), r(b, s, n_kv * hd), r(b, s, n_kv * hd)
    feeds: dict[str, Any] = {"query": np.concatenate([q, k, v], -1), "key": None, "value": None}
    if not packed:
        feeds.update(query=q, key=k, value=v)
    feeds["past_key"] = None if past is None else r(b, n_kv, past, hd)
    feeds["past_value"] = None if past is None else r(b, n_kv, past, hd)
    feeds["seqlens_k"] = np.array(seqlens, np.int32)
    feeds["total_sequence_length"] = np.array(total, np.int32)
    feeds["cos_cache"] = feeds["sin_cache"] = None
    if rotary:
        angles = np.arange(32)[:, None] * 0.1 ** (np.arange(hd // 2) / (hd // 2))[None]
        feeds["cos_cache"], feeds["sin_cache"] = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    feeds["position_ids"] = None if position_ids is None else np.asarray(position_ids, np.int64)
    feeds["attention_bias"] = r(b, 1, s, total) if bias else None
    feeds["head_sink"] = r(n) if sink else None
    return feeds


# (batch, seq, past buffer, seqlens_k, total_sequence_length): first prompts (one right-padded),
# an empty past, decoding with per-sequence lengths, a shared (max-length) buffer, several new
# tokens after a past, and a total below the past buffer plus the new tokens.
GQA_CASES = {
    "prompt": (2, 5, None, [4, 4], 5),
    "prompt_padded": (2, 5, None, [4, 2], 5),
    "prompt_empty_past": (2, 5, 0, [4, 2], 5),
    "decode": (2, 1, 4, [4, 2], 5),
    "decode_shared_buffer": (2, 1, 8, [4, 2], 5),
    "decode_short_total": (2, 1, 4, [3, 2], 4),
    "chunk_after_past": (1, 3, 4, [6], 7),
    "chunk_shared_buffer": (1, 3, 10, [6], 7),
}


@pytest.mark.parametrize("case", list(GQA_CASES))
@pytest.mark.parametrize("packed", [False, True])
def test_gqa_cache_layouts(rng: np.random.Generator, case: str, packed: bool) -> None:
    b, s, past, seqlens, total = GQA_CASES[case]
    _compare(
        "GroupQueryAttention",
        _gqa_feeds(rng, b, s, past, seqlens, total, packed=packed),
        3,
        num_heads=4,
        kv_num_heads=2,
    )


@pytest.mark.parametrize(
    "case, attrs",
    [
        ("prompt_padded", {"causal": 0}),
        ("prompt", {"local_window_size": 2}),
        ("decode", {"local_window_size": 1}),
        ("decode", {"local_window_size": 3}),
        ("prompt", {"softcap": 1.5}),
        ("decode", {"smooth_softmax": 1}),
        ("decode", {"scale": 0.7}),
        ("chunk_after_past", {"softcap": 2.0, "local_window_size": 2}),
    ],
)
def test_gqa_attributes(rng: np.random.Generator, case: str, attrs: dict[str, Any]) -> None:
    b, s, past, seqlens, total = GQA_CASES[case]
    _compare(
        "GroupQueryAttention", _gqa_feeds(rng, b, s, past, seqlens, total), 3, num_heads=4, kv_num_heads=2, **attrs
    )


@pytest.mark.parametrize("case", ["prompt", "decode"])
def test_gqa_bias_sink_heads(rng: np.random.Generator, case: str) -> None:
    b, s, past, seqlens, total = GQA_CASES[case]
    feeds = _gqa_feeds(rng, b, s, past, seqlens, total, bias=True, sink=True)
    _compare("GroupQueryAttention", feeds, 3, num_heads=4, kv_num_heads=2)
    # As many KV heads as query heads (plain MHA), and one shared KV head (MQA); no past, one output.
    for heads in ((2, 2), (4, 1)):
        feeds = _gqa_feeds(rng, b, s, None, [s - 1] * b, s, heads=heads)
        _compare("GroupQueryAttention", feeds, 1, num_heads=heads[0], kv_num_heads=heads[1])


@pytest.mark.parametrize(
    "case, position_ids",
    [
        ("prompt", None),
        # A first prompt counts up from position_ids' first element, for every sequence.
        ("prompt", [[3, 4, 5, 6, 7], [1, 5, 2, 6, 0]]),
        ("prompt_padded", [[2, 3, 4, 5, 6], [2, 3, 4, 0, 0]]),
        ("decode", None),
        ("decode", [[9], [3]]),
        ("chunk_after_past", [[9, 3, 7]]),
        ("chunk_shared_buffer", None),
    ],
)
@pytest.mark.parametrize("interleaved", [0, 1])
def test_gqa_rotary(rng: np.random.Generator, case: str, position_ids: Any, interleaved: int) -> None:
    b, s, past, seqlens, total = GQA_CASES[case]
    # onnxruntime's CPU kernel wants a head size that is a multiple of 16 for rotary.
    feeds = _gqa_feeds(rng, b, s, past, seqlens, total, hd=16, rotary=True, position_ids=position_ids)
    _compare("GroupQueryAttention", feeds, 3, num_heads=4, kv_num_heads=2, do_rotary=1, rotary_interleaved=interleaved)


@pytest.mark.parametrize("case", ["prompt_padded", "decode"])
def test_gqa_float16(rng: np.random.Generator, case: str) -> None:
    b, s, past, seqlens, total = GQA_CASES[case]
    feeds = _gqa_feeds(rng, b, s, past, seqlens, total, hd=16, rotary=True, dtype=np.float16)
    _compare("GroupQueryAttention", feeds, 3, num_heads=4, kv_num_heads=2, do_rotary=1)


def test_bad_inputs_raise_value_errors(rng: np.random.Generator) -> None:
    qa = _q_attention_feeds(rng, np.uint8, False)
    gqa = _gqa_feeds(rng, *GQA_CASES["decode"])
    heads = {"num_heads": 4, "kv_num_heads": 2}
    cases = [
        ("QAttention", dict(qa, bias=qa["bias"][:-1]), {"num_heads": 2}, "bias has shape"),
        ("QAttention", qa, {"num_heads": 3}, "not divisible by num_heads"),
        ("QAttention", dict(qa, mask_index=np.ones((3,), np.int32)), {"num_heads": 2}, "mask_index has shape"),
        ("GroupQueryAttention", dict(gqa, seqlens_k=np.array([4], np.int32)), heads, "seqlens_k has shape"),
        ("GroupQueryAttention", dict(gqa, total_sequence_length=np.array(3, np.int32)), heads, "total_sequence"),
        ("GroupQueryAttention", dict(gqa, past_key=gqa["past_key"][:, :1]), heads, "past_key has shape"),
        ("GroupQueryAttention", gqa, {"num_heads": 4, "kv_num_heads": 3}, "multiple of kv_num_heads"),
        ("GroupQueryAttention", dict(gqa, key=gqa["key"][..., :-1]), heads, "key has shape"),
    ]
    for op_type, feeds, attrs, what in cases:
        with pytest.raises(RuntimeError, match=what) as info:  # the session's error, from the kernel's
            _ours(op_type, feeds, 3 if op_type == "GroupQueryAttention" else 1, **attrs)
        assert isinstance(info.value.__cause__, ValueError), repr(info.value.__cause__)


# -- end to end: fused by onnxruntime's optimizer, quantized by its quantize_dynamic -------------


def test_bert_fused_and_dynamically_quantized(tmp_path: Any, rng: np.random.Generator) -> None:
    from onnxruntime.quantization import quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    hidden, heads, seq, vocab = 32, 4, 12, 40
    plain, fused, quantized = tmp_path / "bert.onnx", tmp_path / "fused.onnx", tmp_path / "quant.onnx"
    onnx.save(_bert_like(rng, vocab=vocab, seq=seq, hidden=hidden, heads=heads, layers=2), plain)
    # opt_level 0: only the Python fusions (the onnxruntime pass before them wants torch).
    optimize_model(str(plain), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0).save_model_to_file(
        str(fused)
    )
    # The fused contrib nodes have no shape inference: tell the quantizer their outputs are float.
    quantize_dynamic(str(fused), str(quantized), extra_options={"DefaultTensorType": TensorProto.FLOAT})
    kinds = {node.op_type for node in onnx.load(quantized).graph.node if node.domain == MS}
    assert {"QAttention", "QEmbedLayerNormalization"} <= kinds, kinds

    mask = np.ones((3, seq), np.int64)
    mask[0, 7:] = 0
    mask[2, 3:] = 0
    feeds = {
        "input_ids": rng.integers(0, vocab, (3, seq)).astype(np.int64),
        "token_type_ids": rng.integers(0, 2, (3, seq)).astype(np.int64),
        "attention_mask": mask,
    }
    want = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = onnxpy.InferenceSession(str(quantized)).run(None, feeds)[0]
    # Requantizing between layers can flip a rounding on a 1-ulp float difference: allow a step.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
