"""Reduction kernels: Reduce* (axes as attribute before opset 13/18, as input after), ArgMax, ArgMin.

Every Reduce* op goes through :func:`_run`, which turns the ONNX axes rules into a numpy ``axis``
tuple. "Reduce nothing" (noop_with_empty_axes with empty axes) is ``axis=()``: numpy then applies
only the element-wise part of a composite reduction, which is what the spec asks for (ReduceLogSum
returns log(x), ReduceSumSquare x*x...). A reduction over an empty set returns the op's identity
(0 for sums, 1 for products, -inf / the type's minimum for max...) without calling the reduction,
since numpy's max/min refuse empty inputs.

Narrow floats (float16, bfloat16) accumulate in float32 and are rounded once at the end;
integers accumulate in their own type (wrapping like C), as onnxruntime does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ._compat import host_ints, normalize_axes, normalize_axis
from .nn import _row_vector
from .pool import MATVEC_MEAN_MAX, _spatial_mean
from .registry import op

# A reduction body: (xp, x, axis tuple, keepdims) -> array (any float dtype; cast back by _run).
Body = Callable[[Any, Any, tuple[int, ...], bool], Any]


def _axis_tuple(x: Any, axes: Any, noop_with_empty_axes: int) -> tuple[int, ...]:
    ax = host_ints(axes) if axes is not None else []
    if not ax:
        return () if noop_with_empty_axes else tuple(range(x.ndim))
    return tuple(normalize_axes(ax, x.ndim))


def _acc_dtype(dtype: np.dtype) -> np.dtype | None:
    """The dtype to accumulate in: float32 for narrow floats, None (the input's own) otherwise."""
    # ml_dtypes types (bfloat16, float8...) have kind "V".
    if (dtype.kind == "f" and dtype.itemsize < 4) or dtype.kind == "V":
        return np.dtype(np.float32)
    return None


def _float_work(x: Any) -> Any:
    """x as a float array for the log/sqrt bodies: narrow floats in float32, ints in float64."""
    if x.dtype.kind in "iub":
        return x.astype(np.float64)
    acc = _acc_dtype(x.dtype)
    return x if acc is None else x.astype(acc)


def _out_shape(shape: tuple[int, ...], axis: tuple[int, ...], keepdims: int) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axis else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axis)


def _cast_back(xp: Any, r: Any, dtype: np.dtype) -> Any:
    if r.dtype == dtype:
        return r
    if dtype.kind in "iu" and r.dtype.kind == "f":
        # C-style float -> int conversion truncates toward zero.
        r = xp.trunc(r)
    return r.astype(dtype)


def _run(xp: Any, body: Body, empty: Callable[[np.dtype], Any], data: Any, axes: Any, keepdims: int, noop: int) -> Any:
    axis = _axis_tuple(data, axes, noop)
    if any(data.shape[a] == 0 for a in axis):
        return xp.full(_out_shape(data.shape, axis, keepdims), empty(data.dtype), dtype=data.dtype)
    return _cast_back(xp, xp.asarray(body(xp, data, axis, bool(keepdims))), data.dtype)


# -- reduction bodies ------------------------------------------------------------------------------


def _sum(xp: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    rows = _trailing_rows(xp, x, axis)
    if rows is not None:
        # Trailing axes of a host float array (x.sum((2, 3)) over feature maps): one
        # matrix-vector product with ones, as ReduceMean's (256x56x56: 203 -> 55 us).
        sums = rows @ _row_vector(rows.shape[1], 1.0, x.dtype)  # cached, read-only
        return sums.reshape(_out_shape(x.shape, axis, keepdims))
    # An explicit dtype stops numpy from widening small ints to int64.
    return xp.sum(x, axis=axis, keepdims=keepdims, dtype=_acc_dtype(x.dtype) or x.dtype)


def _prod(xp: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    return xp.prod(x, axis=axis, keepdims=keepdims, dtype=_acc_dtype(x.dtype) or x.dtype)


def _max(xp: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    return xp.max(x, axis=axis, keepdims=keepdims)


def _min(xp: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    return xp.min(x, axis=axis, keepdims=keepdims)


def _mean(xp: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    if (
        xp is np
        and axis
        and x.dtype.kind == "f"
        and tuple(sorted(axis)) == tuple(range(x.ndim - len(axis), x.ndim))
        and 0 < math.prod(x.shape[x.ndim - len(axis) :]) <= MATVEC_MEAN_MAX
    ):
        # The trailing axes of a host float array (a classifier head's spatial mean): one
        # matrix-vector product with 1/count, as GlobalAveragePool does (ops/pool.py).
        lead = x.shape[: x.ndim - len(axis)]
        mean = _spatial_mean(np, x.reshape(1, -1, *x.shape[x.ndim - len(axis) :]))
        return mean.reshape(lead + ((1,) * len(axis) if keepdims else ()))
    total = _sum(xp, x, axis, keepdims)
    count = 1
    for a in axis:
        count *= x.shape[a]
    if total.dtype.kind in "iu":
        # Integer mean divides like C: truncation toward zero.
        q = xp.floor_divide(total, count)
        if total.dtype.kind == "i":
            q = q + ((total < 0) & (xp.remainder(total, count) != 0)).astype(q.dtype)
        return q
    total = xp.asarray(total)
    if count != 1:
        total = total / total.dtype.type(count)
    return total


def _l1(xp: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    if x.dtype.kind == "u":
        return _sum(xp, x, axis, keepdims)
    return _sum(xp, xp.abs(x), axis, keepdims)


def _sum_square(xp: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    w = x if _acc_dtype(x.dtype) is None else x.astype(np.float32)
    rows = _trailing_rows(xp, w, axis)
    if rows is not None:
        # One pass over the rows, without the squared temporary (1000x512: 278 -> 107 us).
        sums = np.einsum("ij,ij->i", rows, rows)
        return sums.reshape(_out_shape(w.shape, axis, keepdims))
    return _sum(xp, w * w, axis, keepdims)


def _trailing_rows(xp: Any, x: Any, axis: tuple[int, ...]) -> Any:
    """``x`` as (rows, values) when ``axis`` is its trailing axes and each row holds at most
    MATVEC_MEAN_MAX values of a C-contiguous host float array (sums whose rounding stays small
    without numpy's pairwise order); else None."""
    count = math.prod(x.shape[a] for a in axis)
    if (
        xp is np
        and axis
        and x.dtype in (np.float32, np.float64)
        and x.flags.c_contiguous
        and tuple(sorted(axis)) == tuple(range(x.ndim - len(axis), x.ndim))
        and 0 < count <= MATVEC_MEAN_MAX
    ):
        return x.reshape(-1, count)
    return None


def _l2(xp: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    return xp.sqrt(_sum_square(xp, _float_work(x), axis, keepdims))


def _log_sum(xp: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    return xp.log(xp.sum(_float_work(x), axis=axis, keepdims=keepdims))


def _log_sum_exp(xp: Any, x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    w = _float_work(x)
    # Shift by the maximum so exp cannot overflow; an infinite maximum is not shifted (it would
    # turn into nan) and dominates the result on its own.
    m = xp.max(w, axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, m.dtype.type(0))
    s = xp.log(xp.sum(xp.exp(w - m), axis=axis, keepdims=True)) + m
    return s if keepdims else s.reshape(_out_shape(x.shape, axis, 0))


# -- identities for reductions over an empty set ---------------------------------------------------


def _zero(dtype: np.dtype) -> Any:
    return 0


def _one(dtype: np.dtype) -> Any:
    return 1


def _lowest(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return False
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return -np.inf


def _highest(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return True
    if dtype.kind in "iu":
        return np.iinfo(dtype).max
    return np.inf


def _minus_inf(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind not in "iub" else np.iinfo(dtype).min


# -- registration: one attribute-axes kernel (opset 1) and one input-axes kernel per op -------------

_BODIES: dict[str, tuple[Body, Callable[[np.dtype], Any], int]] = {
    # name: (body, empty-set value, opset where axes became an input)
    "ReduceSum": (_sum, _zero, 13),
    # The spec leaves an empty mean undefined; onnxruntime returns 0.
    "ReduceMean": (_mean, _zero, 18),
    "ReduceMax": (_max, _lowest, 18),
    "ReduceMin": (_min, _highest, 18),
    "ReduceProd": (_prod, _one, 18),
    "ReduceL1": (_l1, _zero, 18),
    "ReduceL2": (_l2, _zero, 18),
    "ReduceLogSum": (_log_sum, _minus_inf, 18),
    "ReduceLogSumExp": (_log_sum_exp, _minus_inf, 18),
    "ReduceSumSquare": (_sum_square, _zero, 18),
}


def _register(name: str, body: Body, empty: Callable[[np.dtype], Any], input_since: int) -> None:
    def with_attribute(xp: Any, data: Any, *, axes: list[int] | None = None, keepdims: int = 1) -> Any:
        return _run(xp, body, empty, data, axes, keepdims, 0)

    def with_input(xp: Any, data: Any, axes: Any = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0) -> Any:
        return _run(xp, body, empty, data, axes, keepdims, noop_with_empty_axes)

    for fn, suffix in ((with_attribute, "attr"), (with_input, "input")):
        fn.__name__ = fn.__qualname__ = f"{name.lower()}_{suffix}"
    op(name, 1)(with_attribute)
    op(name, input_since, host_inputs=(1,))(with_input)


for _name, (_body, _empty, _since) in _BODIES.items():
    _register(_name, _body, _empty, _since)


# -- ArgMax / ArgMin -------------------------------------------------------------------------------


def _arg(xp: Any, fn: Any, data: Any, axis: int, keepdims: int, select_last_index: int) -> Any:
    if data.ndim == 0:
        raise ValueError("input must have rank >= 1")
    a = normalize_axis(axis, data.ndim)
    if data.shape[a] == 0:
        out = [1 if k == a else d for k, d in enumerate(data.shape) if keepdims or k != a]
        if 0 in out:  # nothing to index (another axis is empty too): the empty result, as onnxruntime
            return xp.zeros(out, dtype=np.int64)
        raise ValueError(f"cannot take the index of an extreme over the empty axis {axis} of shape {list(data.shape)}")
    if data.dtype.kind == "b":
        data = data.view(np.uint8)
    if select_last_index:
        # The first extreme of the reversed axis is the last one of the original.
        idx = fn(xp.flip(data, axis=a), axis=a, keepdims=bool(keepdims))
        idx = (data.shape[a] - 1) - idx
    else:
        idx = fn(data, axis=a, keepdims=bool(keepdims))
    return xp.asarray(idx).astype(np.int64, copy=False)


@op("ArgMax", 1)
def argmax_1(xp: Any, data: Any, *, axis: int = 0, keepdims: int = 1) -> Any:
    return _arg(xp, xp.argmax, data, axis, keepdims, 0)


@op("ArgMax", 12)
def argmax(xp: Any, data: Any, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> Any:
    return _arg(xp, xp.argmax, data, axis, keepdims, select_last_index)


@op("ArgMin", 1)
def argmin_1(xp: Any, data: Any, *, axis: int = 0, keepdims: int = 1) -> Any:
    return _arg(xp, xp.argmin, data, axis, keepdims, 0)


@op("ArgMin", 12)
def argmin(xp: Any, data: Any, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> Any:
    return _arg(xp, xp.argmin, data, axis, keepdims, select_last_index)
