"""reshaped_view: a reshape that never copies, on every numpy onnxpy supports."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest

from onnxpy.ops import _compat
from onnxpy.ops._compat import reshaped_view


def _old_numpy_reshape(a, shape, **kwargs):  # type: ignore[no-untyped-def]
    """numpy < 2.1's np.reshape, which has no copy keyword."""
    if kwargs:
        raise TypeError("reshape() got an unexpected keyword argument 'copy'")
    return np.asarray(a).reshape(shape)


@pytest.mark.parametrize("old_numpy", [False, True])
def test_a_view_where_the_memory_allows_it_and_none_where_it_would_copy(
    monkeypatch: pytest.MonkeyPatch, old_numpy: bool
) -> None:
    quiet = warnings.catch_warnings() if old_numpy else contextlib.nullcontext()
    with quiet:
        if old_numpy:
            monkeypatch.setattr(_compat.np, "reshape", _old_numpy_reshape)
            # its fallback sets .shape, which numpy >= 2.5 (not the old numpy simulated) deprecates
            warnings.simplefilter("ignore", DeprecationWarning)
        a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        v = reshaped_view(a, (6, 4))
        assert v is not None and v.shape == (6, 4) and np.shares_memory(v, a)
        v[0, 0] = -1
        assert a[0, 0, 0] == -1  # the same memory, not a copy
        assert reshaped_view(a.transpose(0, 2, 1), (2, 12)) is None  # would need a copy
        band = np.zeros((1, 4, 10, 6), np.float32)[:, :, 2:5]  # rows of an NCHW map: (4, 3 * 6) merges
        assert reshaped_view(band, (1, 4, 18)) is not None
        assert reshaped_view(band, (1, 72)) is None
