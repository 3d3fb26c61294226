"""Pooling kernels against onnxruntime on attribute combinations the conformance suite does not
reach: ceil_mode with pads, dilations, Indices with storage_order and padding, integer inputs,
count_include_pad with ceil_mode, LpPool p values, MaxUnpool round trips, MaxRoiPool."""

from __future__ import annotations

import math
from typing import Any

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
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int64): TensorProto.INT64,
}


def _model(op_type: str, feeds: dict[str, np.ndarray], outs: dict[str, int], opset: int, **attrs: Any) -> bytes:
    node = helper.make_node(op_type, list(feeds), list(outs), **attrs)
    vi = [helper.make_tensor_value_info(n, ELEM[v.dtype], list(v.shape)) for n, v in feeds.items()]
    ov = [helper.make_tensor_value_info(n, e, None) for n, e in outs.items()]
    model = helper.make_model(helper.make_graph([node], "g", vi, ov), opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _both(
    op_type: str,
    feeds: dict[str, np.ndarray],
    opset: int = 19,
    outs: dict[str, int] | None = None,
    **attrs: Any,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    outs = outs or {"Y": ELEM[next(iter(feeds.values())).dtype]}
    data = _model(op_type, feeds, outs, opset, **attrs)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxpy.InferenceSession(data).run(None, feeds)
    return got, want


def _ours(op_type: str, feeds: dict[str, np.ndarray], opset: int = 19, **attrs: Any) -> np.ndarray:
    data = _model(op_type, feeds, {"Y": ELEM[next(iter(feeds.values())).dtype]}, opset, **attrs)
    return onnxpy.InferenceSession(data).run(None, feeds)[0]


def _same(got: list[np.ndarray], want: list[np.ndarray], tol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(g, w)


POOL_CASES = [
    # name, x shape, attrs
    ("ceil_pads", (2, 3, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1)),
    ("ceil_asym", (1, 2, 6, 9), dict(kernel_shape=[2, 4], strides=[3, 2], pads=[0, 2, 1, 0], ceil_mode=1)),
    ("dilated", (1, 2, 9, 10), dict(kernel_shape=[3, 2], strides=[1, 2], dilations=[2, 3], pads=[2, 1, 2, 1])),
    ("dilated_ceil", (1, 2, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 3], dilations=[2, 2], ceil_mode=1)),
    ("same_upper", (1, 2, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER")),
    ("same_lower", (1, 2, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_LOWER")),
    ("valid", (1, 2, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="VALID")),
    ("valid_ceil", (1, 2, 7, 5), dict(kernel_shape=[2, 2], strides=[2, 3], auto_pad="VALID", ceil_mode=1)),
    ("1d", (2, 3, 11), dict(kernel_shape=[3], strides=[2], pads=[1, 2], ceil_mode=1)),
    ("3d", (1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[0, 1, 1, 1, 0, 0])),
    # Kernels wider than the map: ceil mode still has the first (partial) window, as in a
    # SqueezeNet's ceil-mode pools on a small input (onnxruntime and PyTorch give 1x1)
    ("ceil_wider_kernel", (1, 2, 2, 2), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("ceil_wider_kernel_1d", (2, 3, 2), dict(kernel_shape=[3], strides=[2], ceil_mode=1)),
    ("ceil_wider_dilated", (1, 2, 2, 3), dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2], ceil_mode=1)),
    ("ceil_no_window", (1, 2, 1, 1), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    # No window along one axis only, through the padded path: an empty result, not window
    # slices that wrap around (ceil((2 - 5) / 2) + 1 = 0 rows, 1 column).
    (
        "ceil_no_window_one_axis",
        (1, 3, 1, 1),
        dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2], pads=[1, 1, 0, 2], ceil_mode=1),
    ),
]


@pytest.mark.parametrize("name,shape,attrs", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_max_pool(name: str, shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    got, want = _both("MaxPool", {"X": x}, opset=12, **attrs)
    _same(got, want)


# onnxruntime defines column-major Indices (storage_order=1) for 2-D pooling only.
INDEX_CASES = [(*c, so) for c in POOL_CASES for so in (0, 1) if so == 0 or len(c[1]) == 4]


@pytest.mark.parametrize("name,shape,attrs,storage_order", INDEX_CASES, ids=[f"{c[0]}-so{c[3]}" for c in INDEX_CASES])
def test_max_pool_indices(name: str, shape: tuple[int, ...], attrs: dict[str, Any], storage_order: int) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32)
    outs = {"Y": TensorProto.FLOAT, "Indices": TensorProto.INT64}
    got, want = _both("MaxPool", {"X": x}, opset=12, outs=outs, storage_order=storage_order, **attrs)
    _same(got, want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16, np.float64])
def test_max_pool_dtypes(dtype: Any) -> None:
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is not None:
        # extreme values included: padding must never win, even against the type's minimum
        x = rng.integers(info.min, info.max, size=(1, 2, 6, 7), endpoint=True).astype(dtype)
        x[0, 0, 0, :] = info.min
    else:
        x = rng.standard_normal((1, 2, 6, 7)).astype(dtype)
    attrs = dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 1, 0], ceil_mode=1)
    got, want = _both("MaxPool", {"X": x}, opset=12, **attrs)
    _same(got, want)


def test_a_kernel_too_wide_for_any_window_is_refused_as_onnxruntime_does() -> None:
    # ceil((1 - 5) / 2) + 1 < 0: no window can start inside the map (onnxruntime: "Calculated
    # output dimension is negative"); in floor mode any kernel wider than the map is refused.
    x = np.ones((1, 1, 1, 2), np.float32)
    for attrs in (
        dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2], ceil_mode=1),
        dict(kernel_shape=[3, 3], strides=[2, 2]),
    ):
        with pytest.raises(onnxpy.RuntimeException, match="larger than the padded input"):
            _ours("MaxPool", {"X": x}, **attrs)


def test_max_pool_indices_ignore_padding_at_type_minimum() -> None:
    x = np.full((1, 1, 3, 3), np.iinfo(np.int8).min, dtype=np.int8)
    outs = {"Y": TensorProto.INT8, "Indices": TensorProto.INT64}
    data = _model("MaxPool", {"X": x}, outs, 12, kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    y, idx = onnxpy.InferenceSession(data).run(None, {"X": x})
    assert y.shape == (1, 1, 4, 4)
    assert np.all(y == np.iinfo(np.int8).min)
    assert idx.min() >= 0 and idx.max() < 9  # every index names a real input element


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("kind", ["ties", "nan", "type_minimum"])
def test_max_pool_indices_ties_nan_and_padding_as_onnxruntime(kind: str, storage_order: int) -> None:
    """The first maximum in kernel order wins, a padded position never does, and a NaN wins
    only as a window's first element: the same element as onnxruntime picks."""
    if kind != "ties":
        skip_before_onnxruntime(
            (1, 32), "skips NaN in max pools and names padded positions at the type minimum (seen in 1.23)"
        )
    rng = np.random.default_rng(6)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 1], pads=[1, 1, 1, 1], ceil_mode=1)
    if kind == "ties":  # few distinct values: nearly every window has several maxima
        x = rng.integers(-2, 2, size=(2, 3, 7, 6)).astype(np.int8)
        outs = {"Y": TensorProto.INT8, "Indices": TensorProto.INT64}
    elif kind == "type_minimum":  # the padding's value is the input's too
        x = np.full((1, 2, 5, 5), np.iinfo(np.int8).min, dtype=np.int8)
        x[0, 1, 2, 2] = 3
        outs = {"Y": TensorProto.INT8, "Indices": TensorProto.INT64}
    else:
        x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
        x[0, 0, ::2, ::3] = np.nan
        outs = {"Y": TensorProto.FLOAT, "Indices": TensorProto.INT64}
    got, want = _both("MaxPool", {"X": x}, opset=12, outs=outs, storage_order=storage_order, **attrs)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_max_pool_indices_make_no_python_loop_over_taps() -> None:
    from tests.helpers import python_lines_run

    x = np.random.default_rng(7).standard_normal((1, 4, 9, 9)).astype(np.float32)
    outs = {"Y": TensorProto.FLOAT, "Indices": TensorProto.INT64}
    lines = {}
    for k in (2, 5):
        data = _model("MaxPool", {"X": x}, outs, 12, kernel_shape=[k, k], pads=[1, 1, 1, 1])
        sess = onnxpy.InferenceSession(data)
        sess.run(None, {"X": x})
        _, lines[k] = python_lines_run(lambda: sess.run(None, {"X": x}))  # noqa: B023 - called at once
    assert lines[5] < lines[2] + 10, lines  # 25 taps cost no more Python than 4


def test_max_pool_opset8_storage_order() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 2, 5, 4)).astype(np.float32)
    outs = {"Y": TensorProto.FLOAT, "Indices": TensorProto.INT64}
    got, want = _both("MaxPool", {"X": x}, opset=8, outs=outs, kernel_shape=[2, 2], storage_order=1, strides=[1, 2])
    _same(got, want)


@pytest.mark.parametrize("small_map_limit", [0, 1 << 30], ids=["window-sums", "one-product"])
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("name,shape,attrs", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_average_pool(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    shape: tuple[int, ...],
    attrs: dict[str, Any],
    count_include_pad: int,
    small_map_limit: int,
) -> None:
    # Both forms: window sums divided by their counts, and one product with the matrix that
    # the pool makes of the unit planes (small maps).
    from onnxpy.ops import pool as pool_mod

    monkeypatch.setattr(pool_mod, "_SMALL_MAP_MEAN_MAX_ENTRIES", small_map_limit)
    if count_include_pad and name in ("ceil_pads", "dilated", "same_upper", "same_lower"):
        skip_before_onnxruntime((1, 24), "counts padded positions wrongly here (onnxpy matches onnx.reference)")
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(np.float32)
    got, want = _both("AveragePool", {"X": x}, opset=19, count_include_pad=count_include_pad, **attrs)
    _same(got, want)


def test_average_pool_opset7_and_10() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 3, 7, 7)).astype(np.float32)
    got, want = _both("AveragePool", {"X": x}, opset=7, kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)
    _same(got, want)
    got, want = _both("AveragePool", {"X": x}, opset=10, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
    _same(got, want)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize(
    "shape,attrs,whole",
    [
        ((2, 8, 7, 7), {"kernel_shape": [7, 7]}, True),  # ResNet's head
        ((1, 8, 6, 6), {"kernel_shape": [7, 7], "pads": [0, 0, 1, 1]}, None),  # GoogLeNet's
        ((2, 4, 9), {"kernel_shape": [9]}, True),  # 1-D
        ((1, 3, 7, 7), {"kernel_shape": [6, 6]}, False),  # 2x2 windows
    ],
    ids=["7x7-on-7x7", "padded", "1d", "not-whole"],
)
def test_average_pool_over_the_whole_map(
    monkeypatch: pytest.MonkeyPatch,
    shape: tuple[int, ...],
    attrs: dict[str, Any],
    whole: bool | None,
    count_include_pad: int,
) -> None:
    # One mean per channel where the single window covers the map and counts no padding.
    from onnxpy.ops import pool as pool_mod

    taken: list[bool] = []
    original = pool_mod._whole_map_mean
    monkeypatch.setattr(pool_mod, "_whole_map_mean", lambda *a: taken.append((r := original(*a)) is not None) or r)
    if count_include_pad and "pads" in attrs:
        skip_before_onnxruntime((1, 24), "counts padded positions wrongly under asymmetric pads")
    rng = np.random.default_rng(8)
    x = rng.standard_normal(shape).astype(np.float32)
    got, want = _both("AveragePool", {"X": x}, opset=19, count_include_pad=count_include_pad, **attrs)
    _same(got, want)
    expected = whole if whole is not None else not count_include_pad
    assert taken == [expected]


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize(
    "shape,dtype,attrs,tiled",
    [
        ((1, 6, 8, 8), np.float32, {"kernel_shape": [2, 2], "strides": [2, 2]}, True),  # DenseNet's
        ((2, 3, 6, 9), np.float64, {"kernel_shape": [2, 2], "strides": [2, 2]}, True),  # last column unread
        ((1, 4, 9, 9), np.float32, {"kernel_shape": [3, 3], "strides": [3, 3]}, True),
        ((1, 4, 6, 8), np.float32, {"kernel_shape": [1, 2], "strides": [1, 2]}, True),
        ((1, 4, 7, 8), np.float32, {"kernel_shape": [2, 2], "strides": [2, 2]}, False),  # a row left over
        ((1, 4, 8, 8), np.float32, {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}, False),
        ((1, 4, 8, 8), np.float32, {"kernel_shape": [2, 2], "strides": [1, 1]}, False),  # overlapping
        ((1, 4, 8, 70), np.float32, {"kernel_shape": [2, 2], "strides": [2, 2]}, False),  # rows too long
    ],
    ids=["2x2", "odd-width-f64", "3x3", "1x2", "odd-height", "padded", "stride-1", "wide"],
)
def test_average_pool_tiling_the_map_is_one_product(
    monkeypatch: pytest.MonkeyPatch,
    shape: tuple[int, ...],
    dtype: type,
    attrs: dict[str, Any],
    tiled: bool,
    count_include_pad: int,
) -> None:
    # Windows that tile the map (kernel == stride, no padding reached) take one matrix product.
    from onnxpy.ops import pool as pool_mod

    taken: list[bool] = []
    original = pool_mod._tiled_mean
    monkeypatch.setattr(pool_mod, "_tiled_mean", lambda *a: taken.append((r := original(*a)) is not None) or r)
    x = np.random.default_rng(10).standard_normal(shape).astype(dtype)
    if dtype == np.float32:
        got, want = _both("AveragePool", {"X": x}, opset=19, count_include_pad=count_include_pad, **attrs)
    else:  # onnxruntime has no float64 AveragePool: the windows' means, straight from numpy
        (kh, kw), (n, c, h, w) = attrs["kernel_shape"], shape
        got = [_ours("AveragePool", {"X": x}, count_include_pad=count_include_pad, **attrs)]
        oh, ow = h // kh, w // kw
        want = [x[:, :, : oh * kh, : ow * kw].reshape(n, c, oh, kh, ow, kw).mean(axis=(3, 5))]
    _same(got, want)
    assert taken == [tiled]


def test_average_pool_float16() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 2, 9, 9)).astype(np.float16)
    got = _ours("AveragePool", {"X": x}, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    want = _ours("AveragePool", {"X": x.astype(np.float32)}, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("name", ["ceil_pads", "dilated", "same_upper", "1d", "3d", "ceil_no_window_one_axis"])
def test_lp_pool(p: int, name: str) -> None:
    _, shape, attrs = next(c for c in POOL_CASES if c[0] == name)
    rng = np.random.default_rng(8)
    x = rng.standard_normal(shape).astype(np.float32)
    got, want = _both("LpPool", {"X": x}, opset=18, p=p, **attrs)
    _same(got, want, 1e-4)


def test_lp_pool_opset11() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    got, want = _both("LpPool", {"X": x}, opset=11, p=3, kernel_shape=[2, 3], strides=[2, 1], pads=[1, 0, 0, 1])
    _same(got, want, 1e-4)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 7), (1, 2, 3, 2, 4)])
def test_global_lp_pool(p: int, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(10)
    x = rng.standard_normal(shape).astype(np.float32)
    got, want = _both("GlobalLpPool", {"X": x}, opset=2, p=p)
    _same(got, want, 1e-4)


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 7), (1, 2, 3, 2, 4), (1, 3, 1, 1), (1, 64, 13, 13)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_global_pools(op_type: str, shape: tuple[int, ...], dtype: Any) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape).astype(dtype)
    if dtype == np.float64:  # onnxruntime has no double kernels for these: numpy oracle
        axes = tuple(range(2, len(shape)))
        want = [x.mean(axis=axes, keepdims=True) if op_type == "GlobalAveragePool" else x.max(axis=axes, keepdims=True)]
        got = [_ours(op_type, {"X": x}, opset=17)]
    else:
        got, want = _both(op_type, {"X": x}, opset=17)
    _same(got, want, 2e-3 if dtype == np.float16 else 1e-5)


# -- MaxUnpool -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,attrs",
    [
        ((1, 2, 4, 4), dict(kernel_shape=[2, 2], strides=[2, 2])),
        ((2, 3, 6, 5), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])),
        ((1, 1, 9), dict(kernel_shape=[3], strides=[3])),
    ],
)
def test_max_unpool_round_trip(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(12)
    x = rng.standard_normal(shape).astype(np.float32)
    outs = {"Y": TensorProto.FLOAT, "Indices": TensorProto.INT64}
    pooled, idx = onnxpy.InferenceSession(_model("MaxPool", {"X": x}, outs, 12, **attrs)).run(None, {"X": x})
    feeds = {"X": pooled, "I": idx}
    nd = len(shape) - 2
    p = attrs.get("pads", [0] * 2 * nd)
    default = [
        (pooled.shape[2 + i] - 1) * attrs["strides"][i] + attrs["kernel_shape"][i] - p[i] - p[nd + i] for i in range(nd)
    ]
    if default == list(shape[2:]):
        got, want = _both("MaxUnpool", feeds, opset=11, **attrs)
        _same(got, want)
    # with output_shape equal to the pooled input's shape every index lands where it came from
    feeds["output_shape"] = np.array(shape, dtype=np.int64)
    got, want = _both("MaxUnpool", feeds, opset=11, **attrs)
    _same(got, want)
    assert got[0].shape == shape
    np.testing.assert_array_equal(got[0].reshape(-1)[idx.reshape(-1)], pooled.reshape(-1))


def test_max_unpool_bad_index_raises() -> None:
    x = np.ones((1, 1, 2, 2), np.float32)
    idx = np.array([[[[0, 1], [2, 99]]]], np.int64)
    data = _model("MaxUnpool", {"X": x, "I": idx}, {"Y": TensorProto.FLOAT}, 11, kernel_shape=[2, 2], strides=[2, 2])
    with pytest.raises(Exception, match="indices"):
        onnxpy.InferenceSession(data).run(None, {"X": x, "I": idx})


# -- MaxRoiPool ----------------------------------------------------------------------------------


@pytest.mark.parametrize("spatial_scale", [1.0, 0.5])
def test_max_roi_pool(spatial_scale: float) -> None:
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = np.array(
        [[0, 1, 1, 6, 5], [1, 0, 0, 11, 9], [0, 3.4, 2.6, 4.2, 3.1], [1, 8, 7, 20, 15], [0, 5, 5, 5, 5]],
        dtype=np.float32,
    )
    got, want = _both("MaxRoiPool", {"X": x, "rois": rois}, opset=17, pooled_shape=[3, 4], spatial_scale=spatial_scale)
    _same(got, want)


# -- the unpadded (clipped-tap) and flat-line pooling paths ---------------------------------------


def _brute_pool(
    x: np.ndarray, k: list[int], s: list[int], d: list[int], pads: list[int], out: list[int], mode: str
) -> np.ndarray:
    """Window by window over an explicitly padded copy: the definition, slowly."""
    nd = len(k)
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(
        x.astype(np.float64),
        [(0, 0), (0, 0)] + [(pads[i], pads[nd + i] + k[i] * d[i]) for i in range(nd)],
        constant_values=fill,
    )
    y = np.empty(x.shape[:2] + tuple(out))
    for pos in np.ndindex(*out):
        idx = tuple(slice(p * s[i], p * s[i] + (k[i] - 1) * d[i] + 1, d[i]) for i, p in enumerate(pos))
        win = xp[(slice(None), slice(None), *idx)]
        axes = tuple(range(2, 2 + nd))
        y[(slice(None), slice(None), *pos)] = win.max(axis=axes) if mode == "max" else win.sum(axis=axes)
    return y


GEOMETRIES = [
    # (input spatial, kernel, strides, dilations, pads): same-padding stride 1 (flat passes on
    # every axis), even stride-2 reductions (flat innermost pass), odd sizes, dilations, pads
    # past the kernel's reach, asymmetric pads, 1-D and 3-D.
    ((28, 28), [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
    ((112, 112), [3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
    ((111, 111), [3, 3], [2, 2], [1, 1], [0, 0, 0, 0]),
    ((14, 14), [5, 5], [1, 1], [1, 1], [2, 2, 2, 2]),
    ((16, 16), [2, 2], [2, 2], [1, 1], [0, 0, 0, 0]),
    ((13, 9), [3, 2], [1, 2], [2, 1], [2, 0, 2, 1]),
    ((10, 12), [3, 3], [3, 2], [1, 1], [0, 1, 2, 0]),
    ((7, 7), [3, 3], [1, 1], [1, 1], [2, 2, 2, 2]),
    # Strided windows of 3+ taps on the innermost axis: a stride-1 flat pass, subsampled, with
    # the windows crossing the axis's ends recomputed (pads, dilations, both ends).
    ((9, 13), [3, 4], [2, 3], [1, 2], [1, 2, 0, 1]),
    ((12, 11), [3, 3], [2, 2], [1, 1], [0, 1, 1, 1]),
    ((8, 17), [1, 5], [1, 3], [1, 1], [0, 2, 0, 2]),
    ((20,), [4], [1], [1], [1, 2]),
    ((6, 7, 8), [3, 3, 3], [1, 1, 2], [1, 1, 1], [1, 1, 1, 1, 1, 1]),
]


@pytest.mark.parametrize("spatial,k,s,d,pads", GEOMETRIES)
@pytest.mark.parametrize("mode", ["max", "sum"])
def test_clipped_pool_paths_match_the_definition(
    spatial: tuple[int, ...], k: list[int], s: list[int], d: list[int], pads: list[int], mode: str
) -> None:
    from onnxpy.ops import pool as P

    x = np.random.default_rng(3).standard_normal((2, 3, *spatial)).astype(np.float32)
    nd = len(spatial)
    out = [(n + pads[i] + pads[nd + i] - ((k[i] - 1) * d[i] + 1)) // s[i] + 1 for i, n in enumerate(spatial)]
    want = _brute_pool(x, k, s, d, pads, out, mode)
    combine = np.maximum if mode == "max" else np.add
    got = P._separable_clipped(np, x, k, s, d, pads[:nd], out, combine)
    # The clipped path needs, on every axis, a tap inside the input for every window.
    covered = all(
        any(all(0 <= q * s[i] - pads[i] + j * d[i] < n for q in range(out[i])) for j in range(k[i]))
        for i, n in enumerate(spatial)
    )
    if not covered:
        assert got is None  # the padded path runs instead (the onnxruntime test covers it)
        return
    assert got is not None and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spatial,k,s,d,pads", [g for g in GEOMETRIES if len(g[0]) == 2])
@pytest.mark.parametrize("mode", ["max", "sum"])
@pytest.mark.parametrize("layout", ["nchw", "strided"])
def test_pools_in_blocks_of_planes_match_the_definition(
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    spatial: tuple[int, ...],
    k: list[int],
    s: list[int],
    d: list[int],
    pads: list[int],
    mode: str,
    layout: str,
) -> None:
    """Large 2-D pools run a few planes at a time (``_run_blocked``): here every input is
    large enough and a block holds two planes, so 2 images x 5 channels make 6 blocks, the
    last one short; a strided view (every other channel of a larger array) is blocked in place."""
    from onnxpy.ops import pool as P

    x = np.random.default_rng(6).standard_normal((2, 10 if layout == "strided" else 5, *spatial)).astype(np.float32)
    if layout == "strided":
        x = x[:, ::2]
    monkeypatch.setattr(P, "_BLOCKED_MIN_BYTES", 0)
    monkeypatch.setattr(P, "_BLOCK_BYTES", 2 * math.prod(spatial) * x.itemsize)
    # Plans are cached per geometry: none made under other limits may answer, none made under
    # these may outlive the test.
    P._clipped_plan.cache_clear()
    request.addfinalizer(P._clipped_plan.cache_clear)
    blocks: list[int] = []
    run = P._run_steps

    def counted(src: Any, acc: Any, steps: Any, combine: Any) -> None:
        if acc.ndim == 4:  # not the subsampled pass's flat steps (its edge steps count)
            blocks.append(acc.shape[1])
        run(src, acc, steps, combine)

    monkeypatch.setattr(P, "_run_steps", counted)
    out = [(n + pads[i] + pads[2 + i] - ((k[i] - 1) * d[i] + 1)) // s[i] + 1 for i, n in enumerate(spatial)]
    got = P._separable_clipped(np, x, k, s, d, pads[:2], out, np.maximum if mode == "max" else np.add)
    if got is None:
        return  # pads past the kernel's reach: the padded path (test above)
    assert blocks == [2, 2, 2, 2, 1, 1] * 2  # two passes per block
    np.testing.assert_allclose(got, _brute_pool(x, k, s, d, pads, out, mode), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("geometry", [g for g in GEOMETRIES if len(g[0]) == 2 and g[2] == [1, 1]])
@pytest.mark.parametrize("mode", ["max", "sum", "floor"])
@pytest.mark.parametrize("strided", [False, True])
def test_stride_one_pools_in_blocks_of_channels_match_the_definition(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, geometry: tuple[Any, ...], mode: str, strided: bool
) -> None:
    """Large stride-1 2-D pools run a block of whole channels of one image at a time
    (``_run_channel_blocks``), each block's last pass writing into the result: here a block
    holds two channels, so 2 images x 5 channels make 6 blocks, the last of each image short;
    "floor" is FusedMaxPool's max(pool, 0) applied per block; a strided view (every other
    channel of a larger array) takes the blocks too, through strided passes."""
    from onnxpy.ops import pool as P

    spatial, k, s, d, pads = geometry
    x = (
        np.random.default_rng(7)
        .standard_normal((2, 10 if strided else 5, *spatial))
        .astype(np.float32)[:, :: 1 + strided]
    )
    for name, value in (("_CHANNEL_BLOCKED_MIN_BYTES", 0), ("_CHANNEL_BLOCK_BYTES", 2 * math.prod(spatial) * 4)):
        monkeypatch.setattr(P, name, value)
    P._clipped_plan.cache_clear()  # no plan made under other limits may answer, nor outlive the test
    request.addfinalizer(P._clipped_plan.cache_clear)
    blocks: list[int] = []
    run = P._run_pass

    def counted(xp: Any, src: Any, plan: Any, combine: Any, acc: Any = None) -> Any:
        if acc is not None:  # a block's last pass, writing its channels of the result
            assert acc.base is not None and acc.flags.c_contiguous
            blocks.append(acc.shape[1])
        return run(xp, src, plan, combine, acc)

    monkeypatch.setattr(P, "_run_pass", counted)
    out = [(n + pads[i] + pads[2 + i] - ((k[i] - 1) * d[i] + 1)) // s[i] + 1 for i, n in enumerate(spatial)]
    combine = np.add if mode == "sum" else np.maximum
    got = P._separable_clipped(np, x, k, s, d, pads[:2], out, combine, 0.0 if mode == "floor" else None)
    if got is None:
        return  # pads past the kernel's reach: the padded path (test above)
    assert blocks == [2, 2, 1] * 2
    want = _brute_pool(x, k, s, d, pads, out, "sum" if mode == "sum" else "max")
    np.testing.assert_allclose(got, np.maximum(want, 0) if mode == "floor" else want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("kernel,pads", [([3, 3], [1, 1, 1, 1]), ([5, 5], [2, 2, 2, 2]), ([3, 3], [0, 1, 1, 0])])
def test_large_stride_one_pools_match_onnxruntime(op_type: str, kernel: list[int], pads: list[int]) -> None:
    """Inputs over the channel-block threshold (Inception v3's 288x35x35 pool projections,
    YOLO's 5x5 SPPF pools) through the session, against onnxruntime: MaxPool, and AveragePool
    with and without counting the padding."""
    x = np.random.default_rng(11).standard_normal((1, 288, 35, 35)).astype(np.float32)
    assert x.nbytes > 1 << 20
    if op_type == "MaxPool":
        _same(*_both(op_type, {"X": x}, kernel_shape=kernel, pads=pads))
        return
    for cip in (0, 1):
        if cip and pads[:2] != pads[2:]:
            skip_before_onnxruntime((1, 24), "counts padded positions wrongly under asymmetric pads")
        _same(*_both(op_type, {"X": x}, kernel_shape=kernel, pads=pads, count_include_pad=cip))


@pytest.mark.parametrize("spatial,k,s,d,pads", [g for g in GEOMETRIES if len(g[0]) == 2])
@pytest.mark.parametrize("mode", ["max", "sum"])
def test_channels_last_input_is_pooled_channels_last(
    spatial: tuple[int, ...], k: list[int], s: list[int], d: list[int], pads: list[int], mode: str
) -> None:
    """A channels-last input (ShuffleNet's pools read a channels-last 1x1 result) is reduced in
    its own memory order, spatial axes first, and the result stays channels-last."""
    from onnxpy.ops import _layout
    from onnxpy.ops import pool as P

    x = np.random.default_rng(9).standard_normal((2, 6, *spatial)).astype(np.float32)
    x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    out = [(n + pads[i] + pads[2 + i] - ((k[i] - 1) * d[i] + 1)) // s[i] + 1 for i, n in enumerate(spatial)]
    got = P._separable_clipped(np, x, k, s, d, pads[:2], out, np.maximum if mode == "max" else np.add)
    if got is None:
        return  # pads past the kernel's reach: the padded path
    assert _layout.is_channels_last(got) or got.shape[2] * got.shape[3] == 1
    np.testing.assert_allclose(got, _brute_pool(x, k, s, d, pads, out, mode), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spatial,k,s,d,pads", [g for g in GEOMETRIES if len(g[0]) == 2])
def test_fast_pooling_paths_match_onnxruntime(
    spatial: tuple[int, ...], k: list[int], s: list[int], d: list[int], pads: list[int]
) -> None:
    x = np.random.default_rng(4).standard_normal((1, 4, *spatial)).astype(np.float32)
    _same(*_both("MaxPool", {"X": x}, kernel_shape=k, strides=s, dilations=d, pads=pads))
    if d == [1, 1]:
        for cip in (0, 1):
            if cip and pads[: len(k)] != pads[len(k) :]:
                skip_before_onnxruntime((1, 24), "counts padded positions wrongly under asymmetric pads")
            _same(*_both("AveragePool", {"X": x}, kernel_shape=k, strides=s, pads=pads, count_include_pad=cip))


def test_strided_innermost_pass_is_the_subsampled_flat_one() -> None:
    """SqueezeNet's 3x3/2 max pool on 111x111 takes the subsampled flat pass (the geometry
    tests above check its values); 2-tap windows keep the strided form."""
    from onnxpy.ops import pool as P

    x = np.random.default_rng(5).standard_normal((1, 2, 7, 111)).astype(np.float32)
    three = P._AxisTaps(((0, 55), (0, 55), (0, 55)), 0, (1, 2), 3, 2, 1, 0, 55)
    plan = P._subsampled_plan(x.shape, x.itemsize, True, 3, three, P._SUBSAMPLED_MAX_BYTES)
    assert plan is not None
    got = P._run_pass(np, x, plan, np.maximum)
    want = np.maximum(np.maximum(x[..., 0:109:2], x[..., 1:110:2]), x[..., 2:111:2])
    np.testing.assert_array_equal(got, want)
    two = P._AxisTaps(((0, 55), (0, 55)), 0, (1,), 2, 2, 1, 0, 55)
    assert P._subsampled_plan(x.shape, x.itemsize, True, 3, two, P._SUBSAMPLED_MAX_BYTES) is None


def test_strided_rows_pass_is_the_subsampled_flat_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows axis of an NCHW input takes the subsampled flat pass too (every row shift
    combined at stride 1, then every s-th row kept): the same values as the strided taps,
    including the windows that start in the padding; blocked pools of a contiguous input use
    it for their first pass, a strided view keeps the strided steps, and channels-last input
    (whose rows are long runs already) keeps its own passes."""
    from onnxpy.ops import pool as P

    x = np.random.default_rng(8).standard_normal((1, 3, 112, 9)).astype(np.float32)
    # 3 taps at stride 2 with one row of padding on top: output row 0 reads rows -1..1.
    padded = P._AxisTaps(((1, 56), (0, 56), (0, 56)), 1, (0, 2), 3, 2, 1, 1, 56)
    plan = P._subsampled_plan(x.shape, x.itemsize, True, 2, padded, P._SUBSAMPLED_MAX_BYTES)
    assert plan is not None and plan.kind == "subsampled" and plan.edges
    got = P._run_pass(np, x, plan, np.maximum)
    want = np.maximum(x[:, :, 0:111:2], x[:, :, 1:112:2])
    want[:, :, 1:] = np.maximum(want[:, :, 1:], x[:, :, 1:110:2])
    np.testing.assert_array_equal(got, want)
    two = P._AxisTaps(((0, 56), (0, 56)), 0, (1,), 2, 2, 1, 0, 56)
    assert P._subsampled_plan(x.shape, x.itemsize, True, 2, two, P._SUBSAMPLED_MAX_BYTES) is None
    assert (
        P._subsampled_plan(x.shape, x.itemsize, False, 2, padded, P._SUBSAMPLED_MAX_BYTES) is None
    )  # needs one run of memory
    assert (
        P._subsampled_plan((1, 3, 112, 9, 4), 4, True, 2, padded, P._SUBSAMPLED_MAX_BYTES) is None
    )  # not the rows axis

    big = (1, 64, 111, 111)
    P._clipped_plan.cache_clear()
    blocked = P._clipped_plan(big, 4, True, True, (3, 3), (2, 2), (1, 1), (0, 0), (55, 55), 2, P._current_limits())
    assert isinstance(blocked, P._BlockedPlan) and blocked.first_subsampled is not None
    assert blocked.first_subsampled_last is not None
    strided = P._clipped_plan(big, 4, False, True, (3, 3), (2, 2), (1, 1), (0, 0), (55, 55), 2, P._current_limits())
    assert isinstance(strided, P._BlockedPlan) and strided.first_subsampled is None
    channels_last = P._clipped_plan(
        (1, 27, 27, 64), 4, True, True, (3, 3), (2, 2), (1, 1), (0, 0), (13, 13), 1, P._current_limits()
    )
    assert isinstance(channels_last, tuple) and [p.kind for p in channels_last] == ["axis", "axis"]
    x = np.random.default_rng(9).standard_normal(big).astype(np.float32)
    calls: list[int] = []
    run = P._run_subsampled

    def counted(src: Any, acc: Any, plan: Any, line: Any, combine: Any) -> None:
        calls.append(acc.shape[2])
        run(src, acc, plan, line, combine)

    monkeypatch.setattr(P, "_run_subsampled", counted)
    y = P._max_pool(np, x, [3, 3], [2, 2], [1, 1], [0, 0, 0, 0], "NOTSET", 1, 0, False)
    per_block = blocked.per_block
    assert calls == [55, 55] * -(-64 // per_block)  # rows, then columns, in every block
    want = x[:, :, 0:109:2, 0:109:2]
    for i in range(3):
        for j in range(3):
            want = np.maximum(want, x[:, :, i : i + 109 : 2, j : j + 109 : 2])
    np.testing.assert_array_equal(y, want)


def test_changed_limits_are_never_answered_from_a_cached_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans are cached per geometry and per the byte limits a call read (benchmarks/knob_ab.py
    switches them between calls): with the subsampled pass's limit at 0 the next call plans
    without it, no cache cleared, and gives the same values."""
    from onnxpy.ops import pool as P

    x = np.random.default_rng(10).standard_normal((1, 64, 111, 111)).astype(np.float32)
    calls: list[int] = []
    run = P._run_subsampled

    def counted(src: Any, acc: Any, plan: Any, line: Any, combine: Any) -> None:
        calls.append(1)
        run(src, acc, plan, line, combine)

    monkeypatch.setattr(P, "_run_subsampled", counted)
    first = P._max_pool(np, x, [3, 3], [2, 2], [1, 1], [0, 0, 0, 0], "NOTSET", 0, 0, False)
    assert calls
    calls.clear()
    monkeypatch.setattr(P, "_SUBSAMPLED_MAX_BYTES", 0)
    second = P._max_pool(np, x, [3, 3], [2, 2], [1, 1], [0, 0, 0, 0], "NOTSET", 0, 0, False)
    assert not calls
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize(
    "shape,attrs",
    [
        ((1, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [3, 3]}),  # windows that tile the map
        ((1, 3, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # a small map, padding not counted
        ((1, 3, 40, 40), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),  # window sums
    ],
    ids=["tiled", "small-map", "window-sums"],
)
def test_average_pool_of_equal_values_is_that_value(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    # Sums, then the division by the count, on every path: weights of 1/9 inside a product
    # made the mean of nine 100s 100.00001.
    x = np.full(shape, 100.0, dtype=np.float32)
    y = _ours("AveragePool", {"X": x}, **attrs)
    assert y.size and np.all(y == 100.0), np.unique(y)
