"""nn.py kernels against onnxruntime (numpy oracles where onnxruntime lacks the op or the type):
softmax family, Gemm/MatMul in half precision, the normalizations, LRN, Dropout, losses,
Attention, RotaryEmbedding, SwiGLU and CausalConvWithState."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from tests.helpers import skip_before_onnxruntime

ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
}


def _model(op_type: str, feeds: dict[str, np.ndarray | None], outs: dict[str, int], opset: int, **attrs: Any) -> bytes:
    names = list(feeds)
    while names and feeds[names[-1]] is None:
        names.pop()
    inputs = [n if feeds[n] is not None else "" for n in names]
    node = helper.make_node(op_type, inputs, list(outs), **attrs)
    vi = [helper.make_tensor_value_info(n, ELEM[v.dtype], list(v.shape)) for n, v in feeds.items() if v is not None]
    ov = [helper.make_tensor_value_info(n, e, None) for n, e in outs.items() if n]
    model = helper.make_model(helper.make_graph([node], "g", vi, ov), opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model.SerializeToString()


def _present(feeds: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    return {k: v for k, v in feeds.items() if v is not None}


def _outs(feeds: dict[str, np.ndarray | None], outs: dict[str, int] | None) -> dict[str, int]:
    return outs or {"Y": ELEM[next(v for v in feeds.values() if v is not None).dtype]}


def _ours(
    op_type: str, feeds: dict[str, np.ndarray | None], opset: int, outs: dict[str, int] | None = None, **attrs: Any
) -> list[np.ndarray]:
    data = _model(op_type, feeds, _outs(feeds, outs), opset, **attrs)
    return onnxpy.InferenceSession(data).run(None, _present(feeds))


def _both(
    op_type: str, feeds: dict[str, np.ndarray | None], opset: int, outs: dict[str, int] | None = None, **attrs: Any
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    data = _model(op_type, feeds, _outs(feeds, outs), opset, **attrs)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, _present(feeds))
    got = onnxpy.InferenceSession(data).run(None, _present(feeds))
    return got, want


def _same(got: list[np.ndarray], want: list[np.ndarray], tol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        if g.dtype.kind in "fV":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


# -- softmax family ------------------------------------------------------------------------------


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_softmax_axes_and_opsets(op_type: str, opset: int, axis: int) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 4, 5)) * 5).astype(np.float32)
    got, want = _both(op_type, {"X": x}, opset, axis=axis)
    _same(got, want)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_refuses_a_scalar(op_type: str, opset: int) -> None:
    # onnxruntime refuses at load (rank must be >= 1); onnxpy failed inside numpy at opset 13
    # and quietly returned a scalar before.
    x = np.array(1.5, np.float32)
    data = _model(op_type, {"X": x}, {"Y": TensorProto.FLOAT}, opset, axis=-1)
    with pytest.raises(Exception):  # noqa: PT011, B017 - the runtimes raise different types and words
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match=rf"{op_type}.*rank >= 1, got rank 0"):  # noqa: PT011
        onnxpy.InferenceSession(data).run(None, {"X": x})


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
def test_softmax_float16_and_large_values(op_type: str) -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 300)) * 4).astype(np.float16)
    x[0] += np.float16(6e4) - x[0].max()  # near the top of float16's range
    got, want = _both(op_type, {"X": x}, 13)
    _same(got, want, 3e-3)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("case", ["plain", "far_below", "masked", "inf", "nan"])
def test_large_softmax_runs_in_blocks_of_rows(monkeypatch: pytest.MonkeyPatch, case: str, op_type: str) -> None:
    """Large inputs run a block of rows at a time, each shifted by its block's maximum (here
    blocks of 4 rows of 60, so 9 blocks, the last short); a row far below its block's maximum
    is redone with its own shift, masked (-inf) entries give 0 (LogSoftmax: -inf), and +inf or
    NaN anywhere sends the whole array the general way, all as onnxruntime computes them."""
    from onnxpy.ops import nn as nn_ops

    monkeypatch.setattr(nn_ops, "_SOFTMAX_BLOCKED_MIN_VALUES", 0)
    monkeypatch.setattr(nn_ops, "_SOFTMAX_BLOCK_VALUES", 4 * 60)
    monkeypatch.setattr(nn_ops, "_SOFTMAX_SMALL_VALUES", 0)  # not the small-array path
    monkeypatch.setattr(nn_ops, "_LOG_SOFTMAX_ROWS_MIN_VALUES", 0)
    blocked: list[bool] = []
    real_rows = nn_ops._log_softmax_rows
    monkeypatch.setattr(nn_ops, "_log_softmax_rows", lambda v: blocked.append((y := real_rows(v)) is not None) or y)
    x = (np.random.default_rng(21).standard_normal((1, 3, 11, 60)) * 3).astype(np.float32)
    if case == "far_below":
        x[0, 1, 5] -= 300  # its sum under the block's shift would underflow to 0
    elif case == "masked":
        x[0, 2, 7, ::3] = -np.inf
        x[0, 0, 2, :] = -np.inf
        x[0, 0, 2, 4] = 1.0  # one live entry in an otherwise masked row
    elif case in ("inf", "nan"):
        x[0, 1, 3, 9] = np.inf if case == "inf" else np.nan
    got, want = _both(op_type, {"X": x}, 13)
    np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(want[0]))
    np.testing.assert_array_equal(np.isneginf(got[0]), np.isneginf(want[0]))
    np.testing.assert_allclose(np.nan_to_num(got[0]), np.nan_to_num(want[0]), rtol=1e-5, atol=1e-6)
    if op_type == "LogSoftmax":
        assert blocked == [case in ("plain", "far_below", "masked")]  # non-finite input: the general form
    elif case in ("plain", "far_below", "masked"):
        probs, nan_free = nn_ops._softmax_checked(np, x, 3, False)
        assert nan_free == (case != "far_below")  # a redone row might have been NaN: not proven
        np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)


def test_softmax_masked_row() -> None:
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0], [np.inf, 0.0, 1.0]], np.float32)
    got, want = _both("Softmax", {"X": x}, 13)
    assert np.isnan(got[0][0]).all() == np.isnan(want[0][0]).all()
    np.testing.assert_allclose(got[0][1], want[0][1], rtol=1e-6)


@pytest.mark.parametrize(
    "row",
    [
        "classifier",  # 1000 logits, one large
        "masked",  # some -inf: they get 0
        "all_masked",  # every value -inf: NaN, as onnxruntime
    ],
)
@pytest.mark.parametrize("opset,dtype", [(11, np.float32), (13, np.float32), (13, np.float64)])
def test_softmax_of_one_row(row: str, opset: int, dtype: Any) -> None:
    """A classifier's single row takes a five-call path of its own; its edge cases go the
    general way."""
    x = (np.random.default_rng(3).standard_normal((1, 1000)) * 3).astype(dtype)
    if row == "classifier":
        x[0, 7] = 40
    elif row == "masked":
        x[0, ::3] = -np.inf
    elif row == "all_masked":
        x[...] = -np.inf
    got, want = _both("Softmax", {"X": x}, opset, axis=1 if opset == 11 else -1)
    _same(got, want, 1e-6)


def test_softmax_empty() -> None:
    x = np.zeros((0, 4), np.float32)
    assert _ours("Softmax", {"X": x}, 13)[0].shape == (0, 4)


# -- Gemm / MatMul -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm(dtype: Any, trans_a: int, trans_b: int) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 7) if not trans_a else (7, 5)).astype(dtype)
    b = rng.standard_normal((7, 6) if not trans_b else (6, 7)).astype(dtype)
    c = rng.standard_normal((1, 6)).astype(dtype)
    feeds = {"A": a, "B": b, "C": c}
    got, want = _both("Gemm", feeds, 13, alpha=0.7, beta=1.3, transA=trans_a, transB=trans_b)
    _same(got, want, 5e-3 if dtype == np.float16 else 1e-5)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_matmul_half_keeps_dtype(dtype: Any) -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 3, 16, 32)).astype(dtype)
    b = rng.standard_normal((32, 8)).astype(dtype)
    (got,) = _ours("MatMul", {"A": a, "B": b}, 13)
    assert got.dtype == np.dtype(dtype)
    want = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=5e-2)


# -- BatchNormalization --------------------------------------------------------------------------


def _bn_feeds(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = np.float32, pdtype: Any = None) -> dict:
    c = shape[1]
    pdtype = pdtype or dtype
    return {
        "X": rng.standard_normal(shape).astype(dtype),
        "scale": rng.standard_normal(c).astype(pdtype),
        "B": rng.standard_normal(c).astype(pdtype),
        "mean": rng.standard_normal(c).astype(pdtype),
        "var": rng.random(c).astype(pdtype) + np.asarray(0.5, pdtype),
    }


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 2, 2)])
def test_batch_norm_inference(opset: int, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(5)
    got, want = _both("BatchNormalization", _bn_feeds(rng, shape), opset, epsilon=1e-3)
    _same(got, want, 1e-5)


def test_batch_norm_opset7_non_spatial() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 4)).astype(np.float32)
    p = {k: rng.standard_normal((2, 4)).astype(np.float32) for k in ("scale", "B", "mean")}
    p["var"] = rng.random((2, 4)).astype(np.float32) + 0.5
    (got,) = _ours("BatchNormalization", {"X": x, **p}, 7, spatial=0, epsilon=1e-4)
    want = (x - p["mean"]) / np.sqrt(p["var"] + 1e-4) * p["scale"] + p["B"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_batch_norm_training_mode() -> None:
    rng = np.random.default_rng(7)
    feeds = _bn_feeds(rng, (4, 3, 5, 2))
    outs = {"Y": TensorProto.FLOAT, "running_mean": TensorProto.FLOAT, "running_var": TensorProto.FLOAT}
    y, rm, rv = _ours("BatchNormalization", feeds, 15, outs=outs, training_mode=1, momentum=0.8, epsilon=1e-3)
    x = feeds["X"].astype(np.float64)
    m = x.mean(axis=(0, 2, 3))
    v = x.var(axis=(0, 2, 3))
    shape = (1, 3, 1, 1)
    want = (x - m.reshape(shape)) / np.sqrt(v.reshape(shape) + 1e-3) * feeds["scale"].reshape(shape) + feeds[
        "B"
    ].reshape(shape)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rm, feeds["mean"] * 0.8 + m * 0.2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, feeds["var"] * 0.8 + v * 0.2, rtol=1e-5, atol=1e-6)


def test_batch_norm_mixed_precision_opset15() -> None:
    rng = np.random.default_rng(8)
    feeds = _bn_feeds(rng, (2, 4, 3, 3), dtype=np.float16, pdtype=np.float32)
    (got,) = _ours("BatchNormalization", feeds, 15)
    assert got.dtype == np.float16
    x = feeds["X"].astype(np.float32)
    s = (1, 4, 1, 1)
    want = (x - feeds["mean"].reshape(s)) / np.sqrt(feeds["var"].reshape(s) + 1e-5) * feeds["scale"].reshape(s) + feeds[
        "B"
    ].reshape(s)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=3e-3, atol=3e-3)


# -- Instance / Group / Layer / RMS normalization ------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5), (1, 2, 3, 2, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_instance_norm(shape: tuple[int, ...], dtype: Any) -> None:
    rng = np.random.default_rng(9)
    feeds = {
        "input": (rng.standard_normal(shape) * 3 + 1).astype(dtype),
        "scale": rng.standard_normal(shape[1]).astype(dtype),
        "B": rng.standard_normal(shape[1]).astype(dtype),
    }
    got, want = _both("InstanceNormalization", feeds, 6, epsilon=1e-3)
    _same(got, want, 1e-2 if dtype == np.float16 else 1e-4)


def _group_norm_oracle(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, groups: int, eps: float) -> np.ndarray:
    n, c = x.shape[:2]
    xg = x.astype(np.float64).reshape(n, groups, -1)
    y = (xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + eps)
    if scale.size == groups:  # opset 18: one scale per group
        y = y * scale.reshape(1, -1, 1) + bias.reshape(1, -1, 1)
        return y.reshape(x.shape)
    y = y.reshape(n, c, -1) * scale.reshape(1, -1, 1) + bias.reshape(1, -1, 1)
    return y.reshape(x.shape)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm(opset: int, groups: int) -> None:
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    nparams = groups if opset == 18 else 6
    scale = rng.standard_normal(nparams).astype(np.float32)
    bias = rng.standard_normal(nparams).astype(np.float32)
    (got,) = _ours("GroupNormalization", {"X": x, "scale": scale, "bias": bias}, opset, num_groups=groups, epsilon=1e-4)
    np.testing.assert_allclose(got, _group_norm_oracle(x, scale, bias, groups, 1e-4), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_instance_and_group_norms_of_host_floats_normalize_rows_in_place(
    monkeypatch: pytest.MonkeyPatch, dtype: Any, layout: str
) -> None:
    """Float32/float64 host inputs take the row form (statistics per plane or group as BLAS
    and einsum passes, then one scale and one shift pass in place), never the general
    _normalize; results match a float64 oracle for several images, groups of several channels,
    constant planes (zero variance) and channels-last input."""
    from onnxpy.ops import nn as nn_ops

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the general form ran")

    monkeypatch.setattr(nn_ops, "_normalize", refuse)
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((3, 8, 9, 10)) * 4 + 2).astype(dtype)
    x[1, 5] = 7.0  # a constant plane: variance 0, the epsilon alone
    if layout == "channels_last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    scale = rng.standard_normal(8).astype(dtype)
    bias = rng.standard_normal(8).astype(dtype)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    (got,) = _ours("InstanceNormalization", {"input": x, "scale": scale, "B": bias}, 6, epsilon=1e-3)
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_allclose(got, _group_norm_oracle(x, scale, bias, 8, 1e-3), rtol=tol, atol=tol)
    (got,) = _ours("GroupNormalization", {"X": x, "scale": scale, "bias": bias}, 21, num_groups=4, epsilon=1e-3)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, _group_norm_oracle(x, scale, bias, 4, 1e-3), rtol=tol, atol=tol)
    (got,) = _ours("GroupNormalization", {"X": x, "scale": scale[:4], "bias": bias[:4]}, 18, num_groups=4, epsilon=1e-3)
    np.testing.assert_allclose(got, _group_norm_oracle(x, scale[:4], bias[:4], 4, 1e-3), rtol=tol, atol=tol)


def test_group_norm_21_float16() -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((2, 4, 8)) * 10).astype(np.float16)
    scale = rng.standard_normal(4).astype(np.float16)
    bias = rng.standard_normal(4).astype(np.float16)
    (got,) = _ours("GroupNormalization", {"X": x, "scale": scale, "bias": bias}, 21, num_groups=2)
    assert got.dtype == np.float16
    want = _group_norm_oracle(x, scale.astype(np.float64), bias.astype(np.float64), 2, 1e-5)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize(("shape", "groups"), [((0, 4, 3), 2), ((2, 0, 3), 1), ((2, 4, 0), 2)])
def test_group_norm_empty_input(opset: int, shape: tuple[int, ...], groups: int) -> None:
    # Y has X's shape (the spec) and no value to compute. onnxruntime and onnx.reference both fail
    # here (their Reshape to [N, groups, -1] cannot infer -1 from no element); onnxpy failed the
    # same way with numpy's message.
    x = np.zeros(shape, np.float32)
    n = groups if opset == 18 else shape[1]
    scale, bias = np.ones(n, np.float32), np.zeros(n, np.float32)
    (got,) = _ours("GroupNormalization", {"X": x, "scale": scale, "bias": bias}, opset, num_groups=groups)
    assert got.shape == shape and got.dtype == np.float32


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_with_stats(axis: int, with_bias: bool) -> None:
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((2, 3, 4)) * 2 + 1).astype(np.float32)
    norm_shape = x.shape[axis % 3 :]
    feeds = {
        "X": x,
        "Scale": rng.standard_normal(norm_shape).astype(np.float32),
        "B": rng.standard_normal(norm_shape).astype(np.float32) if with_bias else None,
    }
    outs = {"Y": TensorProto.FLOAT, "Mean": TensorProto.FLOAT, "InvStdDev": TensorProto.FLOAT}
    got, want = _both("LayerNormalization", feeds, 17, outs=outs, axis=axis, epsilon=1e-3)
    _same(got, want, 1e-5)


def test_layer_norm_of_constant_rows_is_exact() -> None:
    """A constant row's mean is the constant and its variance 0 (so 1/std is 1/sqrt(eps)),
    also over a width whose reciprocal is not exact: means are sums divided by the count."""
    x = np.full((2, 120), 1.5, np.float32)
    x[1] = -3.25
    feeds = {"X": x, "Scale": np.full(120, 2, np.float32), "B": np.full(120, -1.5, np.float32)}
    outs = {"Y": TensorProto.FLOAT, "Mean": TensorProto.FLOAT, "InvStdDev": TensorProto.FLOAT}
    y, mean, inv_std = _ours("LayerNormalization", feeds, 17, outs=outs, epsilon=1e-5)
    np.testing.assert_array_equal(mean.ravel(), [1.5, -3.25])
    np.testing.assert_array_equal(inv_std.ravel(), np.float32(1) / np.sqrt(np.float32(1e-5)))
    np.testing.assert_array_equal(y, np.full((2, 120), -1.5, np.float32))


def test_layer_norm_float16() -> None:
    rng = np.random.default_rng(13)
    feeds = {
        "X": (rng.standard_normal((3, 64)) * 8).astype(np.float16),
        "Scale": rng.standard_normal(64).astype(np.float16),
        "B": rng.standard_normal(64).astype(np.float16),
    }
    got, want = _both("LayerNormalization", feeds, 17)
    _same(got, want, 5e-3)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rms_norm(axis: int, dtype: Any) -> None:
    rng = np.random.default_rng(14)
    x = (rng.standard_normal((2, 3, 8)) * 3).astype(dtype)
    scale = rng.standard_normal(x.shape[axis % 3 :]).astype(dtype)
    got, want = _both("RMSNormalization", {"X": x, "scale": scale}, 23, axis=axis, epsilon=1e-4)
    _same(got, want, 5e-3 if dtype == np.float16 else 1e-5)


# -- LRN -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_lrn(size: int, dtype: Any) -> None:
    rng = np.random.default_rng(15)
    x = rng.standard_normal((2, 6, 3, 4)).astype(dtype)
    attrs = dict(size=size, alpha=0.01, beta=0.6, bias=1.5)
    # the spec's formula: a channel window [c - floor((size-1)/2), c + ceil((size-1)/2)]
    x64 = x.astype(np.float64)
    sq = np.zeros_like(x64)
    for ch in range(6):
        lo, hi = max(0, ch - (size - 1) // 2), min(5, ch + size - 1 - (size - 1) // 2)
        sq[:, ch] = (x64[:, lo : hi + 1] ** 2).sum(axis=1)
    want = x64 / (1.5 + 0.01 / size * sq) ** 0.6
    (got,) = _ours("LRN", {"X": x}, 13, **attrs)
    tol = 3e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    if size % 2:  # onnxruntime implements odd sizes only
        got, want_ort = _both("LRN", {"X": x}, 13, **attrs)
        _same(got, want_ort, tol)


def _lrn_reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    c = x.shape[1]
    sq = np.zeros_like(x64)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + size - 1 - (size - 1) // 2)
        sq[:, ch] = (x64[:, lo : hi + 1] ** 2).sum(axis=1)
    return x64 / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize("beta", [0.75, 0.5, 1.0, 0.6])
@pytest.mark.parametrize("size", [5, 4, 33])  # 33: wider than the shifted-add path takes
def test_lrn_blocked_path_across_blocks(size: int, beta: float, monkeypatch: pytest.MonkeyPatch) -> None:
    # 64 channels x 1600 positions: more than one block of positions (with blocks of 65,536
    # values, 1024 positions at 64 channels); values of mixed magnitude, as after a ReLU'd conv.
    from onnxpy.ops import nn as nn_ops

    monkeypatch.setattr(nn_ops, "_LRN_BLOCK_VALUES", 65536)
    rng = np.random.default_rng(17)
    x = (rng.standard_normal((2, 64, 40, 40)) * rng.uniform(0.1, 30, (1, 64, 1, 1))).astype(np.float32)
    attrs = dict(size=size, alpha=1e-4, beta=beta, bias=1.0)
    (got,) = _ours("LRN", {"X": x}, 13, **attrs)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _lrn_reference(x, size, 1e-4, beta, 1.0), rtol=2e-6, atol=1e-6)
    if size % 2:
        got, want_ort = _both("LRN", {"X": x}, 13, **attrs)
        _same(got, want_ort, 1e-5)


def test_lrn_of_a_strided_view_and_more_neighbours_than_channels() -> None:
    rng = np.random.default_rng(18)
    x = rng.standard_normal((1, 3, 8, 10)).astype(np.float32)[:, :, :, ::2]
    from onnxpy.ops.nn import lrn

    got = lrn(np, x, size=9, alpha=0.5, beta=0.75, bias=2.0)  # the kernel itself: sessions copy inputs
    np.testing.assert_allclose(got, _lrn_reference(x, 9, 0.5, 0.75, 2.0), rtol=2e-6, atol=1e-6)


# -- Dropout -------------------------------------------------------------------------------------


def test_dropout_inference_identity_and_masks() -> None:
    rng = np.random.default_rng(16)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    outs = {"Y": TensorProto.FLOAT, "mask": TensorProto.FLOAT}
    y, mask = _ours("Dropout", {"X": x}, 7, outs=outs, ratio=0.3)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.float32 and np.all(mask == 1)
    # Inference keeps every element, so the mask is all ones / True. (onnxruntime's opset 7-11
    # kernel returns all zeros / False here; from opset 12 on it agrees.)
    outs = {"Y": TensorProto.FLOAT, "mask": TensorProto.BOOL}
    y, mask = _ours("Dropout", {"X": x}, 10, outs=outs, ratio=0.3)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.bool_ and mask.all()
    got, want = _both("Dropout", {"X": x}, 13, outs=outs)
    _same(got, want)
    feeds = {"X": x, "ratio": np.array(0.3, np.float32), "training_mode": np.array(False)}
    got, want = _both("Dropout", feeds, 13, outs=outs)
    _same(got, want)


def test_dropout_training_seeded() -> None:
    rng = np.random.default_rng(17)
    x = rng.standard_normal((20, 30)).astype(np.float32)
    feeds = {"X": x, "ratio": np.array(0.25, np.float32), "training_mode": np.array(True)}
    outs = {"Y": TensorProto.FLOAT, "mask": TensorProto.BOOL}
    y1, m1 = _ours("Dropout", feeds, 13, outs=outs, seed=5)
    y2, m2 = _ours("Dropout", feeds, 13, outs=outs, seed=5)
    np.testing.assert_array_equal(m1, m2)  # the same seed gives the same mask
    np.testing.assert_allclose(y1, np.where(m1, x / 0.75, 0), rtol=1e-6)
    np.testing.assert_array_equal(y1, y2)
    assert 0.6 < m1.mean() < 0.9  # about 1 - ratio kept
    _, m3 = _ours("Dropout", feeds, 13, outs=outs, seed=6)
    assert not np.array_equal(m1, m3)
    feeds["ratio"] = np.array(0.0, np.float32)
    y0, m0 = _ours("Dropout", feeds, 13, outs=outs, seed=5)
    np.testing.assert_array_equal(y0, x)
    assert m0.all()


# -- losses --------------------------------------------------------------------------------------

LOSS_CASES = [
    # name, scores shape, reduction, with weight, ignore_index
    ("NC_mean", (5, 4), "mean", False, None),
    ("NC_sum_w", (5, 4), "sum", True, None),
    ("NC_none_ii", (5, 4), "none", False, 2),
    ("NCd_mean_w_ii", (3, 4, 6), "mean", True, 1),
    ("NCdd_none_w", (2, 3, 4, 2), "none", True, None),
    ("NCddd_sum_ii_neg", (2, 3, 2, 2, 3), "sum", False, -1),
    ("NCdd_mean_ii_neg_w", (2, 5, 3, 2), "mean", True, -5),
]


def _loss_feeds(rng: np.random.Generator, shape: tuple[int, ...], weight: bool, ii: int | None, tdtype: Any) -> dict:
    n, c = shape[:2]
    target = rng.integers(0, c, size=(n, *shape[2:])).astype(tdtype)
    if ii is not None:
        target.reshape(-1)[::3] = ii
    return {
        "scores": rng.standard_normal(shape).astype(np.float32),
        "labels": target,
        "weights": rng.random(c).astype(np.float32) + 0.1 if weight else None,
    }


@pytest.mark.parametrize("name,shape,reduction,weight,ii", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
@pytest.mark.parametrize("tdtype", [np.int64, np.int32])
def test_softmax_cross_entropy(
    name: str, shape: tuple[int, ...], reduction: str, weight: bool, ii: int | None, tdtype: Any
) -> None:
    rng = np.random.default_rng(18)
    feeds = _loss_feeds(rng, shape, weight, ii, tdtype)
    attrs: dict[str, Any] = {"reduction": reduction}
    if ii is not None:
        attrs["ignore_index"] = ii
    outs = {"loss": TensorProto.FLOAT, "log_prob": TensorProto.FLOAT}
    got, want = _both("SoftmaxCrossEntropyLoss", feeds, 13, outs=outs, **attrs)
    _same(got, want, 1e-5)


@pytest.mark.parametrize("name,shape,reduction,weight,ii", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_negative_log_likelihood(
    name: str, shape: tuple[int, ...], reduction: str, weight: bool, ii: int | None
) -> None:
    rng = np.random.default_rng(19)
    f = _loss_feeds(rng, shape, weight, ii, np.int64)
    feeds = {"input": f["scores"], "target": f["labels"], "weight": f["weights"]}
    attrs: dict[str, Any] = {"reduction": reduction}
    if ii is not None:
        attrs["ignore_index"] = ii
    got, want = _both("NegativeLogLikelihoodLoss", feeds, 13, **attrs)
    _same(got, want, 1e-5)


def test_nll_target_out_of_range_raises() -> None:
    x = np.zeros((2, 3), np.float32)
    t = np.array([0, 3], np.int64)
    with pytest.raises(Exception, match="target"):
        _ours("NegativeLogLikelihoodLoss", {"input": x, "target": t}, 13)


# -- Attention -----------------------------------------------------------------------------------


def _attention_oracle(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    causal_offset: np.ndarray | int | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    nonpad: np.ndarray | None = None,
    window: tuple[int, int] = (-1, -1),
) -> np.ndarray:
    """Plain 4-D scaled dot-product attention in float64 with GQA by repetition."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    s = q @ k.swapaxes(-1, -2) * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    if softcap:
        s = softcap * np.tanh(s / softcap)
    sq, tot = s.shape[-2:]
    if mask is not None:
        m = mask
        if m.shape[-1] < tot:
            fill = False if m.dtype == bool else -np.inf
            m = np.concatenate([m, np.full((*m.shape[:-1], tot - m.shape[-1]), fill, dtype=m.dtype)], axis=-1)
        s = s + (np.where(m, 0, -np.inf) if m.dtype == bool else m.astype(np.float64))
    i = np.arange(sq)[:, None]
    j = np.arange(tot)[None, :]
    off = np.asarray(0 if causal_offset is None else causal_offset).reshape(-1, 1, 1, 1)
    allowed = np.ones((1, 1, sq, tot), bool)
    if causal_offset is not None:
        allowed = allowed & (j <= i + off)
    if nonpad is not None:
        allowed = allowed & (j < nonpad.reshape(-1, 1, 1, 1))
    if window[0] >= 0:
        allowed = allowed & (j >= i + off - window[0])
    if window[1] >= 0:
        allowed = allowed & (j <= i + off + window[1])
    s = np.where(allowed, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    dead = ~np.isfinite(mx)
    e = np.exp(s - np.where(dead, 0, mx))
    p = np.where(dead, 0, e / np.where(dead, 1, e.sum(-1, keepdims=True)))
    return p @ v


def _to3d(x: np.ndarray) -> np.ndarray:
    b, h, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, h * d)


@pytest.mark.parametrize("qh,kvh", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("layout", ["3d", "4d"])
def test_attention_gqa_layouts(qh: int, kvh: int, layout: str) -> None:
    rng = np.random.default_rng(20)
    q = rng.standard_normal((2, qh, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, kvh, 7, 8)).astype(np.float32)
    v = rng.standard_normal((2, kvh, 7, 6)).astype(np.float32)
    want = _attention_oracle(q, k, v)
    if layout == "3d":
        feeds = {"Q": _to3d(q), "K": _to3d(k), "V": _to3d(v)}
        (got,) = _ours("Attention", feeds, 23, q_num_heads=qh, kv_num_heads=kvh)
        want = _to3d(want)
        ort_got, ort_want = _both("Attention", feeds, 23, q_num_heads=qh, kv_num_heads=kvh)
    else:
        feeds = {"Q": q, "K": k, "V": v}
        (got,) = _ours("Attention", feeds, 23)
        ort_got, ort_want = _both("Attention", feeds, 23)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    _same(ort_got, ort_want, 1e-5)


def test_attention_without_keys_names_the_problem() -> None:
    # Softmax over no key has no value: onnxruntime refuses too ("KV sequence length must be
    # greater than 0"); onnxpy failed in numpy's max of an empty axis.
    q = np.zeros((1, 2, 3, 8), np.float32)
    kv = np.zeros((1, 2, 0, 8), np.float32)
    feeds = {"Q": q, "K": kv, "V": kv}
    with pytest.raises(Exception, match="KV sequence length"):  # noqa: PT011 - onnxruntime's Fail
        _both("Attention", feeds, 23)
    with pytest.raises(Exception, match=r"Attention: no key/value positions \(K \[1, 2, 0, 8\]"):  # noqa: PT011
        _ours("Attention", feeds, 23)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "bool_short", "float_4d"])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_past_kv_masks_causal(mask_kind: str, causal: int) -> None:
    rng = np.random.default_rng(21)
    b, qh, kvh, sq, past, hd = 2, 4, 2, 3, 4, 8
    q = rng.standard_normal((b, qh, sq, hd)).astype(np.float32)
    k = rng.standard_normal((b, kvh, sq, hd)).astype(np.float32)
    v = rng.standard_normal((b, kvh, sq, hd)).astype(np.float32)
    pk = rng.standard_normal((b, kvh, past, hd)).astype(np.float32)
    pv = rng.standard_normal((b, kvh, past, hd)).astype(np.float32)
    tot = past + sq
    mask = {
        "none": None,
        "bool": rng.random((sq, tot)) > 0.3,
        "float": rng.standard_normal((sq, tot)).astype(np.float32),
        "bool_short": rng.random((sq, tot - 2)) > 0.2,
        "float_4d": rng.standard_normal((b, 1, sq, tot)).astype(np.float32),
    }[mask_kind]
    feeds = {"Q": q, "K": k, "V": v, "attn_mask": mask, "past_key": pk, "past_value": pv}
    outs = {"Y": TensorProto.FLOAT, "present_key": TensorProto.FLOAT, "present_value": TensorProto.FLOAT}
    y, pres_k, pres_v = _ours("Attention", feeds, 23, outs=outs, is_causal=causal)
    full_k = np.concatenate([pk, k], axis=2)
    full_v = np.concatenate([pv, v], axis=2)
    np.testing.assert_array_equal(pres_k, full_k)
    np.testing.assert_array_equal(pres_v, full_v)
    want = _attention_oracle(q, full_k, full_v, mask, causal_offset=past if causal else None)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_output_modes_softcap_scale(mode: int) -> None:
    rng = np.random.default_rng(22)
    q = rng.standard_normal((1, 2, 4, 8)).astype(np.float32) * 3
    k = rng.standard_normal((1, 2, 5, 8)).astype(np.float32) * 3
    v = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    mask = rng.standard_normal((4, 5)).astype(np.float32)
    feeds = {"Q": q, "K": k, "V": v, "attn_mask": mask}
    data = _model_with_gaps(feeds, 23, qk_matmul_output_mode=mode, softcap=2.0, scale=0.2)
    y, qk = onnxpy.InferenceSession(data).run(None, feeds)
    raw = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * 0.2
    capped = 2.0 * np.tanh(raw / 2.0)
    biased = capped + mask
    e = np.exp(biased - biased.max(-1, keepdims=True))
    probs = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(qk, (raw, capped, biased, probs)[mode], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, probs @ v, rtol=1e-5, atol=1e-5)


def _model_with_gaps(feeds: dict[str, np.ndarray], opset: int, **attrs: Any) -> bytes:
    node = helper.make_node("Attention", list(feeds), ["Y", "", "", "qk"], **attrs)
    vi = [helper.make_tensor_value_info(n, ELEM[v.dtype], list(v.shape)) for n, v in feeds.items()]
    ov = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "qk")]
    model = helper.make_model(helper.make_graph([node], "g", vi, ov), opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model.SerializeToString()


def test_attention_fully_masked_rows_are_zero() -> None:
    rng = np.random.default_rng(23)
    q = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    k = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    v = rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
    mask = np.array([[True, False, True], [False, False, False], [True, True, True]])
    (y,) = _ours("Attention", {"Q": q, "K": k, "V": v, "attn_mask": mask}, 23)
    assert not np.isnan(y).any()
    np.testing.assert_array_equal(y[0, 0, 1], 0)
    np.testing.assert_allclose(y, _attention_oracle(q, k, v, mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_nonpad_kv_seqlen(causal: int) -> None:
    rng = np.random.default_rng(24)
    q = rng.standard_normal((3, 2, 2, 8)).astype(np.float32)
    k = rng.standard_normal((3, 2, 6, 8)).astype(np.float32)
    v = rng.standard_normal((3, 2, 6, 8)).astype(np.float32)
    nonpad = np.array([6, 3, 1], np.int64)
    feeds = {
        "Q": q,
        "K": k,
        "V": v,
        "attn_mask": None,
        "past_key": None,
        "past_value": None,
        "nonpad_kv_seqlen": nonpad,
    }
    (y,) = _ours("Attention", feeds, 24, is_causal=causal)
    want = _attention_oracle(q, k, v, nonpad=nonpad, causal_offset=nonpad - 2 if causal else None)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [(2, 0), (1, 1), (0, -1), (-1, 2)])
def test_attention_sliding_window(window: tuple[int, int]) -> None:
    rng = np.random.default_rng(25)
    q = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    k = rng.standard_normal((1, 2, 7, 4)).astype(np.float32)
    v = rng.standard_normal((1, 2, 7, 4)).astype(np.float32)
    (y,) = _ours("Attention", {"Q": q, "K": k, "V": v}, 25, left_window_size=window[0], right_window_size=window[1])
    want = _attention_oracle(q, k, v, causal_offset=None, window=window)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_attention_float16_against_onnxruntime() -> None:
    rng = np.random.default_rng(26)
    q = rng.standard_normal((1, 4, 6, 16)).astype(np.float16)
    k = rng.standard_normal((1, 2, 6, 16)).astype(np.float16)
    v = rng.standard_normal((1, 2, 6, 16)).astype(np.float16)
    got, want = _both("Attention", {"Q": q, "K": k, "V": v}, 23, is_causal=1)
    _same(got, want, 5e-3)


# -- RotaryEmbedding -----------------------------------------------------------------------------


def _caches(rng: np.random.Generator, positions: int, half: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    theta = rng.random((positions, half)) * 6.0
    return np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim", [0, 4])
@pytest.mark.parametrize("layout", ["3d", "4d"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rotary_embedding(interleaved: int, rotary_dim: int, layout: str, dtype: Any) -> None:
    if layout == "4d" and rotary_dim:
        skip_before_onnxruntime((1, 24), "refuses a partial rotary_dim on 4-D input")
    rng = np.random.default_rng(27)
    b, h, s, d = 2, 3, 5, 8
    x = rng.standard_normal((b, h, s, d)).astype(dtype)
    half = (rotary_dim or d) // 2
    cos, sin = _caches(rng, 10, half, dtype)
    pos = rng.integers(0, 10, size=(b, s)).astype(np.int64)
    attrs: dict[str, Any] = {"interleaved": interleaved, "rotary_embedding_dim": rotary_dim}
    if layout == "3d":
        x = _to3d(x)
        attrs["num_heads"] = h
    feeds = {"X": x, "cos_cache": cos, "sin_cache": sin, "position_ids": pos}
    got, want = _both("RotaryEmbedding", feeds, 23, **attrs)
    _same(got, want, 2e-3 if dtype == np.float16 else 1e-5)


def test_rotary_embedding_without_position_ids() -> None:
    rng = np.random.default_rng(28)
    x = rng.standard_normal((2, 2, 3, 6)).astype(np.float32)
    cos, sin = _caches(rng, 6, 3, np.float32)
    cos3 = cos.reshape(2, 3, 3)
    sin3 = sin.reshape(2, 3, 3)
    got, want = _both("RotaryEmbedding", {"X": x, "cos_cache": cos3, "sin_cache": sin3}, 23)
    _same(got, want)


# -- SwiGLU / CausalConvWithState (numpy oracles: onnxruntime lacks them) -------------------------


@pytest.mark.parametrize("alpha", [1.0, 1.702])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_swiglu(alpha: float, dtype: Any) -> None:
    rng = np.random.default_rng(29)
    a = (rng.standard_normal((3, 8)) * 4).astype(dtype)
    b = rng.standard_normal((3, 8)).astype(dtype)
    (got,) = _ours("SwiGLU", {"A": a, "B": b}, 28, alpha=alpha)
    a64 = a.astype(np.float64)
    want = a64 / (1 + np.exp(-alpha * a64)) * b.astype(np.float64)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=3e-3, atol=3e-3 if dtype == np.float16 else 1e-6)


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("length", [1, 3, 6])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_with_state(k: int, length: int, with_state: bool, activation: str) -> None:
    rng = np.random.default_rng(30)
    n, c = 2, 3
    x = rng.standard_normal((n, c, length)).astype(np.float32)
    w = rng.standard_normal((c, 1, k)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    state = rng.standard_normal((n, c, k - 1)).astype(np.float32) if with_state else None
    feeds = {"input": x, "weight": w, "bias": bias, "past_state": state}
    outs = {"output": TensorProto.FLOAT, "present_state": TensorProto.FLOAT}
    y, present = _ours("CausalConvWithState", feeds, 27, outs=outs, activation=activation)
    prefix = state if state is not None else np.zeros((n, c, k - 1), np.float32)
    full = np.concatenate([prefix, x], axis=2).astype(np.float64)
    want = np.stack([(full[:, :, t : t + k] * w[:, 0, :]).sum(-1) for t in range(length)], axis=-1) + bias.reshape(
        1, c, 1
    )
    if activation == "silu":
        want = want / (1 + np.exp(-want))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(present, full[:, :, full.shape[2] - (k - 1) :].astype(np.float32))
