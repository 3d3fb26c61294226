"""reshaped_view: a reshape that never copies."""

from __future__ import annotations

import numpy as np

from onnxpy.ops._compat import reshaped_view


def test_a_view_where_the_memory_allows_it_and_none_where_it_would_copy() -> None:
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    v = reshaped_view(a, (6, 4))
    assert v is not None and v.shape == (6, 4) and np.shares_memory(v, a)
    v[0, 0] = -1
    assert a[0, 0, 0] == -1  # the same memory, not a copy
    assert reshaped_view(a.transpose(0, 2, 1), (2, 12)) is None  # would need a copy
    band = np.zeros((1, 4, 10, 6), np.float32)[:, :, 2:5]  # rows of an NCHW map: (4, 3 * 6) merges
    assert reshaped_view(band, (1, 4, 18)) is not None
    assert reshaped_view(band, (1, 72)) is None
