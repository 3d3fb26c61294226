"""Math kernels: CumSum, CumProd, Einsum, Trilu, Hardmax, Det, TopK, LpNormalization,
MeanVarianceNormalization, EyeLike, BitCast."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.dtypes import np_dtype
from ._compat import host_ints, host_scalar, normalize_axes, normalize_axis, require_rank
from .registry import op


def _is_narrow_float(dtype: np.dtype) -> bool:
    # float16, and the ml_dtypes types (bfloat16...) whose kind is "V"
    return (dtype.kind == "f" and dtype.itemsize < 4) or dtype.kind == "V"


# -- CumSum / CumProd ------------------------------------------------------------------------------


def _scan(xp: Any, fn: Any, identity: int, x: Any, axis: Any, exclusive: int, reverse: int) -> Any:
    if x.ndim == 0:
        raise ValueError("input x must have rank >= 1")
    a = normalize_axis(int(host_scalar(axis)), x.ndim)
    narrow = _is_narrow_float(x.dtype)
    acc = np.dtype(np.float32) if narrow else x.dtype
    out = xp.empty(x.shape, dtype=acc)
    src, dst = x, out
    if reverse:
        # Scanning the reversed views writes the reversed scan straight into out.
        src, dst = xp.flip(x, axis=a), xp.flip(out, axis=a)
    if exclusive:
        # out[0] = identity, out[i] = scan(x[:i]): scan all but the last element into out[1:].
        n = x.shape[a]
        head = [slice(None)] * x.ndim
        head[a] = slice(0, 1)
        dst[tuple(head)] = identity
        if n > 1:
            lo = list(head)
            lo[a] = slice(0, n - 1)
            hi = list(head)
            hi[a] = slice(1, n)
            _inclusive(xp, fn, src[tuple(lo)], a, acc, dst[tuple(hi)])
    else:
        _inclusive(xp, fn, src, a, acc, dst)
    return out.astype(x.dtype) if narrow else out


def _inclusive(xp: Any, fn: Any, src: Any, a: int, acc: np.dtype, dst: Any) -> None:
    """dst = fn(src) along axis ``a`` (cumsum or cumprod), by whole rows where that pays."""
    if xp is np and _rows_pay(src.shape, a):
        _scan_rows(np.add if fn is xp.cumsum else np.multiply, src, a, acc, dst)
    else:
        fn(src, axis=a, dtype=acc, out=dst)


def _rows_pay(shape: tuple[int, ...], a: int) -> bool:
    """Whether ``_scan_rows`` beats numpy's scan: a long axis with rows of many values after it.
    numpy accumulates along the axis itself, one strided element at a time (7 ns a value
    along the middle axis of 1x4096x256, against 0.3 for onnxruntime)."""
    return shape[a] >= 64 and math.prod(shape[a + 1 :]) >= 32


def _scan_rows(ufunc: Any, src: np.ndarray, a: int, acc: np.dtype, dst: np.ndarray) -> None:
    """dst = the inclusive scan (``ufunc``: add or multiply) of ``src`` along axis ``a``, as
    whole rows (every value after the axis at once) in two levels: each block of about sqrt(n)
    rows scanned row by row, all blocks in the same numpy call, then each block combined with
    the previous block's last row. About 2 sqrt(n) calls over contiguous rows instead of n
    strided scalar chains: 1x4096x256 along the middle axis 7.3 -> 1.4 ms, 2x1024x1536 18.3 ->
    3.5 ms (onnxruntime 0.3 for the first). The order of the operations differs from a
    sequential scan's (blocks first): float sums round differently in the last bits; integers
    are exact either way."""
    shape = src.shape
    outer, n, inner = math.prod(shape[:a]), shape[a], math.prod(shape[a + 1 :])
    x = np.ascontiguousarray(src, dtype=acc).reshape(outer, n, inner)
    y = np.empty_like(x)
    r = max(2, math.isqrt(n))
    q = n // r
    main = q * r
    xb = x[:, :main].reshape(outer, q, r, inner)
    yb = y[:, :main].reshape(outer, q, r, inner)
    yb[:, :, 0] = xb[:, :, 0]
    for i in range(1, r):
        ufunc(yb[:, :, i - 1], xb[:, :, i], out=yb[:, :, i])
    for k in range(1, q):
        ufunc(yb[:, k], yb[:, k - 1, r - 1 : r], out=yb[:, k])
    for i in range(main, n):
        ufunc(y[:, i - 1], x[:, i], out=y[:, i])
    dst[...] = y.reshape(shape)


@op("CumSum", 11, host_inputs=(1,))
def cumsum(xp: Any, x: Any, axis: Any, *, exclusive: int = 0, reverse: int = 0) -> Any:
    return _scan(xp, xp.cumsum, 0, x, axis, exclusive, reverse)


@op("CumProd", 26, host_inputs=(1,))
def cumprod(xp: Any, x: Any, axis: Any, *, exclusive: int = 0, reverse: int = 0) -> Any:
    return _scan(xp, xp.cumprod, 1, x, axis, exclusive, reverse)


# -- Einsum ----------------------------------------------------------------------------------------


@op("Einsum", 12)
def einsum(xp: Any, *inputs: Any, equation: str) -> Any:
    if not inputs:
        raise ValueError("Einsum needs at least one input")
    eq = equation.replace(" ", "")
    n_terms = len(eq.split("->")[0].split(","))
    if n_terms != len(inputs):
        raise ValueError(f"equation '{equation}' has {n_terms} input terms but the node has {len(inputs)} inputs")
    dtype = inputs[0].dtype
    if _is_narrow_float(dtype):
        inputs = tuple(x.astype(np.float32) for x in inputs)
    # optimize=True lets numpy contract pairs through BLAS (tensordot) instead of its C loop.
    r = xp.einsum(eq, *inputs, optimize=len(inputs) > 1)
    return xp.asarray(r).astype(dtype, copy=False)


# -- Trilu -----------------------------------------------------------------------------------------


@op("Trilu", 14, host_inputs=(1,))
def trilu(xp: Any, input: Any, k: Any = None, *, upper: int = 1) -> Any:  # noqa: A002 - spec name
    if input.ndim < 2:
        raise ValueError(f"input must have rank >= 2, got shape {list(input.shape)}")
    kk = 0 if k is None else int(host_scalar(k))
    rows, cols = input.shape[-2:]
    # Clamp k to where the result no longer changes, so huge values stay cheap.
    kk = max(-rows - 1, min(cols + 1, kk))
    ints = _MASK_INTS.get(input.dtype.itemsize)
    if (
        xp is np
        and ints is not None
        and input.dtype.kind in "biufcV"  # not strings (object or unicode)
        and input.size >= _TRILU_MASK_MIN
        and rows * cols <= _TRILU_MASK_MAX
    ):
        # The kept triangle as a mask of all-ones / all-zero integers, ANDed with x's bits:
        # one vectorized pass, where numpy's triu / tril build a boolean mask and pick values
        # with where() (128x512 float32 116 -> 22 us; onnxruntime 17). Same bits, NaN included.
        mask = _triangle_mask(rows, cols, kk, bool(upper), ints)
        return np.bitwise_and(input.view(ints), mask).view(input.dtype)
    return xp.triu(input, kk) if upper else xp.tril(input, kk)


# Integers as wide as each element size (complex128 keeps numpy's form), and the sizes that
# take the mask: from 4,096 values, for matrices of at most 1,048,576 (a cached mask of at
# most 8 MB; eight masks are kept).
_MASK_INTS = {1: np.dtype(np.int8), 2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}
_TRILU_MASK_MIN = 4096
_TRILU_MASK_MAX = 1 << 20


@functools.lru_cache(maxsize=8)
def _triangle_mask(rows: int, cols: int, k: int, upper: bool, ints: np.dtype) -> np.ndarray:
    """-1 (all bits set) where Trilu keeps a value, 0 elsewhere: (rows, cols), read-only."""
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]  # j - i
    keep = offset >= k if upper else offset <= k
    mask = np.negative(keep.astype(ints))
    mask.flags.writeable = False  # shared by every call
    return mask


# -- Hardmax ---------------------------------------------------------------------------------------


def _one_hot_argmax(xp: Any, x: Any, axis: int) -> Any:
    idx = xp.argmax(x, axis=axis, keepdims=True)  # the first maximum wins ties
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    positions = xp.arange(x.shape[axis]).reshape(shape)
    return (positions == idx).astype(x.dtype)


@op("Hardmax", 1)
def hardmax_1(xp: Any, input: Any, *, axis: int = 1) -> Any:  # noqa: A002 - spec name
    # Before opset 13 the input is coerced to 2-D [prod(shape[:axis]), prod(shape[axis:])].
    require_rank(input, 1, "Hardmax")  # a scalar has no axis to take the maximum over
    a = normalize_axis(axis, input.ndim)
    outer = int(np.prod(input.shape[:a], dtype=np.int64))
    inner = int(np.prod(input.shape[a:], dtype=np.int64))
    if input.size == 0:
        return xp.zeros(input.shape, dtype=input.dtype)
    return _one_hot_argmax(xp, input.reshape(outer, inner), 1).reshape(input.shape)


@op("Hardmax", 13)
def hardmax(xp: Any, input: Any, *, axis: int = -1) -> Any:  # noqa: A002 - spec name
    require_rank(input, 1, "Hardmax")
    a = normalize_axis(axis, input.ndim)
    if input.size == 0:
        return xp.zeros(input.shape, dtype=input.dtype)
    return _one_hot_argmax(xp, input, a)


# -- Det -------------------------------------------------------------------------------------------


@op("Det", 11)
def det(xp: Any, X: Any) -> Any:  # noqa: N803 - spec name
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise ValueError(f"X must be [*, M, M], got shape {list(X.shape)}")
    w = X.astype(np.float32) if _is_narrow_float(X.dtype) else X
    return xp.asarray(xp.linalg.det(w)).astype(X.dtype, copy=False)


# -- TopK ------------------------------------------------------------------------------------------


def _sorted_order(xp: Any, v: Any, axis: int, largest: int) -> Any:
    """Positions along ``axis`` that sort v: by value (descending if largest), ties by position."""
    if not largest:
        return xp.argsort(v, axis=axis, kind="stable")
    # A stable ascending sort of the reversed axis, read from the end, puts the larger values first
    # and keeps equal values in ascending position.
    rev = xp.argsort(xp.flip(v, axis=axis), axis=axis, kind="stable")
    return (v.shape[axis] - 1) - xp.flip(rev, axis=axis)


def _leading(idx: Any, axis: int, k: int) -> Any:
    sl = [slice(None)] * idx.ndim
    sl[axis] = slice(0, k)
    return idx[tuple(sl)]


def _topk(xp: Any, x: Any, k: int, axis: int, largest: int, sorted_: int) -> tuple[Any, Any]:
    if x.ndim == 0:
        raise ValueError("input X must have rank >= 1")
    a = normalize_axis(axis, x.ndim)
    n = x.shape[a]
    if k < 0 or k > n:
        raise ValueError(f"k = {k} is out of range for axis {axis} of size {n} (shape {list(x.shape)})")
    plain = x.dtype.kind in "iuf" and not (x.dtype.kind == "f" and xp.isnan(x).any())
    if k == 1 and plain:
        # The first maximum (minimum) is the one TopK names: ties go to the lower index.
        idx = (xp.argmax if largest else xp.argmin)(x, axis=a, keepdims=True)
    elif 0 < k and k * 8 <= n and n >= 512 and plain:
        idx = _topk_select(xp, x, k, a, largest)
    else:
        # ml_dtypes' types (bfloat16, float8) sort by a comparison that NaN breaks (5.0 was lost
        # behind a NaN): their values sort exactly as float32, where NaN sorts last.
        key = x.astype(np.float32) if x.dtype.kind == "V" else x
        idx = _leading(_sorted_order(xp, key, a, largest), a, k)
    idx = idx.astype(np.int64, copy=False)
    return xp.take_along_axis(x, idx, axis=a), idx


def _topk_select(xp: Any, x: Any, k: int, a: int, largest: int) -> Any:
    """Top-k without sorting the whole axis (k much smaller than n): a partition finds the k-th
    value, the elements strictly beyond it plus the first tied ones (by index) make the k winners,
    and only those k are sorted."""
    n = x.shape[a]
    if xp is np and a == x.ndim - 1 and x.dtype.kind == "f":
        found = _topk_sampled(x, k, largest)
        if found is not None:
            return found
    kth = n - k if largest else k - 1
    at_kth = [slice(None)] * x.ndim
    at_kth[a] = slice(kth, kth + 1)
    pivot = xp.partition(x, kth, axis=a)[tuple(at_kth)]
    if xp is np and a == x.ndim - 1:
        # Usually exactly k values per line reach the k-th (no tie straddles it: each line
        # has at least k, so a total of lines * k means k in each). Then the winners in index
        # order are one flatnonzero, without the cumulative count of ties and the stable sort of
        # the mask: 25,200 values, k = 100, 234 -> 59 us; 16 x 32,000, k = 40, 7.9 -> 0.8 ms.
        reach = x >= pivot if largest else x <= pivot
        lines = x.size // n
        if np.count_nonzero(reach) == lines * k:
            flat = np.flatnonzero(reach).reshape(*x.shape[:-1], k)
            picked = flat - (np.arange(lines, dtype=flat.dtype) * n).reshape(*x.shape[:-1], 1)
            order = _sorted_order(xp, xp.take_along_axis(x, picked, axis=a), a, largest)
            return xp.take_along_axis(picked, order, axis=a)
    beyond = x > pivot if largest else x < pivot
    tied = x == pivot
    need = k - xp.sum(beyond, axis=a, keepdims=True)
    chosen = beyond | (tied & (xp.cumsum(tied, axis=a) <= need))
    # Exactly k chosen per line; a stable sort of the booleans (linear time) lists them in index order.
    picked = _leading(xp.argsort(~chosen, axis=a, kind="stable"), a, k)
    order = _sorted_order(xp, xp.take_along_axis(x, picked, axis=a), a, largest)
    return xp.take_along_axis(picked, order, axis=a)


# Sample values per winner that _topk_sampled draws its threshold from, how many winners' worth
# of values it aims to let past the threshold (a margin against unlucky samples), the fewest
# sampled values it keeps (a threshold from the top 2 or 3 of a sample strays far), and the
# smallest input it takes (below, its dozen numpy calls cost more than a partition).
_SAMPLE_PER_WINNER = 32
_CANDIDATES_PER_WINNER = 4
_MIN_SAMPLED_KEPT = 8
_SAMPLED_MIN_VALUES = 1 << 15
# Shorter lines partition faster than this path's calls cost (128 x 512, k = 5: 214 -> 263 us).
_SAMPLED_MIN_LINE = 2048


def _topk_sampled(x: np.ndarray, k: int, largest: int) -> np.ndarray | None:
    """Top-k positions along the last axis of a host float array without NaN, sorted, ties by
    index: a threshold from an evenly spaced sample of each line (its value with about 4k
    values of the line expected beyond it), one comparison pass keeping the values at or beyond
    it, then an exact sort of those candidates only. Exact whenever every line keeps at least
    k candidates, since the k winners are all at or beyond any value k of them reach; None
    where a line keeps fewer (an unlucky sample) or too many (ties), for the partition path.
    np.partition walks every line in several passes: 8 x 32,000 values, k = 40, 1.4 ms."""
    n = x.shape[-1]
    # At most every 4th value: a larger sample's partition would cost most of the line's.
    step = max(4, n // (_SAMPLE_PER_WINNER * k))
    if n < max(16 * k, _SAMPLED_MIN_LINE) or x.size < _SAMPLED_MIN_VALUES:
        return None  # too few values a winner to sample, short lines, or a small call
    lines = x.size // n
    x2 = x.reshape(lines, n)
    sample = x2[:, ::step]
    m = sample.shape[1]
    j = min(m, max(_MIN_SAMPLED_KEPT, -(-_CANDIDATES_PER_WINNER * k // step)))  # kept per line
    kth = m - j if largest else j - 1
    t = np.partition(sample, kth, axis=1)[:, kth : kth + 1]
    reach = x2 >= t if largest else x2 <= t
    flat = np.flatnonzero(reach)  # line by line, each line's candidates in index order
    if flat.size > x.size // 4:
        return None  # ties at the threshold: most values pass
    rows = flat // n
    counts = np.bincount(rows, minlength=lines)
    if int(counts.min()) < k or int(counts.max()) > n // 4:
        return None
    # Candidates as (lines, most), each line padded past its own count with a value that sorts
    # last and an index past the axis.
    start = np.zeros(lines, dtype=np.intp)
    np.cumsum(counts[:-1], out=start[1:])
    slot = np.arange(flat.size, dtype=np.intp) - start[rows]
    most = int(counts.max())
    vals = np.full((lines, most), -np.inf if largest else np.inf, dtype=x.dtype)
    idx = np.full((lines, most), n, dtype=np.intp)
    vals[rows, slot] = x2.reshape(-1)[flat]
    idx[rows, slot] = flat - rows * n
    # A stable sort keeps equal values in index order; the padding sorts after every real value
    # (after a real infinity of its sign too, being later).
    order = np.argsort(-vals if largest else vals, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(idx, order, axis=1).reshape(*x.shape[:-1], k)


@op("TopK", 1)
def topk_1(xp: Any, X: Any, *, axis: int = -1, k: int) -> tuple[Any, Any]:  # noqa: N803 - spec name
    return _topk(xp, X, int(k), axis, 1, 1)


@op("TopK", 10, host_inputs=(1,))
def topk_10(xp: Any, X: Any, K: Any, *, axis: int = -1) -> tuple[Any, Any]:  # noqa: N803 - spec names
    return _topk(xp, X, _k_value(K), axis, 1, 1)


@op("TopK", 11, host_inputs=(1,))
def topk(xp: Any, X: Any, K: Any, *, axis: int = -1, largest: int = 1, sorted: int = 1) -> tuple[Any, Any]:  # noqa: A002, N803 - spec names
    return _topk(xp, X, _k_value(K), axis, largest, sorted)


def _k_value(K: Any) -> int:  # noqa: N803 - spec name
    ks = host_ints(K)
    if len(ks) != 1:
        raise ValueError(f"K must hold a single value, got {len(ks)}")
    return ks[0]


# -- LpNormalization / MeanVarianceNormalization ---------------------------------------------------


@op("LpNormalization", 1)
def lp_normalization(xp: Any, input: Any, *, axis: int = -1, p: int = 2) -> Any:  # noqa: A002 - spec name
    a = normalize_axis(axis, input.ndim)
    w = input.astype(np.float32) if _is_narrow_float(input.dtype) else input
    if p == 1:
        norm = xp.sum(xp.abs(w), axis=a, keepdims=True)
    elif p == 2:
        norm = xp.sqrt(xp.sum(w * w, axis=a, keepdims=True))
    else:
        raise ValueError(f"p must be 1 or 2, got {p}")
    # A zero norm (all-zero slice) gives zeros, not nan.
    safe = xp.where(norm == 0, norm.dtype.type(1), norm)
    return (w / safe).astype(input.dtype, copy=False)


@op("MeanVarianceNormalization", 9)
def mean_variance_normalization(xp: Any, X: Any, *, axes: Sequence[int] = (0, 2, 3)) -> Any:  # noqa: N803 - spec name
    ax = tuple(normalize_axes(axes, X.ndim))
    w = X.astype(np.float32) if _is_narrow_float(X.dtype) else X
    centered = w - xp.mean(w, axis=ax, keepdims=True)
    std = xp.sqrt(xp.mean(centered * centered, axis=ax, keepdims=True))
    # The spec's function body adds 1e-9 to the deviation.
    return (centered / (std + std.dtype.type(1e-9))).astype(X.dtype, copy=False)


# -- EyeLike ---------------------------------------------------------------------------------------


@op("EyeLike", 9)
def eye_like(xp: Any, input: Any, *, dtype: int | None = None, k: int = 0) -> Any:  # noqa: A002 - spec name
    if input.ndim != 2:
        raise ValueError(f"input must be 2-D, got shape {list(input.shape)}")
    dt = input.dtype if dtype is None else np_dtype(int(dtype))
    rows, cols = input.shape
    return xp.eye(rows, cols, k=int(k), dtype=dt)


# -- BitCast ---------------------------------------------------------------------------------------

# Bits per element of the types numpy stores one to a byte (ml_dtypes keeps the value in the low bits).
_SUB_BYTE_BITS = {"int4": 4, "uint4": 4, "float4_e2m1fn": 4, "int2": 2, "uint2": 2}


def _bits(dtype: np.dtype) -> int:
    return _SUB_BYTE_BITS.get(dtype.name, dtype.itemsize * 8)


@op("BitCast", 26, alias={0: 0})
def bit_cast(xp: Any, input: Any, *, to: int) -> Any:  # noqa: A002 - spec name
    target = np_dtype(int(to))
    src = input.dtype
    if src.kind in "OUS" or target.kind in "OUS":
        raise TypeError("BitCast does not accept strings")
    if _bits(src) != _bits(target):
        raise ValueError(
            f"BitCast from {src} ({_bits(src)} bits) to {target} ({_bits(target)} bits): bit widths differ"
        )
    if target == np.bool_:
        # A bool must hold 0 or 1; any other byte pattern reads as true.
        return input.view(np.uint8) != 0
    if target.name in _SUB_BYTE_BITS:
        # Keep only the low bits: the byte's upper bits are not part of the value.
        mask = np.uint8((1 << _bits(target)) - 1)
        return (input.view(np.uint8) & mask).view(target)
    return input.view(target)
