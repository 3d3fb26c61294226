"""Passes over long rows against one value a row, without numpy's operand buffers.

A ufunc given a broadcast operand (stride 0, such as ``mean[:, None]``) copies it into its
8,192-value buffer before each inner loop, which costs about one extra pass; with the buffer
shrunk to 16 values numpy calls the loop once per row instead, which costs about 60 ns a row.
Rows of 1,024 to 4,096 values gain (one pass of 64 x 3,136 float32 in place: 48 -> 25 us),
short ones lose (512 x 196: 25 -> 45) and so, oddly, do longer ones (InstanceNormalization,
whose three such passes run here: 64 x 3,136 237 -> 173 us, 4 x 64 x 4,096 906 -> 534,
256 x 1,024 310 -> 242, but 64 x 4,608 170 -> 180, 32 x 16,384 321 -> 340). Setting the size
and back costs about 3 us, so only arrays of many values switch (see docs/benchmark.md, "numpy
buffers non-contiguous operands"). numpy 2 keeps the size in a context variable: other
threads are not affected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

# Rows of MIN_ROW to MAX_ROW values, in arrays of at least MIN_VALUES, run unbuffered.
MIN_ROW = 1024
MAX_ROW = 4096
MIN_VALUES = 1 << 16
_SMALL_BUFFER = 16


@contextlib.contextmanager
def _unbuffered() -> Iterator[None]:
    old = np.setbufsize(_SMALL_BUFFER)
    try:
        yield
    finally:
        np.setbufsize(old)


def per_row_passes(row: int, values: int) -> contextlib.AbstractContextManager[None]:
    """A context for ufunc passes over ``values`` values in rows of ``row``, each against a
    broadcast per-row operand: unbuffered where that is faster."""
    if MIN_ROW <= row <= MAX_ROW and values >= MIN_VALUES:
        return _unbuffered()
    return contextlib.nullcontext()
