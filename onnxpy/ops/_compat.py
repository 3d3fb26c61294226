"""Small helpers shared by kernels; the only place that papers over numpy / CuPy differences."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np


def numpy_core(name: str) -> Any:
    """numpy's internal module ``name`` (``multiarray``, ``umath``), for the C functions
    without their Python wrappers. Imported by its full name: ``numpy._core`` does not hold its
    submodules as attributes until they are imported."""
    return importlib.import_module(f"numpy._core.{name}")


def reshaped_view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` reshaped to ``shape`` as a view of the same memory, or None where that would need
    a copy (setting ``.shape`` did this until numpy 2.5 deprecated it)."""
    try:
        return np.reshape(a, shape, copy=False)
    except ValueError:
        return None


def broadcasts_into(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    """Whether an array of shape ``small`` broadcasts to ``big`` without growing it: each of its
    axes, aligned from the right, is 1 or big's. Plain Python: np.broadcast_shapes takes about
    5 us a call, most of an elementwise step on a small tensor when asked each run."""
    offset = len(big) - len(small)
    if offset < 0:
        return False
    for i, d in enumerate(small):
        if d != 1 and d != big[offset + i]:
            return False
    return True


def host_ints(x: Any) -> list[int]:
    """A 0-d or 1-d integer tensor (shape, axes, pads...) as a Python list of ints."""
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [int(v) for v in x]
    arr = x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)
    return [int(v) for v in arr.reshape(-1).tolist()]


def host_scalar(x: Any) -> Any:
    """A one-element tensor as a Python number."""
    arr = x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)
    if arr.size != 1:
        raise ValueError(f"expected a single value, got shape {list(arr.shape)}")
    return arr.reshape(-1)[0].item()


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1) and not (rank == 0 and axis in (0, -1)):
        raise ValueError(f"{what} {axis} is out of range for a tensor of rank {rank} (expected [{-rank}, {rank - 1}])")
    return axis + rank if axis < 0 else axis


def require_rank(x: Any, least: int, what: str) -> None:
    """Refuse an input of rank below ``least`` with a message giving the rank, where a kernel
    would otherwise fail inside numpy or quietly treat a scalar as a row."""
    if x.ndim < least:
        raise ValueError(f"{what}: input must have rank >= {least}, got rank {x.ndim} (shape {list(x.shape)})")


def normalize_axes(axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    out = [normalize_axis(int(a), rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise ValueError(f"{what} {list(axes)} repeat an axis")
    return out


def _half_of_memory() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


# The budget when a kernel runs outside a session (constant folding at creation, tests).
DEFAULT_MAX_ALLOC_BYTES = _half_of_memory()


def alloc_budget(ctx: Any) -> int:
    budget = getattr(getattr(ctx, "session", None), "max_alloc_bytes", None)
    return DEFAULT_MAX_ALLOC_BYTES if budget is None else int(budget)


def check_alloc(shape: Sequence[int], dtype: Any, ctx: Any, what: str) -> None:
    """Refuse an allocation whose size comes from data when it is negative or over the session budget.

    Python integers do not overflow, so a product of huge dimensions is simply over budget.
    """
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise ValueError(f"{what}: shape {dims} has a negative dimension")
    count = 1
    for d in dims:
        count *= d
    itemsize = np.dtype(dtype).itemsize
    nbytes = count * max(itemsize, 1)
    budget = alloc_budget(ctx)
    if nbytes > budget:
        raise MemoryError(
            f"{what}: shape {dims} of {np.dtype(dtype)} needs {nbytes} bytes, over the session's allocation "
            f"budget of {budget} bytes (session config 'session.max_allocation_bytes')"
        )


def same_dtype_scalar(xp: Any, value: Any, like: Any) -> Any:
    return xp.asarray(value, dtype=like.dtype)


def _quiet_state() -> tuple[Any, Any] | None:
    """numpy's floating-point error state context variable and the value that ignores every
    error (what ``np.errstate(all="ignore")`` sets), or None where this numpy keeps them
    elsewhere."""
    try:
        config = numpy_core("_ufunc_config")
        return config._extobj_contextvar, config._make_extobj(all="ignore")
    except (ImportError, AttributeError, TypeError):
        return None


_QUIET = _quiet_state()


class quiet_floats:  # noqa: N801 - used like np.errstate
    """``np.errstate(all="ignore")`` without rebuilding numpy's error state object on every
    entry: the state is made once and the context variable set directly (about 1.0 -> 0.3 us,
    once per run). Made at import, the state keeps the ufunc buffer size of that moment (a
    later ``np.setbufsize`` does not reach runs). Falls back to np.errstate on a numpy
    without that variable."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        if _QUIET is None:
            self._token = np.errstate(all="ignore")
            self._token.__enter__()
        else:
            self._token = _QUIET[0].set(_QUIET[1])

    def __exit__(self, *exc: object) -> None:
        if _QUIET is None:
            self._token.__exit__(*exc)
        else:
            _QUIET[0].reset(self._token)
