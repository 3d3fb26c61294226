"""Reusable host buffers for kernels' large temporaries, one set per thread.

A kernel's temporaries of several MB (Winograd's transformed tiles, im2col columns) live for one
call. From glibc they come either from the heap or, above its (moving) mmap threshold, as fresh
pages that the kernel zero-fills and faults in on every call: VGG-19 faulted 18-30 MB per run
that way, and which arrays cross the threshold shifts with whatever the process freed before,
so a change to one layer could slow the next ones by 2x. A per-thread buffer per call site,
grown to the largest size seen and reused, makes those costs steady.

Rules for a kernel: take a scratch array only for a temporary that dies before the kernel
returns (never return it or a view of it), and give each concurrent use its own ``key``.
Threads never share buffers, so concurrent runs are safe. Arrays below ``MIN_BYTES`` come
from numpy as usual: the allocator reuses those well, and ResNet-50, whose largest Winograd
temporaries are 1.8 MB, ran about 2% slower with them in scratch buffers (within this VM's
noise, but never faster).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

MIN_BYTES = 2 << 20

_local = threading.local()


def scratch(key: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialized C-contiguous array of ``shape`` and ``dtype`` that the calling thread
    may use until its next request for ``key``."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dtype=dt)
    buffers: dict[str, np.ndarray] | None = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    buf = buffers.get(key)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(nbytes, dtype=np.uint8)
        buffers[key] = buf
    return buf[:nbytes].view(dt).reshape(shape)


def held_bytes() -> int:
    """Bytes the calling thread's scratch buffers hold (for tests and memory accounting)."""
    buffers: dict[str, np.ndarray] = getattr(_local, "buffers", {})
    return sum(b.nbytes for b in buffers.values())


def release() -> None:
    """Drop the calling thread's scratch buffers."""
    _local.buffers = {}
