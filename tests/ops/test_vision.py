"""Vision kernels against onnxruntime (numpy where onnxruntime lacks the case): Resize and
Upsample over every mode / coordinate transformation / nearest rounding / antialias / axes /
aspect-ratio policy and several dtypes, GridSample 2-D and 3-D with every padding mode,
RoiAlign, NonMaxSuppression, AffineGrid, CenterCropPad, SpaceToDepth and DepthToSpace."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxpy
from onnxpy.model.dtypes import elem_type

RNG = np.random.default_rng(1234)


def node_model(op: str, inputs: dict[str, np.ndarray | None], opset: int, n_outputs: int = 1, **attrs: Any) -> bytes:
    """A one-node model; an input given as None is omitted (empty name)."""
    names = [n if v is not None else "" for n, v in inputs.items()]
    while names and names[-1] == "":
        names.pop()
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    vis = [helper.make_tensor_value_info(n, elem_type(v.dtype), v.shape) for n, v in inputs.items() if v is not None]
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, 0, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 21 else 10
    inferred = onnx.shape_inference.infer_shapes(model)
    for o, io in zip(model.graph.output, inferred.graph.output):
        o.type.CopyFrom(io.type)
    first = next(v for v in inputs.values() if v is not None)
    for o in model.graph.output:
        if not o.type.tensor_type.elem_type:
            o.type.tensor_type.elem_type = elem_type(first.dtype)
    return model.SerializeToString()


def run_both(
    op: str, inputs: dict[str, np.ndarray | None], opset: int, n_outputs: int = 1, **attrs: Any
) -> tuple[list[Any], list[Any]]:
    model = node_model(op, inputs, opset, n_outputs, **attrs)
    feeds = {n: v for n, v in inputs.items() if v is not None}
    got = onnxpy.InferenceSession(model).run(None, feeds)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, want


def run_ours(op: str, inputs: dict[str, np.ndarray | None], opset: int, n_outputs: int = 1, **attrs: Any) -> list[Any]:
    model = node_model(op, inputs, opset, n_outputs, **attrs)
    return onnxpy.InferenceSession(model).run(None, {n: v for n, v in inputs.items() if v is not None})


def assert_same(got: Any, want: Any, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    elif atol >= 1 and want.dtype.kind in "iu":  # integers from float math: off by at most atol
        assert np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)), initial=0) <= atol
    else:
        np.testing.assert_array_equal(got, want)


# -- Resize ---------------------------------------------------------------------------------------

COORD_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
# Scales whose products with the input sizes are whole numbers, so onnxruntime's integer
# output length and the spec's fractional one agree.
SCALES = [(2.0, 3.0), (0.5, 0.25), (1.5, 0.75), (3.0, 0.5)]


@pytest.mark.parametrize("coord", COORD_MODES)
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("scales", SCALES)
def test_resize_nearest_scales(coord: str, nearest_mode: str, scales: tuple[float, float]) -> None:
    x = RNG.standard_normal((2, 3, 4, 8)).astype(np.float32)
    s = np.array([1, 1, *scales], dtype=np.float32)
    got, want = run_both(
        "Resize",
        {"X": x, "roi": None, "scales": s},
        19,
        coordinate_transformation_mode=coord,
        nearest_mode=nearest_mode,
    )
    assert_same(got[0], want[0])


@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
def test_resize_nearest_at_exact_ties_picks_what_exact_arithmetic_does(nearest_mode: str) -> None:
    # 7 -> 5 columns at scale 0.75, half_pixel_symmetric: the middle output's source is exactly
    # 3.0 (offset 1/6 + 2.5 / 0.75 - 0.5), which float64 computes as 3.0000000000000004; ceil
    # took column 4 there, onnxruntime column 3.
    x = np.arange(2 * 7, dtype=np.float32).reshape(1, 2, 1, 7)
    s = np.array([1, 1, 1, 0.75], dtype=np.float32)
    got, want = run_both(
        "Resize",
        {"X": x, "roi": None, "scales": s},
        19,
        coordinate_transformation_mode="half_pixel_symmetric",
        nearest_mode=nearest_mode,
    )
    assert_same(got[0], want[0])
    assert got[0][0, 0, 0, 2] == 3.0


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coord", COORD_MODES)
@pytest.mark.parametrize("scales", SCALES)
def test_resize_interpolating_scales(mode: str, coord: str, scales: tuple[float, float]) -> None:
    x = RNG.standard_normal((1, 2, 4, 8)).astype(np.float32)
    s = np.array([1, 1, *scales], dtype=np.float32)
    got, want = run_both(
        "Resize", {"X": x, "roi": None, "scales": s}, 19, mode=mode, coordinate_transformation_mode=coord
    )
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coord", COORD_MODES)
@pytest.mark.parametrize("sizes", [(7, 5), (3, 13), (1, 1), (9, 8)])
def test_resize_sizes(mode: str, coord: str, sizes: tuple[int, int]) -> None:
    x = RNG.standard_normal((1, 2, 5, 8)).astype(np.float32)
    sz = np.array([1, 2, *sizes], dtype=np.int64)
    got, want = run_both(
        "Resize",
        {"X": x, "roi": None, "scales": None, "sizes": sz},
        19,
        mode=mode,
        coordinate_transformation_mode=coord,
    )
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("scales", [(0.5, 0.25), (0.6, 0.3), (1.7, 0.8), (2.0, 0.5)])
def test_resize_antialias(mode: str, exclude_outside: int, scales: tuple[float, float]) -> None:
    x = RNG.standard_normal((1, 2, 10, 20)).astype(np.float32)
    s = np.array([1, 1, *scales], dtype=np.float32)
    got, want = run_both(
        "Resize", {"X": x, "roi": None, "scales": s}, 19, mode=mode, antialias=1, exclude_outside=exclude_outside
    )
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("a", [-0.5, -0.75, -0.3])
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_cubic_coefficient_and_exclude_outside(a: float, exclude_outside: int) -> None:
    x = RNG.standard_normal((1, 1, 6, 7)).astype(np.float32)
    s = np.array([1, 1, 1.5, 0.5], dtype=np.float32)
    got, want = run_both(
        "Resize", {"X": x, "roi": None, "scales": s}, 19, mode="cubic", cubic_coeff_a=a, exclude_outside=exclude_outside
    )
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("extrapolation", [0.0, -7.5])
def test_resize_tf_crop_and_resize(mode: str, extrapolation: float) -> None:
    x = RNG.standard_normal((1, 1, 6, 8)).astype(np.float32)
    roi = np.array([0, 0, -0.2, 0.3, 1, 1, 0.7, 1.4], dtype=np.float32)
    sz = np.array([1, 1, 5, 7], dtype=np.int64)
    got, want = run_both(
        "Resize",
        {"X": x, "roi": roi, "scales": None, "sizes": sz},
        19,
        mode=mode,
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=extrapolation,
    )
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)
    assert (np.asarray(got[0]) == np.float32(extrapolation)).any()


def test_resize_tf_crop_and_resize_refuses_a_non_finite_roi() -> None:
    x = RNG.standard_normal((1, 1, 6, 8)).astype(np.float32)
    roi = np.array([0, 0, np.nan, 0.3, 1, 1, 0.7, np.inf], dtype=np.float32)
    sz = np.array([1, 1, 5, 7], dtype=np.int64)
    with pytest.raises(onnxpy.OnnxpyError, match="roi must hold finite values for tf_crop_and_resize"):
        run_ours(
            "Resize",
            {"X": x, "roi": roi, "scales": None, "sizes": sz},
            19,
            coordinate_transformation_mode="tf_crop_and_resize",
        )


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("axes", [[2, 3], [3, 2], [-1, -2], [1]])
def test_resize_axes_and_keep_aspect_ratio(policy: str, axes: list[int]) -> None:
    x = RNG.standard_normal((1, 3, 6, 9)).astype(np.float32)
    sz = np.array([5, 4][: len(axes)], dtype=np.int64)
    attrs: dict[str, Any] = {"axes": axes, "mode": "linear"}
    if policy != "stretch":
        attrs["keep_aspect_ratio_policy"] = policy
    if any(a < 0 for a in axes):
        # onnxruntime ignores negative axes under keep_aspect_ratio_policy: compare with the
        # same axes counted from the front.
        (got,) = run_ours("Resize", {"X": x, "roi": None, "scales": None, "sizes": sz}, 19, **attrs)
        attrs["axes"] = [a % x.ndim for a in axes]
        (want,) = run_ours("Resize", {"X": x, "roi": None, "scales": None, "sizes": sz}, 19, **attrs)
        np.testing.assert_array_equal(got, want)
    got, want = run_both("Resize", {"X": x, "roi": None, "scales": None, "sizes": sz}, 19, **attrs)
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
@pytest.mark.parametrize("sizes", [[2, 3], [7, 4], [4, 5]])
@pytest.mark.parametrize("nearest_mode", ["floor", "round_prefer_floor", "ceil"])
def test_resize_keep_aspect_ratio_nearest_picks_exact_sources(policy: str, sizes: list[int], nearest_mode: str) -> None:
    """The common ratio is sizes / in_size exactly: rounded to float32 first, 1/3 put output 1
    at source 2.99999994, and floor took pixel 2 instead of 3."""
    x = np.arange(36, dtype=np.float32).reshape(1, 1, 6, 6)
    sz = np.array(sizes, dtype=np.int64)
    attrs = {
        "axes": [2, 3],
        "mode": "nearest",
        "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": nearest_mode,
        "keep_aspect_ratio_policy": policy,
    }
    got, want = run_both("Resize", {"X": x, "roi": None, "scales": None, "sizes": sz}, 19, **attrs)
    np.testing.assert_array_equal(got[0], want[0])


def test_resize_axes_with_scales_and_roi() -> None:
    x = RNG.standard_normal((2, 4, 6)).astype(np.float32)
    roi = np.array([0.1, 0.9], dtype=np.float32)
    s = np.array([2.0], dtype=np.float32)
    got, want = run_both(
        "Resize",
        {"X": x, "roi": roi, "scales": s},
        18,
        axes=[1],
        mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize",
    )
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_volumetric_and_all_axes(mode: str) -> None:
    x = RNG.standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    s = np.array([1, 1, 2, 0.6, 1.5], dtype=np.float32)
    got, want = run_both("Resize", {"X": x, "roi": None, "scales": s}, 13, mode=mode)
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)
    # Batch and channel axes resize too.
    s = np.array([2, 0.5, 1, 1, 1], dtype=np.float32)
    got, want = run_both("Resize", {"X": x[:, :2], "roi": None, "scales": s}, 13, mode="nearest")
    assert_same(got[0], want[0])


def test_resize_cubic_volumetric_is_separable() -> None:
    # onnxruntime has no 5-D cubic Resize: all axes at once equal one axis after the other.
    x = RNG.standard_normal((1, 2, 4, 5, 6)).astype(np.float64)
    (whole,) = run_ours(
        "Resize", {"X": x, "roi": None, "scales": np.array([1, 1, 2, 0.6, 1.5], np.float32)}, 18, mode="cubic"
    )
    y = x
    for axis, scale in ((2, 2.0), (3, 0.6), (4, 1.5)):
        (y,) = run_ours(
            "Resize", {"X": y, "roi": None, "scales": np.array([scale], np.float32)}, 18, mode="cubic", axes=[axis]
        )
    np.testing.assert_allclose(whole, y, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.int64, np.float16, np.float64])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_dtypes(dtype: Any, mode: str) -> None:
    # A seed of its own: the module's generator is consumed in whatever order xdist runs tests.
    x = (np.random.default_rng(17).standard_normal((1, 2, 5, 6)) * 40).astype(dtype)
    s = np.array([1, 1, 1.6, 0.5], dtype=np.float32)
    if dtype in (np.uint8, np.int8, np.int32) or (dtype == np.float16 and mode == "nearest"):
        got, want = run_both("Resize", {"X": x, "roi": None, "scales": s}, 19, mode=mode)
        # Integers interpolate in float32 and truncate: a value within rounding of an integer
        # may land on either side, so linear integer results may differ by one.
        tol = 1 if (mode == "linear" and np.dtype(dtype).kind in "iu") else 1e-3
        assert_same(got[0], want[0], rtol=1e-3, atol=tol)
        return
    # onnxruntime lacks this type: its float32 result, truncated for integers.
    (got,) = run_ours("Resize", {"X": x, "roi": None, "scales": s}, 19, mode=mode)
    _, (ref,) = run_both("Resize", {"X": x.astype(np.float32), "roi": None, "scales": s}, 19, mode=mode)
    want = np.trunc(ref).astype(dtype) if np.dtype(dtype).kind == "i" else ref.astype(dtype)
    assert got.dtype == np.dtype(dtype)
    int_linear = mode == "linear" and np.dtype(dtype).kind == "i"  # truncation at a rounding edge
    np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=1 if int_linear else 1e-4
    )


def test_resize_linear_int64_and_float16_follow_float_math() -> None:
    # A generator of its own: with the module's, the values depended on which tests ran before.
    x = (np.random.default_rng(52).standard_normal((1, 1, 5, 6)) * 40).astype(np.float64)
    s = np.array([1, 1, 1.6, 0.5], dtype=np.float32)
    (ref,) = run_ours("Resize", {"X": x, "roi": None, "scales": s}, 19, mode="linear")
    (got_i,) = run_ours("Resize", {"X": x.astype(np.int64), "roi": None, "scales": s}, 19, mode="linear")
    # Integers interpolate in float32 (as onnxruntime) and truncate toward zero, but for values
    # within 1e-3 of an integer, which are that integer (127 * weights summing to 1 is 126.99999).
    (ref_i,) = run_ours(
        "Resize", {"X": x.astype(np.int64).astype(np.float32), "roi": None, "scales": s}, 19, mode="linear"
    )
    nearest = np.rint(ref_i)
    want_i = np.where(np.abs(ref_i - nearest) < 1e-3, nearest, np.trunc(ref_i)).astype(np.int64)
    np.testing.assert_array_equal(got_i, want_i)
    (got_h,) = run_ours("Resize", {"X": x.astype(np.float16), "roi": None, "scales": s}, 19, mode="linear")
    assert got_h.dtype == np.float16
    np.testing.assert_allclose(got_h.astype(np.float64), ref, rtol=2e-3, atol=0.05)


def test_resize_strings_nearest_gathers_like_indices() -> None:
    idx = np.arange(12, dtype=np.int64).reshape(1, 3, 4)
    words = np.array([f"w{i}" for i in range(12)], dtype=object).reshape(1, 3, 4)
    s = np.array([1, 1.7, 2.4], dtype=np.float32)
    (gi,) = run_ours("Resize", {"X": idx, "roi": None, "scales": s}, 19)
    (gs,) = run_ours("Resize", {"X": words, "roi": None, "scales": s}, 19)
    assert gs.tolist() == words.reshape(-1)[gi].tolist()


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_11_and_13(opset: int, mode: str) -> None:
    x = RNG.standard_normal((1, 2, 4, 6)).astype(np.float32)
    roi = np.zeros(0, dtype=np.float32)
    s = np.array([1, 1, 2, 0.5], dtype=np.float32)
    got, want = run_both(
        "Resize", {"X": x, "roi": roi, "scales": s}, opset, mode=mode, coordinate_transformation_mode="asymmetric"
    )
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)
    # Opset 11 needs an empty scales tensor next to sizes; 13 omits it.
    no_scales = np.zeros(0, dtype=np.float32) if opset == 11 else None
    sz = np.array([1, 2, 7, 3], dtype=np.int64)
    got, want = run_both("Resize", {"X": x, "roi": roi, "scales": no_scales, "sizes": sz}, opset, mode=mode)
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_resize_11_tf_half_pixel_for_nn() -> None:
    x = RNG.standard_normal((1, 1, 5, 7)).astype(np.float32)
    s = np.array([1, 1, 1.6, 0.6], dtype=np.float32)
    got, want = run_both(
        "Resize",
        {"X": x, "roi": np.zeros(0, np.float32), "scales": s},
        11,
        coordinate_transformation_mode="tf_half_pixel_for_nn",
    )
    assert_same(got[0], want[0])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(2.0, 3.0), (0.5, 0.6), (1.5, 2.5)])
def test_resize_10(mode: str, scales: tuple[float, float]) -> None:
    x = RNG.standard_normal((1, 2, 5, 6)).astype(np.float32)
    s = np.array([1, 1, *scales], dtype=np.float32)
    got, want = run_both("Resize", {"X": x, "scales": s}, 10, mode=mode)
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_7_and_9(mode: str) -> None:
    x = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    got, want = run_both("Upsample", {"X": x}, 7, mode=mode, scales=[1.0, 1.0, 2.0, 1.5])
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)
    s = np.array([1, 1, 3, 2.5], dtype=np.float32)
    got, want = run_both("Upsample", {"X": x, "scales": s}, 9, mode=mode)
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_upsample_rejects_downscaling() -> None:
    x = np.ones((1, 1, 4, 4), dtype=np.float32)
    with pytest.raises(Exception, match="scales must be >= 1"):
        run_ours("Upsample", {"X": x, "scales": np.array([1, 1, 0.5, 1], np.float32)}, 9)


def test_resize_errors_name_the_problem() -> None:
    x = np.ones((1, 1, 4, 4), dtype=np.float32)
    s = np.array([1, 1, 2, 2], dtype=np.float32)
    with pytest.raises(Exception, match="scales has 3 values"):
        run_ours("Resize", {"X": x, "roi": None, "scales": s[:3]}, 19)
    model = node_model("Resize", {"X": x, "roi": None, "scales": s}, 19, coordinate_transformation_mode="nope")
    with pytest.raises(Exception, match="coordinate_transformation_mode"):
        onnxpy.InferenceSession(model).run(None, {"X": x, "scales": s})


def test_resize_large_image_is_vectorized() -> None:
    from tests.helpers import python_lines_run

    x = RNG.standard_normal((1, 3, 256, 256)).astype(np.float32)
    s = np.array([1, 1, 2, 2], dtype=np.float32)
    model = node_model("Resize", {"X": x, "roi": None, "scales": s}, 19, mode="cubic")
    sess = onnxpy.InferenceSession(model)
    sess.run(None, {"X": x, "scales": s})
    (y,), lines = python_lines_run(lambda: sess.run(None, {"X": x, "scales": s}))
    assert y.shape == (1, 3, 512, 512)
    # About 500 lines whatever the image size; a per-pixel Python loop would run 786,432+.
    assert lines < 5000, f"{lines} Python lines for one resize"


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "asymmetric"])
def test_resize_as_products_agrees_with_the_gathers(monkeypatch: pytest.MonkeyPatch, mode: str, coord: str) -> None:
    """Short axes interpolate as one product with a matrix of weights; the per-tap gathers
    (the form for long axes) give the same values."""
    from onnxpy.ops import vision

    x = RNG.standard_normal((2, 3, 20, 24)).astype(np.float32)
    s = np.array([1, 1, 2.5, 1.5], dtype=np.float32)
    model = node_model(
        "Resize", {"X": x, "roi": None, "scales": s}, 19, mode=mode, coordinate_transformation_mode=coord
    )
    dense = onnxpy.InferenceSession(model).run(None, {"X": x, "scales": s})[0]
    monkeypatch.setattr(vision, "_DENSE_IN_PER_TAP", 0)
    gathered = onnxpy.InferenceSession(model).run(None, {"X": x, "scales": s})[0]
    np.testing.assert_allclose(dense, gathered, rtol=1e-6, atol=1e-6)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"X": x, "scales": s})[0]
    assert_same(dense, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 6, 7), (1, 2, 100, 150)])
def test_resize_non_finite_values_reach_only_their_own_taps(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...]
) -> None:
    # A product with the weight matrix would give 0 * inf = NaN in every output of the row: a
    # non-finite input takes the gathers, as long axes always do.
    from onnxpy.ops import vision

    x = RNG.standard_normal(shape).astype(np.float32)
    x[0, 0, 2, 3] = np.nan
    x[0, 0, 4, 1] = np.inf
    s = np.array([1, 1, 2, 2], dtype=np.float32)
    model = node_model("Resize", {"X": x, "roi": None, "scales": s}, 19, mode="linear")
    got = onnxpy.InferenceSession(model).run(None, {"X": x, "scales": s})[0]
    monkeypatch.setattr(vision, "_DENSE_IN_PER_TAP", 0)
    gathered = onnxpy.InferenceSession(model).run(None, {"X": x, "scales": s})[0]
    np.testing.assert_array_equal(got, gathered)
    assert np.isnan(got).sum() == 16 and np.isinf(got).sum() == 16  # the 4x4 outputs each reaches
    # onnxruntime agrees but where its border columns multiply the inf by a zero weight (NaN).
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"X": x, "scales": s})[0]
    both = np.isfinite(got) & np.isfinite(want)
    assert both.sum() >= got.size - 40
    np.testing.assert_allclose(got[both], want[both], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_plans_follow_each_runs_shape_and_scales(mode: str) -> None:
    """A node remembers its plan per input shape and scales (making one took most of a small
    Resize's time): runs of other shapes and scales in turn each get their own."""
    from tests.helpers import python_lines_run

    x0 = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    s0 = np.array([1, 1, 2, 2], dtype=np.float32)
    proto = onnx.load_from_string(node_model("Resize", {"X": x0, "roi": None, "scales": s0}, 19, mode=mode))
    for i, d in enumerate(proto.graph.input[0].type.tensor_type.shape.dim[2:]):
        d.dim_param = f"d{i}"
    proto.graph.output[0].type.tensor_type.ClearField("shape")
    model = proto.SerializeToString()
    ours = onnxpy.InferenceSession(model)
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x1 = RNG.standard_normal((1, 2, 6, 3)).astype(np.float32)
    s1 = np.array([1, 1, 0.5, 2], dtype=np.float32)
    for x, scales in [(x0, s0), (x1, s0), (x0, s1), (x0, s0), (x1, s1), (x1, s0)]:
        feeds = {"X": x, "scales": scales}
        assert_same(ours.run(None, feeds)[0], theirs.run(None, feeds)[0])
    fresh = onnxpy.InferenceSession(model)
    _, first = python_lines_run(lambda: fresh.run(None, {"X": x0, "scales": s0}))
    _, again = python_lines_run(lambda: fresh.run(None, {"X": x0, "scales": s0}))
    assert again < 0.75 * first, (first, again)  # the second run only gathers


# -- GridSample -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_16(mode: str, padding: str, align: int) -> None:
    x = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    grid = RNG.uniform(-1.6, 1.6, (2, 4, 7, 2)).astype(np.float32)
    grid[0, 0, :3] = [[-1, -1], [1, 1], [0, 0]]  # exact corners and the centre
    got, want = run_both("GridSample", {"X": x, "grid": grid}, 16, mode=mode, padding_mode=padding, align_corners=align)
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_empty_batch(mode: str) -> None:
    x = np.zeros((0, 1, 3, 3), np.float32)
    grid = np.zeros((0, 2, 2, 2), np.float32)
    got, want = run_both("GridSample", {"X": x, "grid": grid}, 20, mode=mode)
    assert got[0].shape == (0, 1, 2, 2)
    assert_same(got[0], want[0])


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_volumetric(mode: str, padding: str, align: int) -> None:
    x = RNG.standard_normal((2, 2, 3, 4, 5)).astype(np.float32)
    grid = RNG.uniform(-1.5, 1.5, (2, 2, 3, 4, 3)).astype(np.float32)
    got, want = run_both("GridSample", {"X": x, "grid": grid}, 22, mode=mode, padding_mode=padding, align_corners=align)
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_grid_sample_float_types(dtype: Any) -> None:
    x = RNG.standard_normal((1, 2, 4, 4)).astype(dtype)
    grid = RNG.uniform(-1, 1, (1, 3, 3, 2)).astype(dtype)
    got, want = run_both("GridSample", {"X": x, "grid": grid}, 20, mode="linear")
    assert_same(got[0], want[0], rtol=2e-3, atol=2e-3)


def _cubic_1d(t: float, a: float = -0.75) -> list[float]:
    def w(d: float) -> float:
        d = abs(d)
        if d <= 1:
            return (a + 2) * d**3 - (a + 3) * d**2 + 1
        if d < 2:
            return a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a
        return 0.0

    return [w(t + 1), w(t), w(1 - t), w(2 - t)]


def test_grid_sample_volumetric_cubic_against_numpy() -> None:
    # onnxruntime has no 3-D cubic GridSample: a scalar reference with zero padding.
    x = RNG.standard_normal((1, 1, 4, 5, 6))
    grid = RNG.uniform(-1.2, 1.2, (1, 2, 2, 3, 3))
    (got,) = run_ours("GridSample", {"X": x, "grid": grid}, 20, mode="cubic", align_corners=0)
    want = np.zeros((1, 1, 2, 2, 3))
    sizes = x.shape[2:]
    for p in itertools.product(range(2), range(2), range(3)):
        g = grid[(0, *p)]
        coords = [((g[2 - d] + 1) * sizes[d] - 1) / 2 for d in range(3)]
        base = [int(np.floor(c)) for c in coords]
        ws = [_cubic_1d(c - b) for c, b in zip(coords, base)]
        total = 0.0
        for k in itertools.product(range(4), repeat=3):
            idx = [b - 1 + kk for b, kk in zip(base, k)]
            if all(0 <= i < s for i, s in zip(idx, sizes)):
                total += ws[0][k[0]] * ws[1][k[1]] * ws[2][k[2]] * x[(0, 0, *idx)]
        want[(0, 0, *p)] = total
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def test_grid_sample_integer_input_truncates() -> None:
    x = np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4) * 3
    grid = RNG.uniform(-1, 1, (1, 2, 3, 2)).astype(np.float32)
    (got,) = run_ours("GridSample", {"X": x, "grid": grid}, 20)
    (ref,) = run_ours("GridSample", {"X": x.astype(np.float32), "grid": grid}, 20)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.trunc(ref).astype(np.int32))


# -- RoiAlign -------------------------------------------------------------------------------------


def _rois(n: int, size: float) -> np.ndarray:
    a = RNG.uniform(-2, size, (n, 2))
    b = a + RNG.uniform(0.2, size / 1.5, (n, 2))
    return np.concatenate([a, b], axis=1).astype(np.float32)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("sampling_ratio", [0, 1, 3])
def test_roi_align_16(mode: str, ctm: str, sampling_ratio: int) -> None:
    x = RNG.standard_normal((2, 3, 12, 10)).astype(np.float32)
    rois = _rois(6, 10)
    batch = np.array([0, 1, 1, 0, 1, 0], dtype=np.int64)
    got, want = run_both(
        "RoiAlign",
        {"X": x, "rois": rois, "batch_indices": batch},
        16,
        mode=mode,
        coordinate_transformation_mode=ctm,
        sampling_ratio=sampling_ratio,
        output_height=3,
        output_width=4,
        spatial_scale=0.8,
    )
    assert_same(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_10_and_double(mode: str) -> None:
    x = RNG.standard_normal((1, 2, 9, 9))
    rois = _rois(4, 8).astype(np.float64)
    batch = np.zeros(4, dtype=np.int64)
    got, want = run_both(
        "RoiAlign", {"X": x, "rois": rois, "batch_indices": batch}, 10, mode=mode, output_height=2, output_width=3
    )
    assert_same(got[0], want[0], rtol=1e-6, atol=1e-8)


def test_roi_align_22_serves_bfloat16_shape_rules() -> None:
    x = RNG.standard_normal((1, 2, 8, 8)).astype(np.float32)
    rois = _rois(3, 7)
    batch = np.zeros(3, dtype=np.int64)
    (got,) = run_ours("RoiAlign", {"X": x, "rois": rois, "batch_indices": batch}, 22, output_height=2, output_width=2)
    (ref,) = run_ours("RoiAlign", {"X": x, "rois": rois, "batch_indices": batch}, 16, output_height=2, output_width=2)
    np.testing.assert_array_equal(got, ref)


# -- NonMaxSuppression ----------------------------------------------------------------------------


def _boxes(b: int, n: int, center: bool) -> np.ndarray:
    p = RNG.uniform(0, 10, (b, n, 2))
    q = p + RNG.uniform(-3, 3, (b, n, 2))
    if center:
        return np.concatenate([(p + q) / 2, np.abs(q - p)], axis=2).astype(np.float32)
    return np.concatenate([p, q], axis=2).astype(np.float32)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("max_out", [1, 3, 100])
@pytest.mark.parametrize("iou", [0.0, 0.3, 0.7])
@pytest.mark.parametrize("score", [None, 0.4])
def test_non_max_suppression(center: int, max_out: int, iou: float, score: float | None) -> None:
    boxes = _boxes(2, 30, bool(center))
    scores = RNG.uniform(0, 1, (2, 3, 30)).astype(np.float32)
    scores[0, 0, 5] = scores[0, 0, 6]  # a tie
    inputs = {
        "boxes": boxes,
        "scores": scores,
        "max_output_boxes_per_class": np.array([max_out], dtype=np.int64),
        "iou_threshold": np.array([iou], dtype=np.float32),
        "score_threshold": None if score is None else np.array([score], dtype=np.float32),
    }
    got, want = run_both("NonMaxSuppression", inputs, 11, center_point_box=center)
    assert_same(got[0], want[0])


def test_non_max_suppression_optional_inputs() -> None:
    boxes = _boxes(1, 10, False)
    scores = RNG.uniform(0, 1, (1, 2, 10)).astype(np.float32)
    got, want = run_both("NonMaxSuppression", {"boxes": boxes, "scores": scores}, 10)
    assert_same(got[0], want[0])
    assert np.asarray(got[0]).shape == (0, 3)
    inputs = {"boxes": boxes, "scores": scores, "max_output_boxes_per_class": np.array([4], np.int64)}
    got, want = run_both("NonMaxSuppression", inputs, 10)
    assert_same(got[0], want[0])
    assert np.asarray(got[0]).shape[0] > 0


def _corners(rng: np.random.Generator, n: int, kind: str) -> tuple[np.ndarray, ...]:
    """Boxes in rank order as _iou_over reads them: x0, x1, y0, y1, area (float32)."""
    if kind == "grid":  # integer corners: many equal edges and exact IoU ties
        p = rng.integers(0, 6, (n, 2)).astype(np.float32)
        q = p + rng.integers(0, 4, (n, 2)).astype(np.float32)  # some without area
    elif kind == "clustered":  # heavy overlap
        p = rng.normal(5, 0.3, (n, 2)).astype(np.float32)
        q = p + rng.uniform(0.5, 2, (n, 2)).astype(np.float32)
    else:  # spread out, mostly disjoint
        p = rng.uniform(0, 100, (n, 2)).astype(np.float32)
        q = p + rng.uniform(0.1, 4, (n, 2)).astype(np.float32)
    x0, y0 = p[:, 0], p[:, 1]
    x1, y1 = q[:, 0], q[:, 1]
    return x0, x1, y0, y1, (x1 - x0) * (y1 - y0)


@pytest.mark.parametrize("kind", ["grid", "clustered", "spread"])
@pytest.mark.parametrize("iou", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("max_out", [1, 7, 10_000])
def test_nms_from_overlapping_pairs_keeps_what_rounds_keep(kind: str, iou: float, max_out: int) -> None:
    """The pair-based greedy NMS (x-overlaps, then one pass in rank order) and the round per
    kept box give the same boxes in the same order."""
    from onnxpy.ops import vision

    rng = np.random.default_rng(12)
    for n in (0, 1, 2, 50, 400):
        corners = _corners(rng, n, kind)
        want = vision._nms_by_rounds(corners, iou, max_out)
        got = vision._nms_by_overlaps(corners, iou, max_out)
        assert got is not None
        np.testing.assert_array_equal(got, want)


def test_nms_many_boxes_against_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    """A detector's batched NMS: thousands of boxes, most of them kept (a class offset keeps
    classes apart), through the pairs; with no pair budget, through the rounds."""
    from onnxpy.ops import vision

    rng = np.random.default_rng(13)
    n = 3000
    p = rng.uniform(0, 300, (n, 2))
    boxes = np.concatenate([p, p + rng.uniform(1, 30, (n, 2))], axis=1)
    boxes += (rng.integers(0, 20, n) * 400.0)[:, None]  # batched_nms's per-class offset
    inputs = {
        "boxes": boxes[None].astype(np.float32),
        "scores": rng.uniform(0, 1, (1, 1, n)).astype(np.float32),
        "max_output_boxes_per_class": np.array([n], dtype=np.int64),
        "iou_threshold": np.array([0.5], dtype=np.float32),
    }
    got, want = run_both("NonMaxSuppression", inputs, 11)
    assert_same(got[0], want[0])
    assert 0.5 * n < len(want[0]) < n
    monkeypatch.setattr(vision, "NMS_PAIR_BUDGET", 0)
    assert_same(run_ours("NonMaxSuppression", inputs, 11)[0], want[0])


# -- AffineGrid, CenterCropPad, SpaceToDepth, DepthToSpace ---------------------------------------


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 1, 3, 4, 5], [2, 1, 1, 6]])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_affine_grid(align: int, size: list[int], dtype: Any) -> None:
    r = len(size) - 2
    theta = RNG.standard_normal((2, r, r + 1)).astype(dtype)
    got, want = run_both("AffineGrid", {"theta": theta, "size": np.array(size, np.int64)}, 20, align_corners=align)
    assert_same(got[0], want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("shape", "target", "axes"),
    [((5, 6), [3, 9], None), ((4, 7, 3), [6, 2], [0, 1]), ((2, 3, 8), [5], [-1]), ((3, 3), [3, 3], None)],
)
def test_center_crop_pad(shape: tuple[int, ...], target: list[int], axes: list[int] | None) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    attrs = {"axes": axes} if axes else {}
    got, want = run_both("CenterCropPad", {"input_data": x, "shape": np.array(target, np.int64)}, 18, **attrs)
    assert_same(got[0], want[0])
    # Hand-computed: the start of the crop rounds down, the extra pad goes right.
    ax = [a % x.ndim for a in axes] if axes else list(range(x.ndim))
    expect = x
    for a, t in zip(ax, target):
        d = expect.shape[a]
        if d >= t:
            expect = np.take(expect, np.arange((d - t) // 2, (d - t) // 2 + t), axis=a)
        else:
            pad = [(0, 0)] * x.ndim
            pad[a] = ((t - d) // 2, t - d - (t - d) // 2)
            expect = np.pad(expect, pad)
    np.testing.assert_array_equal(got[0], expect)


def test_center_crop_pad_strings() -> None:
    x = np.array([["a", "b"], ["c", "d"]], dtype=object)
    (got,) = run_ours("CenterCropPad", {"input_data": x, "shape": np.array([1, 4], np.int64)}, 18)
    assert got.tolist() == [["", "a", "b", ""]]


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_depth_to_space(mode: str, opset: int, dtype: Any) -> None:
    x = (RNG.standard_normal((2, 8, 3, 4)) * 10).astype(dtype)
    (got,) = run_ours("DepthToSpace", {"input": x}, opset, blocksize=2, mode=mode)
    # The spec's own formulas.
    b, c, h, w = x.shape
    if mode == "DCR":
        t = x.reshape(b, 2, 2, c // 4, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(b, c // 4, 2, 2, h, w).transpose(0, 1, 4, 2, 5, 3)
    np.testing.assert_array_equal(got, t.reshape(b, c // 4, h * 2, w * 2))
    if dtype == np.float32:
        got, want = run_both("DepthToSpace", {"input": x}, opset, blocksize=2, mode=mode)
        assert_same(got[0], want[0])


def test_depth_to_space_1_and_space_to_depth_round_trip() -> None:
    x = RNG.standard_normal((1, 18, 2, 3)).astype(np.float32)
    got, want = run_both("DepthToSpace", {"input": x}, 1, blocksize=3)
    assert_same(got[0], want[0])
    (back,) = run_ours("SpaceToDepth", {"input": np.asarray(got[0])}, 13, blocksize=3)
    np.testing.assert_array_equal(back, x)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_28(mode: str) -> None:
    x = RNG.standard_normal((2, 3, 4, 6)).astype(np.float32)
    got, want = run_both("SpaceToDepth", {"input": x}, 28, blocksize=2, mode=mode)
    assert_same(got[0], want[0])
    (back,) = run_ours("DepthToSpace", {"input": np.asarray(got[0])}, 13, blocksize=2, mode=mode)
    np.testing.assert_array_equal(back, x)


def test_space_to_depth_old_opsets_and_errors() -> None:
    x = RNG.standard_normal((1, 2, 6, 4)).astype(np.float32)
    for opset in (1, 13):
        got, want = run_both("SpaceToDepth", {"input": x}, opset, blocksize=2)
        assert_same(got[0], want[0])
    with pytest.raises(Exception, match="divisible by blocksize"):
        run_ours("SpaceToDepth", {"input": x}, 13, blocksize=4)
    with pytest.raises(Exception, match="blocksize"):
        run_ours("DepthToSpace", {"input": x}, 13, blocksize=2)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_non_finite_coordinates(mode: str, padding: str) -> None:
    """An infinite coordinate samples like a very distant one (zeros padding: 0, border: the
    border value); a NaN one gives NaN. Both used to reach the index arithmetic (IndexError)."""
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    grid = np.array([[[[np.inf, 0.0], [-np.inf, 0.2], [0.3, np.nan], [0.1, 0.1]]]], np.float32)
    far = np.array([[[[1e4, 0.0], [-1e4, 0.2], [0.3, 0.0], [0.1, 0.1]]]], np.float32)
    (got,) = run_ours("GridSample", {"X": x, "grid": grid}, 20, mode=mode, padding_mode=padding)
    (want,) = run_ours("GridSample", {"X": x, "grid": far}, 20, mode=mode, padding_mode=padding)
    assert np.isnan(got[0, 0, 0, 2])
    if padding != "reflection":  # reflecting an infinite distance has no defined place
        np.testing.assert_allclose(got[0, 0, 0, [0, 1, 3]], want[0, 0, 0, [0, 1, 3]], rtol=1e-6)
    if padding == "zeros":
        assert got[0, 0, 0, 0] == 0 and got[0, 0, 0, 1] == 0


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("scale", [0.6, 1.3, 2.5])
def test_resize_of_a_constant_integer_image_stays_constant(mode: str, dtype: Any, scale: float) -> None:
    # Weights summing to 1 over a constant 127 gave 126.99999 in float arithmetic, truncated to
    # 126 (onnxruntime too, at some scales); onnx.reference keeps 127. Values within 1e-3 of an
    # integer are that integer; others still truncate as onnxruntime does.
    x = np.full((1, 1, 7, 9), 127, dtype)
    scales = np.array([1, 1, scale, scale], np.float32)
    (y,) = run_ours("Resize", {"X": x, "roi": None, "scales": scales}, 19, mode=mode)
    assert y.dtype == dtype and np.unique(y).tolist() == [127]
    ramp = (np.arange(63).reshape(1, 1, 7, 9) * 2).astype(dtype)
    (z,) = run_ours("Resize", {"X": ramp, "roi": None, "scales": scales}, 19, mode="linear")
    exact = run_ours("Resize", {"X": ramp.astype(np.float32), "roi": None, "scales": scales}, 19, mode="linear")[0]
    near = np.abs(exact - np.rint(exact)) < 1e-3
    np.testing.assert_array_equal(z[~near], np.trunc(exact[~near]).astype(dtype))
    np.testing.assert_array_equal(z[near], np.rint(exact[near]).astype(dtype))
