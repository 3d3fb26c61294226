"""Indexing kernels (onnxpy/ops/indexing.py) against onnxruntime, or numpy where onnxruntime lacks
the case: negative indices and axes, batch_dims, every scatter reduction, empty tensors, Unique's
four outputs, and out-of-range indices that must raise an IndexError naming index and axis size."""

from __future__ import annotations

import itertools
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from onnxpy.model import dtypes

from .test_tensor import assert_same, onnxpy_only, run_error, vs_ort

F, I64, BOOL, STR = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL, TensorProto.STRING
RNG = np.random.default_rng(1)


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# -- gathers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_negative_indices(axis: int) -> None:
    x = _f(3, 4, 5)
    n = x.shape[axis]
    idx = np.array([[0, -1], [n - 1, -n]], dtype=np.int64)
    vs_ort("Gather", {"x": x, "i": idx}, {"y": F}, axis=axis, opset=13)
    vs_ort("Gather", {"x": x, "i": idx.astype(np.int32)}, {"y": F}, axis=axis, opset=13)


def test_gather_scalar_and_empty_indices() -> None:
    x = _f(3, 4)
    vs_ort("Gather", {"x": x, "i": np.array(2, np.int64)}, {"y": F}, axis=0)
    vs_ort("Gather", {"x": x, "i": np.array(-1, np.int64)}, {"y": F}, axis=1)
    vs_ort("Gather", {"x": x, "i": np.array(-3, np.int32)}, {"y": F}, axis=0)
    vs_ort("Gather", {"x": x, "i": np.zeros((0,), np.int64)}, {"y": F}, axis=1)


@pytest.mark.parametrize("bad", [4, -5])
def test_gather_scalar_index_out_of_range_raises(bad: int) -> None:
    msg = run_error("Gather", {"x": _f(3, 4), "i": np.array(bad, np.int64)}, {"y": F}, axis=1, opset=13)
    assert "IndexError" in msg and f"index {bad}" in msg and "size 4" in msg and "axis 1" in msg


@pytest.mark.parametrize("op", ["Gather", "GatherElements"])
@pytest.mark.parametrize("bad", [4, -5])
def test_gather_out_of_range_raises(op: str, bad: int) -> None:
    x = _f(3, 4)
    idx = np.array([[0, bad]], dtype=np.int64)
    msg = run_error(op, {"x": x, "i": idx}, {"y": F}, axis=1, opset=13)
    assert "IndexError" in msg and f"index {bad}" in msg and "size 4" in msg and "axis 1" in msg


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis: int) -> None:
    x = _f(3, 4)
    idx = RNG.integers(-x.shape[axis], x.shape[axis], size=(2, 3)).astype(np.int64)
    vs_ort("GatherElements", {"x": x, "i": idx}, {"y": F}, axis=axis, opset=13)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_gather_elements_3d_with_smaller_indices_and_negatives(axis: int, dtype: Any) -> None:
    # The flat-take path: indices smaller than the data on the other axes (offsets from the
    # data's strides, not the indices'), negative indices wrapped, every axis, several dtypes.
    x = (RNG.standard_normal((4, 5, 6)) * 10).astype(dtype)
    ishape = [3, 4, 5]
    ishape[axis] = 7  # more entries than the axis has: repeats
    idx = RNG.integers(-x.shape[axis], x.shape[axis], size=ishape).astype(np.int64)
    vs_ort("GatherElements", {"x": x, "i": idx}, {"y": dtypes.elem_type(dtype)}, axis=axis, opset=13)


@pytest.mark.parametrize(
    ("dshape", "ishape", "batch_dims"),
    [
        ((2, 2), (2, 2), 0),
        ((2, 2), (2, 1), 0),
        ((2, 2, 2), (2, 1, 2), 0),
        ((2, 3, 4), (2, 2), 1),
        ((2, 3, 4), (2, 3, 1), 2),
    ],
)
def test_gather_nd(dshape: tuple[int, ...], ishape: tuple[int, ...], batch_dims: int) -> None:
    x = _f(*dshape)
    k = ishape[-1]
    limits = dshape[batch_dims : batch_dims + k]
    cols = [RNG.integers(-lim, lim, size=ishape[:-1]) for lim in limits]
    idx = np.stack(cols, axis=-1).astype(np.int64)
    vs_ort("GatherND", {"x": x, "i": idx}, {"y": F}, batch_dims=batch_dims, opset=13)


def test_gather_nd_out_of_range_raises() -> None:
    msg = run_error("GatherND", {"x": _f(2, 3), "i": np.array([[1, 3]], np.int64)}, {"y": F}, opset=13)
    assert "IndexError" in msg and "index 3" in msg and "size 3" in msg


# -- scatters ------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_reductions(reduction: str) -> None:
    x = _f(4, 3)
    idx = np.array([[1], [-1], [1]] if reduction != "none" else [[1], [-1], [0]], dtype=np.int64)
    upd = _f(3, 3)
    vs_ort("ScatterND", {"x": x, "i": idx, "u": upd}, {"y": F}, reduction=reduction, opset=18)


def test_scatter_nd_elementwise_and_opset11() -> None:
    x = _f(2, 3)
    idx = np.array([[0, 2], [1, -3]], dtype=np.int64)
    upd = np.array([10, 20], dtype=np.float32)
    vs_ort("ScatterND", {"x": x, "i": idx, "u": upd}, {"y": F}, opset=11)


def test_scatter_nd_does_not_touch_input() -> None:
    x = _f(3)
    keep = x.copy()
    onnxpy_only("ScatterND", {"x": x, "i": np.array([[0]]), "u": np.array([5], np.float32)}, {"y": F}, opset=13)
    np.testing.assert_array_equal(x, keep)


def test_scatter_nd_out_of_range_raises() -> None:
    msg = run_error(
        "ScatterND", {"x": _f(4), "i": np.array([[4]], np.int64), "u": np.ones(1, np.float32)}, {"y": F}, opset=13
    )
    assert "IndexError" in msg and "index 4" in msg and "size 4" in msg


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(axis: int, reduction: str) -> None:
    x = _f(3, 4)
    n = x.shape[axis]
    shape = (2, 3)
    ax = axis % 2
    if reduction == "none":
        # Distinct targets along the axis so the result does not depend on the order.
        full = list(shape)
        full[ax] = n
        idx = np.take(np.argsort(RNG.random(full), axis=ax), np.arange(shape[ax]), axis=ax)
        idx = (idx - n).astype(np.int64)  # the negative form
    else:
        idx = RNG.integers(-n, n, size=shape).astype(np.int64)
    vs_ort("ScatterElements", {"x": x, "i": idx, "u": _f(*shape)}, {"y": F}, axis=axis, reduction=reduction, opset=18)


def test_scatter_elements_int_and_bfloat16_add() -> None:
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    idx = np.array([[0, 0, 2]], np.int64)
    upd = np.array([[1, 2, 3]], np.int32)
    vs_ort("ScatterElements", {"x": x, "i": idx, "u": upd}, {"y": TensorProto.INT32}, axis=1, reduction="add")
    xb = x.astype(ml_dtypes.bfloat16)
    got = onnxpy_only(
        "ScatterElements",
        {"x": xb, "i": idx, "u": upd.astype(ml_dtypes.bfloat16)},
        {"y": TensorProto.BFLOAT16},
        axis=1,
        reduction="add",
    )[0]
    assert got.astype(np.float32).tolist() == [[3, 1, 5], [3, 4, 5]]


def test_scatter_deprecated() -> None:
    x = _f(3, 3)
    idx = np.array([[1, 0, 2], [0, 2, 1]], np.int64)
    vs_ort("Scatter", {"x": x, "i": idx, "u": _f(2, 3)}, {"y": F}, axis=0, opset=10)


def test_scatter_elements_out_of_range_raises() -> None:
    msg = run_error(
        "ScatterElements",
        {"x": _f(2, 3), "i": np.array([[0, -4]], np.int64), "u": _f(1, 2)},
        {"y": F},
        axis=1,
        opset=18,
    )
    assert "IndexError" in msg and "index -4" in msg and "size 3" in msg and "axis 1" in msg


def _tensor_scatter_oracle(
    past: np.ndarray, upd: np.ndarray, wi: np.ndarray | None, axis: int, mode: str
) -> np.ndarray:
    """The spec's pseudocode, literally."""
    out = past.copy()
    axis = axis % past.ndim
    max_len, seq = past.shape[axis], upd.shape[axis]
    for prefix in itertools.product(*(range(d) for d in past.shape[:axis])):
        start = 0 if wi is None else int(wi[prefix[0]])
        for s in range(seq):
            c = start + s
            if mode == "circular":
                c %= max_len
            out[(*prefix, c)] = upd[(*prefix, s)]
    return out


@pytest.mark.parametrize(
    ("shape", "seq", "axis", "mode", "wi"),
    [
        ((2, 3, 5, 4), 2, -2, "linear", [0, 3]),
        ((2, 3, 5, 4), 2, 2, "circular", [4, 3]),
        ((2, 6, 2), 3, 1, "linear", None),
        ((3, 4), 4, -1, "circular", [1, 2, 3]),
    ],
)
def test_tensor_scatter(shape: tuple[int, ...], seq: int, axis: int, mode: str, wi: list[int] | None) -> None:
    past = _f(*shape)
    ushape = list(shape)
    ushape[axis] = seq
    upd = _f(*ushape)
    w = None if wi is None else np.array(wi, np.int64)
    got = onnxpy_only("TensorScatter", {"p": past, "u": upd, "w": w}, {"y": F}, opset=24, axis=axis, mode=mode)[0]
    assert_same(got, _tensor_scatter_oracle(past, upd, w, axis, mode))


def test_tensor_scatter_linear_overflow_raises() -> None:
    msg = run_error(
        "TensorScatter",
        {"p": _f(2, 4, 2), "u": _f(2, 2, 2), "w": np.array([0, 3], np.int64)},
        {"y": F},
        opset=24,
        axis=1,
    )
    assert "IndexError" in msg and "size 4" in msg


# -- building and selecting ----------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
def test_onehot(axis: int) -> None:
    idx = np.array([[0, 3, -1], [2, -4, 7]], dtype=np.int64)  # -4 is -depth (valid), 7 is out of range
    vs_ort(
        "OneHot",
        {"i": idx, "d": np.array(4, np.int64), "v": np.array([-1.0, 5.0], np.float32)},
        {"y": F},
        axis=axis,
        opset=11,
    )


def test_onehot_float_indices_and_depth() -> None:
    # onnxruntime has no float-index kernel: indices truncate toward zero, -1 wraps to depth - 1.
    got = onnxpy_only(
        "OneHot",
        {
            "i": np.array([0.0, 2.7, -1.2], np.float32),
            "d": np.array([3.0], np.float32),
            "v": np.array([0, 1], np.int32),
        },
        {"y": TensorProto.INT32},
        opset=11,
    )[0]
    assert_same(got, np.array([[1, 0, 0], [0, 0, 1], [0, 0, 1]], np.int32))


def test_onehot_opset9_negative_is_off() -> None:
    got = onnxpy_only(
        "OneHot",
        {"i": np.array([1, -1], np.int64), "d": np.array(3, np.int64), "v": np.array([0, 1], np.int64)},
        {"y": I64},
        opset=9,
    )[0]
    assert got.tolist() == [[0, 1, 0], [0, 0, 0]]


def test_onehot_string_values() -> None:
    got = onnxpy_only(
        "OneHot",
        {"i": np.array([1, 0], np.int64), "d": np.array(2, np.int64), "v": np.array(["off", "on"], dtype=object)},
        {"y": STR},
        opset=11,
    )[0]
    assert got.tolist() == [["off", "on"], ["on", "off"]]
    assert got.dtype == object  # as every string tensor (it was a fixed-width unicode array)
    vs_ort(
        "OneHot",
        {
            "i": np.array([[0, 2], [1, -1]], np.int64),
            "d": np.array(3, np.int64),
            "v": np.array(["a", "bc"], dtype=object),
        },
        {"y": STR},
        opset=11,
    )


@pytest.mark.parametrize(
    "x",
    [
        np.array([[1, 0], [1, 1]], dtype=np.int32),
        np.array([[[0.0, 2.0]], [[0.0, -1.0]]], dtype=np.float32),
        np.array([True, False, True]),
        np.zeros((0, 3), np.float32),
        np.zeros((2, 2), np.int64),
        np.array(5.0, np.float32),
        np.array(0, np.int64),
    ],
)
def test_nonzero(x: np.ndarray) -> None:
    vs_ort("NonZero", {"x": x}, {"y": I64}, opset=13)


def test_nonzero_strings_and_float8() -> None:
    got = onnxpy_only("NonZero", {"x": np.array(["", "a", "b"], dtype=object)}, {"y": I64}, opset=13)[0]
    assert got.tolist() == [[1, 2]]
    x8 = np.array([0, 1.5, 0, -2], dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
    got = onnxpy_only("NonZero", {"x": x8}, {"y": I64}, opset=21)[0]
    assert got.tolist() == [[1, 3]]


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique(axis: int | None, sorted_: int) -> None:
    x = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4], [1, 0, 0], [0, 9, 9]], dtype=np.float32)
    if axis is not None and axis != 0:
        x = np.ascontiguousarray(x.T)
    kw: dict[str, Any] = {"sorted": sorted_}
    if axis is not None:
        kw["axis"] = axis
    vs_ort("Unique", {"x": x}, {"y": F, "idx": I64, "inv": I64, "cnt": I64}, opset=11, **kw)


@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_int_3d_axis(sorted_: int) -> None:
    x = RNG.integers(0, 2, size=(2, 5, 2)).astype(np.int64)
    vs_ort("Unique", {"x": x}, {"y": I64, "i": I64, "v": I64, "c": I64}, opset=11, axis=1, sorted=sorted_)


@pytest.mark.parametrize(("shape", "axis"), [((0, 3), 0), ((0,), 0), ((2, 0), 1)])
def test_unique_axis_on_empty_input(shape: tuple[int, ...], axis: int) -> None:
    # No slices along the axis (or slices of no element): empty outputs, not a reshape error.
    x = np.zeros(shape, np.float32)
    vs_ort("Unique", {"x": x}, {"y": F, "i": I64, "v": I64, "c": I64}, opset=11, axis=axis)


def test_unique_strings_and_first_output_only() -> None:
    x = np.array(["b", "a", "b", "c", "a"], dtype=object)
    y, idx, inv, cnt = onnxpy_only("Unique", {"x": x}, {"y": STR, "i": I64, "v": I64, "c": I64}, sorted=0)
    assert y.tolist() == ["b", "a", "c"] and idx.tolist() == [0, 1, 3]
    assert inv.tolist() == [0, 1, 0, 2, 1] and cnt.tolist() == [2, 2, 1]
    (only,) = onnxpy_only("Unique", {"x": np.array([3, 1, 3], np.int32)}, {"y": TensorProto.INT32})
    assert only.tolist() == [1, 3]


@pytest.mark.parametrize("axis", [None, 0])
def test_unique_with_nan_in_float32_and_bfloat16(axis: int | None) -> None:
    # NaN is one value, flattened (numpy's unique) or in rows (onnxruntime merges such rows;
    # its flattened Unique merges NaN into 2.0, which is wrong). ml_dtypes' sort breaks on NaN
    # (bfloat16 merged nothing): bfloat16 must give the float32 answer, cast back.
    x = np.array([[2, np.nan], [1, 2], [2, np.nan], [5, 1]], np.float32)
    kw: dict[str, Any] = {} if axis is None else {"axis": axis}
    if axis is None:
        y, first, inv, counts = np.unique(x.reshape(-1), return_index=True, return_inverse=True, return_counts=True)
        want = [y, first, inv.reshape(-1), counts]
    else:
        want = vs_ort("Unique", {"x": x}, {"y": F, "i": I64, "v": I64, "c": I64}, opset=11, **kw)
        assert want[0].shape == (3, 2)
    got32 = onnxpy_only("Unique", {"x": x}, {"y": F, "i": I64, "v": I64, "c": I64}, **kw)
    outs = {"y": TensorProto.BFLOAT16, "i": I64, "v": I64, "c": I64}
    got16 = onnxpy_only("Unique", {"x": x.astype(ml_dtypes.bfloat16)}, outs, **kw)
    assert got16[0].dtype == ml_dtypes.bfloat16
    for got in (got32, got16):
        np.testing.assert_array_equal(got[0].astype(np.float32), want[0])
        for g, w in zip(got[1:], want[1:]):
            assert g.tolist() == w.tolist()


def test_unique_empty() -> None:
    y, idx, inv, cnt = onnxpy_only("Unique", {"x": np.zeros((0,), np.float32)}, {"y": F, "i": I64, "v": I64, "c": I64})
    assert y.shape == idx.shape == inv.shape == cnt.shape == (0,)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis: int | None) -> None:
    x = _f(3, 4)
    n = x.size if axis is None else x.shape[axis]
    cond = RNG.integers(0, 2, size=n - 1).astype(bool)  # shorter than the axis: the rest is dropped
    kw = {} if axis is None else {"axis": axis}
    got = vs_ort("Compress", {"x": x, "c": cond}, {"y": F}, opset=11, **kw)[0]
    assert_same(got, np.compress(cond, x, axis=axis))


def test_compress_condition_too_long_raises() -> None:
    msg = run_error("Compress", {"x": _f(2, 2), "c": np.array([0, 1, 1], bool)}, {"y": F}, axis=1, opset=11)
    assert "IndexError" in msg and "size 2" in msg


@pytest.mark.parametrize(("batch_axis", "time_axis"), [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis: int, time_axis: int) -> None:
    x = _f(4, 4, 2)
    lens = np.array([4, 3, 1, 0] if batch_axis == 1 else [1, 2, 3, 4], dtype=np.int64)
    if 0 in lens:
        lens[lens == 0] = 1  # onnxruntime rejects zero lengths
    vs_ort("ReverseSequence", {"x": x, "l": lens}, {"y": F}, batch_axis=batch_axis, time_axis=time_axis, opset=10)


def test_reverse_sequence_too_long_raises() -> None:
    msg = run_error("ReverseSequence", {"x": _f(3, 2), "l": np.array([4, 1], np.int64)}, {"y": F}, opset=10)
    assert "IndexError" in msg and "size 3" in msg


def test_gather_nd_empty_index_tuple_takes_whole_slices() -> None:
    x = _f(2, 3, 4)
    vs_ort("GatherND", {"x": x, "i": np.zeros((2, 5, 0), np.int64)}, {"y": F}, batch_dims=1, opset=13)
