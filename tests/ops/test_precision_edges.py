"""Half precision and non-finite edges found by an audit against onnxruntime 1.32: Gelu's tanh
form and HardSwish computed without float16 cancellation, Mean of float16 summed wide enough,
Clip's omitted bounds (the type's finite limits), and Softmax of a row holding +inf."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops.test_reduce import node_model, run_ort, run_ours


def _ulps(got: np.ndarray, exact: np.ndarray) -> float:
    """Largest error in units of the float16 spacing at the exact value."""
    return float(np.max(np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float16))))


def test_gelu_tanh_in_float16_keeps_its_digits_for_negative_x() -> None:
    x = np.linspace(-6, 4, 401).astype(np.float16)
    xd = x.astype(np.float64)
    exact = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd**3)))
    (got,) = run_ours(node_model("Gelu", {"x": x}, 1, 20, approximate="tanh"), {"x": x})
    assert got.dtype == np.float16
    # In float16, 1 + tanh(u) cancelled to 0 below x = -3 (1,871 ulp off); onnxruntime is within 5.
    assert _ulps(got, exact) <= 2
    # float32 keeps its relative precision in the tail too (onnxruntime's float32 gives 0 or
    # values 80% off below x = -5, where 1 + tanh(u) cancels).
    xf = x.astype(np.float32)
    (ours32,) = run_ours(node_model("Gelu", {"x": xf}, 1, 20, approximate="tanh"), {"x": xf})
    np.testing.assert_allclose(ours32, exact, rtol=1e-5, atol=0)


def test_hardswish_in_float16_is_rounded_once() -> None:
    x = np.linspace(-4, 4, 801).astype(np.float16)
    xd = x.astype(np.float64)
    exact = xd * np.clip(xd / 6 + 0.5, 0, 1)
    (got,) = run_ours(node_model("HardSwish", {"x": x}, 1, 14), {"x": x})
    assert got.dtype == np.float16 and _ulps(got, exact) <= 0.5 + 1e-9  # 8 ulp when computed in float16


def test_mean_of_float16_does_not_overflow_in_its_sum() -> None:
    inputs = {f"x{i}": np.array([60000, -40000, 1], np.float16) for i in range(3)}
    model = node_model("Mean", inputs, 1, 13)
    (got,) = run_ours(model, inputs)
    want = run_ort(model, inputs)
    assert got.dtype == np.float16 and got.tolist() == [60000, -40000, 1]
    if want is not None:
        assert got.tolist() == want[0].tolist()


def test_sum_of_float16_accumulates_in_float32() -> None:
    # 60000 + 60000 overflows float16; onnxruntime adds in float32 and returns 60000.
    inputs = {f"x{i}": np.array([v], np.float16) for i, v in enumerate([60000, 60000, -60000])}
    model = node_model("Sum", inputs, 1, 13)
    (got,) = run_ours(model, inputs)
    (want,) = run_ort(model, inputs)
    assert got.dtype == want.dtype == np.float16
    assert got.tolist() == want.tolist() == [60000]


@pytest.mark.parametrize("bounds", ["min only", "max only", "neither"])
def test_clip_11_float16_omitted_bound_keeps_infinities(bounds: str) -> None:
    # Opset 11 only: onnxruntime and onnx.reference leave a float16 infinity unclipped when the
    # bound is omitted (from opset 12 onnxruntime clamps it to 65504, the test above).
    x = np.array([np.inf, -np.inf, 2.5, -5.0, 1.0], np.float16)
    inputs: dict[str, np.ndarray | None] = {"x": x}
    if bounds == "min only":
        inputs["lo"] = np.array(-1.5, np.float16)
    elif bounds == "max only":
        inputs.update(lo=None, hi=np.array(2.0, np.float16))
    model = node_model("Clip", inputs, 1, 11)
    (got,) = run_ours(model, inputs)
    (want,) = run_ort(model, inputs)
    assert got.dtype == want.dtype == np.float16
    assert got.tolist() == want.tolist()
    assert np.isinf(got[0]) == (bounds != "max only") and np.isinf(got[1]) == (bounds != "min only")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("bounds", ["min only", "max only", "neither"])
def test_clip_omitted_bounds_are_the_types_finite_limits(dtype: type, bounds: str) -> None:
    x = np.array([np.inf, -np.inf, 2.5, -5.0, 1.0], dtype)
    inputs: dict[str, np.ndarray | None] = {"x": x}
    if bounds == "min only":
        inputs["lo"] = np.array(-1.5, dtype)
    elif bounds == "max only":
        inputs.update(lo=None, hi=np.array(2.0, dtype))
    model = node_model("Clip", inputs, 1, 13)
    (got,) = run_ours(model, inputs)
    big = np.finfo(dtype).max
    want = {
        "min only": [big, -1.5, 2.5, -1.5, 1.0],
        "max only": [2.0, -big, 2.0, -5.0, 1.0],
        "neither": [big, -big, 2.5, -5.0, 1.0],
    }[bounds]
    assert got.dtype == dtype and got.tolist() == np.array(want, dtype).tolist()
    theirs = run_ort(model, inputs)
    if theirs is not None:
        assert got.tolist() == theirs[0].tolist()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("width", [4, 5000])  # the general path and the long-row fast path
def test_softmax_of_a_row_holding_plus_inf_is_nan(dtype: type, width: int) -> None:
    x = np.zeros((3, width), dtype)
    x[0, :4] = [np.inf, 1, 2, 3]  # exp(inf - inf): the spec's function body gives NaN everywhere
    x[1, :] = -np.inf  # 0 / 0
    x[2, :4] = [1, 2, 3, 4]  # a plain row stays finite
    model = node_model("Softmax", {"x": x}, 1, 13)
    (got,) = run_ours(model, {"x": x})
    assert np.isnan(got[:2]).all() and np.isfinite(got[2]).all()
    want = run_ort(model, {"x": x})
    if want is not None:
        np.testing.assert_allclose(got.astype(np.float64), want[0].astype(np.float64), rtol=1e-3, atol=1e-6)
