"""Elementwise kernels against onnxruntime (numpy where onnxruntime lacks the case): every unary op
over its float types, binary type combinations (Pow), Mod / Div integer semantics, narrow floats,
variadic ops at opset 7, and the ``out=`` buffers the planner relies on."""

from __future__ import annotations

import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from onnxpy.ops import elementwise
from tests.ops.test_reduce import assert_same, node_model, run_ort, run_ours

UNARY = [
    "Abs", "Neg", "Reciprocal", "Floor", "Ceil", "Round", "Sqrt", "Exp", "Log", "Sin", "Cos", "Tan",
    "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Sign", "Erf", "Relu", "Sigmoid",
    "Tanh", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "ThresholdedRelu", "Softplus",
    "Softsign", "Mish", "Gelu", "Shrink",
]  # fmt: skip


def unary_input(op: str, dtype: Any, rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(64) * 3
    v[:6] = [0.0, -0.0, 0.5, -0.5, 2.5, -2.5]  # signed zeros and rounding ties
    if op in ("Log", "Sqrt"):
        v = np.abs(v)
    elif op in ("Asin", "Acos", "Atanh"):
        v = np.tanh(v)
    elif op == "Acosh":
        v = np.abs(v) + 1
    # values exact in float16, so runs at every precision see the same inputs
    return v.astype(np.float16).astype(dtype)


def quiet(fn: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("op", UNARY)
def test_unary_matches_onnxruntime(op: str, dtype: Any) -> None:
    x = unary_input(op, dtype, np.random.default_rng(0))
    opset = 20 if op == "Gelu" else 18
    inputs = {"x": x}
    model = node_model(op, inputs, 1, opset)
    got = quiet(lambda: run_ours(model, inputs))[0]
    want = run_ort(model, inputs)
    if want is None:
        # onnxruntime lacks this type: the float32 result (itself checked above) rounded to dtype.
        want = quiet(
            lambda: run_ours(node_model(op, {"x": x.astype(np.float32)}, 1, opset), {"x": x.astype(np.float32)})
        )
        want = [want[0].astype(dtype)]
    assert_same(got, want[0], rtol=2e-3 if dtype == np.float16 else 1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op", UNARY)
def test_unary_on_a_scalar_tensor(op: str, dtype: Any) -> None:
    """A 0-d input gives the 0-d value of the one-element result (numpy's ufuncs return
    scalars for 0-d arrays: Sigmoid, Erf and Gelu failed on them)."""
    opset = 20 if op == "Gelu" else 18
    one = unary_input(op, dtype, np.random.default_rng(2))[6:7]
    scalar = one.reshape(())
    got = quiet(lambda: run_ours(node_model(op, {"x": scalar}, 1, opset), {"x": scalar}))[0]
    want = quiet(lambda: run_ours(node_model(op, {"x": one}, 1, opset), {"x": one}))[0]
    assert_same(got, want.reshape(()))


def test_hard_sigmoid_float16_rounds_once() -> None:
    # alpha * x + beta in float32, rounded to float16 at the end: the correctly rounded value
    x = np.array([-2.135, 0.7, 3.3], np.float16)
    got = run_ours(node_model("HardSigmoid", {"x": x}, 1, 22), {"x": x})[0]
    want = np.clip(x.astype(np.float64) * 0.2 + 0.5, 0, 1).astype(np.float16)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", UNARY)
def test_unary_bfloat16_follows_float32(op: str) -> None:
    x = unary_input(op, np.float32, np.random.default_rng(1)).astype(ml_dtypes.bfloat16)
    xf = x.astype(np.float32)
    got = quiet(lambda: run_ours(node_model(op, {"x": x}, 1, 22 if op != "Gelu" else 20), {"x": x}))[0]
    want = quiet(lambda: run_ours(node_model(op, {"x": xf}, 1, 22 if op != "Gelu" else 20), {"x": xf}))[0]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1.6e-2, atol=1e-2, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
@pytest.mark.parametrize("op", ["Abs", "Neg", "Sign", "Relu"])
def test_integer_unary(op: str, dtype: Any) -> None:
    x = np.array([np.iinfo(dtype).min + 1, -5, 0, 7, np.iinfo(dtype).max], dtype=dtype)
    model = node_model(op, {"x": x}, 1, 14)
    want = run_ort(model, {"x": x})
    if want is None:
        want = [{"Abs": np.abs, "Neg": np.negative, "Sign": np.sign, "Relu": lambda v: np.maximum(v, 0)}[op](x)]
    assert_same(run_ours(model, {"x": x})[0], want[0])


# -- Mod / Div -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_mod_takes_the_sign_of_the_divisor(dtype: Any) -> None:
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, 3.0, -0.0, 1000.0], dtype=dtype)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, 1.5, 2.0, 7.0], dtype=dtype)
    got = run_ours(node_model("Mod", {"a": a, "b": b}, 1, 13), {"a": a, "b": b})[0]
    expected = a.astype(np.float64) - b.astype(np.float64) * np.floor(a.astype(np.float64) / b.astype(np.float64))
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-3)
    assert np.all((got == 0) | (np.sign(got) == np.sign(b)))
    # fmod=1 keeps the sign of the dividend, as onnxruntime does
    model = node_model("Mod", {"a": a, "b": b}, 1, 13, fmod=1)
    assert_same(run_ours(model, {"a": a, "b": b})[0], run_ort(model, {"a": a, "b": b})[0])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_integer_mod_matches_onnxruntime(dtype: Any, fmod: int) -> None:
    rng = np.random.default_rng(2)
    lo = 0 if np.dtype(dtype).kind == "u" else -20
    a = rng.integers(lo, 21, size=40).astype(dtype)
    b = rng.integers(lo, 21, size=40).astype(dtype)
    b[b == 0] = 3
    model = node_model("Mod", {"a": a, "b": b}, 1, 13, fmod=fmod)
    want = run_ort(model, {"a": a, "b": b})
    if want is None:
        want = [np.fmod(a, b) if fmod else np.remainder(a, b)]
    assert_same(run_ours(model, {"a": a, "b": b})[0], want[0])


@pytest.mark.parametrize("op", ["Mod", "Div"])
def test_integer_division_by_zero_is_an_error(op: str) -> None:
    a = np.array([5, 7], dtype=np.int32)
    b = np.array([0, 3], dtype=np.int32)
    attrs_list = [{"fmod": 0}, {"fmod": 1}] if op == "Mod" else [{}]
    for attrs in attrs_list:
        with pytest.raises(Exception, match="by zero"):
            run_ours(node_model(op, {"a": a, "b": b}, 1, 13, **attrs), {"a": a, "b": b})


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64])
def test_integer_div_truncates_toward_zero(dtype: Any) -> None:
    info = np.iinfo(dtype)
    lo = 0 if info.min == 0 else -9
    a = np.array([7, lo, info.max, info.min, 0, 9], dtype=dtype)
    b = np.array([2, 2, 3, 1, 5, 9], dtype=dtype)
    if info.min < 0:
        b[1] = -2
    model = node_model("Div", {"a": a, "b": b}, 1, 14)
    want = run_ort(model, {"a": a, "b": b})
    if want is None:
        want = [np.trunc(a.astype(np.float64) / b.astype(np.float64)).astype(dtype)]
    assert_same(run_ours(model, {"a": a, "b": b})[0], want[0])


# -- Pow -------------------------------------------------------------------------------------------

POW_TYPES = [
    (np.float32, np.float32),
    (np.float32, np.int64),
    (np.float32, np.int32),
    (np.float32, np.float64),
    (np.float64, np.float32),
    (np.float64, np.int64),
    (np.float16, np.float32),
    (np.float16, np.float16),
    (np.int32, np.int32),
    (np.int64, np.int64),
    (np.int32, np.float32),
    (np.int64, np.float64),
    (np.int64, np.int32),
]


@pytest.mark.parametrize(("base", "exponent"), POW_TYPES, ids=lambda t: np.dtype(t).name)
def test_pow_type_combinations_match_onnxruntime(base: Any, exponent: Any) -> None:
    rng = np.random.default_rng(3)
    if np.dtype(base).kind == "i":
        x = rng.integers(-4, 5, size=30).astype(base)
    else:
        x = (np.abs(rng.standard_normal(30)) * 3).astype(base)
        x[:5] = [-2.0, -0.5, 0.0, 1.0, 3.0]  # negative bases with integral exponents below
    if np.dtype(exponent).kind == "i":
        y = rng.integers(-3, 4, size=30).astype(exponent)
    else:
        y = (rng.standard_normal(30) * 2).astype(exponent)
        y[:5] = [2.0, 3.0, 2.0, -1.5, 0.5]
    if np.dtype(base).kind == "i" and np.dtype(exponent).kind == "i":
        x[x == 0] = 2  # 0 ** negative is inf, whose integer conversion is platform-defined
    model = node_model("Pow", {"x": x, "y": y}, 1, 15)
    got = quiet(lambda: run_ours(model, {"x": x, "y": y}))[0]
    want = run_ort(model, {"x": x, "y": y})
    assert want is not None
    assert_same(got, want[0], rtol=2e-3 if base == np.float16 else 1e-5)


def test_pow_negative_integer_exponents() -> None:
    x = np.array([2, -1, -1, 1, 3, -2, 5], dtype=np.int64)
    y = np.array([-1, -3, -2, -5, -2, -1, 0], dtype=np.int64)
    got = run_ours(node_model("Pow", {"x": x, "y": y}, 1, 15), {"x": x, "y": y})[0]
    assert got.tolist() == [0, -1, 1, 1, 0, 0, 1]


def test_pow_square_fast_path_with_a_constant_exponent() -> None:
    x = np.array([[-3.0, 0.5], [np.inf, np.nan]], dtype=np.float32)
    for y in (np.array(2.0, np.float32), np.array([2], np.int64), np.array(2.0, np.float16)):
        got = run_ours(node_model("Pow", {"x": x, "y": y}, 1, 15), {"x": x, "y": y})[0]
        np.testing.assert_array_equal(got, np.power(x, np.float32(2)))
        assert got.dtype == np.float32


@pytest.mark.parametrize("value", [2.0, 3.0, 0.5])
@pytest.mark.parametrize("shapes", [((), (1,)), ((3,), (1, 1)), ((), (1, 1, 1))], ids=str)
def test_pow_with_a_one_value_exponent_of_higher_rank_broadcasts_to_it(
    value: float, shapes: tuple[tuple[int, ...], tuple[int, ...]]
) -> None:
    # The x ** 2 and x ** 3 fast paths returned the base's shape: () ** [2.0] gave a scalar.
    x = np.full(shapes[0], -1.5, dtype=np.float32)
    y = np.full(shapes[1], value, dtype=np.float32)
    model = node_model("Pow", {"x": x, "y": y}, 1, 15)
    got = quiet(lambda: run_ours(model, {"x": x, "y": y}))[0]
    want = run_ort(model, {"x": x, "y": y})
    assert want is not None
    assert_same(got, want[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("exponent", [np.array(3.0, np.float32), np.array([3], np.int64)])
def test_pow_cube_is_onnxruntimes_product_bit_for_bit(dtype: Any, exponent: np.ndarray) -> None:
    """x ** 3 (GPT-2's gelu_new) as x * x * x: onnxruntime's values exactly, and no slow
    power loop for negative bases."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(4096) * 3).astype(dtype)
    x[:6] = [-0.0, 0.0, np.inf, -np.inf, np.nan, -2.0]
    model = node_model("Pow", {"x": x, "y": exponent}, 1, 15)
    got = quiet(lambda: run_ours(model, {"x": x, "y": exponent}))[0]
    want = run_ort(model, {"x": x, "y": exponent})
    assert want is not None
    np.testing.assert_array_equal(got, want[0])
    assert np.signbit(got[0])  # (-0) ** 3 is -0


def test_pow_bfloat16() -> None:
    x = np.array([1.5, 2.0, 0.25], dtype=ml_dtypes.bfloat16)
    y = np.array([3.0, 0.5, -1.0], dtype=np.float32)
    got = run_ours(node_model("Pow", {"x": x, "y": y}, 1, 15), {"x": x, "y": y})[0]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float32), [3.375, np.sqrt(2), 4.0], rtol=1e-2)


# -- variadic ops, opset 7 -------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
@pytest.mark.parametrize("opset", [7, 8, 13])
def test_variadic_ops_every_opset(op: str, opset: int) -> None:
    rng = np.random.default_rng(4)
    shapes = [(2, 3)] * 3 if opset == 7 else [(2, 3), (3,), (1, 3)]  # broadcasting from opset 8
    inputs = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    model = node_model(op, inputs, 1, opset)
    assert_same(run_ours(model, inputs)[0], run_ort(model, inputs)[0])
    one = {"x0": inputs["x0"]}
    model = node_model(op, one, 1, opset)
    got = run_ours(model, one)[0]
    assert_same(got, one["x0"])


def test_max_min_propagate_nan_like_onnxruntime() -> None:
    a = np.array([np.nan, 1.0, 2.0], dtype=np.float32)
    b = np.array([1.0, np.nan, 1.0], dtype=np.float32)
    for op in ("Max", "Min"):
        model = node_model(op, {"a": a, "b": b}, 1, 13)
        assert_same(run_ours(model, {"a": a, "b": b})[0], run_ort(model, {"a": a, "b": b})[0])


# -- out= buffers the planner uses -----------------------------------------------------------------


def test_out_buffers_are_written_and_returned() -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    for fn, want in (
        (lambda out: elementwise.add(np, a, b, out=out), a + b),
        (lambda out: elementwise.sub(np, a, b, out=out), a - b),
        (lambda out: elementwise.mul(np, a, b, out=out), a * b),
        (lambda out: elementwise.relu(np, a, out=out), np.maximum(a, 0)),
    ):
        buf = np.empty_like(a)
        r = fn(buf)
        assert r is buf
        np.testing.assert_array_equal(buf, want)
    # in place over an input, as the planner does when the input dies at this node
    c = a.copy()
    assert elementwise.relu(np, c, out=c) is c
    np.testing.assert_array_equal(c, np.maximum(a, 0))


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.3, 1.0])
@pytest.mark.parametrize("layout", ["small", "blocked", "channels_last", "strided"])
def test_leaky_relu_as_a_maximum_matches_its_definition(
    monkeypatch: pytest.MonkeyPatch, alpha: float, layout: str
) -> None:
    """LeakyRelu with 0 < alpha <= 1 as max(x, alpha x), the op and the fused activation (in
    place): where(x >= 0, x, alpha x)'s values and signed zeros, NaN and infinities kept, large
    arrays a block at a time in their memory order (here blocks of 100 values); alpha 0 keeps
    the other forms, with the same values."""
    from onnxpy.ops import elementwise
    from onnxpy.ops.fused import apply_activation

    monkeypatch.setattr(elementwise, "_LEAKY_BLOCK", 100)
    rng = np.random.default_rng(16)
    x = (rng.standard_normal((2, 6, 7, 9)) * 3).astype(np.float32)
    x[0, 0, 0, :4] = [np.nan, -0.0, -np.inf, np.inf]
    if layout == "small":
        x = x[:1, :1]  # under four blocks: one whole-array pass
    elif layout == "channels_last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    elif layout == "strided":
        x = x[:, ::2]
    with np.errstate(invalid="ignore"):  # alpha 0: -inf * 0 is NaN, in the definition too
        want = np.where(x >= 0, x, x * np.float32(alpha))
        got = elementwise.leaky_relu(np, x, alpha=alpha)
        fused = apply_activation(np, x.copy(), "LeakyRelu", [alpha])
    for y in (got, fused):
        assert y.shape == x.shape and y.dtype == np.float32
        np.testing.assert_array_equal(y, want)
        if alpha:  # (alpha 0 keeps the older forms, whose zeros may lose their sign)
            np.testing.assert_array_equal(np.signbit(y), np.signbit(want))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_elu_and_selu_are_where_forms_bit_for_bit(dtype: type) -> None:
    """Elu and Selu as max(x, 0) + alpha * expm1(min(x, 0)) (times gamma): the where() forms'
    values exactly, NaN and infinities included."""
    from onnxpy.ops.elementwise import elu, selu

    x = (np.random.default_rng(15).standard_normal(5000) * 5).astype(dtype)
    x[:5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    t = np.dtype(dtype).type
    with np.errstate(all="ignore"):
        want_elu = np.where(x > 0, x, np.expm1(np.minimum(x, 0)) * t(0.7))
        want_selu = np.where(x > 0, x, np.expm1(np.minimum(x, 0)) * t(1.6732632)) * t(1.0507)
        got_elu, got_selu = elu(np, x, alpha=0.7), selu(np, x, alpha=1.6732632, gamma=1.0507)
    assert got_elu.dtype == got_selu.dtype == dtype
    np.testing.assert_array_equal(got_elu, want_elu.astype(dtype))
    np.testing.assert_array_equal(got_selu, want_selu.astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("alpha", [1.0, 0.3, 2.5, -1.5])
def test_celu_is_its_formula_bit_for_bit_without_overflowing(dtype: type, alpha: float) -> None:
    """Celu as max(x, 0) + min(0, alpha * expm1(x / alpha)), the spec's formula, exactly (NaN,
    infinities and a negative alpha included; a zero's sign follows numpy's min and max, whose
    float16 and float32 loops differ there), while for alpha > 0 large positive inputs no
    longer overflow expm1 (that path leaves numpy's vector loop); 0-d inputs too."""
    from onnxpy.ops.elementwise import celu

    rng = np.random.default_rng(16)
    x = np.concatenate([rng.standard_normal(3000) * s for s in (1, 8, 3e3)]).astype(dtype)
    x[:5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    t = np.dtype(dtype).type
    with np.errstate(all="ignore"):
        want = (np.maximum(x, t(0)) + np.minimum(t(0), t(alpha) * np.expm1(x / t(alpha)))).astype(dtype)
        got = celu(np, x, alpha=alpha)
        scalar = celu(np, x[5:6].reshape(()), alpha=alpha)
    assert got.dtype == dtype and scalar.shape == ()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(scalar, want[5])
    if alpha > 0:
        large = np.array([1e3, 3e4, 6e4, np.inf], dtype=dtype)
        with np.errstate(over="raise", invalid="raise"):
            np.testing.assert_array_equal(celu(np, large, alpha=alpha), large)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("alpha", [1.0, 0.0, -0.0, -1.0, float("nan")])
def test_thresholded_relu_is_where_bit_for_bit(dtype: type, alpha: float) -> None:
    """ThresholdedRelu through a bit mask is where(x > alpha, x, 0) exactly: NaN and -inf give
    +0, signed zeros kept where they pass, on contiguous, transposed and strided inputs."""
    from onnxpy.ops.elementwise import thresholded_relu

    x = (np.random.default_rng(17).standard_normal(4096) * 4).astype(dtype)
    x[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]
    t = np.dtype(dtype).type
    for view in (x, x.reshape(64, 64).T, x[::3]):
        got = thresholded_relu(np, view, alpha=alpha)
        want = np.where(view > t(alpha), view, t(0))
        assert got.dtype == dtype and got.shape == view.shape
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("slope_shape", [(4, 1, 1), (1,), (2, 4, 3, 5)])
def test_prelu_matches_its_definition_with_specials(dtype: type, slope_shape: tuple[int, ...]) -> None:
    """PRelu as max(x, 0) + slope * min(x, 0): per channel, scalar-like and full slopes, slopes
    above 1 and negative, NaN and infinities as where(x < 0, x * slope, x) gives them."""
    from onnxpy.ops.elementwise import prelu

    rng = np.random.default_rng(14)
    x = (rng.standard_normal((2, 4, 3, 5)) * 3).astype(dtype)
    x[0, 0, 0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    slope = rng.uniform(-2, 3, slope_shape).astype(dtype)
    with np.errstate(invalid="ignore"):
        want = np.where(x < 0, x * slope, x)
        got = prelu(np, x, slope)
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_sigmoid_is_accurate_on_both_sides_without_warnings(dtype: type) -> None:
    """Sigmoid as 1 / (1 + exp(-x)) (ops/elementwise.logistic): relative error near rounding
    wherever the result is a normal number, 0 (not NaN, no warning) where exp(-x) overflows,
    and the fused activation gives the same values in place."""
    import warnings

    from onnxpy.ops.elementwise import logistic, sigmoid
    from onnxpy.ops.fused import apply_activation

    info = np.finfo(dtype)
    x = np.concatenate([np.linspace(-30, 30, 6001), [-1e4, -800.0, -100.0, 0.0, 100.0, 1e4, np.nan]]).astype(dtype)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-x64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = sigmoid(np, x)
        inplace = apply_activation(np, x.copy(), "Sigmoid", [])
    assert got.dtype == x.dtype and inplace.dtype == x.dtype
    np.testing.assert_array_equal(inplace, got)
    assert np.isnan(got[-1]) and not np.isnan(got[:-1]).any()
    normal = want[:-1] >= info.tiny
    rel = np.abs(got[:-1][normal].astype(np.float64) - want[:-1][normal]) / want[:-1][normal]
    assert rel.max() <= 8 * info.eps, rel.max()
    assert (np.abs(got[:-1][~normal].astype(np.float64)) <= info.tiny).all()  # tiny or 0
    if dtype != np.float16:  # sigmoid(-30) = 9.4e-14 is below float16's range
        assert x[0] < 0 and 0 < got[0] < 1e-12  # the negative side keeps its relative accuracy
    out = np.empty_like(x)
    assert logistic(np, x, out=out) is out
    np.testing.assert_array_equal(out, got)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_reciprocal_gives_numpys_bits_and_dtype(dtype: type) -> None:
    """Reciprocal (and Sigmoid's last pass) divide 1 by the array on numpy float32/float64,
    which runs about twice as fast as np.reciprocal: the same bits, signed zeros, infinities,
    NaN and subnormals included, and x's dtype; other dtypes keep np.reciprocal."""
    tiny = float(np.finfo(np.float32).tiny)
    values = [0.0, -0.0, np.inf, -np.inf, np.nan, 3.0, -7.5, 1e-3, 1e30, -1e30, tiny / 4, 1e-45]
    with np.errstate(all="ignore"):  # 1e30 overflows to inf in float16
        x = np.concatenate([values, np.random.default_rng(5).standard_normal(1000) * 50]).astype(dtype)
        want = np.reciprocal(x)
        got = elementwise.reciprocal(np, x)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided", "in_place"])
def test_large_sigmoids_run_in_blocks_of_memory(monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """Arrays over four blocks run a block at a time in their own memory order (here blocks of
    500 values over 2 x 6 x 7 x 36 = 3024 values, the last block short): the
    same values as one whole-array pass, the result in the input's layout, overflowing blocks
    silent; a strided view (no single run of memory) takes the whole-array passes."""
    import warnings

    from onnxpy.ops import _layout, elementwise

    monkeypatch.setattr(elementwise, "_LOGISTIC_BLOCK", 500)
    x = (np.random.default_rng(13).standard_normal((2, 6, 7, 36)) * 40).astype(np.float32)
    if layout == "channels_last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    elif layout == "strided":
        x = np.concatenate([x, x], axis=3)[..., ::2]
    with np.errstate(over="ignore"):
        want = (1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if layout == "in_place":
            buf = x.copy()
            got = elementwise.logistic(np, buf, out=buf)
            assert got is buf
        else:
            got = elementwise.logistic(np, x)
    np.testing.assert_allclose(got, want, rtol=4e-7, atol=1e-30)
    if layout == "channels_last":
        assert _layout.is_channels_last(got)


# -- constant folding --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "consts", "want"),
    [
        ("Log", [[0.0, 1.0]], [-np.inf, 0.0]),
        ("Exp", [[100.0, 0.0]], [np.inf, 1.0]),
        ("Div", [[1.0, 0.0], [0.0, 0.0]], [np.inf, np.nan]),
        ("Sqrt", [[-1.0, 4.0]], [np.nan, 2.0]),
    ],
)
def test_constant_folding_is_silent_about_ieee_results(op: str, consts: list[list[float]], want: list[float]) -> None:
    """A constant subgraph folded at session creation gives IEEE results without numpy's
    RuntimeWarnings (onnxruntime is silent, as is onnxpy's run), and still folds when the caller
    turned warnings into errors."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    import onnxpy
    from tests.helpers import optimized_op_counts

    inits = [numpy_helper.from_array(np.array(c, np.float32), f"c{i}") for i, c in enumerate(consts)]
    nodes = [
        helper.make_node(op, [i.name for i in inits], ["t"]),
        helper.make_node("Add", ["t", "x"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "fold",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    data = model.SerializeToString()
    feeds = {"x": np.zeros(2, np.float32)}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sess = onnxpy.InferenceSession(data)
    assert [str(w.message) for w in seen] == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        counts = optimized_op_counts(model)
    assert op not in counts  # folded even with warnings as errors
    (got,) = sess.run(None, feeds)
    (theirs,) = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    np.testing.assert_array_equal(got, theirs)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
@pytest.mark.parametrize(("lambd", "bias"), [(1.5, 0.5), (0.5, 0.0), (2.0, 1.25), (0.0, 2.75), (3.0, -0.5)])
def test_shrink_integers_truncate_as_onnxruntime(dtype: Any, lambd: float, bias: float) -> None:
    # x -+ bias truncated toward zero (onnxpy cast bias to the integer type first: 0.5 -> 0)
    x = np.arange(-9, 10).astype(dtype)
    model = node_model("Shrink", {"x": x}, 1, 9, lambd=lambd, bias=bias)
    want = run_ort(model, {"x": x})
    assert want is not None, f"onnxruntime runs Shrink on {np.dtype(dtype)}: the comparison must happen"
    assert_same(run_ours(model, {"x": x})[0], want[0])


def test_shrink_large_integers_stay_exact() -> None:
    # onnxruntime computes integer Shrink in float32 (1933755900354450006 -> ...4904868483072)
    x = np.array([1933755900354450006, -1933755900354450007, 123456789, 0], np.int64)
    model = node_model("Shrink", {"x": x}, 1, 9, lambd=0.5, bias=0.5)
    got = run_ours(model, {"x": x})[0]
    assert got.tolist() == [1933755900354450005, -1933755900354450006, 123456788, 0]
