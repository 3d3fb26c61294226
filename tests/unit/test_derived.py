"""onnxpy/ops/_derived.py: forms derived from constant weights are built once per constant,
rebuilt for writable (run-time) weights, and dropped with their source."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np

from onnxpy.ops import _derived


def _counting_build(calls: list[int], source: Any) -> Any:
    def build() -> Any:
        calls.append(1)
        return source.sum()

    return build


def test_read_only_sources_are_built_once_and_dropped_when_freed() -> None:
    w = np.arange(6.0)
    w.flags.writeable = False
    calls: list[int] = []
    assert _derived.derived((w,), ("t",), _counting_build(calls, w)) == 15
    assert _derived.derived((w,), ("t",), _counting_build(calls, w)) == 15
    assert len(calls) == 1
    assert _derived.derived((w,), ("other tag",), _counting_build(calls, w)) == 15
    assert len(calls) == 2
    keys = [k for k, (refs, _) in _derived._CACHE.items() if refs[0]() is w]
    assert len(keys) == 2
    del w
    gc.collect()
    assert not any(k in _derived._CACHE for k in keys)  # both entries went with their source


def test_writable_sources_and_sources_without_the_flag_are_rebuilt() -> None:
    w = np.arange(3.0)
    calls: list[int] = []
    _derived.derived((w,), ("t",), _counting_build(calls, w))
    w[0] = 10  # a run-time weight may change between calls
    assert _derived.derived((w,), ("t",), _counting_build(calls, w)) == 13
    assert len(calls) == 2

    class DeviceArray:  # like CuPy: flags without 'writeable'
        class flags:  # noqa: N801 - mimics the attribute
            c_contiguous = True

        def sum(self) -> int:
            return 7

    d = DeviceArray()
    _derived.derived((d,), ("t",), _counting_build(calls, d))
    _derived.derived((d,), ("t",), _counting_build(calls, d))
    assert len(calls) == 4


def test_all_sources_must_be_read_only() -> None:
    w, b = np.ones(2), np.ones(2)
    w.flags.writeable = False  # b stays writable
    calls: list[int] = []
    for _ in range(2):
        _derived.derived((w, b), ("pair",), _counting_build(calls, w))
    assert len(calls) == 2


def test_in_dtype_converts_a_constant_once_and_a_writable_value_every_time() -> None:
    from onnxpy.ops._derived import in_dtype

    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    w.flags.writeable = False
    first = in_dtype(w, np.dtype(np.float32))
    assert first.dtype == np.float32 and not first.flags.writeable
    assert in_dtype(w, np.dtype(np.float32)) is first  # kernels' own caches key on this identity
    np.testing.assert_array_equal(first, w.astype(np.float32))
    fed = np.arange(6, dtype=np.float16)
    a, b = in_dtype(fed, np.dtype(np.float32)), in_dtype(fed, np.dtype(np.float32))
    assert a is not b and a.flags.writeable
    assert in_dtype(first, np.dtype(np.float32)) is first
