"""onnxruntime's com.microsoft contrib kernels (onnxpy/ops/contrib/) on the fake GPU.

Each case is a one-node model run twice on the device provider: with every input fed (all on the
device) and with only the first input fed and the others initializers (so inputs a kernel reads
on the host, such as attention masks and sequence lengths, stay in host memory). Its outputs
must match the CPU provider's, the node must run where expected (on the device, or on the CPU
for element types CuPy cannot hold), and no device work may escape the provider's stream scope.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxpy as ort
from onnxpy.ops import registry
from tests.ops.test_contrib_attention import GQA_CASES, MASKS, _gqa_feeds, _q_attention_feeds
from tests.ops.test_contrib_fused import _lstm_consts

from . import fake_device
from .fake_device import FakeArray

FAKE = fake_device.NAME
MS = "com.microsoft"
RNG = np.random.default_rng(29)


@dataclass
class Case:
    op_type: str
    inputs: dict[str, Any]  # in the node's input order; None: an omitted optional input
    attrs: dict[str, Any] = field(default_factory=dict)
    n_out: int = 1
    domain: str = MS
    opset: int = 21
    device: str = fake_device.DEVICE  # where the node must run


def _model(case: Case, fed: set[str]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    names, vis, feeds, inits = [], [], {}, []
    for name, value in case.inputs.items():
        names.append("" if value is None else name)
        if value is None:
            continue
        if name in fed:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            vis.append(helper.make_tensor_value_info(name, elem, value.shape))
            feeds[name] = value
        else:
            inits.append(numpy_helper.from_array(value, name))
    while names and names[-1] == "":
        names.pop()
    outs = [f"y{i}" for i in range(case.n_out)]
    node = helper.make_node(case.op_type, names, outs, domain=case.domain, **case.attrs)
    graph = helper.make_graph(
        [node], case.op_type, vis, [helper.make_empty_tensor_value_info(n) for n in outs], initializer=inits
    )
    opsets = [helper.make_opsetid("", case.opset), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model, feeds


# -- data ----------------------------------------------------------------------------------------


def _f(*shape: int, dtype: Any = np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def _i(dt: Any, *shape: int) -> np.ndarray:
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max + 1, shape).astype(dt)


def _s(value: float) -> np.ndarray:
    return np.array(value, np.float32)


def _z(dt: Any, value: int) -> np.ndarray:
    return np.array(value, dt)


def _quant_cases() -> dict[str, Case]:
    u8, i8 = np.uint8, np.int8
    q = {}
    binary = dict(a=_i(u8, 4, 5, 6), sa=_s(0.05), za=_z(u8, 128), b=_i(u8, 5, 1), sb=_s(0.03), zb=_z(u8, 120))
    q["qlinear_add"] = Case("QLinearAdd", {**binary, "sc": _s(0.08), "zc": _z(u8, 125)})
    binary = dict(a=_i(i8, 3, 8), sa=_s(0.05), za=_z(i8, 3), b=_i(i8, 8), sb=_s(0.03), zb=_z(i8, -2))
    q["qlinear_add_omitted_zero_points"] = Case(
        "QLinearAdd", dict(a=_i(i8, 3, 8), sa=_s(0.05), za=None, b=_i(i8, 8), sb=_s(0.03), zb=None, sc=_s(0.07))
    )
    q["qlinear_mul"] = Case("QLinearMul", {**binary, "sc": _s(0.05 * 0.03 * 40), "zc": _z(i8, 1)})
    unary = dict(x=_i(u8, 4, 64), sx=_s(0.06), zx=_z(u8, 131))
    q["qlinear_sigmoid"] = Case("QLinearSigmoid", {**unary, "sy": _s(1 / 256), "zy": _z(u8, 0)})
    q["qlinear_leaky_relu"] = Case("QLinearLeakyRelu", {**unary, "sy": _s(0.05), "zy": _z(u8, 128)}, {"alpha": 0.3})
    pool = dict(x=_i(i8, 2, 4, 9, 11), sx=_s(0.03), zx=_z(i8, 2), sy=_s(0.02), zy=_z(i8, -1))
    q["qlinear_average_pool"] = Case(
        "QLinearAveragePool", pool, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 2]}
    )
    q["qlinear_average_pool_nhwc"] = Case(
        "QLinearAveragePool", pool, {"kernel_shape": [2, 2], "strides": [2, 2], "channels_last": 1}
    )
    q["qlinear_global_average_pool"] = Case("QLinearGlobalAveragePool", pool, {"channels_last": 1})
    q["qlinear_concat"] = Case(
        "QLinearConcat",
        dict(sy=_s(0.04), zy=_z(u8, 120), x1=_i(u8, 2, 3, 5), s1=_s(0.02), z1=_z(u8, 100))
        | dict(x2=_i(u8, 2, 4, 5), s2=_s(0.04), z2=_z(u8, 120), x3=_i(u8, 2, 1, 5), s3=_s(0.07), z3=_z(u8, 130)),
        {"axis": 1},
    )
    soft = dict(x=_i(i8, 2, 5, 7), sx=_s(0.05), zx=_z(i8, 4), sy=_s(1 / 256), zy=_z(i8, -128))
    q["qlinear_softmax"] = Case("QLinearSoftmax", soft, {"axis": -1, "opset": 13})
    q["qlinear_softmax_opset11"] = Case("QLinearSoftmax", soft, {"axis": 1, "opset": 11})
    gemm = dict(a=_i(u8, 7, 40), sa=_s(0.02), za=_z(u8, 130), b=_i(i8, 40, 6), sb=_s(0.004), zb=_z(i8, 3))
    q["qgemm_quantized"] = Case(
        "QGemm", {**gemm, "c": _i(np.int16, 6).astype(np.int32), "sy": _s(0.05), "zy": _z(u8, 128)}, {"alpha": 0.7}
    )
    per_col = dict(sb=RNG.uniform(0.001, 0.01, 6).astype(np.float32), zb=_i(i8, 6))
    q["qgemm_float"] = Case(
        "QGemm", {**gemm, **per_col, "a": _i(u8, 40, 7), "b": _i(i8, 6, 40)}, {"transA": 1, "transB": 1}
    )
    x = _f(3, 4, 5, scale=50.0)
    q["quantize_linear_int16"] = Case(
        "QuantizeLinear", dict(x=x, s=RNG.uniform(0.01, 0.1, 4).astype(np.float32), z=_i(np.int16, 4)), {"axis": 1}
    )
    q["quantize_linear_default_zero_point"] = Case("QuantizeLinear", dict(x=x, s=_s(0.5)))
    q["dequantize_linear_uint16"] = Case(
        "DequantizeLinear", dict(q=_i(np.uint16, 3, 4, 5), s=np.array(0.01, np.float16), z=_z(np.uint16, 30000))
    )
    # 4-bit values stay on the host (CuPy has no int4): the node falls back to the CPU.
    q["dequantize_linear_int4"] = Case(
        "DequantizeLinear",
        dict(q=RNG.integers(-8, 8, (3, 4)).astype(ml_dtypes.int4), s=_s(0.3), z=np.array(1, ml_dtypes.int4)),
        device="cpu",
    )
    a = _f(2, 3, 33)
    b, sb, zb = _i(i8, 33, 5), RNG.uniform(0.001, 0.01, 5).astype(np.float32), _i(i8, 5)
    q["dynamic_quantize_matmul"] = Case("DynamicQuantizeMatMul", dict(a=a, b=b, sb=sb, zb=zb, bias=_f(5)))
    q["matmul_integer_to_float"] = Case(
        "MatMulIntegerToFloat", dict(a=_i(i8, 7, 33), b=b, sa=_s(0.03), sb=sb, za=_z(i8, 2), zb=zb, bias=_f(5))
    )
    k, n, block = 50, 6, 16
    blocks = -(-k // block)
    for bits, zp in ((4, "packed"), (2, None), (8, "float")):
        inputs = dict(
            a=_f(3, k),
            b=RNG.integers(0, 256, (n, blocks, block * bits // 8)).astype(np.uint8),
            s=RNG.uniform(0, 0.1, (n, blocks)).astype(np.float32),
            z=None,
        )
        if zp == "packed":
            inputs["z"] = RNG.integers(0, 256, (n, -(-blocks * bits // 8))).astype(np.uint8)
        elif zp == "float":
            inputs["z"] = RNG.uniform(0, 1 << bits, (n, blocks)).astype(np.float32)
        inputs.update(g_idx=None, bias=_f(n))
        q[f"matmul_{bits}bits"] = Case("MatMulNBits", inputs, dict(K=k, N=n, bits=bits, block_size=block))
    where = dict(x=_i(u8, 5, 6), sx=_s(0.03), zx=_z(u8, 120), y=_i(u8, 4, 5, 1), sy=_s(0.05), zy=_z(u8, 130))
    q["qlinear_where"] = Case(
        "QLinearWhere", {"c": RNG.random((4, 1, 6)) > 0.5, **where, "sz": _s(0.04), "zz": _z(u8, 125)}
    )
    q["qlinear_reduce_mean"] = Case(
        "QLinearReduceMean",
        dict(x=_i(i8, 3, 4, 50), sx=_s(0.02), zx=_z(i8, 5), sy=_s(0.01), zy=_z(i8, -3)),
        {"axes": [0, -1], "keepdims": 0},
    )
    return q


def _transformer_cases() -> dict[str, Case]:
    t = {}
    x, bias = _f(2, 5, 16, scale=3.0), _f(16)
    t["gelu"] = Case("Gelu", {"X": x})
    t["bias_gelu"] = Case("BiasGelu", {"A": x, "B": bias})
    t["fast_gelu_float16"] = Case("FastGelu", {"X": x.astype(np.float16), "bias": bias.astype(np.float16)})
    t["quick_gelu"] = Case("QuickGelu", {"X": x}, {"alpha": 1.25})
    t["bias_split_gelu"] = Case("BiasSplitGelu", {"X": x, "bias": bias})
    t["bias_add"] = Case("BiasAdd", {"X": x, "bias": bias, "skip": _f(2, 5, 16)})
    t["gemm_fast_gelu"] = Case("GemmFastGelu", {"X": x, "W": _f(16, 5), "bias": _f(5)})
    t["fused_matmul"] = Case(
        "FusedMatMul",
        {"A": _f(2, 3, 4, 5), "B": _f(6, 3, 4, 2)},
        {"transBatchA": 1, "transA": 1, "transBatchB": 1, "transB": 1, "alpha": 2.0},
    )
    ln = {"input": _f(2, 5, 32), "skip": _f(1, 5, 32), "gamma": _f(32), "beta": _f(32), "bias": _f(32)}
    t["skip_layer_norm"] = Case("SkipLayerNormalization", ln, {"epsilon": 1e-3}, n_out=4)
    ln = {"input": ln["input"], "skip": ln["skip"], "gamma": ln["gamma"], "bias": ln["bias"]}
    t["skip_simplified_layer_norm"] = Case("SkipSimplifiedLayerNormalization", ln, n_out=4)
    t["simplified_layer_norm"] = Case(
        "SimplifiedLayerNormalization", {"X": _f(2, 3, 12), "scale": _f(12)}, n_out=2, domain=""
    )
    t["layer_norm_opset14"] = Case(
        "LayerNormalization", {"X": _f(2, 3, 12), "Scale": _f(12), "B": _f(12)}, n_out=3, domain="", opset=14
    )
    b, s, h = 3, 6, 16
    mask = np.ones((b, s), np.int32)
    mask[0, 4:] = 0
    embed = {
        "input_ids": RNG.integers(0, 20, (b, s)).astype(np.int32),
        "segment_ids": RNG.integers(0, 2, (b, s)).astype(np.int32),
        "word_embedding": _f(20, h),
        "position_embedding": _f(8, h),
        "segment_embedding": _f(2, h),
        "gamma": _f(h),
        "beta": _f(h),
        "mask": mask,
    }
    t["embed_layer_norm"] = Case("EmbedLayerNormalization", embed, n_out=3)
    embed = {**embed, "segment_ids": None, "segment_embedding": None, "mask": None}
    embed["position_ids"] = RNG.integers(0, 8, (1, s)).astype(np.int32)
    t["embed_layer_norm_position_ids"] = Case("EmbedLayerNormalization", embed, n_out=3)
    att = {"input": _f(2, 5, 12), "weights": _f(12, 24, scale=0.5), "bias": _f(24)}
    masks = {
        "lengths": np.array([3, 5], np.int32),
        "ends_starts": np.array([4, 5, 1, 0], np.int32),
        "keys": (RNG.random((2, 5)) > 0.3).astype(np.int32),
        "3d": RNG.integers(0, 2, (2, 5, 5)).astype(np.int32),
    }
    for what, m in masks.items():
        t[f"attention_mask_{what}"] = Case("Attention", {**att, "mask_index": m}, {"num_heads": 2, "unidirectional": 1})
    t["attention_bias"] = Case(
        "Attention", {**att, "mask_index": None, "past": None, "attention_bias": _f(1, 2, 5, 5)}, {"num_heads": 2}
    )
    past_mask = np.ones((2, 8), np.int32)
    past_mask[1, 1] = 0
    t["attention_past"] = Case(
        "Attention", {**att, "mask_index": past_mask, "past": _f(2, 2, 2, 3, 4)}, {"num_heads": 2}, n_out=2
    )
    q, kv = _f(2, 3, 8), _f(2, 5, 8)
    pad = np.ones((2, 5), np.int32)
    pad[0, 3:] = 0
    mha = {"query": q, "key": kv, "value": _f(2, 5, 12), "bias": _f(28), "key_padding_mask": pad}
    t["multi_head_attention"] = Case("MultiHeadAttention", mha, {"num_heads": 4}, n_out=3)
    mha = {"query": q, "key": _f(2, 3, 8), "value": _f(2, 3, 8), "bias": _f(24), "key_padding_mask": None}
    mha |= {"attention_bias": None, "past_key": _f(2, 2, 4, 4), "past_value": _f(2, 2, 4, 4)}
    t["multi_head_attention_past_causal"] = Case("MultiHeadAttention", mha, {"num_heads": 2, "unidirectional": 1}, 3)
    mha = {"query": q, "key": kv, "value": _f(2, 5, 8), "bias": None, "key_padding_mask": np.array([2, 5], np.int32)}
    t["multi_head_attention_lengths_bias"] = Case(
        "MultiHeadAttention", {**mha, "attention_bias": _f(2, 1, 3, 5)}, {"num_heads": 2, "scale": 0.2}
    )
    packed = _f(2, 4, 2, 3, 3)
    t["multi_head_attention_packed_qkv"] = Case("MultiHeadAttention", {"query": packed}, {"num_heads": 2})
    t["multi_head_attention_packed_kv"] = Case(
        "MultiHeadAttention",
        {"query": _f(2, 4, 6), "key": _f(2, 4, 2, 2, 3), "value": None, "bias": _f(18)},
        {"num_heads": 2},
    )
    angles = RNG.uniform(0, 6, (10, 4))
    rope = {"cos_cache": np.cos(angles).astype(np.float32), "sin_cache": np.sin(angles).astype(np.float32)}
    x3 = _f(2, 4, 24)
    t["rotary_embedding"] = Case(
        "RotaryEmbedding",
        {"input": x3, "position_ids": RNG.integers(0, 10, (2, 4)).astype(np.int64), **rope},
        {"interleaved": 1},
    )
    t["rotary_embedding_start"] = Case(
        "RotaryEmbedding", {"input": x3, "position_ids": np.array([3], np.int64), **rope}
    )
    return t


def _attention_cases() -> dict[str, Case]:
    a = {}
    for mask in (1, 3, 4):
        feeds = {**_q_attention_feeds(RNG, np.int8, True), "mask_index": MASKS[mask]}
        a[f"q_attention_mask{mask}"] = Case("QAttention", feeds, {"num_heads": 2, "unidirectional": 1})
    feeds = {**_q_attention_feeds(RNG, np.uint8, False), "past": _f(2, 2, 2, 3, 4)}
    a["q_attention_past"] = Case("QAttention", feeds, {"num_heads": 2}, n_out=2)
    u8 = np.uint8
    a["q_embed_layer_norm"] = Case(
        "QEmbedLayerNormalization",
        {
            "input_ids": RNG.integers(0, 11, (2, 5)).astype(np.int32),
            "segment_ids": RNG.integers(0, 2, (2, 5)).astype(np.int32),
            "word_embedding_quant": _i(u8, 11, 8),
            "position_embedding_quant": _i(u8, 7, 8),
            "segment_embedding": _i(u8, 2, 8),
            "gamma_quant": _i(u8, 8),
            "beta_quant": _i(u8, 8),
            "mask": np.array([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1]], np.int32),
            "word_embedding_scale": _s(0.01),
            "position_embedding_scale": _s(0.02),
            "segment_embedding_scale": _s(0.03),
            "gamma_scale": _s(0.01),
            "beta_scale": _s(0.005),
            "word_embedding_zero_point": _z(u8, 7),
            "position_embedding_zero_point": _z(u8, 100),
            "segment_embedding_zero_point": _z(u8, 7),
            "gamma_zero_point": _z(u8, 0),
            "beta_zero_point": _z(u8, 7),
        },
        {"epsilon": 1e-5},
        n_out=2,
    )
    gqa = {"num_heads": 4, "kv_num_heads": 2}
    for case in ("prompt_padded", "decode_shared_buffer", "chunk_after_past"):
        b, s, past, seqlens, total = GQA_CASES[case]
        feeds = _gqa_feeds(RNG, b, s, past, seqlens, total, packed=case == "decode_shared_buffer")
        a[f"gqa_{case}"] = Case("GroupQueryAttention", feeds, gqa, n_out=3)
    b, s, past, seqlens, total = GQA_CASES["decode"]
    feeds = _gqa_feeds(RNG, b, s, past, seqlens, total)
    a["gqa_smooth_softmax"] = Case("GroupQueryAttention", feeds, {**gqa, "smooth_softmax": 1, "scale": 0.7})
    b, s, past, seqlens, total = GQA_CASES["prompt"]
    feeds = _gqa_feeds(RNG, b, s, past, seqlens, total, hd=16, rotary=True, position_ids=[[3, 4, 5, 6, 7]] * 2)
    a["gqa_rotary_prompt"] = Case("GroupQueryAttention", feeds, {**gqa, "do_rotary": 1}, n_out=3)
    b, s, past, seqlens, total = GQA_CASES["decode"]
    feeds = _gqa_feeds(RNG, b, s, past, seqlens, total, hd=16, rotary=True, bias=True, sink=True)
    a["gqa_rotary_bias_sink"] = Case(
        "GroupQueryAttention", feeds, {**gqa, "do_rotary": 1, "local_window_size": 3, "softcap": 1.5}, n_out=3
    )
    return a


def _fused_cases() -> dict[str, Case]:
    f = {}
    x, w, b = _f(2, 3, 8, 7), _f(4, 3, 3, 3, scale=0.3), _f(4)
    conv = {"strides": [2, 1], "pads": [1, 1, 0, 1]}
    z = _f(2, 4, 4, 7)
    f["fused_conv"] = Case(
        "FusedConv", {"X": x, "W": w, "B": b, "Z": z}, {**conv, "activation": "Clip", "activation_params": [-1.0, 1.0]}
    )
    f["nhwc_fused_conv"] = Case(
        "NhwcFusedConv",
        {"X": x.transpose(0, 2, 3, 1).copy(), "W": w, "B": b, "Z": z.transpose(0, 2, 3, 1).copy()},
        {**conv, "activation": "HardSigmoid", "activation_params": [0.3, 0.6]},
    )
    f["fused_gemm"] = Case(
        "FusedGemm",
        {"A": _f(6, 5), "B": _f(7, 6), "C": _f(5, 1)},
        dict(activation="Selu", activation_alpha=1.67, activation_gamma=1.05, alpha=0.5, beta=2.0, transA=1, transB=1),
    )
    f["nhwc_max_pool"] = Case(
        "NhwcMaxPool",
        {"x": _i(np.int8, 2, 9, 8, 5)},
        {"kernel_shape": [2, 3], "pads": [1, 0, 1, 2], "dilations": [1, 2]},
    )
    m, c = 6, 4
    f["qlinear_conv_nhwc"] = Case(
        "QLinearConv",
        {
            "x": _i(np.uint8, 2, 7, 9, c),
            "x_scale": _s(0.02),
            "x_zero_point": _z(np.uint8, 5),
            "w": _i(np.int8, m, c // 2, 3, 3),
            "w_scale": RNG.uniform(0.002, 0.01, m).astype(np.float32),
            "w_zero_point": np.zeros(m, np.int8),
            "y_scale": _s(0.05),
            "y_zero_point": _z(np.uint8, 120),
            "B": RNG.integers(-500, 500, m).astype(np.int32),
        },
        {"channels_last": 1, "group": 2, "strides": [2, 1], "pads": [1, 1, 0, 1]},
    )
    consts = _lstm_consts(2, 6, 5, True, np.uint8)
    lstm = {"X": _f(7, 3, 6), "W": consts["W"], "R": consts["R"], "B": consts["B"]}
    lstm |= {"sequence_lens": np.array([7, 2, 5], np.int32), "initial_h": _f(2, 3, 5), "initial_c": _f(2, 3, 5)}
    lstm |= {
        "P": _f(2, 15, scale=0.2),
        **{k: consts[k] for k in ("W_scale", "W_zero_point", "R_scale", "R_zero_point")},
    }
    f["dynamic_quantize_lstm"] = Case(
        "DynamicQuantizeLSTM", lstm, {"hidden_size": 5, "direction": "bidirectional", "clip": 3.0}, n_out=3
    )
    return f


CASES = {**_quant_cases(), **_transformer_cases(), **_attention_cases(), **_fused_cases()}


def test_every_contrib_kernel_has_a_case() -> None:
    covered = {(c.domain, c.op_type) for c in CASES.values()}
    contrib = {key for key, defs in registry._REGISTRY.items() if any("ops.contrib" in d.fn.__module__ for d in defs)}
    assert contrib <= covered, sorted(contrib - covered)


# -- the check -----------------------------------------------------------------------------------


def _session(model: onnx.ModelProto, providers: list[str]) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the contrib node as written
    return ort.InferenceSession(model.SerializeToString(), so, providers=providers)


def _assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    if want.dtype.kind == "f":
        tol = 2e-3 if want.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64), err_msg=what)


@pytest.mark.parametrize("fed", ["all_fed", "constants"])
@pytest.mark.parametrize("name", list(CASES))
def test_contrib_kernel_on_the_fake_device_matches_the_cpu(fake_gpu: type, name: str, fed: str) -> None:
    case = CASES[name]
    present = [k for k, v in case.inputs.items() if v is not None]
    model, feeds = _model(case, set(present) if fed == "all_fed" else {present[0]})
    want = _session(model, ["CPUExecutionProvider"]).run(None, feeds)

    sess = _session(model, [FAKE])
    c = sess._compiled
    layout = [(n.op_type, p.device_type) for n, p in zip(c.graph.nodes, c.placement.providers)]
    assert (case.op_type, case.device) in layout, layout
    if case.device == fake_device.DEVICE:
        assert not c.placement.fallback and not c.placement.copies, (c.placement.fallback, c.placement.copies)
        # Initializers the kernel reads on the host stay in host memory; the others are uploaded.
        opdef = registry.resolve(case.domain, case.op_type, case.opset if not case.domain else 1, FAKE)
        (node,) = c.graph.nodes
        for idx, inp in enumerate(node.inputs):
            if inp in c.constants:
                on_host = idx in opdef.host_inputs
                assert isinstance(c.constants[inp], np.ndarray if on_host else FakeArray), (inp, idx)
    else:
        assert any(case.op_type in why for why in c.placement.fallback), c.placement.fallback

    stray = fake_gpu.outside_scope
    got = sess.run(None, feeds)
    assert fake_gpu.outside_scope == stray, "device work ran outside the provider's stream scope"
    assert len(got) == len(want) == case.n_out
    for i, (g, w) in enumerate(zip(got, want)):
        _assert_same(g, w, f"{name} output {i}")
