"""max(x, scalar) and min(max(x, lo), hi) on numpy through the clip ufunc.

numpy's ``maximum`` against a scalar runs a slow loop: for float32 about 0.45 ns a value where
its ``clip`` ufunc with scalar bounds runs vectorized at about 0.15 (numpy 2.4; 106,624 float32
values in place: 46 us against 14; float64 74 against 39). Every ReLU of a convolution's output
goes through here, so this is several percent of a CNN. float16 is the other way round (clip
3x slower), so it, integers and other array types keep ``maximum``. Both propagate NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._compat import numpy_core

# The ufunc itself (np.clip's Python wrapper costs about 2 us a call).
np_clip = numpy_core("umath").clip
# Upper bound per dtype that takes the clip path; below _SMALL values maximum's lower call
# overhead wins (about 0.8 against 1.4 us).
_CLIPPED = {np.dtype(np.float32): np.float32(np.inf), np.dtype(np.float64): np.float64(np.inf)}
_SMALL = 4096
# Zero as a 0-d array per dtype: numpy converts a Python scalar operand on every call, which
# on a small array costs more than the maximum itself (1x128 float32 in place: 0.77 -> 0.42 us;
# a batch-1 classifier head's ReLU).
_ZEROS = {np.dtype(t): np.zeros((), t) for t in (np.float32, np.float64)}
for _zero in _ZEROS.values():
    _zero.flags.writeable = False  # shared by every call: nothing may write into it


def floor_at(xp: Any, x: Any, floor: float, out: Any = None) -> Any:
    """Elementwise max(x, floor) for a scalar ``floor``, into ``out`` when given (may be x)."""
    if xp is np:
        if x.size >= _SMALL:
            top = _CLIPPED.get(x.dtype)
            if top is not None:
                return np_clip(x, floor, top, out=out)
        elif floor == 0:
            zero = _ZEROS.get(x.dtype)
            if zero is not None:
                return np.maximum(x, zero, out=out)
    return xp.maximum(x, floor, out=out)


def clamp(xp: Any, x: Any, lo: Any, hi: Any) -> Any:
    """min(max(x, lo), hi) in a fresh array (x itself without bounds) for scalars ``lo`` and ``hi``, either
    None for no bound (so hi wins where lo > hi, as ONNX's Clip says). One clip pass on numpy
    floats instead of two slow scalar passes (106,624 float32 values: 14 against 90 us)."""
    if xp is np and x.size >= _SMALL and (lo is not None or hi is not None):
        top = _CLIPPED.get(x.dtype)
        if top is not None:
            return np_clip(x, -top if lo is None else lo, top if hi is None else hi)
    if lo is not None:
        x = xp.maximum(x, lo)
    if hi is not None:
        x = xp.minimum(x, hi)
    return x
