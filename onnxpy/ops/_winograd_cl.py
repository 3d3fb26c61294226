"""Winograd F(m x m, 3x3) convolution computed in channels-last memory, on the CPU.

``conv.py``'s Winograd works in NCHW: gathering the (t x t) input tiles reads every value at a
stride of r floats, and scattering the (r x r) output tiles writes runs of r floats, so both
copies run numpy's element-by-element loops (ResNet-50's 64-channel 56x56 layer: 0.23 ms to
gather and 0.35 ms to scatter, against 0.55 ms for all the GEMMs). In channels-last memory
(H, W, C) every tile element of every channel is one contiguous run of C values, so both copies
move whole runs, and the per-frequency GEMMs become (tiles x C) @ (C x M).

The NCHW input is copied once into a zero-bordered channels-last buffer; a channels-last input
(a depthwise or channels-last convolution's result) is copied without a transpose. The result
goes back to NCHW through OpenBLAS's blocked transpose.

In ResNet-50's run (profiled, two runs each): 128x28x28 F(4x4) 1.51-1.76 -> 1.22-1.46 ms,
64x56x56 1.86-1.99 -> 1.72-1.88, 256x14x14 F(2x2) 1.48-1.52 -> 1.33-1.38; the model 5% faster.
With few tiles (a 7x7 map: 16 tiles of F(2x2)) the (tiles x C) GEMMs are slower than the NCHW
path's (M x C) @ (C x tiles); on VGG's 224x224 maps the copies to and from channels-last cost
more than the path saves. ``pays`` keeps both on the NCHW path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._blas import padded_rows, stacked_matmul, transpose_into
from ._compat import reshaped_view
from ._derived import derived
from ._scratch import scratch
from ._spatial import strided_view

# Tiles per image for which this path runs: below, the NCHW path's GEMM orientation wins (see
# the module docstring); above, on VGG's 224x224 maps, the copies to and from channels-last (9.6
# and 2.3 ms for the 64-channel 224x224 layer) cost more than it saves. VGG's 112x112 layers
# (784 tiles) gain: VGG-19 -3.7% on a Sapphire Rapids Xeon (0 of 42-51 alternating pairs
# slower, its 128-channel 112x112 layers 15.4 -> 12.8 ms; alone after a 32 MB pass, 32 to 128
# channels 2-21% faster), within noise on the EPYC where the limit was 196 before.
_MIN_TILES = 49
_MAX_TILES = 784

# Transformed-tile bytes per band of tile rows: big layers (VGG's 224x224) run in bands so the
# tiles, their transform and the products stay within a few MB.
_BAND_BYTES = 8 << 20


def tile_grid(out: list[int], r: int) -> tuple[int, int, int, int, int]:
    """For F(r x r, 3x3) over an output of size ``out``: the input tile size t, the tile rows and
    columns, and the padded input's rows and columns that they read."""
    th, tw = -(-out[0] // r), -(-out[1] // r)
    return r + 2, th, tw, r * th + 2, r * tw + 2


def pays(out: list[int], r: int) -> bool:
    """Whether a Winograd layer with this output size and tile size runs channels-last."""
    _, th, tw, _, _ = tile_grid(out, r)
    return _MIN_TILES <= th * tw <= _MAX_TILES


def transformed_weights_cl(u: Any, w: Any, r: int) -> np.ndarray:
    """The (t*t, C, M) transposed form of the (t*t, M, C) transformed weights ``u()``; cached
    for read-only ``w``."""
    return derived((w,), ("winograd-cl", r), lambda: np.ascontiguousarray(u().transpose(0, 2, 1)))


def winograd_channels_last(
    x: np.ndarray,
    u_cl: np.ndarray,
    matrices: tuple[np.ndarray, np.ndarray],
    r: int,
    begin: list[int],
    out: list[int],
    bias: np.ndarray | None,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """3x3 stride-1 convolution of ``x`` (N, C, H, W), any layout, by Winograd F(r x r, 3x3):
    ``u_cl`` the (t*t, C, M) transformed weights, ``matrices`` the input and output transforms
    as Kronecker matrices (t*t, t*t) and (r*r, t*t) in x's dtype. Returns (N, M, *out) in NCHW memory,
    ``into`` when given."""
    n, c = x.shape[:2]
    m = u_cl.shape[2]
    oh, ow = out
    t, th, tw, hp, wp = tile_grid(out, r)
    kin, kout = matrices
    y = np.empty((n, m, oh, ow), dtype=x.dtype) if into is None else into
    for i in range(n):
        xcl = _bordered(x[i], begin, (hp, wp))
        ocl = scratch("winograd-cl-out", (r * th, r * tw, m), x.dtype)
        per_row = t * t * tw * max(c, m) * x.itemsize
        rows = max(1, min(th, _BAND_BYTES // per_row))
        for a0 in range(0, th, rows):
            a1 = min(th, a0 + rows)
            _band(xcl[r * a0 : r * a1 + 2], u_cl, kin, kout, r, bias, ocl[r * a0 : r * a1])
        _to_nchw(ocl[:oh, :ow], y[i])
    return y


def _bordered(x: np.ndarray, begin: list[int], size: tuple[int, int]) -> np.ndarray:
    """One image ``x`` (C, H, W), any layout, copied channels-last into a zero-bordered
    (rows, cols, C) scratch buffer at offset ``begin``."""
    c, h, wd = x.shape
    rows, cols = size
    r0, q0 = begin
    r1, q1 = min(rows, r0 + h), min(cols, q0 + wd)
    p = scratch("winograd-cl-in", (rows, cols, c), x.dtype)
    p[:r0] = 0
    p[r1:] = 0
    p[r0:r1, :q0] = 0
    p[r0:r1, q1:] = 0
    # numpy's transposing copy: as fast as OpenBLAS's blocked transpose plus a copy on these
    # maps (64x56x56 85 against 74-90 us, 256x14x14 24 against 26-44).
    p[r0:r1, q0:q1] = x[:, : r1 - r0, : q1 - q0].transpose(1, 2, 0)
    return p


def _band(
    xcl: np.ndarray,
    u_cl: np.ndarray,
    kin: np.ndarray,
    kout: np.ndarray,
    r: int,
    bias: np.ndarray | None,
    dst: np.ndarray,
) -> None:
    """Winograd over the padded channels-last rows ``xcl`` (r*a + 2, Wp, C) into ``dst``
    (r*a, r*b, M), channels-last."""
    rows_p, wp, c = xcl.shape
    m = u_cl.shape[2]
    t = r + 2
    th, tw = (rows_p - 2) // r, (wp - 2) // r
    count = th * tw
    dt = xcl.dtype
    s0, s1, s2 = xcl.strides
    # tiles[i, j, a, b, :] = xcl[r*a + i, r*b + j, :]: runs of C values.
    tiles = scratch("winograd-cl-tiles", (t, t, th, tw, c), dt)
    tiles[...] = strided_view(xcl, (t, t, th, tw, c), (s0, s1, r * s0, r * s1, s2))
    # Per frequency a (tiles x C) @ (C x M) product; with few tiles they are padded with rows of
    # zeros where that lets OpenBLAS run the stack on both threads (_blas.padded_rows).
    rows = padded_rows(t * t, count, c, m, dt)
    v = scratch("winograd-cl-v", (t * t, rows, c), dt)
    v[:, count:] = 0  # rows whose products are ignored, but not left as stale bits (denormals)
    np.matmul(kin, tiles.reshape(t * t, count * c), out=v[:, :count].reshape(t * t, count * c))
    prod = stacked_matmul(np, v, u_cl, out=scratch("winograd-cl-prod", (t * t, rows, m), dt), many=True)
    y = np.matmul(kout, prod[:, :count].reshape(t * t, count * m), out=scratch("winograd-cl-y", (r * r, count * m), dt))
    # y[i, j, a, b, :] is output position (r*a + i, r*b + j): runs of M values.
    spots = dst.reshape(th, r, tw, r, m).transpose(1, 3, 0, 2, 4)
    if bias is None:
        np.copyto(spots, y.reshape(r, r, th, tw, m))
    else:
        np.add(y.reshape(r, r, th, tw, m), bias, out=spots)


def _to_nchw(ocl: np.ndarray, dst: np.ndarray) -> None:
    """The channels-last (H, W, M) result into ``dst`` (M, H, W) through one blocked transpose
    (numpy's copy walks one side value by value); a cropped result is made one run first."""
    oh, ow, m = ocl.shape
    flat = reshaped_view(dst, (m, oh * ow))
    if flat is not None:
        if ocl.strides[0] != ow * ocl.strides[1]:
            ocl = np.ascontiguousarray(ocl)  # runs of ow * M values: a fast copy
        if transpose_into(ocl.reshape(oh * ow, m), flat):
            return
    dst[...] = ocl.transpose(2, 0, 1)
