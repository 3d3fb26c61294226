"""Control of the BLAS thread pool numpy uses (intra_op_num_threads), without extra dependencies.

numpy wheels bundle OpenBLAS under a prefixed symbol name; we look the setter up once through
ctypes. Where no known BLAS is found, the option has no effect (and ``blas_threads_supported``
says so).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator

from ..ops._blas import openblas_library

_SETTERS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)
_lock = threading.Lock()
# The caps of the bodies running now (runs in several threads, each with its own cap): the pool
# is one per process, so it runs at the smallest of them, and at the count it had before the
# first of them once the last ends. (Each body restoring the count it saw on entry left the
# pool capped for good when two overlapped.)
_caps: list[int] = []
_uncapped = 0
_found: tuple[Callable[[int], None], Callable[[], int]] | None | bool = False


def _find() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    global _found
    if _found is not False:
        return _found  # type: ignore[return-value]
    lib = openblas_library()
    result = None
    for set_name, get_name in _SETTERS:
        if lib is not None and hasattr(lib, set_name) and hasattr(lib, get_name):
            setter = getattr(lib, set_name)
            getter = getattr(lib, get_name)
            setter.argtypes = [ctypes.c_int]
            getter.restype = ctypes.c_int
            result = (setter, getter)
            break
    _found = result
    return result


def blas_threads_supported() -> bool:
    return _find() is not None


def get_blas_threads() -> int:
    f = _find()
    return int(f[1]()) if f else 0


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Run the body with the BLAS pool capped at ``n`` threads (0: leave it alone)."""
    f = _find() if n > 0 else None
    if not f:
        yield
        return
    global _uncapped
    with _lock:
        if not _caps:
            _uncapped = int(f[1]())
        _caps.append(int(n))
        f[0](min(_caps))
    try:
        yield
    finally:
        with _lock:
            _caps.remove(int(n))
            f[0](min(_caps) if _caps else _uncapped)


# -- threads parked by onnxpy itself ----------------------------------------------------------
# Worker threads onnxpy keeps alive between tasks (run_async's pool) that wait for work, not
# inside numpy or OpenBLAS: they do not count as running when a fork must know whether it is
# safe (runtime/split). Each is recorded when it starts a task and while it runs one.
_workers_lock = threading.Lock()
_workers: set[int] = set()  # idents of onnxpy's pool threads seen so far
_working: dict[int, int] = {}  # ident -> tasks in progress on it


@contextlib.contextmanager
def pool_task() -> Iterator[None]:
    """Marks the current (pool) thread as working for the duration of one task."""
    me = threading.get_ident()
    with _workers_lock:
        _workers.add(me)
        _working[me] = _working.get(me, 0) + 1
    try:
        yield
    finally:
        with _workers_lock:
            _working[me] -= 1
            if not _working[me]:
                del _working[me]


def other_threads_running() -> int:
    """How many threads of this process besides the caller may be running Python or native
    code now: every live thread except the caller and onnxpy's parked pool threads."""
    alive = {t.ident for t in threading.enumerate()}
    me = threading.get_ident()
    with _workers_lock:
        _workers.intersection_update(alive)  # pool threads that ended
        parked = {w for w in _workers if w not in _working and w != me}
    return len(alive - {me} - parked)
