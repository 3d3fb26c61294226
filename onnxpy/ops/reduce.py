"""Reduction kernels: Reduce* with axes as attribute (old opsets) or input (new opsets)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._compat import host_ints, normalize_axes
from .registry import op


def _axes(x: Any, axes: Any, noop_with_empty_axes: int) -> tuple[int, ...] | None:
    """None means "reduce nothing" (noop); an empty tuple is never returned."""
    ax = host_ints(axes) if axes is not None else []
    if not ax:
        return None if noop_with_empty_axes else tuple(range(x.ndim))
    return tuple(normalize_axes(ax, x.ndim))


def _reduce(xp: Any, fn: Any, x: Any, axes: Any, keepdims: int, noop: int, empty_value: Any = None) -> Any:
    ax = _axes(x, axes, noop)
    if ax is None:
        return x
    if empty_value is not None and any(x.shape[a] == 0 for a in ax):
        shape = (
            [1 if i in ax else d for i, d in enumerate(x.shape)]
            if keepdims
            else [d for i, d in enumerate(x.shape) if i not in ax]
        )
        return xp.full(shape, empty_value, dtype=x.dtype)
    return fn(x, axis=ax, keepdims=bool(keepdims))


def _mean(x: Any, axis: Any, keepdims: bool) -> Any:
    return x.mean(axis=axis, keepdims=keepdims, dtype=np.float32 if x.dtype == np.float16 else None).astype(
        x.dtype, copy=False
    )


@op("ReduceMean", 1)
def reduce_mean_1(xp: Any, data: Any, *, axes: list[int] | None = None, keepdims: int = 1) -> Any:
    return _reduce(xp, _mean, data, axes, keepdims, 0)


@op("ReduceMean", 18, host_inputs=(1,))
def reduce_mean(xp: Any, data: Any, axes: Any = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0) -> Any:
    return _reduce(xp, _mean, data, axes, keepdims, noop_with_empty_axes)
