"""Host memory through glibc's malloc: freed memory kept for the next run, and creation's
peak given back to the operating system.

Keeping (the CPU arena, ``SessionOptions.enable_cpu_mem_arena``, on by default as in
onnxruntime): numpy arrays come from malloc, and glibc by default serves blocks above a
moving threshold (128 KiB to 32 MiB) with fresh pages from the kernel and returns the top of
its heap when more than twice that is free. A kernel's output or temporary then faults its
pages in again on every run: on this VM about 1.8 us per 4 KiB page, more than most kernels
spend computing on it (ShuffleNet's stem, a 1.4 MB im2col and its 1.2 MB result: 280 us with
reused memory, 1.2 ms with fresh pages). onnxpy instead fixes glibc's mmap threshold at 32 MiB
and its trim threshold at 256 MiB, once per process, so blocks below 32 MiB come from the heap
and freed ones stay there for reuse. ShuffleNet alone in a fresh process faulted 1,252 pages a
run, 0 with the arena: 14.0 -> 8.8 ms. The other benchmark models fault nothing either way, and
in a process that ran larger models first glibc's moving threshold had already grown, so
ShuffleNet ran fast there too: the "process history" effect seen on earlier nights. Fixing
either value alone turns the moving threshold off and leaves 128 KiB: every larger block then
faults (DenseNet 50 -> 120 ms).

Giving back: loading a model briefly holds several copies of its weights (file bytes, protobuf,
arrays, folded weights); ``release_free_memory`` trims the heap after creation, whatever the
thresholds, so the process does not stay as large as that peak.

Both are glibc-only; elsewhere they do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Any

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
ARENA_MMAP_THRESHOLD = 32 << 20
ARENA_TRIM_THRESHOLD = 256 << 20


@functools.cache
def _libc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt, libc.gnu_get_libc_version  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's thresholds for reuse (see above), once per process; False where this is not
    glibc or it refused."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, ARENA_MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, ARENA_TRIM_THRESHOLD)
    )
