"""Channels-first (NCHW) and channels-last memory on the CPU, and fast copies to C order.

Depthwise convolutions run channels-last (``_depthwise.py``); most other kernels want NCHW. A
copy between the two is a transpose of a (H*W, C) matrix, which numpy does element by element
through strides: 0.4-0.6 ns a value against 0.09 for a plain copy, in cache. OpenBLAS's blocked
transpose (``_blas.transpose_into``) takes about 0.14 there, and in ShuffleNet's run (20 copies
of a depthwise result for a grouped 1x1 convolution) 530 -> 310-430 us a run.

The other direction, NCHW into the zero-bordered channels-last buffer a depthwise layer reads,
stays with numpy: through a BLAS transpose into a temporary and a copy into the buffer it was
slower in the model (ShuffleNet 16 copies: 600-610 -> 700-940 us), and row by row slower still.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._blas import transpose_into


def flat_in_memory_order(x: Any, out: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``x`` and ``out`` as 1-D views that match element for element, where both lie in one
    contiguous run in the same memory order (C order, channels-last, ...); else None. Lets an
    elementwise kernel work in blocks of a channels-last result without copying it across."""
    if not isinstance(x, np.ndarray) or not isinstance(out, np.ndarray) or x.shape != out.shape:
        return None
    order = sorted(range(x.ndim), key=lambda axis: -x.strides[axis])
    xt, ot = x.transpose(order), out.transpose(order)
    if not (xt.flags.c_contiguous and ot.flags.c_contiguous):
        return None
    return xt.reshape(-1), ot.reshape(-1)


def blocks_in_memory_order(x: Any, out: Any, size: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Matching 1-D blocks of at most ``size`` values of ``x`` and ``out``, in their shared
    memory order (see flat_in_memory_order), for elementwise kernels that keep their passes in
    cache; None where the two are not one run each in the same order."""
    flat = flat_in_memory_order(x, out)
    if flat is None:
        return None
    src, dst = flat
    return [(src[i : i + size], dst[i : i + size]) for i in range(0, src.size, size)]


def is_channels_last(x: Any) -> bool:
    """True for a 4-D numpy array whose channel axis is the contiguous one (C > 1)."""
    return (
        isinstance(x, np.ndarray)
        and x.ndim == 4
        and x.shape[1] > 1
        and x.strides[1] == x.itemsize
        and x.strides[3] == x.shape[1] * x.itemsize
        and x.strides[2] == x.shape[3] * x.strides[3]
    )


def nchw_copy(x: np.ndarray) -> np.ndarray:
    """A C-contiguous (NCHW) copy of the channels-last array ``x`` (see is_channels_last)."""
    n, c, h, w = x.shape
    y = np.empty(x.shape, dtype=x.dtype)
    for i in range(n):
        if not transpose_into(x[i].transpose(1, 2, 0).reshape(h * w, c), y[i].reshape(c, h * w)):
            y[i] = x[i]
    return y


# Matrices a permuted view may take in ``contiguous_copy`` (one OpenBLAS call each), and the
# fewest values a matrix needs for the call to pay: numpy's copy of a matrix in cache is quick,
# OpenBLAS's call costs 10-14 us (8 x 64 x 64 swapped: numpy 15 us, OpenBLAS 113; one 128 x 512:
# 156 against 31).
_MAX_TRANSPOSE_CALLS = 64
_MIN_TRANSPOSE_VALUES = 1 << 15


def contiguous_copy(x: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of the host array ``x``. Where ``x`` is a transposed view of
    C-contiguous memory (leading axes in place, the rest two groups swapped: a 2-D ``.T``, a
    (b, n, m) -> (b, m, n) swap, channels-last NCHW) and float32/float64, each matrix goes through
    OpenBLAS's blocked transpose: numpy's copy walks one side element by element (a 128 x 512
    transposed output 154 us, onnxruntime's Transpose 27)."""
    small = x.size < _MIN_TRANSPOSE_VALUES
    plan = None if small or x.dtype not in (np.float32, np.float64) else _swap_plan(x)
    if plan is not None:
        src, rows, cols = plan
        y = np.empty(x.shape, dtype=x.dtype)
        dst = y.reshape(-1, cols, rows)
        if all(transpose_into(src[i], dst[i]) for i in range(src.shape[0])):
            return y
    return np.array(x, order="C")  # a copy even of a C-contiguous x


def _swap_plan(x: np.ndarray) -> tuple[np.ndarray, int, int] | None:
    """(matrices of x's memory as (count, rows, cols), rows, cols) where x in C order is each
    matrix transposed; None for any other layout."""
    nd = x.ndim
    order = sorted(range(nd), key=lambda axis: (-x.strides[axis], axis))
    base = x.transpose(order)
    if not base.flags.c_contiguous:
        return None
    lead = 0
    while lead < nd and order[lead] == lead:
        lead += 1
    rest = order[lead:]
    if len(rest) < 2:
        return None  # x is C-contiguous already (or one axis: nothing to transpose)
    split = rest[0]  # x's axes [lead, split) follow [split, nd) in memory
    if rest != list(range(split, nd)) + list(range(lead, split)):
        return None
    count, cols, rows = math.prod(x.shape[:lead]), math.prod(x.shape[lead:split]), math.prod(x.shape[split:])
    if count > _MAX_TRANSPOSE_CALLS or min(rows, cols) < 2 or rows * cols < _MIN_TRANSPOSE_VALUES:
        return None
    return base.reshape(count, rows, cols), rows, cols
