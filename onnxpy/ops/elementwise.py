"""Elementwise kernels: unary math, binary arithmetic with broadcasting, comparisons, logic,
activations, variadic Sum/Mean/Max/Min, Where and Clip."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from . import _erf
from ._clamp import clamp, floor_at, np_clip
from ._layout import blocks_in_memory_order, flat_in_memory_order
from .registry import op


def _narrow_float(dtype: np.dtype) -> bool:
    # float16, and the ml_dtypes types (bfloat16...) whose kind is "V"
    return (dtype.kind == "f" and dtype.itemsize < 4) or dtype.kind == "V"


# -- unary math ----------------------------------------------------------------------------------


@op("Abs", 6)
def abs_(xp: Any, x: Any) -> Any:
    return xp.abs(x)


@op("Neg", 6)
def neg(xp: Any, x: Any) -> Any:
    return xp.negative(x)


@op("Reciprocal", 6)
def reciprocal(xp: Any, x: Any) -> Any:
    if x.__class__ is np.ndarray and x.dtype in (np.float32, np.float64):
        return np.divide(x.dtype.type(1), x)  # see _one_over
    return xp.reciprocal(x)


def _one_over(xp: Any, t: Any) -> Any:
    """1 / t in place. numpy's float32/float64 ``reciprocal`` runs about half as fast as a
    division of 1 by the array (1 M float32 values: 241 against 118 us), with the same bits."""
    if xp is np and t.dtype in (np.float32, np.float64):
        return np.divide(t.dtype.type(1), t, out=t)
    return xp.reciprocal(t, out=t)


@op("Floor", 6)
def floor(xp: Any, x: Any) -> Any:
    return xp.floor(x)


@op("Ceil", 6)
def ceil(xp: Any, x: Any) -> Any:
    return xp.ceil(x)


@op("Round", 11)
def round_(xp: Any, x: Any) -> Any:
    return xp.round(x)  # numpy rounds half to even, as ONNX requires


@op("Sqrt", 6)
def sqrt(xp: Any, x: Any) -> Any:
    return xp.sqrt(x)


@op("Exp", 6)
def exp(xp: Any, x: Any) -> Any:
    return xp.exp(x)


@op("Log", 6)
def log(xp: Any, x: Any) -> Any:
    return xp.log(x)


@op("Sin", 7)
def sin(xp: Any, x: Any) -> Any:
    return xp.sin(x)


@op("Cos", 7)
def cos(xp: Any, x: Any) -> Any:
    return xp.cos(x)


@op("Tan", 7)
def tan(xp: Any, x: Any) -> Any:
    return xp.tan(x)


@op("Asin", 7)
def asin(xp: Any, x: Any) -> Any:
    return xp.arcsin(x)


@op("Acos", 7)
def acos(xp: Any, x: Any) -> Any:
    return xp.arccos(x)


@op("Atan", 7)
def atan(xp: Any, x: Any) -> Any:
    return xp.arctan(x)


@op("Sinh", 9)
def sinh(xp: Any, x: Any) -> Any:
    return xp.sinh(x)


@op("Cosh", 9)
def cosh(xp: Any, x: Any) -> Any:
    return xp.cosh(x)


@op("Asinh", 9)
def asinh(xp: Any, x: Any) -> Any:
    return xp.arcsinh(x)


@op("Acosh", 9)
def acosh(xp: Any, x: Any) -> Any:
    return xp.arccosh(x)


@op("Atanh", 9)
def atanh(xp: Any, x: Any) -> Any:
    return xp.arctanh(x)


@op("Sign", 9)
def sign(xp: Any, x: Any) -> Any:
    return xp.sign(x)


@op("Erf", 9)
def erf(xp: Any, x: Any) -> Any:
    if x.dtype.kind != "f" or x.dtype.itemsize < 2:
        return _erf.erf(xp, x.astype(np.float32)).astype(x.dtype)
    return _erf.erf(xp, x)


@op("IsNaN", 9)
def isnan(xp: Any, x: Any) -> Any:
    return xp.isnan(x)


@op("IsInf", 10)
def isinf(xp: Any, x: Any, *, detect_negative: int = 1, detect_positive: int = 1) -> Any:
    if detect_negative and detect_positive:
        return xp.isinf(x)
    if detect_negative:
        return xp.isneginf(x)
    if detect_positive:
        return xp.isposinf(x)
    return xp.zeros(x.shape, dtype=bool)


@op("Not", 1)
def not_(xp: Any, x: Any) -> Any:
    return xp.logical_not(x)


@op("BitwiseNot", 18)
def bitwise_not(xp: Any, x: Any) -> Any:
    return xp.invert(x)


# -- activations ---------------------------------------------------------------------------------


@op("Relu", 6, may_inplace={0: 0})
def relu(xp: Any, x: Any, *, out: Any = None) -> Any:
    return floor_at(xp, x, 0, out=out)


@op("Sigmoid", 6)
def sigmoid(xp: Any, x: Any) -> Any:
    return logistic(xp, x)


def logistic(xp: Any, x: Any, out: Any = None) -> Any:
    """1 / (1 + exp(-x)) in x's floating dtype, into ``out`` when given (may be x). Four passes
    without a branch: numpy's where(), which the split by sign needed, takes 3.5 ns a value
    (106,624 float32 values: 486 -> 85 us). The formula is accurate on both sides (for
    x < 0 it is e^x / (e^x + 1) up to rounding); below about -88 (float32) exp(-x) overflows to
    inf and the result is 0 instead of a subnormal under 1e-38: the overflow is expected and
    silenced. Half precision runs in float32, where its whole range is safe."""
    if x.ndim == 0:  # numpy's ufuncs return scalars for 0-d arrays without out=
        y = logistic(xp, x.reshape(1), None if out is None else out.reshape(1))
        return y.reshape(())
    if x.dtype not in (np.float32, np.float64):
        y = logistic(xp, x.astype(np.float32))
        if out is None:
            return y.astype(x.dtype)
        out[...] = y
        return out
    if xp is np and x.size > 4 * _LOGISTIC_BLOCK:
        # Arrays over 1 MB a block at a time, in x's memory order, so the four passes run in
        # L2 (128x80x80: 988 -> 806 us, channels-last alike; 3.3 M values 3951 -> 3294).
        # Smaller ones gain nothing (140K values: 110 against 115 us).
        y = np.empty_like(x) if out is None else out
        blocks = blocks_in_memory_order(x, y, _LOGISTIC_BLOCK)
        if blocks is not None:
            with np.errstate(over="ignore"):
                for src, t in blocks:
                    np.negative(src, out=t)
                    np.exp(t, out=t)
                    t += 1
                    _one_over(np, t)
            return y
    with np.errstate(over="ignore"):
        t = xp.negative(x, out=out)
        xp.exp(t, out=t)
        t += 1
        return _one_over(xp, t)


_LOGISTIC_BLOCK = 1 << 16


# Values per block of a large Swish: its four passes then stay in L2 (a 1x1 convolution's
# 96x112x112 output: Sigmoid and Mul as two whole-array steps 1392 + 342 us).
_SWISH_BLOCK = 1 << 15


@op("Swish", 24)
def swish_24(xp: Any, X: Any, *, alpha: float = 1.0) -> Any:  # noqa: N803 - spec name
    return swish(xp, X, alpha)


def swish(xp: Any, x: Any, alpha: float = 1.0, out: Any = None) -> Any:
    """x * sigmoid(alpha * x) (SiLU at alpha 1) in x's floating dtype, into ``out`` when given
    (may be x), as x / (1 + exp(-alpha x)): four passes, rounded once. exp overflows to inf
    where alpha x < -88 (float32), giving -0 (the product's limit; x = -inf gives NaN, as
    -inf * sigmoid(-inf) does). Half precision runs in float32."""
    if x.ndim == 0:  # numpy's ufuncs return scalars for 0-d arrays without out=
        y = swish(xp, x.reshape(1), alpha, None if out is None else out.reshape(1))
        return y.reshape(())
    if x.dtype not in (np.float32, np.float64):
        y = swish(xp, x.astype(np.float32), alpha)
        if out is None:
            return y.astype(x.dtype)
        out[...] = y
        return out
    if out is None:
        out = xp.empty_like(x)  # x's memory order (a channels-last result stays channels-last)
    flat = flat_in_memory_order(x, out) if xp is np and x.size > 2 * _SWISH_BLOCK else None
    if flat is not None:
        flat_x, flat_out = flat
        t = np.empty(_SWISH_BLOCK, dtype=x.dtype)
        for start in range(0, x.size, _SWISH_BLOCK):
            block = flat_x[start : start + _SWISH_BLOCK]
            _swish_into(np, block, alpha, t[: block.size], flat_out[start : start + block.size])
        return out
    _swish_into(xp, x, alpha, xp.empty_like(x), out)
    return out


def _swish_into(xp: Any, x: Any, alpha: float, t: Any, out: Any) -> None:
    """out = x / (1 + exp(-alpha x)) through the temporary ``t`` (x's shape; out may be x)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if alpha == 1.0:
            xp.negative(x, out=t)
        else:
            xp.multiply(x, x.dtype.type(-alpha), out=t)
        xp.exp(t, out=t)
        t += 1
        xp.divide(x, t, out=out)


@op("Tanh", 6)
def tanh(xp: Any, x: Any) -> Any:
    return xp.tanh(x)


@op("LeakyRelu", 6)
def leaky_relu(xp: Any, x: Any, *, alpha: float = 0.01) -> Any:
    a = x.dtype.type(alpha)
    if xp is np and 0 < alpha <= 1 and x.dtype.kind == "f" and x.ndim:
        return leaky_relu_into(x, alpha, np.empty_like(x))
    return xp.where(x >= 0, x, x * a)


# Values per block of a large LeakyRelu: its product and maximum then meet in L2
# (256x80x80: 1129 -> 590 us; small arrays run whole).
_LEAKY_BLOCK = 1 << 16


def leaky_relu_into(x: np.ndarray, alpha: float, out: np.ndarray) -> np.ndarray:
    """LeakyRelu of a host float array with 0 < alpha <= 1 into ``out`` (x's shape; may be x):
    max(x, alpha x) is x for x >= 0 and alpha x below, two fast passes where numpy's where()
    takes one slow one (about 3.5 ns a value). NaN stays NaN, -0 stays -0, infinities keep
    their sign (alpha 0 would make inf * 0 a NaN: the callers keep where() for it). Large
    arrays go a block at a time in their memory order."""
    a = x.dtype.type(alpha)
    blocks = blocks_in_memory_order(x, out, _LEAKY_BLOCK) if x.size > 4 * _LEAKY_BLOCK else None
    if blocks is None:
        return np.maximum(x, x * a, out=out)
    t = np.empty(_LEAKY_BLOCK, dtype=x.dtype)
    for src, dst in blocks:
        tb = t[: src.size]
        np.multiply(src, a, out=tb)
        np.maximum(src, tb, out=dst)
    return out


@op("Elu", 6)
def elu(xp: Any, x: Any, *, alpha: float = 1.0) -> Any:
    if xp is np and x.dtype.kind == "f" and x.ndim:
        return _exp_linear_unit(x, alpha)
    return xp.where(x > 0, x, (xp.expm1(xp.minimum(x, 0)) * x.dtype.type(alpha))).astype(x.dtype, copy=False)


def _exp_linear_unit(x: np.ndarray, alpha: float) -> np.ndarray:
    """max(x, 0) + alpha * expm1(min(x, 0)) in x's dtype: one term is 0 at every x (expm1(0)
    is 0), so these are where()'s values without numpy's where at about 3.5 ns a value
    (64x112x112: 4.0 -> 1.03 ms; Selu 4.07 -> 1.16). NaN stays NaN."""
    t = x.dtype.type
    neg = np.minimum(x, t(0))
    np.expm1(neg, out=neg)
    neg *= t(alpha)
    neg += np.maximum(x, t(0))
    return neg


@op("Selu", 6)
def selu(xp: Any, x: Any, *, alpha: float = 1.67326319217681884765625, gamma: float = 1.05070102214813232421875) -> Any:
    t = x.dtype.type
    if xp is np and x.dtype.kind == "f" and x.ndim:
        y = _exp_linear_unit(x, alpha)
        y *= t(gamma)
        return y
    neg = (xp.expm1(xp.minimum(x, 0)) * t(alpha)).astype(x.dtype, copy=False)
    return (xp.where(x > 0, x, neg) * t(gamma)).astype(x.dtype, copy=False)


@op("Celu", 12)
def celu(xp: Any, x: Any, *, alpha: float = 1.0) -> Any:
    # max(x, 0) + min(0, alpha * expm1(x / alpha)), with expm1 evaluated on min(x, 0) only:
    # the same values (the second term is 0 wherever x > 0, for either sign of alpha), but
    # large positive inputs no longer overflow expm1, which leaves numpy's vector loop there
    # (128x512 values of +-1e4: 0.42 -> 0.14 ms) and warned outside a session.
    if x.ndim == 0:  # arithmetic on 0-d arrays gives scalars, which the in-place steps need not be
        return celu(xp, x.reshape(1), alpha=alpha).reshape(())
    t = x.dtype.type
    neg = xp.minimum(x, t(0))
    neg /= t(alpha)
    xp.expm1(neg, out=neg)
    neg *= t(alpha)  # <= 0 for either sign of alpha: the formula's min(0, .) changes nothing
    neg += xp.maximum(x, t(0))
    return neg


@op("HardSigmoid", 6)
def hard_sigmoid(xp: Any, x: Any, *, alpha: float = 0.2, beta: float = 0.5) -> Any:
    # Half precision in float32 (alpha * x + beta rounded once, as onnxruntime does: computed
    # in float16 it was 3 ulp off, 0.07324 for 0.07306 at x = -2.135).
    w = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    t = w.dtype.type
    return xp.clip(w * t(alpha) + t(beta), 0, 1).astype(x.dtype, copy=False)


@op("HardSwish", 14)
def hard_swish(xp: Any, x: Any) -> Any:
    # Half precision in float32, as HardSigmoid (in float16 up to 8 ulp off).
    if x.ndim == 0:  # numpy's ufuncs return scalars for 0-d arrays without out=
        return hard_swish(xp, x.reshape(1)).reshape(())
    w = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    t = w.dtype.type
    # One temporary, each step in place (the same operations as w * clip(w / 6 + 0.5, 0, 1)).
    gate = xp.multiply(w, t(1 / 6))
    gate += t(0.5)
    clip = np_clip if xp is np else xp.clip
    clip(gate, t(0), t(1), out=gate)
    gate *= w
    return gate.astype(x.dtype, copy=False)


@op("ThresholdedRelu", 10)
def thresholded_relu(xp: Any, x: Any, *, alpha: float = 1.0) -> Any:
    keep = x > x.dtype.type(alpha)
    if xp is np and x.dtype.kind == "f" and x.ndim:
        return _kept_or_zero(x, keep)
    return xp.where(keep, x, x.dtype.type(0))


def _kept_or_zero(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``where(keep, x, 0)`` for a host float array: x's bits ANDed with a mask of all ones or
    all zeros, three vectorized passes. numpy's where picks each value with a branch, which
    mispredicts on mixed conditions: 65,536 float32 values 54-70 us against 20."""
    ints = np.dtype(f"i{x.dtype.itemsize}")
    mask = keep.view(np.uint8).astype(ints)  # 0 or 1, in keep's (x's) memory order
    np.negative(mask, out=mask)  # 0 or all bits set
    np.bitwise_and(x.view(ints), mask, out=mask)
    return mask.view(x.dtype)


@op("Softplus", 1)
def softplus(xp: Any, x: Any) -> Any:
    # log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))
    return (xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))).astype(x.dtype, copy=False)


@op("Softsign", 1)
def softsign(xp: Any, x: Any) -> Any:
    return (x / (1 + xp.abs(x))).astype(x.dtype, copy=False)


@op("Mish", 18)
def mish(xp: Any, x: Any) -> Any:
    return (x * xp.tanh(softplus(xp, x))).astype(x.dtype, copy=False)


#: GELU's tanh approximation: 0.5 x (1 + tanh(beta (x + kappa x^3))) with these constants
GELU_TANH_BETA = math.sqrt(2 / math.pi)
GELU_TANH_KAPPA = 0.044715

# Values per block of a large tanh GELU, its seven passes then in L2 (as _erf.gelu32's). On a
# 1 MB-L2 EPYC, 128 x 3072 values: 32K-value blocks 579 us, 64K 490, whole arrays 454;
# 1024 x 3072: 4577, 4125, 4488.
_GELU_TANH_BLOCK = 1 << 16


def gelu_tanh(xp: Any, x: Any, beta: float = GELU_TANH_BETA, kappa: float = GELU_TANH_KAPPA, out: Any = None) -> Any:
    """0.5 x (1 + tanh(beta (x + kappa x^3))) of a floating array, in x's dtype (half precision
    computed in float32), into ``out`` when given (x's shape and dtype; may be x itself).

    0.5 (1 + tanh(u)) is 1 / (1 + exp(-2u)): the same value without 1 + tanh(u) cancelling to 0
    for negative x (float16 lost every digit below x = -3), in seven passes through one
    temporary: x^2 * (-2 beta kappa) - 2 beta, times x, exp, plus 1, then x divided by that.
    Huge |x| overflow those to inf on purpose (exp(+inf) gives the limit -0; inf / inf the
    formula's own NaN at x = -inf): no warnings for that."""
    if x.ndim == 0:  # arithmetic on 0-d arrays gives scalars, which the in-place passes need not be
        return gelu_tanh(xp, x.reshape(1), beta, kappa, None if out is None else out.reshape(1)).reshape(())
    w = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    with np.errstate(over="ignore", invalid="ignore"):
        if xp is np and w.size > 2 * _GELU_TANH_BLOCK and (out is None or out.dtype == w.dtype):
            result = np.empty_like(w) if out is None else out
            views = flat_in_memory_order(w, result)
            if views is not None:
                src, dst = views
                u = np.empty(_GELU_TANH_BLOCK, dtype=w.dtype)
                for start in range(0, src.size, _GELU_TANH_BLOCK):
                    block = src[start : start + _GELU_TANH_BLOCK]
                    _gelu_tanh_into(np, block, beta, kappa, u[: block.size], dst[start : start + block.size])
                return result if out is not None else result.astype(x.dtype, copy=False)
        u = xp.empty_like(w)
        _gelu_tanh_into(xp, w, beta, kappa, u, u)
    if out is None:
        return u.astype(x.dtype, copy=False)
    out[...] = u
    return out


def _gelu_tanh_into(xp: Any, w: Any, beta: float, kappa: float, u: Any, dst: Any) -> None:
    """dst = gelu_tanh(w) through the temporary ``u`` (w's shape; dst may be u or w)."""
    t = w.dtype.type
    xp.multiply(w, w, out=u)
    u *= t(-2 * beta * kappa)
    u += t(-2 * beta)
    u *= w
    xp.exp(u, out=u)  # not exp2 with log2(e) in the constants: see _erf's GELU on exp2's slow path
    u += t(1)
    xp.divide(w, u, out=dst)


@op("Gelu", 20)
def gelu(xp: Any, x: Any, *, approximate: str = "none") -> Any:
    t = x.dtype.type
    if approximate == "tanh":
        return gelu_tanh(xp, x)
    if approximate != "none":
        raise ValueError(f"approximate must be 'none' or 'tanh', got '{approximate}'")
    if x.dtype == np.float64:
        return (t(0.5) * x * (1 + erf(xp, x * t(1 / np.sqrt(2))))).astype(x.dtype, copy=False)
    # float32 and narrower: one fitted expression (see _erf.gelu32), computed in float32.
    return _erf.gelu32(xp, x).astype(x.dtype, copy=False)


@op("Shrink", 9)
def shrink(xp: Any, x: Any, *, bias: float = 0.0, lambd: float = 0.5) -> Any:
    t = x.dtype.type
    if x.dtype.kind in "iu":
        return _shrink_integers(xp, x, bias, lambd)
    return xp.where(x < -lambd, x + t(bias), xp.where(x > lambd, x - t(bias), t(0))).astype(x.dtype, copy=False)


def _shrink_integers(xp: Any, x: Any, bias: float, lambd: float) -> Any:
    """Shrink of integers: x -+ bias truncated toward zero, as onnxruntime gives it (it
    computes in float32 and casts back), but exact for every value. With bias = b + f (b an
    integer, 0 <= f < 1), trunc(x - bias) is x - b, less 1 where f > 0 and x - b > 0;
    trunc(x + bias) is x + b, plus 1 where f > 0 and x + b < 0."""
    info = np.iinfo(x.dtype)
    b = math.floor(bias)
    f = bias - b
    if not info.min <= b <= info.max:  # |bias| beyond the type: computed in float64
        v = x.astype(np.float64)
        y = xp.where(v < -lambd, v + bias, xp.where(v > lambd, v - bias, 0.0))
        return xp.trunc(y).astype(x.dtype)
    t = x.dtype.type
    with np.errstate(over="ignore"):
        down = x - t(b)  # x - bias before truncation's correction (wraps as integers do)
        up = x + t(b)
        if f > 0:
            down -= (down > 0).astype(x.dtype)
            up += (up < 0).astype(x.dtype)
    return xp.where(x < -lambd, up, xp.where(x > lambd, down, t(0))).astype(x.dtype, copy=False)


@op("PRelu", 7)
def prelu(xp: Any, x: Any, slope: Any) -> Any:
    if (
        xp is np
        and x.dtype.kind == "f"
        and slope.dtype == x.dtype
        and np.broadcast_shapes(x.shape, slope.shape) == x.shape
    ):
        # max(x, 0) + slope * min(x, 0): four fast passes where where() takes one slow one
        # (about 3.5 ns a value; 64x112x112 per-channel 7.6 -> 0.83 ms). NaN stays NaN, -inf
        # gives -inf * slope, as where() does.
        neg = np.minimum(x, x.dtype.type(0))
        y = np.maximum(x, x.dtype.type(0))
        neg *= slope
        y += neg
        return y
    return xp.where(x < 0, x * slope, x).astype(x.dtype, copy=False)


# -- binary arithmetic ---------------------------------------------------------------------------


@op("Add", 7, may_inplace={0: 0, 1: 0})
def add(xp: Any, a: Any, b: Any, *, out: Any = None) -> Any:
    if out is not None:
        return xp.add(a, b, out=out)
    return xp.add(a, b)


@op("Sub", 7, may_inplace={0: 0, 1: 0})
def sub(xp: Any, a: Any, b: Any, *, out: Any = None) -> Any:
    if out is not None:
        return xp.subtract(a, b, out=out)
    return xp.subtract(a, b)


@op("Mul", 7, may_inplace={0: 0, 1: 0})
def mul(xp: Any, a: Any, b: Any, *, out: Any = None) -> Any:
    if out is not None:
        return xp.multiply(a, b, out=out)
    return xp.multiply(a, b)


@op("Div", 7)
def div(xp: Any, a: Any, b: Any) -> Any:
    if a.dtype.kind in "iu":
        return _int_div_trunc(xp, a, b)
    return xp.divide(a, b)


def _int_div_trunc(xp: Any, a: Any, b: Any) -> Any:
    """Integer division rounding toward zero (C semantics), as onnxruntime computes it."""
    if xp.any(b == 0):
        raise ZeroDivisionError("integer division by zero")
    q = xp.floor_divide(a, b)
    if a.dtype.kind == "i":
        fix = (xp.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        q = q + fix.astype(q.dtype)
    return q


@op("Pow", 7)
def pow_(xp: Any, X: Any, Y: Any) -> Any:  # noqa: N803 - spec names
    if X.dtype.kind in "iu":
        if Y.dtype.kind in "iu":
            return _int_pow(xp, X, Y)
        # An integer base with a float exponent: computed in double, truncated back like C.
        return xp.trunc(xp.power(X.astype(np.float64), Y.astype(np.float64, copy=False))).astype(X.dtype)
    if Y.size == 1 and Y.ndim <= X.ndim and isinstance(Y, np.ndarray) and Y.dtype.kind in "iuf":
        # (An exponent of higher rank than the base still broadcasts the result to its rank.)
        exponent = float(Y.reshape(-1)[0])
        if exponent == 2.0:
            # x**2 (LayerNorm / variance decompositions): the product is exact and much faster.
            return xp.multiply(X, X)
        if exponent == 3.0 and X.dtype.kind == "f" and not _narrow_float(X.dtype):
            # x**3 (GPT-2's gelu_new): onnxruntime's result is x * x * x bit for bit, and numpy's
            # float32 power takes a slow path for negative bases with an integral exponent
            # (8,192 values: 509 us against 3.5).
            cube = xp.multiply(X, X)
            cube *= X
            return cube
    if _narrow_float(X.dtype):
        # Narrow floats work in float32 so a float32 exponent is not first rounded to the base's type.
        yw = Y if Y.dtype.kind == "f" and Y.dtype.itemsize >= 4 else Y.astype(np.float32)
        return xp.power(X.astype(np.float32), yw).astype(X.dtype)
    if Y.dtype.kind in "iu" or _narrow_float(Y.dtype):
        return xp.power(X, Y.astype(X.dtype))
    return xp.power(X, Y).astype(X.dtype, copy=False)


def _int_pow(xp: Any, x: Any, y: Any) -> Any:
    """Integer power. A negative exponent gives what C's pow cast back to an integer gives:
    1 ** -n = 1, (-1) ** -n = +-1, 0 ** -n = the type's minimum (inf converted), others 0."""
    y = y.astype(x.dtype) if y.dtype != x.dtype else y
    if y.dtype.kind == "u" or not bool(xp.any(y < 0)):
        return xp.power(x, y)
    t = x.dtype.type
    neg = y < 0
    r = xp.power(x, xp.where(neg, t(0), y))
    minus_one_pow = xp.where((y % 2) != 0, t(-1), t(1))
    at_neg = xp.where(x == 0, t(np.iinfo(x.dtype).min), t(0))
    at_neg = xp.where(x == -1, minus_one_pow, at_neg)
    at_neg = xp.where(x == 1, t(1), at_neg)
    return xp.where(neg, at_neg, r)


@op("Mod", 10)
def mod(xp: Any, A: Any, B: Any, *, fmod: int = 0) -> Any:  # noqa: N803 - spec names
    if A.dtype.kind in "iu" and bool(xp.any(B == 0)):
        raise ZeroDivisionError("integer modulo by zero")
    if fmod:
        return xp.fmod(A, B)  # the sign of the dividend (C fmod)
    # The sign of the divisor, for floats too: numpy's remainder is a - b * floor(a / b), with the
    # edge cases (inf, nan, zero divisor) the spec's tests expect.
    return xp.remainder(A, B)


@op("BitShift", 11)
def bit_shift(xp: Any, a: Any, b: Any, *, direction: str) -> Any:
    if direction == "LEFT":
        return xp.left_shift(a, b)
    if direction == "RIGHT":
        return xp.right_shift(a, b)
    raise ValueError(f"direction must be 'LEFT' or 'RIGHT', got '{direction}'")


@op("BitwiseAnd", 18)
def bitwise_and(xp: Any, a: Any, b: Any) -> Any:
    return xp.bitwise_and(a, b)


@op("BitwiseOr", 18)
def bitwise_or(xp: Any, a: Any, b: Any) -> Any:
    return xp.bitwise_or(a, b)


@op("BitwiseXor", 18)
def bitwise_xor(xp: Any, a: Any, b: Any) -> Any:
    return xp.bitwise_xor(a, b)


# -- comparisons and logic -----------------------------------------------------------------------


@op("Equal", 7)
def equal(xp: Any, a: Any, b: Any) -> Any:
    return xp.equal(a, b)


@op("Greater", 7)
def greater(xp: Any, a: Any, b: Any) -> Any:
    return xp.greater(a, b)


@op("Less", 7)
def less(xp: Any, a: Any, b: Any) -> Any:
    return xp.less(a, b)


@op("GreaterOrEqual", 12)
def greater_equal(xp: Any, a: Any, b: Any) -> Any:
    return xp.greater_equal(a, b)


@op("LessOrEqual", 12)
def less_equal(xp: Any, a: Any, b: Any) -> Any:
    return xp.less_equal(a, b)


@op("And", 7)
def and_(xp: Any, a: Any, b: Any) -> Any:
    return xp.logical_and(a, b)


@op("Or", 7)
def or_(xp: Any, a: Any, b: Any) -> Any:
    return xp.logical_or(a, b)


@op("Xor", 7)
def xor(xp: Any, a: Any, b: Any) -> Any:
    return xp.logical_xor(a, b)


@op("Where", 9)
def where(xp: Any, condition: Any, x: Any, y: Any) -> Any:
    return xp.where(condition, x, y)


# -- variadic ------------------------------------------------------------------------------------


def _fold(xp: Any, fn: Any, inputs: tuple[Any, ...], what: str) -> Any:
    if not inputs:
        raise ValueError(f"{what} needs at least one input")
    acc = inputs[0]
    for x in inputs[1:]:
        acc = fn(acc, x)
    return acc if len(inputs) > 1 else xp.array(acc, copy=True)


@op("Sum", 6)
def sum_(xp: Any, *data: Any) -> Any:
    # Half precision adds in float32, rounded once: 60000 + 60000 - 60000 is 60000, not inf
    # (onnxruntime accumulates so too).
    narrow = len(data) > 2 and data[0].dtype.itemsize < 4 and data[0].dtype.kind in "fV"
    if narrow:
        return _fold(xp, xp.add, [d.astype(np.float32) for d in data], "Sum").astype(data[0].dtype)
    return _fold(xp, xp.add, data, "Sum")


@op("Mean", 6)
def mean(xp: Any, *data: Any) -> Any:
    # Half precision sums in float32: three float16 values of 60000 have a mean, not inf.
    narrow = bool(data) and data[0].dtype.itemsize < 4 and data[0].dtype.kind in "fV"
    total = _fold(xp, xp.add, [d.astype(np.float32) for d in data] if narrow else data, "Mean")
    dtype = data[0].dtype if narrow else total.dtype
    return (total / total.dtype.type(len(data))).astype(dtype, copy=False)


@op("Max", 6)
def max_(xp: Any, *data: Any) -> Any:
    return _fold(xp, xp.maximum, data, "Max")


@op("Min", 6)
def min_(xp: Any, *data: Any) -> Any:
    return _fold(xp, xp.minimum, data, "Min")


# -- Clip ----------------------------------------------------------------------------------------


@op("Clip", 6)
def clip_6(xp: Any, x: Any, *, min: float = -3.4028234663852886e38, max: float = 3.4028234663852886e38) -> Any:  # noqa: A002 - spec names
    t = x.dtype.type
    return xp.clip(x, t(min), t(max)).astype(x.dtype, copy=False)


@op("Clip", 11)
def clip_11(xp: Any, x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002 - spec names
    # Clip-11 on float16 leaves an omitted bound open (infinities pass), as onnxruntime and the
    # reference do; float and double take the finite limits as from opset 12.
    return _clip(xp, x, min, max, finite_limits=x.dtype != np.float16)


@op("Clip", 12)
def clip(xp: Any, x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002 - spec names
    return _clip(xp, x, min, max, finite_limits=True)


def _clip(xp: Any, x: Any, min: Any, max: Any, *, finite_limits: bool) -> Any:  # noqa: A002 - spec names
    lo = None if min is None else min.reshape(()).astype(x.dtype, copy=False)
    hi = None if max is None else max.reshape(()).astype(x.dtype, copy=False)
    if finite_limits and (x.dtype.kind == "f" or (x.dtype.kind == "V" and x.dtype.itemsize <= 2)):
        # An omitted bound is the type's lowest / largest finite value (the spec's
        # numeric_limits defaults): an infinity is clipped to it, as onnxruntime does.
        info = np.finfo(x.dtype) if x.dtype.kind == "f" else ml_dtypes.finfo(x.dtype)
        lo = info.min if lo is None else lo
        hi = info.max if hi is None else hi
    if lo is None and hi is None:
        return xp.array(x, copy=True)
    # ONNX: values are first raised to min, then lowered to max (max wins if min > max).
    return clamp(xp, x, lo, hi)
