"""Give memory freed during session creation back to the operating system.

Loading a model briefly holds several copies of its weights (file bytes, protobuf, arrays,
folded weights). glibc keeps freed heap pages for reuse, so without a trim the process
stays as large as that peak. malloc_trim is glibc-only; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _malloc_trim() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
