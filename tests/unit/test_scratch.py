"""ops/_scratch.py: per-thread reusable buffers for kernels' large temporaries."""

from __future__ import annotations

import threading

import numpy as np

from onnxpy.ops import _scratch
from onnxpy.ops._scratch import MIN_BYTES, held_bytes, release, scratch


def test_a_large_temporary_reuses_its_buffer_and_grows_when_needed() -> None:
    release()
    n = MIN_BYTES // 4
    a = scratch("k", (n,), np.float32)
    a[:] = 1
    b = scratch("k", (2, n // 2), np.float32)
    assert b.shape == (2, n // 2) and b.flags.c_contiguous
    assert np.shares_memory(a, b)  # same buffer, as the old contents show
    assert (b == 1).all()
    c = scratch("k", (2 * n,), np.float64)  # larger: a new buffer
    assert c.dtype == np.float64 and not np.shares_memory(a, c)
    assert held_bytes() == c.nbytes
    d = scratch("other", (n,), np.float32)  # another key: its own buffer
    assert not np.shares_memory(c, d)
    release()
    assert held_bytes() == 0


def test_small_temporaries_are_plain_arrays() -> None:
    release()
    a = scratch("k", (16,), np.float32)
    b = scratch("k", (16,), np.float32)
    assert not np.shares_memory(a, b) and held_bytes() == 0


def test_threads_never_share_buffers() -> None:
    release()
    mine = scratch("k", (MIN_BYTES,), np.uint8)
    theirs: list[np.ndarray] = []
    t = threading.Thread(target=lambda: theirs.append(scratch("k", (MIN_BYTES,), np.uint8)))
    t.start()
    t.join()
    assert not np.shares_memory(mine, theirs[0])
    assert _scratch.held_bytes() == MIN_BYTES
    release()
