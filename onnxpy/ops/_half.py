"""float32 <-> float16 and bfloat16 -> float32 conversions on the host in a few vectorized
integer and float passes.

numpy's own casts between float32 and float16 are scalar loops (x86-64 wheels have no F16C
dispatch for them): 2.5-4.4 ns a value to float16 and 1.6-2.2 back, against onnxruntime's
0.25. These give numpy's bits exactly (round to nearest even, subnormals, signed zeros,
infinities; a NaN stays a NaN of the same sign) at 1.4-1.7x its speed to float16, 2.7-3x
back (65,536 and 1,048,576 values).

float32 -> float16: |x| is rounded to the half grid by float addition: adding m = 2^(e + 13),
for e the exponent of |x| (at least -14, the half subnormals' fixed grid), leaves a sum whose
last place is 2^(e - 10), so the hardware rounds |x| to 11 significant bits, ties to even;
subtracting m back is exact. Scaling by 2^-112 then maps the rounded value onto float32 bits
whose 13-bit right shift is the half's bits, subnormal halves included (their products are
float32 subnormals in steps of 2^13 units). Magnitudes from 65,520 up round to 65,536, whose
bits come out as the half's infinity once larger ones are clamped to it.

bfloat16 -> float32 is the upper half of the float32's bits: a widening copy and a shift (ml_dtypes'
cast takes 0.55 ns a value, this 0.23). The other way ml_dtypes' rounding is as fast as the
integer passes it would take here (57 against 43-61 us for 65,536 values), so it stays.

float16 -> float32: the half's bits, sign-extended to 32 bits and shifted left by 13, with the
three bits between the sign and the exponent cleared, are a float32 that times 2^112 is the
value (subnormal halves become normal floats exactly). Infinities and NaNs come out as
magnitudes of 65,536 and beyond; setting their exponent bits restores them, payload kept.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._clamp import np_clip
from ._layout import blocks_in_memory_order

# Values per block (temporaries of 512 KB). The passes run at about 0.13 ns a value from L2 or
# memory alike, so blocks only bound the temporaries; smaller ones pay more calls (1,048,576
# values to float16: blocks of 32,768 2.59 ms, 131,072 1.97, the whole array 1.96).
_BLOCK = 1 << 17
# Fewer values than these go through numpy's cast: the passes cost 14 and 9 us in calls
# (to float16 4,096 values 10.6 us in numpy, 17.9 here; 65,536 161 against 96; to float32
# 4,096 6.1 against 10.1, 65,536 107 against 35).
MIN_VALUES_TO_HALF = 1 << 14
MIN_VALUES_FROM_HALF = 1 << 13

_ABS = np.uint32(0x7FFF_FFFF)
_EXPONENT = np.uint32(0x7F80_0000)
_HALF_MIN_NORMAL_F = np.float32(2.0**-14)
_F32_MAX = np.float32(np.finfo(np.float32).max)
_TO_GRID = np.uint32(13 << 23)  # times 2^13
_HALF_OVERFLOW = np.uint32(0x477F_F000)  # 65,520: rounds to infinity
_TWO_16 = np.uint32(0x4780_0000)  # 65,536.0
_F32_INF = np.uint32(0x7F80_0000)
_DOWN = np.float32(2.0**-112)
_UP = np.float32(2.0**112)
_SHIFT = np.uint32(13)


def _by_blocks(x: np.ndarray, dtype: type, convert: Callable[[np.ndarray, np.ndarray], None]) -> np.ndarray:
    """A fresh ``dtype`` array of x's shape and memory order, filled by ``convert(src, dst)``
    on matching 1-D blocks of at most _BLOCK values (through a contiguous copy of x where x is
    not one run of memory)."""
    out = np.empty_like(x, dtype=dtype)
    blocks = blocks_in_memory_order(x, out, _BLOCK)
    if blocks is None:
        out[...] = _by_blocks(np.ascontiguousarray(x), dtype, convert)
        return out
    for src, dst in blocks:
        convert(src, dst)
    return out


def float32_to_float16(x: np.ndarray) -> np.ndarray:
    """``x.astype(np.float16)`` for a float32 host array, in x's memory order: the same bits,
    NaNs aside (each becomes the quiet NaN of its sign)."""
    size = min(x.size, _BLOCK)
    a, m = np.empty(size, dtype=np.uint32), np.empty(size, dtype=np.uint32)

    def convert(src: np.ndarray, dst: np.ndarray) -> None:
        _round_block(src.view(np.uint32), a[: src.size], m[: src.size], dst.view(np.uint16))

    return _by_blocks(x, np.float16, convert)


def _round_block(u: np.ndarray, a: np.ndarray, m: np.ndarray, h: np.ndarray) -> None:
    """h = the float16 bits of the float32 bits u, through the temporaries a and m."""
    np.bitwise_and(u, _ABS, out=a)
    largest = int(a.max())
    if largest >= _HALF_OVERFLOW:  # infinities and NaNs to 65,536 too (NaNs restored below)
        np.minimum(a, _TWO_16, out=a)
    np.bitwise_and(a, _EXPONENT, out=m)
    af, mf = a.view(np.float32), m.view(np.float32)
    # m is a power of two (or 0) as a float: its floor at 2^-14 through the clip ufunc (numpy's
    # integer maximum against a scalar is a slow loop: 16 against 4 us for 32,768 values)
    np_clip(mf, _HALF_MIN_NORMAL_F, _F32_MAX, out=mf)
    m += _TO_GRID
    af += mf  # rounds |x| to the half grid, ties to even
    af -= mf
    af *= _DOWN
    a >>= _SHIFT
    np.right_shift(u, 16, out=m)  # the sign, at bit 15 (a strided uint16 view of u is slower)
    m &= np.uint32(0x8000)
    a |= m
    h[...] = a
    if largest > _F32_INF:
        h[(u & _ABS) > _F32_INF] |= np.uint16(0x7E00)  # NaN: a quiet NaN of the same sign


def float16_to_float32(x: np.ndarray) -> np.ndarray:
    """``x.astype(np.float32)`` for a float16 host array, bit for bit, in x's memory order."""
    return _by_blocks(x, np.float32, lambda src, dst: _widen_block(src.view(np.int16), dst))


def _widen_block(h: np.ndarray, f: np.ndarray) -> None:
    """f = the float32 values of the float16 bits h (read as int16), in place in f."""
    w = f.view(np.int32)
    w[...] = h  # sign-extended: the sign lands at bit 31
    w <<= 13
    w &= np.int32(-0x7000_2000)  # 0x8FFF_E000: the sign, then the half's exponent and mantissa
    f *= _UP
    if f.max() >= 65536.0 or f.min() <= -65536.0:  # infinities and NaNs
        w[np.abs(f) >= 65536.0] |= np.int32(0x7F80_0000)


def bfloat16_to_float32(x: np.ndarray) -> np.ndarray:
    """``x.astype(np.float32)`` for a bfloat16 host array, bit for bit, in x's memory order."""
    return _by_blocks(x, np.float32, _bfloat16_block)


def _bfloat16_block(src: np.ndarray, dst: np.ndarray) -> None:
    w = dst.view(np.uint32)
    w[...] = src.view(np.uint16)  # the bfloat16's bits are the float32's upper half
    w <<= np.uint32(16)
