"""A vectorized erf for any array namespace (numpy has none, and a Python loop is too slow).

|x| < 0.5: the Maclaurin series of erf (x**2 <= 0.25: few terms reach the target precision).
|x| >= 0.5: erf(x) = 1 - exp(-x**2) * g(|x|), where g(t) = erfc(t) * exp(t**2) is smooth and slowly
varying; g is a polynomial in u = (t - 3) / (t + 3) (a Chebyshev interpolant converted to powers),
fitted once at import against math.erfc. Beyond t_max, erf is +-1 at the working precision.
Float64 inputs work in float64 (error ~1e-15). Narrower floats work in float32 through the
fitted GELU below: erf(x) = 2 Phi(x sqrt(2)) - 1 = tanh(x P(x^2)), P a polynomial (error 1.4e-7
absolute), 14 array passes with no branches.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._layout import blocks_in_memory_order, flat_in_memory_order

_K = 3.0


def _fit(t_max: float, degree: int) -> tuple[float, float, list[float]]:
    lo, hi = (0.5 - _K) / (0.5 + _K), (t_max - _K) / (t_max + _K)
    nodes = np.cos(np.pi * (np.arange(degree + 1) + 0.5) / (degree + 1))
    u = lo + (nodes + 1) * 0.5 * (hi - lo)
    t = _K * (1 + u) / (1 - u)
    g = np.array([math.erfc(v) * math.exp(v * v) for v in t])
    cheb = np.polynomial.chebyshev.chebfit(nodes, g, degree)
    return lo, hi, list(np.polynomial.chebyshev.cheb2poly(cheb))


# (working dtype, t_max, Chebyshev degree, Maclaurin terms)
_PLANS = {
    np.dtype(np.float64): (np.float64, 6.0, 18, 16),
    np.dtype(np.float32): (np.float32, 4.0, 9, 7),
}
_FITS = {k: _fit(v[1], v[2]) for k, v in _PLANS.items()}
_SERIES = [2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(16)]


def _erf32(xp: Any, x: Any, scale: float = 1.0) -> Any:
    """erf(scale * x) in float32, in a fresh array. NaN needs no special case since every step
    propagates it."""
    if xp is np and x.size > 2 * _ERF_BLOCK:
        return _erf32_blocked(x, scale)
    v = x.astype(np.float32, copy=False) if scale == 1.0 else x.astype(np.float32) * np.float32(scale)
    result = xp.empty_like(v)
    _erf32_core(xp, v, xp.empty_like(v), result)
    return result


def _erf32_core(xp: Any, v: Any, u: Any, out: Any) -> None:
    """out = erf(v) = tanh(v P(v^2)) for the float32 array ``v`` (left as it is), through the
    temporary ``u`` (v's shape). P(u) = -Q(2u) / sqrt(2) for GELU's Q, which has no real root
    and only grows in magnitude past its fit, so tanh saturates to +-1 there, through the
    overflow of huge inputs too (silenced): no clamp pass."""
    with np.errstate(over="ignore", invalid="ignore"):
        xp.multiply(v, v, out=u)
        xp.multiply(u, _ERF_P[-1], out=out)
        out += _ERF_P[-2]
        for c in _ERF_P[-3::-1]:
            out *= u
            out += c
        out *= v
    xp.tanh(out, out=out)


# Values per block of a large erf: its 14 passes then run on 128 KB arrays in L2 instead of
# whole-array temporaries streaming through memory (197x3072, as an unfused GELU's Erf:
# 3624 -> 1814 us alone, hot; onnxruntime 147, threaded).
_ERF_BLOCK = 1 << 15


def _erf32_blocked(x: np.ndarray, scale: float) -> np.ndarray:
    """``_erf32`` of a large host array, _ERF_BLOCK values at a time in x's memory order (the
    result keeps it), through reused temporaries: the same operations, so the same bits."""
    result = np.empty_like(x, dtype=np.float32)
    blocks = blocks_in_memory_order(x, result, _ERF_BLOCK)
    if blocks is None:  # x is not one run of memory
        result[...] = _erf32_blocked(np.ascontiguousarray(x), scale)
        return result
    v, u = np.empty(_ERF_BLOCK, dtype=np.float32), np.empty(_ERF_BLOCK, dtype=np.float32)
    for block, dst in blocks:
        n = block.size
        vb = block  # read as it is: the passes leave their input alone
        if block.dtype != np.float32 or scale != 1.0:
            vb = v[:n]
            vb[...] = block  # to float32, as x.astype(np.float32)
            if scale != 1.0:
                vb *= np.float32(scale)
        _erf32_core(np, vb, u[:n], dst)
    return result


# GELU in float32: x * Phi(x) = x / (1 + exp(-2 g(x))), where Phi(x) = (1 + tanh(g(x))) / 2 defines
# g; g(x) / x is smooth in u = x^2 and fitted on [0, 5] as a degree-6 polynomial Q(u) = -2 g(x) / x
# (weighted least squares iterated towards minimax; |Phi error| < 3e-8 in float64). Q has no real
# root and is at most Q(25) = -3.015 for every u >= 25 (its maximum there), so beyond |x| = 5
# exp(Q(u) x) only saturates further, the way Phi does, and u needs no clamp (a clamp cost one
# of the slowest passes). Huge |x| overflow Q(u) x to -+inf, giving x and -0. Measured against
# math.erfc on [-12, 12] in float32: absolute error < 8e-7, 18 array passes (the first form,
# x * (1 + erf(x / sqrt(2))) / 2, took 30 through a rational erf).
_GELU_Q = (
    -1.5957698822046613,
    -0.0726661634936665,
    6.518026269508244e-05,
    0.00011061706250593093,
    -7.930414482936002e-06,
    2.6460439813227033e-07,
    -3.5146063724435824e-09,
)
# erf(x) = tanh(g(x sqrt(2))) = tanh(x P(x^2)) with P(u) = -Q(2u) / sqrt(2), in float32.
# Against math.erf on [-12, 12]: absolute error 1.4e-7, relative 6.3e-7 where |x| < 0.5; 14
# passes instead of the 25 of a rational fit x P(x^2) / Q(x^2) and its two clamps (65,536
# values 210 -> 135 us; numpy's float32 tanh is one vectorized pass).
_ERF_P = tuple(np.float32(-c * 2.0**k / math.sqrt(2.0)) for k, c in enumerate(_GELU_Q))
# The exponential is numpy's exp, not exp2 with log2(e) folded into Q (which runs 1.7x as fast on
# arguments in range: 65,536 values 24 against 42 us): exp2 leaves its vector loop for results
# that underflow or overflow float32, 35 ns a value for arguments in (-150, -126) and 4-5 beyond,
# against 0.6 for exp everywhere, and GELU inputs past |x| = 7.1 land there. A GELU of 128x512
# values with standard deviation 3 (2% past 7) took 152 us through exp2, 137 through exp;
# with standard deviation 6, 385 against 166. Flooring the argument first costs the pass exp2
# saves.


# Values per block of a large GELU. Each of its 18 passes then reads and writes arrays of 128 KB
# that stay in L2 instead of streaming whole-array temporaries through memory: BERT's
# 8 x 128 x 512 GELU 1935 -> 1008 us (Xeon, 2 MB L2); 16K-value blocks 1135, 64K 1061. Arrays
# up to two blocks run whole (65,536 values: 130 us either way).
_GELU_BLOCK = 1 << 15


def gelu32(xp: Any, x: Any, out: Any = None) -> Any:
    """GELU (erf form) of a float32 array, in a fresh float32 array or into ``out`` (x's shape,
    float32; may be x itself)."""
    if x.ndim == 0:  # arithmetic on 0-d arrays gives scalars, which the in-place passes need not be
        return gelu32(xp, x.reshape(1), None if out is None else out.reshape(1)).reshape(())
    v = x.astype(np.float32, copy=False)
    if xp is np and v.size > 2 * _GELU_BLOCK:
        return _gelu32_blocked(v, out)
    # Huge |x| overflow u and Q(u) to +-inf on purpose (see above): no warnings for that.
    with np.errstate(over="ignore", invalid="ignore"):
        u = v * v
        q = u * np.float32(_GELU_Q[-1])
        _gelu_finish(xp, v, u, q)
        return xp.divide(v, q, out=q if out is None else out)


def _gelu_finish(xp: Any, v: Any, u: Any, q: Any) -> None:
    """q = 1 + exp(Q(u) v) in place, from q = u * Q's leading coefficient (GELU is v / q)."""
    q += np.float32(_GELU_Q[-2])
    for c in _GELU_Q[-3::-1]:
        q *= u
        q += np.float32(c)
    q *= v
    xp.exp(q, out=q)  # exp(-2 g(x)); overflows to inf for very negative x, giving -0
    q += np.float32(1.0)


def _gelu32_blocked(v: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``gelu32`` of a large host array, _GELU_BLOCK values at a time through two reused
    temporaries; the same operations, so the same bits. Blocks run in v's memory order and the
    result keeps it (a channels-last convolution's result is not copied across first: MaxViT's
    GELUs on 256x56x56 maps 1.6 ms a call that way). Into ``out`` when given."""
    result = np.empty_like(v) if out is None else out  # v's memory order where it has one
    views = flat_in_memory_order(v, result)
    if views is None:  # v is not one run, or out runs in another order
        result[...] = _gelu32_blocked(np.ascontiguousarray(v))
        return result
    flat, y = views
    u = np.empty(_GELU_BLOCK, dtype=np.float32)
    q = np.empty(_GELU_BLOCK, dtype=np.float32)
    lead = np.float32(_GELU_Q[-1])
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, flat.size, _GELU_BLOCK):
            block = flat[start : start + _GELU_BLOCK]
            ub, qb = u[: block.size], q[: block.size]
            np.multiply(block, block, out=ub)
            np.multiply(ub, lead, out=qb)
            _gelu_finish(np, block, ub, qb)
            np.divide(block, qb, out=y[start : start + block.size])
    return result


def erf(xp: Any, x: Any) -> Any:
    """erf of a floating array, returned in x's dtype."""
    if x.ndim == 0:  # see gelu32
        return erf(xp, x.reshape(1)).reshape(())
    if x.dtype != np.float64:
        return _erf32(xp, x).astype(x.dtype, copy=False)
    key = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    work, t_max, _deg, terms = _PLANS[key]
    lo, hi, poly = _FITS[key]
    v = x.astype(work, copy=False)
    a = xp.abs(v)
    z = v * v
    small = xp.full_like(v, _SERIES[terms - 1])
    for c in reversed(_SERIES[: terms - 1]):
        small *= z
        small += c
    small *= v
    t = xp.clip(a, 0.5, t_max)
    s = (t - _K) / (t + _K)
    s -= (lo + hi) / 2
    s *= 2 / (hi - lo)
    g = xp.full_like(v, poly[-1])
    for c in reversed(poly[:-1]):
        g *= s
        g += c
    t *= t
    xp.negative(t, out=t)
    xp.exp(t, out=t)
    g *= t
    tail = 1 - g
    tail[a >= t_max] = 1
    tail = xp.copysign(tail, v)
    out = xp.where(a < 0.5, small, tail)
    return out.astype(x.dtype, copy=False)
