"""ConcatAppend: a channel Concat that grows its first input in place when it can.

DenseNet concatenates every layer's output onto the block's features so far:
cat_k = Concat(cat_{k-1}, y_k). As plain Concats each copies the whole prefix again, so a
block of L layers copies O(L^2) channels. ConcatAppend (from optimizer/passes/chain_concat.py)
allocates the block's final width once, at the chain's first link, and returns prefix views
of that buffer; each later link writes only its new inputs after the prefix.

A link appends in place only when its first input is exactly the filled prefix of such a
buffer: no other link has appended to that prefix yet (a branch would overwrite it), which a
per-buffer fill count records. Otherwise it allocates afresh and copies, as a Concat does.
Values already handed out are never changed: appends write only past their extent, and the
executor writes in place only into arrays that own their memory, which prefix views do not.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from .registry import op

DOMAIN = "onnxpy.fused"

# id(buffer) -> (weak reference to it, channels filled so far).
_FILLED: dict[int, tuple[weakref.ref[np.ndarray], int]] = {}
_LOCK = threading.Lock()


def _filled(buf: np.ndarray) -> int:
    hit = _FILLED.get(id(buf))
    return hit[1] if hit is not None and hit[0]() is buf else -1


def _record(buf: np.ndarray, count: int) -> None:
    key = id(buf)
    with _LOCK:
        hit = _FILLED.get(key)
        if hit is None or hit[0]() is not buf:
            _FILLED[key] = (weakref.ref(buf, lambda _ref, key=key: _FILLED.pop(key, None)), count)
        else:
            _FILLED[key] = (hit[0], count)


def _growable(a: Any, total: int) -> np.ndarray | None:
    """The buffer ``a`` is the filled channel prefix of, if ``total`` channels fit in it."""
    buf = a.base
    if (
        a.__class__ is not np.ndarray
        or buf is None
        or buf.__class__ is not np.ndarray
        or buf.ndim != a.ndim
        or buf.shape[0] != a.shape[0]
        or buf.shape[2:] != a.shape[2:]
        or buf.shape[1] < total
        or buf.strides != a.strides
        or buf.dtype != a.dtype
        or a.ctypes.data != buf.ctypes.data
    ):
        return None
    return buf if _filled(buf) == a.shape[1] else None


@op("ConcatAppend", 1, domain=DOMAIN)
def concat_append(xp: Any, first: Any, *rest: Any, capacity: int) -> Any:
    """Concat(first, *rest) on axis 1, as a prefix view of a buffer of ``capacity`` channels."""
    parts = (first, *rest)
    if first.ndim < 2 or any(p.ndim != first.ndim for p in parts):
        raise ValueError(f"ConcatAppend needs inputs of one rank >= 2, got shapes {[list(p.shape) for p in parts]}")
    for p in rest:
        if p.shape[0] != first.shape[0] or p.shape[2:] != first.shape[2:]:
            raise ValueError(
                f"ConcatAppend inputs must match outside axis 1, got shapes {[list(p.shape) for p in parts]}"
            )
    dtype = np.result_type(*parts)
    total = sum(p.shape[1] for p in parts)
    if xp is not np or any(p.__class__ is not np.ndarray for p in parts):
        return xp.concatenate(parts, axis=1)
    buf = _growable(first, total) if first.dtype == dtype else None
    if buf is None:
        buf = np.empty((first.shape[0], max(int(capacity), total), *first.shape[2:]), dtype=dtype)
        buf[:, : first.shape[1]] = first
    start = first.shape[1]
    for p in rest:
        buf[:, start : start + p.shape[1]] = p
        start += p.shape[1]
    _record(buf, start)
    return buf[:, :start]
