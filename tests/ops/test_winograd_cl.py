"""Channels-last Winograd (ops/_winograd_cl.py) against a direct convolution: tile sizes, pads,
batches, input layouts, bands, results written into a caller's buffer, and its choice."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from onnxpy.ops import _scratch
from onnxpy.ops import _winograd_cl as winograd_cl
from onnxpy.ops import conv as conv_mod
from tests.ops.test_conv import assert_conv_close, reference_conv, term_scale


@pytest.fixture
def cl_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Every layer runs channels-last (whatever its tile count); records (N, C, M) per call."""
    calls: list[tuple[int, ...]] = []
    original = winograd_cl.winograd_channels_last

    def counted(x: np.ndarray, u_cl: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        calls.append((x.shape[0], x.shape[1], u_cl.shape[2]))
        return original(x, u_cl, *args, **kwargs)

    monkeypatch.setattr(winograd_cl, "_MIN_TILES", 1)
    monkeypatch.setattr(winograd_cl, "_MAX_TILES", 10**9)
    monkeypatch.setattr(winograd_cl, "winograd_channels_last", counted)
    return calls


CASES = [
    # name, x shape, w shape, pads (F(4x4) from 64 channels on maps of 48x48 and more, or from
    # 128 channels on 27x27 and more; F(2x2) below from 192 channels)
    ("f4_square", (1, 64, 56, 56), (64, 64, 3, 3), [1, 1, 1, 1]),
    ("f4_odd_asymmetric", (1, 128, 29, 27), (136, 128, 3, 3), [0, 1, 2, 0]),
    ("f4_batch", (2, 128, 27, 28), (96, 128, 3, 3), [1, 1, 1, 1]),
    ("f2_cropped", (1, 256, 13, 15), (256, 256, 3, 3), [1, 1, 1, 1]),
    ("f2_unpadded", (1, 384, 11, 9), (192, 384, 3, 3), [0, 0, 0, 0]),
]


@pytest.mark.parametrize("name,xs,ws,pads", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_matches_a_direct_convolution(
    cl_calls: list[tuple[int, ...]], name: str, xs: tuple, ws: tuple, pads: list[int], bias: bool
) -> None:
    rng = np.random.default_rng(len(name) + 7 * bias)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    got = conv_mod.conv_nd(np, x, w, b, pads=pads)
    assert cl_calls == [(xs[0], xs[1], ws[0])]
    assert got.dtype == np.float32 and got.flags.c_contiguous
    args = ([1, 1], pads, [1, 1], 1)
    assert_conv_close(got, reference_conv(x, w, b, *args), term_scale(x, w, b, *args))


def test_reads_a_channels_last_input_as_it_is(cl_calls: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 64, 48, 50)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    cl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # same values, NHWC memory
    want = conv_mod.conv_nd(np, x, w, b, pads=[1, 1, 1, 1])
    got = conv_mod.conv_nd(np, cl, w, b, pads=[1, 1, 1, 1])
    assert len(cl_calls) == 2
    np.testing.assert_array_equal(got, want)


def test_float64_keeps_its_precision(cl_calls: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 64, 48, 48))
    w = rng.standard_normal((64, 64, 3, 3))
    got = conv_mod.conv_nd(np, x, w, None, pads=[1, 1, 1, 1])
    assert cl_calls and got.dtype == np.float64
    want = reference_conv(x, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def test_writes_into_a_channel_slice(cl_calls: list[tuple[int, ...]]) -> None:
    # ConcatConv hands each member its channels of the concatenated result.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 128, 27, 27)).astype(np.float32)
    w = rng.standard_normal((96, 128, 3, 3)).astype(np.float32)
    b = rng.standard_normal(96).astype(np.float32)
    whole = np.full((1, 160, 27, 27), -7.0, dtype=np.float32)
    part = whole[:, 32:128]
    got = conv_mod.conv_nd(np, x, w, b, pads=[1, 1, 1, 1], into=part)
    assert cl_calls and np.shares_memory(got, whole)
    want = reference_conv(x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], 1)
    assert_conv_close(whole[:, 32:128], want, term_scale(x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], 1))
    assert np.all(whole[:, :32] == -7.0) and np.all(whole[:, 128:] == -7.0)


def test_bands_of_tile_rows_give_the_same_result(
    cl_calls: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 128, 29, 27)).astype(np.float32)
    w = rng.standard_normal((128, 128, 3, 3)).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)
    whole = conv_mod.conv_nd(np, x, w, b, pads=[1, 1, 1, 1])
    bands: list[int] = []
    band = winograd_cl._band

    def counted(xcl: np.ndarray, *args: Any) -> None:
        bands.append(args[-1].shape[0])
        band(xcl, *args)

    monkeypatch.setattr(winograd_cl, "_BAND_BYTES", 100_000)  # one or two tile rows a band
    monkeypatch.setattr(winograd_cl, "_band", counted)
    banded = conv_mod.conv_nd(np, x, w, b, pads=[1, 1, 1, 1])
    assert len(bands) > 2 and sum(bands) == 4 * 8, bands  # 8 tile rows of 4 cover 29 rows
    np.testing.assert_allclose(banded, whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())


def test_results_survive_the_next_call(cl_calls: list[tuple[int, ...]]) -> None:
    # Its temporaries are reused per-thread buffers (ops/_scratch.py): no result may live in one.
    rng = np.random.default_rng(5)
    w = rng.standard_normal((128, 128, 3, 3)).astype(np.float32)
    x1, x2 = (rng.standard_normal((1, 128, 56, 56)).astype(np.float32) for _ in range(2))
    _scratch.release()
    y1 = conv_mod.conv_nd(np, x1, w, pads=[1, 1, 1, 1])
    assert _scratch.held_bytes() >= _scratch.MIN_BYTES  # the transformed tiles (3.6 MB) were scratch
    kept = y1.copy()
    y2 = conv_mod.conv_nd(np, x2, w, pads=[1, 1, 1, 1])
    assert len(cl_calls) == 2 and not np.shares_memory(y1, y2)
    np.testing.assert_array_equal(y1, kept)


def test_constant_weights_are_transformed_once() -> None:
    rng = np.random.default_rng(6)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    w.flags.writeable = False
    built: list[int] = []

    def transform() -> np.ndarray:
        built.append(1)
        return conv_mod._transform_weights(np, w, 4)

    first = winograd_cl.transformed_weights_cl(transform, w, 4)
    again = winograd_cl.transformed_weights_cl(transform, w, 4)
    assert again is first and len(built) == 1 and first.shape == (36, 64, 64)
    writable = w.copy()  # a weight fed at run time: derived afresh each call
    assert winograd_cl.transformed_weights_cl(
        lambda: conv_mod._transform_weights(np, writable, 4), writable, 4
    ) is not (winograd_cl.transformed_weights_cl(lambda: conv_mod._transform_weights(np, writable, 4), writable, 4))


def test_tile_counts_choose_the_layout() -> None:
    assert winograd_cl.pays([56, 56], 4)  # ResNet-50: 196 tiles
    assert winograd_cl.pays([28, 28], 4) and winograd_cl.pays([14, 14], 2)  # 49 tiles
    assert not winograd_cl.pays([7, 7], 2)  # 16 tiles: the NCHW path's GEMM orientation
    assert winograd_cl.pays([112, 112], 4)  # 784 tiles: VGG's 112x112 layers
    assert not winograd_cl.pays([224, 224], 4)  # 3136 tiles: the copies cost more (VGG)
