"""Indexing kernels: Gather, GatherElements (more in later families)."""

from __future__ import annotations

from typing import Any

from ._compat import normalize_axis
from .registry import op


def _check_indices(xp: Any, indices: Any, dim: int, what: str) -> Any:
    """Indices with negatives wrapped; out-of-range ones raise naming the bad value."""
    if indices.size:
        lo = int(indices.min())
        hi = int(indices.max())
        if lo < -dim or hi >= dim:
            bad = lo if lo < -dim else hi
            raise IndexError(
                f"{what}: index {bad} is out of bounds for an axis of size {dim} (valid: [{-dim}, {dim - 1}])"
            )
    return xp.where(indices < 0, indices + dim, indices) if indices.dtype.kind == "i" else indices


@op("Gather", 1)
def gather(xp: Any, data: Any, indices: Any, *, axis: int = 0) -> Any:
    axis = normalize_axis(axis, data.ndim)
    idx = _check_indices(xp, indices, data.shape[axis], "Gather")
    return xp.take(data, idx.astype("int64", copy=False), axis=axis)


@op("GatherElements", 11)
def gather_elements(xp: Any, data: Any, indices: Any, *, axis: int = 0) -> Any:
    axis = normalize_axis(axis, data.ndim)
    if indices.ndim != data.ndim:
        raise ValueError(f"GatherElements: indices rank {indices.ndim} must equal data rank {data.ndim}")
    idx = _check_indices(xp, indices, data.shape[axis], "GatherElements")
    return xp.take_along_axis(data, idx.astype("int64", copy=False), axis=axis)
