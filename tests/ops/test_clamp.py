"""floor_at (ops/_clamp.py): max(x, scalar) through numpy's clip ufunc where that is faster."""

from __future__ import annotations

import numpy as np
import pytest

from onnxpy.ops._clamp import _SMALL, clamp, floor_at


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int8])
@pytest.mark.parametrize("size", [7, _SMALL, 3 * _SMALL + 5])
@pytest.mark.parametrize("floor", [0, -0.5, 2])
def test_floor_at_matches_maximum(dtype: type, size: int, floor: float) -> None:
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 4).astype(dtype)
    if np.issubdtype(dtype, np.integer) and floor != int(floor):
        floor = int(floor)
    want = np.maximum(x, np.asarray(floor).astype(dtype))
    got = floor_at(np, x, floor)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)
    assert got is not x
    inplace = x.copy()
    assert floor_at(np, inplace, floor, out=inplace) is inplace
    np.testing.assert_array_equal(inplace, want)


@pytest.mark.parametrize("size", [5, 2 * _SMALL])
def test_floor_at_propagates_nan_and_keeps_infinities(size: int) -> None:
    x = np.resize(np.array([np.nan, -np.inf, np.inf, -3.0, 3.0], dtype=np.float32), size)
    got = floor_at(np, x, 0)
    assert np.isnan(got[0]) and got[1] == 0 and got[2] == np.inf and got[3] == 0 and got[4] == 3


def test_floor_at_on_strided_views() -> None:
    """A channels-last result seen as NCHW, and a cropped view: written in place, rest untouched."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((1, 28, 30, 64)).astype(np.float32)
    view = base.transpose(0, 3, 1, 2)[:, :, :, :28]
    want = base.copy()
    want[:, :, :28, :] = np.maximum(want[:, :, :28, :], 0)
    floor_at(np, view, 0, out=view)
    np.testing.assert_array_equal(base, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
@pytest.mark.parametrize("size", [7, 2 * _SMALL])
@pytest.mark.parametrize("bounds", [(-0.5, 0.75), (1.0, -1.0), (None, 0.25), (-0.25, None), (None, None)])
def test_clamp_matches_raising_to_lo_then_lowering_to_hi(dtype: type, size: int, bounds: tuple) -> None:
    """ONNX's Clip order: hi wins where lo > hi; a missing bound is no bound; NaN stays NaN."""
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 3).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        x[::97] = np.nan
    lo, hi = (None if v is None else np.asarray(v * (4 if dtype == np.int32 else 1)).astype(dtype) for v in bounds)
    want = x.copy()
    if lo is not None:
        want = np.maximum(want, lo)
    if hi is not None:
        want = np.minimum(want, hi)
    got = clamp(np, x, lo, hi)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("layout", ["nchw", "channels-last", "2-D"])
def test_channel_max_raises_each_channel_to_its_floor(dtype: type, layout: str) -> None:
    """ChannelMax (ops/fused.py) broadcasts the floor into its result first; same values as
    numpy's broadcast maximum, NaN kept, in any memory layout."""
    from onnxpy.ops.fused import channel_max

    rng = np.random.default_rng(13)
    shape = (2, 5) if layout == "2-D" else (2, 5, 4, 3)
    x = rng.standard_normal(shape).astype(dtype)
    x.flat[::7] = np.nan
    if layout == "channels-last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    floor = rng.standard_normal(5).astype(dtype)
    want = np.maximum(x, floor.reshape((1, 5) + (1,) * (x.ndim - 2)))
    got = channel_max(np, x, floor)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("path", ["blocks-of-channels", "one-clip"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_channel_max_large_map_paths_match_the_broadcast_maximum(
    dtype: type, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large maps run a block of channels at a time, or on planes of 3,000 values and more one
    clip against per-channel bounds (ops/fused.py): the broadcast maximum's values, every block
    (the short last one too) and each image of a batch with its own floors, NaN kept."""
    from onnxpy.ops import fused

    rng = np.random.default_rng(14)
    shape = (2, 5, 4, 3) if path == "blocks-of-channels" else (2, 3, 60, 55)
    x = rng.standard_normal(shape).astype(dtype)
    x.flat[::11] = np.nan
    floor = rng.standard_normal(shape[1]).astype(dtype)
    want = np.maximum(x, floor.reshape(1, -1, 1, 1))
    calls = []
    if path == "blocks-of-channels":
        blocked = fused._channel_max_blocked
        monkeypatch.setattr(fused, "_channel_max_blocked", lambda *a: calls.append(1) or blocked(*a))
        monkeypatch.setattr(fused, "_CHANNEL_MAX_BLOCKED_BYTES", 0)
        monkeypatch.setattr(fused, "_CHANNEL_MAX_BLOCK_BYTES", 2 * 12 * x.itemsize)  # 2 channels: 2, 2, 1
    else:
        clip = np.clip
        monkeypatch.setattr(np, "clip", lambda *a, **k: calls.append(1) or clip(*a, **k))
    got = fused.channel_max(np, x, floor)
    assert calls, f"the {path} path did not run"
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(got, want)
