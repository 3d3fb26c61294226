"""The copy from channels-last memory to NCHW (ops/_layout.py) and the BLAS transpose under it
(ops/_blas.transpose_into)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxpy.ops import _blas
from onnxpy.ops._layout import is_channels_last, nchw_copy

needs_blas = pytest.mark.skipif(
    _blas.openblas_library() is None, reason="numpy here bundles no OpenBLAS that _blas can find (another numpy build)"
)


@needs_blas
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 6), (6, 1), (5, 7), (136, 784)])
def test_transpose_into_writes_the_transpose_and_nothing_else(dtype: type, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    rows, cols = shape
    src = rng.standard_normal((rows, cols + 3)).astype(dtype)[:, :cols]  # rows with a stride
    wide = rng.standard_normal((cols, rows + 2)).astype(dtype)
    before = wide.copy()
    dst = wide[:, :rows]
    assert _blas.transpose_into(src, dst)
    np.testing.assert_array_equal(dst, src.T)
    np.testing.assert_array_equal(wide[:, rows:], before[:, rows:])


@pytest.mark.parametrize(
    "src,dst",
    [
        (np.zeros((3, 4), np.float16), np.zeros((4, 3), np.float16)),  # no BLAS routine
        (np.zeros((3, 8), np.float32)[:, ::2], np.zeros((4, 3), np.float32)),  # strided columns
        (np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32)),  # not the transposed shape
        (np.zeros((3, 4), np.float32), np.zeros((4, 3), np.float64)),  # dtypes differ
    ],
)
def test_transpose_into_declines_what_it_cannot_do(src: np.ndarray, dst: np.ndarray) -> None:
    before = dst.copy()
    assert not _blas.transpose_into(src, dst)
    np.testing.assert_array_equal(dst, before)


def test_transpose_into_declines_overlapping_arrays() -> None:
    same = np.arange(16, dtype=np.float32).reshape(4, 4)
    before = same.copy()
    assert not _blas.transpose_into(same, same)
    np.testing.assert_array_equal(same, before)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_nchw_copy_of_a_channels_last_array(dtype: type) -> None:
    rng = np.random.default_rng(4)
    want = rng.standard_normal((2, 5, 3, 4)).astype(dtype)
    x = np.ascontiguousarray(want.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    assert is_channels_last(x)
    got = nchw_copy(x)
    assert got.flags.c_contiguous and got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "group,kernel,pads",
    [(4, 1, [0, 0, 0, 0]), (1, 3, [1, 1, 1, 1]), (2, 3, [0, 1, 1, 0]), (1, 1, [1, 1, 1, 1])],
)
def test_convolutions_of_channels_last_inputs_match_nchw_ones(group: int, kernel: int, pads: list[int]) -> None:
    """Paths that read NCHW copy a channels-last input first (conv._conv_dispatch)."""
    from onnxpy.ops.conv import conv_nd

    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 8, 6, 5)).astype(np.float32)
    w = rng.standard_normal((12, 8 // group, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(12).astype(np.float32)
    x_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    assert is_channels_last(x_last)
    want = conv_nd(np, x, w, b, group=group, pads=pads)
    got = conv_nd(np, x_last, w, b, group=group, pads=pads)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
@pytest.mark.parametrize("kernel", [1, 3])
def test_shuffled_convolution_equals_the_convolution_then_the_shuffle(bias: bool, layout: str, kernel: int) -> None:
    """shuffle_groups g: output channel a * M/g + j lands at j * g + a, bias included."""
    from onnxpy.ops.conv import conv_nd

    rng = np.random.default_rng(12)
    g = 4
    x = rng.standard_normal((1, 8, 5, 6)).astype(np.float32)
    w = rng.standard_normal((12, 2, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(12).astype(np.float32) if bias else None
    pads = [kernel // 2] * 4
    plain = conv_nd(np, x, w, b, group=4, pads=pads)
    want = plain.reshape(1, g, 3, 5, 6).transpose(0, 2, 1, 3, 4).reshape(1, 12, 5, 6)
    if layout == "channels-last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    got = conv_nd(np, x, w, b, group=4, pads=pads, shuffle_groups=g)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
