"""Convolution kernels through BLAS: 1x1 as a plain GEMM, depthwise as shifted multiply-adds
(channels-last on the CPU, ``_depthwise.py``), 3x3 through Winograd where it pays, everything
else as im2col over a strided view followed by one batched GEMM per group."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from . import _winograd_cl as winograd_cl
from ._blas import gemm_accumulate, stacked_matmul
from ._compat import check_alloc
from ._depthwise import depthwise_channels_last, padded_channels_last, tiled_rows
from ._derived import derived, in_dtype
from ._layout import is_channels_last, nchw_copy
from ._scratch import scratch
from ._spatial import geometry, pad_input, strided_view, window_slices, windows_view
from .registry import memoized, op


def compute_dtype(dtype: Any) -> np.dtype:
    """float32 / float64 run as they are; half precision (float16, bfloat16) runs in float32,
    since numpy has no BLAS path for it and accumulating in half precision loses accuracy."""
    dt = np.dtype(dtype)
    if dt == np.float32 or dt == np.float64:
        return dt
    return np.dtype(np.float32)


def conv_nd(
    xp: Any,
    x: Any,
    w: Any,
    b: Any = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
    epilogue: Callable[[Any], Any] | None = None,
    shuffle_groups: int = 0,
    into: Any = None,
    accumulate: bool = False,
    channels_last: bool = False,
    exact: bool = False,
) -> Any:
    """N-D convolution in the compute dtype (see ``compute_dtype``); the caller casts back.

    ``into``, a C-contiguous array of the output's shape and compute dtype, receives the result
    (and is returned): the main paths have BLAS or their last pass write it directly, so a
    concatenation of convolutions needs no copy (``ops/fused.py``, ConcatConv).

    ``shuffle_groups`` g > 0 returns the output channels in ShuffleNet's channel-shuffle order
    (channel a * M/g + j goes to j * g + a); a grouped 1x1 convolution with g groups writes
    its GEMM results straight into that order (``optimizer/passes/fold_shuffle.py``).

    ``epilogue``, an in-place function such as a fused activation, is applied to the result;
    the depthwise path applies it block by block while the output is still in cache.

    ``accumulate``: ``into`` already holds an addend (a residual) and receives addend +
    convolution, added in the GEMM itself (see ``_accumulate``). Returns None, ``into``
    untouched, where that path does not apply or ``into`` does not have the result's shape and
    dtype: the caller then adds the plain result, as a GEMM-less path would cost the same.

    ``channels_last``: return the result as an NCHW-shaped view of channels-last memory where
    the im2col path runs for one image (its GEMM then computes Y^T); for a depthwise reader
    (``optimizer/passes/channels_last_output.py``). Elsewhere ignored: values never change.

    ``exact``: only paths that sum the products themselves (no Winograd, whose F(4x4)
    transforms divide by 6 and 24), so integer-valued operands whose sums stay within the
    dtype's integer range give the exact integer result (ConvInteger, QLinearConv)."""
    # Everything up to the kernel path depends on shapes and attributes only: checked and
    # computed once per node and input shapes (about 8 us of a 1x1 convolution's 17).
    key = (
        None
        if ctx is None
        else (
            x.shape,
            x.dtype,
            w.shape,
            None if b is None else b.shape,
            auto_pad,
            None if dilations is None else tuple(dilations),
            group,
            None if kernel_shape is None else tuple(kernel_shape),
            None if pads is None else tuple(pads),
            None if strides is None else tuple(strides),
            shuffle_groups,
        )
    )
    geo, cdt, live = memoized(
        ctx, key, lambda: _checked_geometry(x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides, ctx)
    )
    if live is not None:
        # Kernel taps that read only padding for every output (a dilation wider than the
        # map) are dropped: the same convolution with a smaller kernel over part of x.
        crop, taps, new_pads = live
        tag = ("live-taps", *((t.start, t.stop) for t in taps))  # slices are unhashable before 3.12
        w_live = derived((w,), tag, lambda: _read_only(xp.ascontiguousarray(w[taps])))
        return conv_nd(
            xp, x[crop], w_live, b, dilations=geo.dilations, group=group, pads=new_pads, strides=geo.strides,
            ctx=ctx, epilogue=epilogue, shuffle_groups=shuffle_groups, into=into, accumulate=accumulate,
            channels_last=channels_last, exact=exact,
        )  # fmt: skip
    x = x.astype(cdt, copy=False)
    w = in_dtype(w, cdt)
    bias = None if b is None else in_dtype(b, cdt)
    begin, _, out, k, strides, dilations, group = geo[:7]
    m = w.shape[0]
    if accumulate:
        # Checked before the buffer's shape: an addend that broadcasts (a per-image or per-
        # channel term, smaller than the result) is added by the caller instead.
        fits = into is not None and into.shape == (x.shape[0], m, *out) and into.dtype == cdt
        if shuffle_groups or not fits or not _accumulate(xp, x, w, bias, geo, into):
            return None  # the caller adds the plain result instead
        if epilogue is not None:
            epilogue(into)
        return into
    if into is not None and (into.shape != (x.shape[0], m, *out) or into.dtype != cdt):
        raise ValueError(
            f"Conv output buffer of shape {list(into.shape)} and {into.dtype} does not match the result "
            f"({[x.shape[0], m, *out]}, {cdt})"
        )
    if shuffle_groups:
        if shuffle_groups < 0 or m % shuffle_groups:
            raise ValueError(f"shuffle_groups {shuffle_groups} must divide the output channels ({m})")
        return _delivered(_conv_shuffled(xp, x, w, bias, geo, shuffle_groups, epilogue), into)
    nd = len(k)
    if (
        xp is np
        and math.prod(out)
        and nd == 2
        and x.shape[1] == group == m
        and w.shape[1] == 1
        and any(kk > 1 for kk in k)
    ):
        # Dilated too (DeepLab's and LR-ASPP's backbones): the padded-width form below would
        # copy every tap's columns, 30 MB for a 5x5 at dilation 2 on 960x14x14 (2.9 ms).
        return _delivered(depthwise_channels_last(x, w, bias, begin, out, strides, epilogue, dilations), into)
    y = _delivered(_conv_dispatch(xp, x, w, bias, geo, into, channels_last and into is None and xp is np, exact), into)
    if epilogue is not None:
        epilogue(y)
    return y


def _accumulate(xp: Any, x: Any, w: Any, b: Any, geo: _Geometry, into: Any) -> bool:
    """``into += conv(x)`` as one GEMM adding into ``into`` (BLAS beta = 1, ``_blas``), the bias
    a row of W against a row of ones, for one image and group 1: 1x1 convolutions of NCHW input
    and those the plain im2col takes. False, ``into`` untouched, for every other case."""
    begin, end, out, k, strides, dilations, group = geo[:7]
    n, c = x.shape[:2]
    m = w.shape[0]
    o = math.prod(out)
    if xp is np and n == 1 and group == 1 and o and not is_channels_last(x):
        cols = None
        if geo.pointwise:
            if b is None:
                if gemm_accumulate(w.reshape(m, c), x.reshape(c, o), into.reshape(m, o)):
                    return True
            else:
                cols = np.empty((c + 1, o), dtype=x.dtype)
                cols[:c] = x.reshape(c, o)
                cols[c] = 1
        elif len(k) == 2 and not _tap_sum_pays(strides, c, m) and not _winograd_tile(k, strides, dilations, c, m, out):
            if _channels_last_columns_pay(out, k, strides):
                columns = _channels_last_columns(x, k, begin, out, strides, dilations, b is not None)
                return gemm_accumulate(_channels_last_weights(w, b, x.dtype), columns.T, into.reshape(m, o))
            view = windows_view(
                xp, pad_input(xp, x, begin, end, out, geo.extent, strides, 0), k, strides, dilations, out
            )
            kk = math.prod(k)
            cols = np.empty((c * kk + (b is not None), o), dtype=x.dtype)
            cols[: c * kk].reshape(c, *k, *out)[...] = view[0].transpose(0, 3, 4, 1, 2)
            if b is not None:
                cols[-1] = 1
        if cols is not None:
            wmat = w.reshape(m, -1) if b is None else _bias_augmented(xp, w, b, x.dtype)
            if gemm_accumulate(wmat, cols, into.reshape(m, o)):
                return True
    return False


def _delivered(y: Any, into: Any) -> Any:
    """``y``, copied into ``into`` unless it is ``into`` already (or there is none)."""
    if into is None or y is into:
        return y
    into[...] = y
    return into


def _checked_geometry(
    x: Any,
    w: Any,
    b: Any,
    auto_pad: str,
    dilations: list[int] | None,
    group: int,
    kernel_shape: list[int] | None,
    pads: list[int] | None,
    strides: list[int] | None,
    ctx: Any,
) -> tuple[_Geometry, np.dtype, Any]:
    """The convolution's checked geometry and compute dtype; raises for invalid shapes or
    attributes, and for outputs over the session's allocation budget."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(
            f"Conv needs X of rank >= 3 and W of the same rank, got X {list(x.shape)} and W {list(w.shape)}"
        )
    nd = x.ndim - 2
    n, c = x.shape[:2]
    m = w.shape[0]
    k = list(w.shape[2:])
    if kernel_shape is not None and list(kernel_shape) != k:
        raise ValueError(f"kernel_shape {kernel_shape} does not match W's spatial shape {k}")
    if group <= 0 or c % group or m % group:
        raise ValueError(f"group {group} must divide the input channels ({c}) and the output channels ({m})")
    cg = c // group
    if w.shape[1] != cg:
        raise ValueError(f"W has {w.shape[1]} input channels per group, X has {c} channels / group {group} = {cg}")
    if b is not None and tuple(b.shape) != (m,):
        raise ValueError(f"Conv bias B must have shape [{m}] (output channels), got {list(b.shape)}")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    begin, end, out = geometry(x.shape[2:], k, strides, dilations, pads, auto_pad)
    # Pads and dilations size the padded copy and the output: check before allocating.
    check_alloc([n, c, *(s + b + e for s, b, e in zip(x.shape[2:], begin, end))], x.dtype, ctx, "Conv (padded input)")
    check_alloc([n, m, *out], x.dtype, ctx, "Conv (output)")
    pointwise = all(kk == 1 for kk in k) and not any(begin) and not any(end) and all(st == 1 for st in strides)
    extent = [(kk - 1) * d + 1 for kk, d in zip(k, dilations)]
    geo = _Geometry(begin, end, out, k, strides, dilations, group, pointwise, extent, None)
    geo = geo._replace(regions=_tap_regions(x.shape[2:], geo, m * cg))
    return geo, compute_dtype(x.dtype), _live_taps(x.shape[2:], geo)


def _live_taps(sizes: tuple[int, ...], geo: _Geometry) -> tuple[tuple[slice, ...], tuple[slice, ...], list[int]] | None:
    """Where some kernel taps read only padding for every output position (DeepLab's ASPP:
    dilation 24 or 36 on a 14x14 map leaves only the centre tap), the convolution without
    them: (slices of X, slices of W, pads). Tap i of an axis reads o * s + i * d - begin for
    output o; the live taps of an axis are one run, since those positions grow with i. None
    where every tap reads the input somewhere (or no output exists)."""
    if not all(geo.out):
        return None
    crop: list[slice] = [slice(None), slice(None)]
    taps: list[slice] = [slice(None), slice(None)]
    begins: list[int] = []
    ends: list[int] = []
    pruned = False
    for size, b, o, kk, s, d in zip(sizes, geo.begin, geo.out, geo.kernel, geo.strides, geo.dilations):
        live = [i for i in range(kk) if i * d - b + (o - 1) * s >= 0 and i * d - b < size]
        if not live:
            return None  # all padding: the plain path makes the zeros (and the bias)
        first, last = live[0], live[-1]
        pruned = pruned or first > 0 or last < kk - 1
        ext = (last - first) * d + 1
        # The pruned kernel starts first * d later: its begin pad shrinks by that much, and
        # where it would go negative the input's start is cropped instead; the end pad is what
        # the same outputs need, the input's unread end cropped where that is negative.
        start = first * d - b
        lo = max(start, 0)
        need_end = start + (o - 1) * s + ext  # one past the last position read
        hi = min(need_end, size)
        crop.append(slice(lo, hi))
        taps.append(slice(first, last + 1))
        begins.append(lo - start)
        ends.append(need_end - hi)
    if not pruned:
        return None
    return tuple(crop), tuple(taps), begins + ends


_REGION_MIN_SAVED = 1 << 22  # multiply-adds


def _tap_regions(
    sizes: tuple[int, ...], geo: _Geometry, channel_pairs: int
) -> tuple[tuple[int, slice, slice, slice, slice], ...] | None:
    """For a 2-D convolution (one group) whose taps read the input for less than half of the
    outputs in all (a dilation near the map's size: DeepLab's ASPP at dilation 12 on 14x14,
    where a corner tap reaches 4 of 196 outputs), each tap's (index, output rows, output
    columns, input rows, input columns) where it reads the input. _conv2d_tap_regions then
    multiplies each tap over its region only, not over zero padding."""
    if len(sizes) != 2 or geo.group != 1 or not all(geo.out):
        return None
    per_axis = []
    for size, b, o, kk, s, d in zip(sizes, geo.begin, geo.out, geo.kernel, geo.strides, geo.dilations):
        spans = []
        for i in range(kk):
            e = i * d - b  # output o reads position o * s + e: inside for o in [lo, hi)
            lo, hi = max(0, -(e // s)), min(o, (size - 1 - e) // s + 1)
            spans.append((lo, max(lo, hi)))
        per_axis.append(spans)
    reached = math.prod(sum(hi - lo for lo, hi in spans) for spans in per_axis)
    full = math.prod(geo.kernel) * math.prod(geo.out)
    # Worth a product per tap only where it saves many multiply-adds (not on tiny maps, where
    # nine small products cost more than the one they replace).
    if 2 * reached > full or (full - reached) * channel_pairs < _REGION_MIN_SAVED:
        return None
    regions = []
    kw = geo.kernel[1]
    for i, (r0, r1) in enumerate(per_axis[0]):
        for j, (c0, c1) in enumerate(per_axis[1]):
            if r1 > r0 and c1 > c0:
                (sh, sw), (dh, dw), (bh, bw) = geo.strides, geo.dilations, geo.begin
                rows_in = slice(r0 * sh + i * dh - bh, (r1 - 1) * sh + i * dh - bh + 1, sh)
                cols_in = slice(c0 * sw + j * dw - bw, (c1 - 1) * sw + j * dw - bw + 1, sw)
                regions.append((i * kw + j, slice(r0, r1), slice(c0, c1), rows_in, cols_in))
    return tuple(regions)


def _read_only(a: Any) -> Any:
    if hasattr(a, "flags"):
        a.flags.writeable = False
    return a


class _Geometry(NamedTuple):
    """Where the windows of one convolution sit: pads before/after, output size, kernel,
    strides, dilations (per spatial axis) and the group count; then two facts derived from
    them once per node (the memo), not on every call: whether it is a plain 1x1 convolution
    (no padding, stride 1) and each kernel axis's extent with its dilation."""

    begin: list[int]
    end: list[int]
    out: list[int]
    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    group: int
    pointwise: bool
    extent: list[int]
    # Per kernel tap of a 2-D convolution whose taps mostly read padding: the outputs it reaches
    # and the input it reads there (see _tap_regions); None elsewhere.
    regions: tuple[tuple[int, slice, slice, slice, slice], ...] | None


def _conv_shuffled(
    xp: Any, x: Any, w: Any, b: Any, geo: _Geometry, g: int, epilogue: Callable[[Any], Any] | None
) -> Any:
    """The convolution with its output channels shuffled over ``g`` groups (see conv_nd)."""
    begin, end, out, k, strides, _, group = geo[:7]
    n, c = x.shape[:2]
    m = w.shape[0]
    o = math.prod(out)
    res = xp.empty((n, m, *out), dtype=x.dtype)
    # pre[:, a * m/g + j] lands in res[:, j * g + a]: through this view it is written in order.
    pre = res.reshape(n, m // g, g, o).transpose(0, 2, 1, 3)  # (n, g, m/g, o)
    if xp is np and geo.pointwise and group == g and n * o:
        # The grouped GEMM's result blocks are exactly the shuffle's source groups: BLAS writes
        # each group's rows with a row stride of g rows, and no copy is made. (numpy only:
        # CuPy's matmul is not known to write into strided outputs in place.)
        if b is not None and _grouped_bias_pays(x, o):
            # The bias rides in the GEMMs (see _GROUPED_BIAS_MIN_POSITIONS).
            xp.matmul(_grouped_bias_augmented(w, b, group, x.dtype), _grouped_columns(x, group), out=pre)
            if epilogue is not None:
                epilogue(res)
            return res
        # A channels-last input is copied to NCHW first: BLAS reading it transposed was slower
        # than the copy and a plain GEMM (136x28x28, 4 groups: 131 against 103 us).
        if is_channels_last(x):
            x = nchw_copy(x)
        xs = x.reshape(n, group, c // group, o)
        xp.matmul(w.reshape(group, m // group, c // group), xs, out=pre)
    else:
        pre[...] = _conv_dispatch(xp, x, w, None, geo).reshape(n, g, m // g, o)
    if b is not None:
        # The bias in shuffled order, added over the result in memory order: a contiguous pass
        # instead of one through the strided view (136x28x28: 18 against 41 us).
        shuffled = derived((b,), ("shuffled-bias", g), lambda: xp.ascontiguousarray(b.reshape(g, m // g).T))
        res.reshape(n, m, o)[...] += shuffled.reshape(1, m, 1)
    if epilogue is not None:
        epilogue(res)
    return res


# Grouped 1x1 convolutions with at least this many output positions add their bias in the GEMMs
# (``_grouped_columns``): the copy of the input under a row of ones costs less than a pass adding
# the bias over the result (ShuffleNet -1.0 to -1.4%, 12-15 of 15 alternating rounds; its 272x14x14
# and 136x28x28 layers 6-7 us faster each). On 7x7 maps the K + 1 products ran 2-10 us slower,
# and a channels-last input (a depthwise result), which one blocked transpose copies to NCHW,
# would need one per group: 11 us slower.
_GROUPED_BIAS_MIN_POSITIONS = 100


def _grouped_bias_pays(x: Any, positions: int) -> bool:
    return positions >= _GROUPED_BIAS_MIN_POSITIONS and not is_channels_last(x)


def _grouped_columns(x: np.ndarray, group: int) -> np.ndarray:
    """The NCHW input of a grouped 1x1 convolution as (N, group, C/group + 1, positions), each
    group's channels followed by a row of ones: the GEMMs with ``_grouped_bias_augmented``
    weights add the bias themselves."""
    n, c = x.shape[:2]
    cg = c // group
    cols = np.empty((n, group, cg + 1, math.prod(x.shape[2:])), dtype=x.dtype)
    cols[:, :, cg] = 1
    cols[:, :, :cg] = x.reshape(n, group, cg, -1)
    return cols


def _grouped_bias_augmented(w: np.ndarray, b: np.ndarray, group: int, dt: np.dtype) -> np.ndarray:
    """[W_g | b_g] per group, (group, M/group, C/group + 1), for ``_grouped_columns``; cached
    for constant W and B."""

    def build() -> np.ndarray:
        m, cg = w.shape[:2]
        wb = np.empty((group, m // group, cg + 1), dtype=dt)
        wb[:, :, :cg] = w.reshape(group, m // group, cg)
        wb[:, :, cg] = b.reshape(group, m // group)
        return wb

    return derived((w, b), ("grouped-bias-augmented", group, np.dtype(dt).str), build)


def _conv_dispatch(
    xp: Any, x: Any, w: Any, b: Any, geo: _Geometry, into: Any = None, channels_last: bool = False, exact: bool = False
) -> Any:
    """The convolution paths other than channels-last depthwise, in ``x``'s (compute) dtype;
    those that can write their result into ``into`` (see conv_nd) do."""
    begin, end, out, k, strides, dilations, group = geo[:7]
    nd = len(k)
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    cdt = x.dtype
    ext = geo.extent
    o = math.prod(out)
    pointwise = geo.pointwise
    winograd = nd == 2 and group == 1 and n * o and not exact
    tile = _winograd_tile(k, strides, dilations, c, m, out, xp is np) if winograd else 0
    if tile and _tap_sum_pays(strides, c, m):
        tile = 0
    if tile and xp is np and winograd_cl.pays(out, tile):
        # Channels-last Winograd reads any input layout (a channels-last one without a transpose).
        u_cl = winograd_cl.transformed_weights_cl(lambda: _transform_weights(xp, w, tile), w, tile)
        return winograd_cl.winograd_channels_last(x, u_cl, _transforms(tile, x.dtype), tile, begin, out, b, into)
    if xp is np and pointwise and group > 1 and b is not None and _grouped_bias_pays(x, o):
        # A grouped 1x1 convolution (ShuffleNet's) with its bias added in the GEMMs (see
        # _GROUPED_BIAS_MIN_POSITIONS).
        y = np.empty((n, m, *out), dtype=cdt) if into is None else into
        np.matmul(_grouped_bias_augmented(w, b, group, cdt), _grouped_columns(x, group), out=y.reshape(n, group, mg, o))
        return y
    if xp is np and is_channels_last(x) and not (pointwise and group == 1):
        # A channels-last input (a depthwise result) that this path reads as NCHW: one blocked
        # transpose, not numpy's element-by-element copy inside a reshape or the padding
        # (ShuffleNet's grouped 1x1 after each depthwise: 136x28x28 65 -> 15 us).
        x = nchw_copy(x)
    if n == 0 or o == 0:
        y = xp.zeros((n, m, *out), dtype=cdt)
    elif all(kk == 1 for kk in k):
        # 1x1: Y[n, g] = W[g] @ X[n, g] over flattened spatial positions; strides and pads only
        # select / zero-extend the positions first.
        if not pointwise:
            x = pad_input(xp, x, begin, end, out, ext, strides, 0)
            x = x[window_slices([0] * nd, dilations, strides, out)]
        elif group == 1 and is_channels_last(x):
            # Channels-last input (a depthwise result): Y^T = X^T W^T keeps the output
            # channels-last too, and BLAS reads both operands in place.
            xt = x.reshape(n, c, o).transpose(0, 2, 1)  # (n, o, c), rows contiguous
            if b is not None and c < m:
                # As in NCHW below: [X^T | 1] @ [W^T ; b] adds the bias in the GEMM, for one
                # copy of the smaller input (measured 10-20% faster on MobileNet's expansions).
                xs = xp.empty((n, o, c + 1), dtype=cdt)
                xs[:, :, :c] = xt
                xs[:, :, c] = 1
                return xp.matmul(xs, _bias_augmented(xp, w, b, cdt).T).transpose(0, 2, 1).reshape(n, m, *out)
            yt = xp.matmul(xt, tiled_rows(w, m, c, 1, cdt))  # (n, o, m)
            if b is not None:
                # As rows of r*m values: an inner loop of m (often 16-32) alone is slow.
                r = max(1, 1024 // m)
                while (n * o) % r:
                    r -= 1
                yt.reshape(-1, r * m)[...] += tiled_rows(b, m, 1, r, cdt)[0]
            return yt.transpose(0, 2, 1).reshape(n, m, *out)
        if b is not None and group == 1 and cg < m:
            # Fewer input than output channels: append a row of ones to X and the bias as a
            # column of W, so the GEMM adds the bias. Copying the (smaller) input costs less than
            # a separate pass over the (larger) output.
            xs = xp.empty((n, cg + 1, o), dtype=cdt)
            xs[:, :cg].reshape(n, cg, *out)[...] = x  # one copy, even from a strided selection
            xs[:, cg] = 1
            wb = _bias_augmented(xp, w, b, cdt)
            if into is not None:
                xp.matmul(wb, xs, out=into.reshape(n, m, o))
                return into
            return xp.matmul(wb, xs).reshape(n, m, *out)
        xs = x.reshape(n, group, cg, o)
        if into is not None:
            xp.matmul(w.reshape(group, mg, cg), xs, out=into.reshape(n, group, mg, o))
            y = into
        else:
            y = xp.matmul(w.reshape(group, mg, cg), xs).reshape(n, m, *out)
    elif geo.regions is not None:
        y = _conv2d_tap_regions(xp, x, w, geo.regions, out, into)  # the bias is added below
    elif nd == 2 and group == 1 and _tap_sum_pays(strides, c, m):
        return _conv2d_tap_sum(xp, x, w, begin, end, out, dilations, b, into)
    elif tile:
        return _winograd(xp, x, w, begin, out, tile, b, into)
    elif (
        xp is np
        and nd in (2, 3)
        and group == 1
        and all(s == 1 for s in strides)
        and _tap_accumulate_pays(c, k, o)
        and (y := _conv_tap_accumulate(x, w, begin, out, dilations, b, into)) is not None
    ):
        return y  # (None: no BLAS routine to call; im2col below)
    elif nd == 2 and all(s == 1 for s in strides) and group > 1 and (cg > 1 or mg == 1):
        # Grouped stride 1: each im2col row is one contiguous run of the padded input ("padded
        # width"). For group 1 the plain im2col below wins: its GEMM carries the bias and writes
        # the result in place, where the padded width needs one more pass to crop and add the
        # bias (measured on every 3x3/5x5 shape of SqueezeNet, Inception v1/v2 and VGG that no
        # Winograd or tap-sum path takes: 3-40% faster, e.g. 32->128 on 27x27 406 -> 322 us).
        return _conv2d_padded_width(xp, x, w, begin, end, out, dilations, group, b, into)
    elif xp is np and nd == 2 and group == 1 and not channels_last and _channels_last_columns_pay(out, k, strides):
        return _im2col_channels_last(x, w, b, begin, out, strides, dilations, into)
    else:
        xp_ = pad_input(xp, x, begin, end, out, ext, strides, 0)
        if cg == 1 and mg == 1:
            y = _depthwise(xp, xp_, w, k, strides, dilations, out)
        elif b is not None and group == 1:
            # The bias rides in the GEMM: a row of ones under the columns (built anyway), the
            # bias as a column of W; no pass over the output to add it.
            return _im2col_gemm(xp, xp_, w, k, strides, dilations, out, group, b, into, channels_last)
        else:
            y = _im2col_gemm(xp, xp_, w, k, strides, dilations, out, group, into=into)
    if b is not None:
        y += b.reshape((1, m) + (1,) * nd)
    return y


def _conv2d_padded_width(
    xp: Any,
    x: Any,
    w: Any,
    begin: list[int],
    end: list[int],
    out: list[int],
    dilations: list[int],
    group: int,
    bias: Any,
    into: Any = None,
) -> Any:
    """Stride-1 2-D convolution as one GEMM per group over "padded-width" columns.

    With the input padded to width Wp, the window element under kernel offset (i, j) for output
    row r, column q sits at flat position (r + i*d) * Wp + q + j*d, so for a fixed offset all
    outputs read one contiguous run of oh * Wp values: im2col copies whole runs, and the GEMM
    computes oh * Wp columns of which the last Wp - ow per row are discarded when the result
    (plus bias) is written to the output in one pass.
    """
    n, c = x.shape[:2]
    m, _, kh, kw = w.shape
    dh, dw = dilations
    oh, ow = out
    # One extra zero row at the bottom keeps the last run of the last offset inside the buffer.
    hp = x.shape[2] + begin[0] + end[0] + 1
    wp = x.shape[3] + begin[1] + end[1]
    xpad = xp.zeros((n, c, hp, wp), dtype=x.dtype)
    xpad[:, :, begin[0] : begin[0] + x.shape[2], begin[1] : begin[1] + x.shape[3]] = x
    run = oh * wp
    cg, mg = c // group, m // group
    item = xpad.itemsize
    y = xp.empty((n, m, oh, ow), dtype=x.dtype) if into is None else into
    # Every group at once (a depthwise layer: one channel per group): a (group, cg, kh, kw, n,
    # run) view -> (group, cg*kh*kw, n*run) copy of contiguous runs, one stacked product, one
    # pass cropping the rows and adding the bias. (A
    # loop over groups made three numpy calls a group: RegNet's 25-group 3x3 on 400x7x7 285 us,
    # onnxruntime 45.)
    plane = hp * wp * item
    view = _as_strided(
        xp, xpad, (group, cg, kh, kw, n, run), (cg * plane, plane, dh * wp * item, dw * item, c * plane, item)
    )
    cols = view.reshape(group, cg * kh * kw, n * run)
    prod = stacked_matmul(xp, w.reshape(group, mg, cg * kh * kw), cols)  # (group, mg, n * run)
    full = prod.reshape(m, n, oh, wp)[:, :, :, :ow].transpose(1, 0, 2, 3)
    if bias is None:
        y[...] = full
    else:
        xp.add(full, bias.reshape(1, m, 1, 1), out=y)
    return y


# Output rows of at most this many positions make a 2-D convolution's im2col channels-last
# (_im2col_channels_last). Against the NCHW im2col, alternating calls, hot and after a 32 MB
# pass: 7x7 and 14x14 outputs 0.58-0.86 and 0.68-1.02 of its time at every channel count tried
# (3 to 512, 3x3 and 5x5, strides 1 and 2); 17 and 20 wide even; 28 and 56 wide 1.10-1.17
# (stride-2 layers of 64-96 channels; the NCHW copy's runs of ow values are long enough there).
_CHANNELS_LAST_COLUMNS_MAX_WIDTH = 14


def _channels_last_columns_pay(out: list[int], k: list[int], strides: list[int]) -> bool:
    """Whether a 2-D convolution (group 1) that im2col takes builds its columns channels-last:
    on narrow outputs, where the windows overlap. Windows that tile the input (kernel ==
    stride: a vision transformer's 16x16 patches, ConvNeXt's 2x2 downsampling) make columns no
    larger than the input, and the channels-last copy of the input is then most of the work.
    Their time against the NCHW im2col's, hot / after a 32 MB pass: 2x2/2 layers of 32-384
    channels 0.88-1.52 / 1.09-1.38, 4x4/4 stems 1.12-1.40 / 1.13-1.17, a 16x16 patch layer of 3
    channels 1.53 / 1.55, 32x32 (ViT-B/32) 2.17 / 2.23."""
    return out[1] <= _CHANNELS_LAST_COLUMNS_MAX_WIDTH and k[0] * k[1] > strides[0] * strides[1]


def _channels_last_columns(
    x: np.ndarray,
    k: list[int],
    begin: list[int],
    out: list[int],
    strides: list[int],
    dilations: list[int],
    ones: bool,
) -> np.ndarray:
    """im2col of a 2-D convolution's input ``x`` (N, C, H, W), any layout, as (N * positions,
    kh * kw * C) columns ordered (i, j, c), with a last column of ones when ``ones``.

    Each image is copied once, channels-last with its zero border (as the depthwise path does);
    a position's window is then kh runs of kw * C values, so the column copy moves long runs
    where the NCHW im2col moves runs of ow values, and on small maps numpy's cost per run is
    most of that copy: 2.7-4.4x faster on 7x7 and 14x14 maps of 160-256 channels."""
    n, c = x.shape[:2]
    kh, kw = k
    sh, sw = strides
    dh, dw = dilations
    oh, ow = out
    o = oh * ow
    kk = kh * kw * c
    rows, cols = sh * (oh - 1) + dh * (kh - 1) + 1, sw * (ow - 1) + dw * (kw - 1) + 1
    columns = np.empty((n * o, kk + ones), dtype=x.dtype)
    if ones:
        columns[:, kk] = 1
    item = columns.itemsize
    line = cols * c * item
    for img in range(n):
        p = padded_channels_last(x[img], begin, (rows, cols))
        view = strided_view(p, (oh, ow, kh, kw, c), (sh * line, sw * c * item, dh * line, dw * c * item, item))
        columns[img * o : (img + 1) * o, :kk].reshape(oh, ow, kh, kw, c)[...] = view
    return columns


def _channels_last_weights(w: np.ndarray, bias: np.ndarray | None, dt: np.dtype) -> np.ndarray:
    """W (M, C, kh, kw) as (M, kh * kw * C), columns ordered (i, j, c) as _channels_last_columns'
    rows, with the bias as a last column when given; cached for constant W and B."""

    def build() -> np.ndarray:
        m = w.shape[0]
        wr = w.astype(dt, copy=False).transpose(0, 2, 3, 1).reshape(m, -1)
        if bias is None:
            return _read_only(np.ascontiguousarray(wr))
        return _read_only(np.concatenate([wr, bias.astype(dt, copy=False).reshape(m, 1)], axis=1))

    return derived((w,) if bias is None else (w, bias), ("conv-cl-columns", np.dtype(dt).str), build)


def _im2col_channels_last(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    begin: list[int],
    out: list[int],
    strides: list[int],
    dilations: list[int],
    into: np.ndarray | None,
) -> np.ndarray:
    """A 2-D convolution (group 1) as one GEMM over channels-last im2col columns (see
    _channels_last_columns): Y = [W' | b] cols^T, BLAS reading the columns transposed in place,
    so the result is NCHW, written into ``into`` when given."""
    n = x.shape[0]
    m = w.shape[0]
    oh, ow = out
    columns = _channels_last_columns(x, list(w.shape[2:]), begin, out, strides, dilations, bias is not None)
    wmat = _channels_last_weights(w, bias, x.dtype)
    y = np.empty((n, m, oh, ow), dtype=x.dtype) if into is None else into
    if n == 1:
        np.matmul(wmat, columns.T, out=y.reshape(m, oh * ow))
    else:
        # One GEMM over every image's positions (a product per image, a few dozen columns each,
        # ran 3-20% slower at batch 8), then the (M, N, positions) result copied per image.
        y[...] = np.matmul(wmat, columns.T).reshape(m, n, oh, ow).transpose(1, 0, 2, 3)
    return y


# im2col columns of more than this many bytes per image make a stride-1 convolution
# accumulate one product per tap instead (_conv_tap_accumulate). 3-D: on MC3 and R(2+1)D any
# threshold from 0 to 32 MB gave the same run time. 2-D, where the other paths are tuned:
# 15-25% faster with 25 MB of columns (Inception v3's 32 -> 32 and 32 -> 64 on 147x147),
# even at 14.5 MB (80 -> 192 on 71x71), slower at 7 MB (64 -> 192 on 56x56: 2.9 against 2.4 ms).
_TAP_ACCUMULATE_MIN_BYTES = 8 << 20
_TAP_ACCUMULATE_MIN_BYTES_2D = 16 << 20


def _tap_accumulate_pays(c: int, k: list[int], positions: int) -> bool:
    threshold = _TAP_ACCUMULATE_MIN_BYTES_2D if len(k) == 2 else _TAP_ACCUMULATE_MIN_BYTES
    return c * math.prod(k) * positions * 4 > threshold


def _conv_tap_accumulate(
    x: np.ndarray,
    w: np.ndarray,
    begin: list[int],
    out: list[int],
    dilations: list[int],
    bias: np.ndarray | None,
    into: np.ndarray | None,
) -> np.ndarray | None:
    """A 2-D or 3-D stride-1 convolution as one BLAS product per tap, added into one result: in
    the padded input flattened per channel, each tap of every output position sits at one
    fixed offset, so each tap's operand is a plain 2-D view (channels x positions) and nothing
    is copied but the padding. The positions run over whole padded rows (and planes); the
    columns (and rows) past the output are cut when the result is written. im2col's columns
    were 27 copies of the input: 173 MB for MC3's 64-channel 8x56x56 layers (60-80 ms a
    layer, 25 this way). None where BLAS cannot take the operands."""
    n, c = x.shape[:2]
    m = w.shape[0]
    k = w.shape[2:]
    nd = len(k)
    if nd == 3 and k[1] == k[2] == 1 and begin[1] == begin[2] == 0 and tuple(out[1:]) == tuple(x.shape[3:]):
        return _temporal_tap_accumulate(x, w, begin[0], out[0], dilations[0], bias, into)
    # The padded extents the windows read, and one spare row (plane) so the last tap's run stays in.
    ext = [o + d * (kk - 1) for o, d, kk in zip(out, dilations, k)]
    xpad = np.zeros((n, c, ext[0] + 1, *ext[1:]), dtype=x.dtype)
    src = x[(slice(None), slice(None), *(slice(0, max(0, e - b)) for e, b in zip(ext, begin)))]
    xpad[(slice(None), slice(None), *(slice(b, b + s) for b, s in zip(begin, src.shape[2:])))] = src
    flat = xpad.reshape(n, c, -1)
    run = out[0] * math.prod(ext[1:])
    # (taps, M, C): each tap's weights one contiguous matrix; cached for constant weights.
    per_tap = derived(
        (w,),
        ("conv-taps", x.dtype.str),
        lambda: np.ascontiguousarray(w.transpose(*range(2, 2 + nd), 0, 1).astype(x.dtype).reshape(math.prod(k), m, c)),
    )
    steps = [math.prod(ext[i + 1 :]) * dilations[i] for i in range(nd)]  # flat offset per tap step
    offsets = [sum(t * s for t, s in zip(tap, steps)) for tap in np.ndindex(*k)]
    y = np.empty((n, m, *out), dtype=x.dtype) if into is None else into
    acc = np.empty((m, run), dtype=x.dtype)
    crop = (slice(None), slice(None), *(slice(0, o) for o in out[1:]))
    for img in range(n):
        if bias is None:
            acc[...] = 0
        else:
            acc[...] = bias.astype(x.dtype, copy=False)[:, None]
        for t, off in enumerate(offsets):
            if not gemm_accumulate(per_tap[t], flat[img, :, off : off + run], acc):
                return None
        y[img] = acc.reshape(m, out[0], *ext[1:])[crop]
    return y


def _temporal_tap_accumulate(
    x: np.ndarray, w: np.ndarray, begin: int, od: int, dd: int, bias: np.ndarray | None, into: np.ndarray | None
) -> np.ndarray | None:
    """``_conv_tap_accumulate`` for a (k, 1, 1) kernel without padding across the planes'
    rows and columns (R(2+1)D's temporal layers): tap a of output plane d reads input plane
    d + a*dd - begin whole, so each tap is one product between runs of whole planes of the
    input and of the result, with no padded copy and nothing to cut."""
    n, c, depth = x.shape[:3]
    m, kd = w.shape[0], w.shape[2]
    hw = x.shape[3] * x.shape[4]
    flat = np.ascontiguousarray(x).reshape(n, c, depth * hw)
    per_tap = derived(
        (w,),
        ("conv3d-temporal", x.dtype.str),
        lambda: np.ascontiguousarray(w[:, :, :, 0, 0].transpose(2, 0, 1).astype(x.dtype)),
    )
    y = np.empty((n, m, od, *x.shape[3:]), dtype=x.dtype) if into is None or not into.flags.c_contiguous else into
    result = y.reshape(n, m, od * hw)
    for img in range(n):
        if bias is None:
            result[img] = 0
        else:
            result[img] = bias.astype(x.dtype, copy=False)[:, None]
        for a in range(kd):
            shift = a * dd - begin  # output plane d reads input plane d + shift
            d0, d1 = max(0, -shift), min(od, depth - shift)
            if d0 < d1 and not gemm_accumulate(
                per_tap[a], flat[img, :, (d0 + shift) * hw : (d1 + shift) * hw], result[img, :, d0 * hw : d1 * hw]
            ):
                return None
    if into is not None and y is not into:
        into[...] = y
        return into
    return y


def _tap_sum_pays(strides: list[int], c: int, m: int) -> bool:
    """Whether ``_conv2d_tap_sum`` beats im2col and Winograd: stride 1 and M <= C/4."""
    return all(s == 1 for s in strides) and 4 * m <= c


def _conv2d_tap_sum(
    xp: Any,
    x: Any,
    w: Any,
    begin: list[int],
    end: list[int],
    out: list[int],
    dilations: list[int],
    bias: Any,
    into: Any = None,
) -> Any:
    """Stride-1 2-D convolution with few output channels (M <= C/4) as shifted sums of one GEMM
    over all kernel taps at once.

    The input is laid out with ``s`` >= max(left, right pad) zero columns after each row and
    flattened per channel: (C, H*(W+s)). With the taps' weights stacked as a (kh*kw*M, C) matrix,
    P = W_stacked @ X is one GEMM, and Y = the sum over taps of P's tap block shifted by the
    tap's offset, (dy*dh - pt)*(W+s) + dx*dw - pl positions: no im2col copy. The copy costs
    C*kh*kw values per output position, the shifted sums M*kh*kw: with M much smaller than C
    (DenseNet's 128 -> 32 layers) the taps win. One tall GEMM instead of a skinny (M-row) GEMM
    per tap: DenseNet's 56x56 1611 -> 1271 us, 28x28 567 -> 389 us alone; it loses from
    M >= C/2. Taps go _TAPS_PER_GEMM at a time, so P stays within a few times the input for
    large kernels.

    A shift that leaves a row lands in the zero columns (s of them cover a left reach of pl,
    which wraps into the previous row's, and a right reach of pr), so it reads the padding's
    zeros; one that leaves the image reads the zero margins around P, which is what zero
    padding rows would have added. Without padded rows the GEMM runs over H*(W+s) positions
    instead of (H+pt+pb+1)*(W+pl+pr) (DenseNet's 3x3 at 14x14: 210 against 272; at 7x7, 56
    against 90): DenseNet-121 -2.4 to -3.0% (paired runs, both ways round).

    Where the output rows are as long as the input's (the usual "same" padding) and X is one
    contiguous block per image, there are no zero columns at all (s = 0): the GEMM reads X in
    place, the few product columns a shift reads across a row's end are zeroed instead
    (``_wrapped_columns``), and the sums go straight into the result.
    """
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    dh, dw = dilations
    oh, ow = out
    pt, pl = begin
    taps = kh * kw
    shifts = [(t % kw) * dw - pl for t in range(taps)]  # each tap's column offset
    # Output rows as long as the input's, every column shift shorter than a row, and X one
    # block per image: the GEMM reads X in place, no padded copy (see ``_wrapped_columns``).
    in_place = xp is np and ow == wd and x.flags.c_contiguous and all(abs(s) < wd for s in shifts)
    row = wd if in_place else max(wd + max(pl, end[1]), ow)  # output rows must fit too
    n_in, n_out = h * row, oh * row
    if in_place:
        xs = x
    else:
        xs = xp.empty((n, c, h, row), dtype=x.dtype)
        xs[..., wd:] = 0
        xs[..., :wd] = x
    stacked = derived((w,), ("per-tap", np.dtype(x.dtype).str), lambda: _per_tap(xp, w, x.dtype)).reshape(taps * m, c)
    offsets = [((t // kw) * dh - pt) * row + shifts[t] for t in range(taps)]
    # The product sits between zero margins wide enough for every shift, so each tap adds over
    # all outputs, one contiguous block per channel (partial ranges ran 60% slower).
    left, right = max(0, -min(offsets)), max(0, max(offsets) + n_out - n_in)
    y = xp.empty((n, m, oh, ow), dtype=x.dtype) if into is None else into
    # Sums straight into the result where its rows are the accumulator's (and it is not X's
    # memory, which later tap groups read again). Host arrays: CuPy keeps the accumulator.
    direct = (
        xp is np
        and row == ow
        and n > 0
        and y[0].flags.c_contiguous
        and not (into is not None and np.may_share_memory(y, x))
    )
    acc = None if direct else xp.empty((m, n_out), dtype=x.dtype)
    prod = xp.empty((min(taps, _TAPS_PER_GEMM) * m, left + n_in + right), dtype=x.dtype)
    prod[:, :left] = 0
    prod[:, left + n_in :] = 0
    for i in range(n):
        flat = xs[i].reshape(c, n_in)
        total = y[i].reshape(m, n_out) if direct else acc
        for t0 in range(0, taps, _TAPS_PER_GEMM):
            t1 = min(taps, t0 + _TAPS_PER_GEMM)
            middle = prod[: (t1 - t0) * m, left : left + n_in]
            if xp is np:
                np.matmul(stacked[t0 * m : t1 * m], flat, out=middle)
            else:  # CuPy's matmul is not known to write into strided outputs in place
                middle[...] = xp.matmul(stacked[t0 * m : t1 * m], flat)
            if in_place:
                _wrapped_columns(middle.reshape(t1 - t0, m, h, wd), shifts[t0:t1], kw)
            if xp is np and t0 == 0 and t1 == taps and n_out <= _TAP_SUM_REDUCE_MAX_POSITIONS:
                # Every tap in one product: its blocks are one strided view (a tap row down
                # adds kw blocks and dh rows, a tap to the right one block and dw columns),
                # summed by a single reduction instead of a call per tap.
                item = prod.itemsize
                length = prod.shape[1]
                start = prod.reshape(-1)[left + offsets[0] :]
                strides = ((kw * m * length + dh * row) * item, (m * length + dw) * item, length * item, item)
                np.add.reduce(strided_view(start, (kh, kw, m, n_out), strides), axis=(0, 1), out=total)
                continue
            blocks = [
                prod[(t - t0) * m : (t - t0 + 1) * m, left + offsets[t] : left + offsets[t] + n_out]
                for t in range(t0, t1)
            ]
            if t0 == 0:
                if len(blocks) > 1:
                    xp.add(blocks[0], blocks[1], out=total)
                    blocks = blocks[2:]
                else:
                    total[...] = blocks[0]
                    blocks = []
            for b in blocks:
                total += b
        if direct:
            if bias is not None:
                total += bias.reshape(m, 1)
            continue
        full = total.reshape(m, oh, row)[:, :, :ow]
        if bias is None:
            y[i] = full
        else:
            xp.add(full, bias.reshape(m, 1, 1), out=y[i])
    return y


def _wrapped_columns(grid: np.ndarray, shifts: list[int], period: int) -> None:
    """Zero, in each tap's product ``grid[t]`` (M, H, W) over unpadded rows, the columns its
    shift reads across a row's end: a tap shifted by dx < 0 reads, for the first -dx outputs of
    a row, the last -dx columns of the row before; by dx > 0, for the last dx outputs, the
    first dx columns of the next row. No output reads those columns inside the image at that
    shift, so zeros there are the zero padding those outputs would have read. Saves the copy
    of X with zero columns after each row (DenseNet's 128 -> 32 3x3 layers: 56x56 1416 -> 1211
    us, 28x28 427 -> 380, 14x14 157 -> 130 alone).

    ``shifts`` repeat with the kernel's width ``period`` (a tap's shift is its column's), so the
    taps of one column are zeroed together, one strided assignment each (a 3x3 kernel: two
    instead of six; 8.5 -> 3 us a call on 7x7 maps)."""
    width = grid.shape[3]
    for first in range(min(period, len(shifts))):
        dx = shifts[first]
        if dx < 0:
            grid[first::period, :, :, width + dx :] = 0
        elif dx > 0:
            grid[first::period, :, :, :dx] = 0


# Kernel taps per stacked GEMM of the tap sum: a 3x3 kernel in one.
_TAPS_PER_GEMM = 9

# Outputs per channel up to which the tap sum adds its blocks by one reduction over a strided
# view of them (one call) instead of one add per tap: DenseNet's 128 -> 32 layers' sums at 7x7
# 7.7 -> 3.5 us, 14x14 15.1 -> 11.1, 28x28 the same; at 56x56 193 -> 213 (numpy's reduction
# over such views runs slower on blocks larger than L1).
_TAP_SUM_REDUCE_MAX_POSITIONS = 1024


def _conv2d_tap_regions(
    xp: Any,
    x: Any,
    w: Any,
    regions: tuple[tuple[int, slice, slice, slice, slice], ...],
    out: list[int],
    into: Any,
) -> Any:
    """The convolution as, per kernel tap, one product of the tap's (M, C) weights with the
    input it reads, added over the outputs it reaches (``_tap_regions``): no work for taps
    over zero padding. DeepLab's dilation-12 ASPP on 14x14 (960 -> 256) does 324 of the 1,764
    output-tap products a full convolution does."""
    n, c = x.shape[:2]
    m = w.shape[0]
    per_tap = derived((w,), ("per-tap", np.dtype(x.dtype).str), lambda: _per_tap(xp, w, x.dtype))
    y = xp.zeros((n, m, *out), dtype=x.dtype) if into is None else into
    if into is not None:
        y[...] = 0
    for t, rows, cols, rows_in, cols_in in regions:
        block = x[:, :, rows_in, cols_in]
        r, q = block.shape[2:]
        prod = xp.matmul(per_tap[t], block.reshape(n, c, r * q))  # the reshape copies the strided block
        y[:, :, rows, cols] += prod.reshape(n, m, r, q)
    return y


def _per_tap(xp: Any, w: Any, dtype: Any) -> Any:
    """W (M, C, kh, kw) as (kh*kw, M, C): one contiguous matrix per kernel tap."""
    m, c, kh, kw = w.shape
    return xp.ascontiguousarray(w.astype(dtype, copy=False).transpose(2, 3, 0, 1)).reshape(kh * kw, m, c)


def _as_strided(xp: Any, x: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    if xp is np:
        return strided_view(x, shape, strides)
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides)


# -- Winograd F(2x2, 3x3) and F(4x4, 3x3) ------------------------------------------------------------
# Y = A^T [ (G g G^T) * (B^T d B) ] A for each (t x t) input tile d giving an (r x r) output tile,
# t = r + 2 (Lavin & Gray). F(4x4, 3x3) does 36 multiplies per 16 outputs instead of 144. Both
# transforms run as GEMMs with Kronecker-product matrices over all tiles at once, so numpy spends
# its time in BLAS, not in elementwise passes. Transformed weights are cached per constant.
def _winograd_matrices() -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    bt2 = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
    g2 = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
    at2 = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)
    bt4 = np.array(
        [
            [4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1],
        ],
        dtype=np.float64,
    )
    g4 = np.array(
        [
            [1 / 4, 0, 0],
            [-1 / 6, -1 / 6, -1 / 6],
            [-1 / 6, 1 / 6, -1 / 6],
            [1 / 24, 1 / 12, 1 / 6],
            [1 / 24, -1 / 12, 1 / 6],
            [0, 0, 1],
        ],
        dtype=np.float64,
    )
    at4 = np.array(
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], dtype=np.float64
    )
    # (vec of B^T d B) = kron(B^T, B^T) @ (vec of d) for row-major vectorization; same for A.
    return {
        r: (np.kron(bt, bt), g, np.kron(at, at)) for r, (bt, g, at) in {2: (bt2, g2, at2), 4: (bt4, g4, at4)}.items()
    }


_WINO = _winograd_matrices()


@functools.lru_cache(maxsize=16)
def _transforms(r: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The input and output transform matrices of F(r x r, 3x3) in ``dtype``, made once
    rather than converted from float64 on every call."""
    kin, _, kout = _WINO[r]
    return kin.astype(dtype), kout.astype(dtype)


def _winograd_tile(
    k: list[int], strides: list[int], dilations: list[int], c: int, m: int, out: list[int], host: bool = True
) -> int:
    """Output tile size for a 3x3 stride-1 convolution worth doing by Winograd (4 or 2), else 0.

    Chosen from measurements of every 3x3 layer shape of ResNet-50, VGG-19, Inception v1/v2,
    DenseNet-121 and SqueezeNet, against the padded-width im2col GEMM: the transforms cost in
    proportion to C and M per tile, the GEMM saving in proportion to C * M, so Winograd needs
    many channels, and more output than input channels favours the direct GEMM.

    On the host, layers of 49-784 tiles run channels-last (``_winograd_cl.py``), whose
    transforms cost less: there F(4x4) on maps of 27x27 and more, and F(2x2) on smaller ones,
    win from 32 input channels (Inception v2's 28x28 layers of 64-96 channels 2.4% and its 14x14
    ones 3.7% of the model, in alternating rounds; Inception v1's neutral), and F(4x4) up to
    M = 3C (see below). Elsewhere (and on a GPU), the NCHW path: on maps of 48x48 and more F(4x4)
    wins from 64 channels, on 27x27 to 47x47 from 128 (in a model the weights come cold from
    memory, and F(4x4)'s transformed weights are 4x the raw ones). Below that only wide layers
    (>= 192 input channels) gain, and F(2x2) wastes fewer positions on small maps than F(4x4)'s
    4x4 tiles.
    """
    if k != [3, 3] or strides != [1, 1] or dilations != [1, 1] or m > 3 * c:
        return 0
    large = out[0] * out[1] >= 27 * 27
    # Channels-last F(4x4) also takes up to 3x more output than input channels (Inception v1 and
    # v2's 64 -> 192 at 56x56: 4.1 -> 2.6 ms alone, each model -2.6 to -4.1%, paired runs both
    # ways round); 4x (SqueezeNet's expands) was 1% slower.
    if host and c >= 32 and winograd_cl.pays(out, 4 if large else 2) and (m <= 2 * c or large):
        return 4 if large else 2
    if m > 2 * c:
        return 0
    if large:
        return 4 if c >= (64 if out[0] * out[1] >= 48 * 48 else 128) else 0
    # Below 10x10 the 2x2 tiles waste more (7x7: 16 tiles for 12.25) and the transforms weigh
    # more. Alone, F(2x2) beat im2col on 7x7 maps from 512 channels; in ResNet-50's run, where
    # the transformed weights (16/9 of the raw ones, 17 MB for 512 channels) come cold from
    # memory, im2col was faster there too (the model 1.1%, 10/12 alternating rounds).
    return 2 if c >= 192 and out[0] * out[1] >= 100 else 0


def _winograd_weights(xp: Any, w: Any, r: int) -> Any:
    """(t*t, M, C) transformed weights; cached for read-only (constant) weights."""
    return derived((w,), ("winograd", r), lambda: _transform_weights(xp, w, r))


def _transform_weights(xp: Any, w: Any, r: int) -> Any:
    g = _WINO[r][1]
    t = g.shape[0]
    m, c = w.shape[:2]
    host = _to_host(w)
    u_host = np.empty((t, t, m, c), dtype=w.dtype)
    # G . w . G^T as two GEMMs over the kernels, in float64 for accuracy; a block of output
    # channels at a time, so the float64 temporaries stay small (whole, they reached 4x the
    # float32 result: 150 MB for a 512x512 layer, the peak of a ResNet-50 session's memory).
    step = max(1, (1 << 21) // max(1, c * t * t))
    for m0 in range(0, m, step):
        block = np.asarray(host[m0 : m0 + step], dtype=np.float64)  # (mb, c, 3, 3)
        a = np.tensordot(g, block, axes=(1, 2))  # (t, mb, c, 3)
        u_host[:, :, m0 : m0 + step] = np.tensordot(a, g, axes=(3, 1)).transpose(0, 3, 1, 2)  # (t, t, mb, c)
    return xp.asarray(u_host.reshape(t * t, m, c))


def _bias_augmented(xp: Any, w: Any, b: Any, cdt: np.dtype) -> Any:
    """[W | b] as (M, C + 1) for a 1x1 convolution; cached for read-only (constant) W and B."""

    def build() -> Any:
        m = w.shape[0]
        return xp.concatenate(
            [w.reshape(m, -1).astype(cdt, copy=False), b.reshape(m, 1).astype(cdt, copy=False)], axis=1
        )

    return derived((w, b), ("bias-augmented", np.dtype(cdt).str), build)


def _to_host(a: Any) -> Any:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a


def _winograd(xp: Any, x: Any, w: Any, begin: list[int], out: list[int], r: int, bias: Any, into: Any = None) -> Any:
    n, c = x.shape[:2]
    m = w.shape[0]
    oh, ow = out
    t, th, tw, hp, wp = winograd_cl.tile_grid(out, r)
    xpad = _zero_bordered(xp, "winograd-padded", x, begin, (hp, wp))
    u = _winograd_weights(xp, w, r)
    out_arr = xp.empty((n, m, oh, ow), dtype=x.dtype) if into is None else into
    # Bands of tile rows bound the transformed tiles (t*t values per input channel and tile) to
    # about _WINOGRAD_BAND_BYTES: whole, VGG's 64-channel 224x224 layer had 29 MB arrays, fresh
    # pages on every call (36 -> 25 ms in bands). Smaller layers run in one band.
    per_row = t * t * max(c, m) * n * tw * x.dtype.itemsize
    rows = max(1, _WINOGRAD_BAND_BYTES // per_row) if per_row * th > 4 * _WINOGRAD_BAND_BYTES else th
    for a0 in range(0, th, rows):
        a1 = min(th, a0 + rows)
        y0, y1 = r * a0, min(oh, r * a1)
        _winograd_band(xp, xpad[:, :, r * a0 : r * a1 + 2], u, r, bias, out_arr[:, :, y0:y1, :], ow)
    return out_arr


# Transformed-tile bytes per band of a large Winograd layer (see _winograd).
_WINOGRAD_BAND_BYTES = 4 << 20


def _temporary(xp: Any, key: str, shape: tuple[int, ...], dtype: Any) -> Any:
    """A kernel temporary: a reused per-thread buffer on the host (see _scratch.py)."""
    return scratch(key, shape, dtype) if xp is np else xp.empty(shape, dtype=dtype)


def _zero_bordered(xp: Any, key: str, x: Any, begin: list[int], size: tuple[int, int]) -> Any:
    """``x`` (N, C, H, W) copied into a zero-bordered (N, C, *size) temporary at ``begin``."""
    n, c, h, wd = x.shape
    hp, wp = size
    if xp is not np:
        pad = xp.zeros((n, c, hp, wp), dtype=x.dtype)
        pad[:, :, begin[0] : begin[0] + h, begin[1] : begin[1] + wd] = x
        return pad
    pad = scratch(key, (n, c, hp, wp), x.dtype)
    r0, r1, q0, q1 = begin[0], begin[0] + h, begin[1], begin[1] + wd
    pad[:, :, :r0] = 0
    pad[:, :, r1:] = 0
    pad[:, :, r0:r1, :q0] = 0
    pad[:, :, r0:r1, q1:] = 0
    pad[:, :, r0:r1, q0:q1] = x
    return pad


def _winograd_band(xp: Any, xpad: Any, u: Any, r: int, bias: Any, dst: Any, ow: int) -> None:
    """Winograd over the padded rows ``xpad`` (N, C, r*a + 2, Wp) into ``dst`` (N, M, rows, ow)."""
    n, c = xpad.shape[:2]
    m = u.shape[1]
    t = r + 2
    th, tw = (xpad.shape[2] - 2) // r, (xpad.shape[3] - 2) // r
    s = xpad.strides
    # tiles[i, j, c, n, a, b] = xpad[n, c, r*a + i, r*b + j]: gathered once into (t*t, C*N*T).
    tiles = _as_strided(xp, xpad, (t, t, c, n, th, tw), (s[2], s[3], s[1], s[0], r * s[2], r * s[3]))
    kin, kout = _transforms(r, np.dtype(xpad.dtype))
    dt = xpad.dtype
    count = n * th * tw
    gathered = _temporary(xp, "winograd-tiles", (t * t, c * count), dt)
    gathered.reshape(t, t, c, n, th, tw)[...] = tiles
    v = xp.matmul(xp.asarray(kin, dtype=dt), gathered, out=_temporary(xp, "winograd-v", (t * t, c * count), dt))
    prod = stacked_matmul(xp, u, v.reshape(t * t, c, count), out=_temporary(xp, "winograd-prod", (t * t, m, count), dt))
    y = xp.matmul(
        xp.asarray(kout, dtype=dt),
        prod.reshape(t * t, m * count),
        out=_temporary(xp, "winograd-y", (r * r, m * count), dt),
    )  # (r*r, M*N*T)
    # (i, j, M, N, a, b) -> (N, M, a, i, b, j): the output tiles in place, cropped to dst.
    rows = dst.shape[2]
    y = y.reshape(r, r, m, n, th, tw).transpose(3, 2, 4, 0, 5, 1).reshape(n, m, r * th, r * tw)[:, :, :rows, :ow]
    if bias is None:
        dst[...] = y
    else:
        xp.add(y, bias.reshape(1, m, 1, 1), out=dst)


def _depthwise(
    xp: Any, xpad: Any, w: Any, k: list[int], strides: list[int], dilations: list[int], out: list[int]
) -> Any:
    """One channel per group (strided or N-D; stride-1 2-D goes through the padded-width path):
    per-channel im2col, then one batched (1 x K) @ (K x positions) product per channel, which
    BLAS runs as a single pass over the columns."""
    n, c = xpad.shape[:2]
    nd = len(k)
    kk = math.prod(k)
    o = math.prod(out)
    view = windows_view(xp, xpad, k, strides, dilations, out)  # (N, C, *out, *k)
    perm = (1, *range(2 + nd, 2 + 2 * nd), 0, *range(2, 2 + nd))
    cols = view.transpose(perm).reshape(c, kk, n * o)
    y = xp.matmul(w.reshape(c, 1, kk), cols).reshape(c, n, *out)
    return xp.ascontiguousarray(xp.moveaxis(y, 0, 1))


def _im2col_gemm(
    xp: Any,
    xpad: Any,
    w: Any,
    k: list[int],
    strides: list[int],
    dilations: list[int],
    out: list[int],
    group: int,
    bias: Any = None,
    into: Any = None,
    channels_last: bool = False,
) -> Any:
    """Convolution as one GEMM per group over im2col columns; with ``bias`` (group 1 only) the
    columns get a row of ones and W the bias as a last column. For one image the GEMM writes
    ``into`` directly when given; with ``channels_last`` (group 1, bias, one image, no
    ``into``) it computes Y^T = cols^T [W | b]^T, the result channels-last."""
    n, c = xpad.shape[:2]
    nd = len(k)
    m = w.shape[0]
    cg, mg = c // group, m // group
    kk = math.prod(k)
    o = math.prod(out)
    view = windows_view(xp, xpad, k, strides, dilations, out)  # (N, C, *out, *k)
    # Columns ordered (C, *k) x (N, *out) to match W flattened as (M, C * prod(k)).
    perm = (1, *range(2 + nd, 2 + 2 * nd), 0, *range(2, 2 + nd))
    if bias is None:
        cols = view.transpose(perm).reshape(group, cg * kk, n * o)
        if into is not None and n == 1:
            xp.matmul(w.reshape(group, mg, cg * kk), cols, out=into.reshape(group, mg, o))
            return into
        y = xp.matmul(w.reshape(group, mg, cg * kk), cols)  # (group, Mg, N * O)
    else:
        cols = xp.empty((cg * kk + 1, n * o), dtype=xpad.dtype)
        if xp is np and nd == 2 and dilations == [1, 1] and kk >= 6 * math.prod(strides) > 6:
            _strided_columns(cols[:-1], xpad, k, strides, out)
        else:
            cols[:-1].reshape(view.transpose(perm).shape)[...] = view.transpose(perm)
        cols[-1] = 1
        if channels_last and n == 1 and into is None:
            yt = xp.matmul(cols.T, _bias_augmented(xp, w, bias, xpad.dtype).T)  # (O, M)
            return yt.reshape(1, *out, m).transpose(0, nd + 1, *range(1, nd + 1))
        if into is not None and n == 1:
            xp.matmul(_bias_augmented(xp, w, bias, xpad.dtype), cols, out=into.reshape(m, o))
            return into
        y = xp.matmul(_bias_augmented(xp, w, bias, xpad.dtype), cols)  # (M, N * O)
    y = y.reshape(m, n, *out)
    if n == 1:
        return y.reshape(1, m, *out)
    return xp.ascontiguousarray(xp.moveaxis(y, 1, 0))


def _strided_columns(dst: np.ndarray, xpad: np.ndarray, k: list[int], strides: list[int], out: list[int]) -> None:
    """The im2col columns of a strided 2-D convolution into ``dst`` (C * kh * kw, N * oh * ow),
    through the input's stride phases.

    Copied straight from the windows, every column row reads the input at the stride, a value
    at a time (ResNet-50's 7x7/2 stem: 1.85 M values, 0.6 ms). Split once into its sy * sx
    phases (the rows and columns congruent to (py, px) modulo the strides), the input holds
    each tap's window as a plain shifted block of one phase, so the column copies move whole
    runs of ow values: 0.6 -> 0.3 ms for that stem, the split included; AlexNet's 11x11/4 stem
    0.39 -> 0.28. The split is an extra pass over the input, which pays only where each input
    value lands in many columns (kh * kw >= 6 * sy * sx): 3x3/2 layers were 0-50% slower."""
    n, c, hp, wp = xpad.shape
    kh, kw = k
    sy, sx = strides
    oh, ow = out
    phases = np.empty((sy, sx, n, c, -(-hp // sy), -(-wp // sx)), dtype=xpad.dtype)
    cols = dst.reshape(c, kh, kw, n, oh, ow)
    for py in range(min(sy, kh)):
        for px in range(min(sx, kw)):
            src = xpad[:, :, py::sy, px::sx]
            phase = phases[py, px]
            phase[:, :, : src.shape[2], : src.shape[3]] = src
            # Tap (sy * a + py, sx * b + px) of output (r, q) reads phase row r + a, column q + b,
            # always within the part just filled (the windows stay inside xpad).
            s_n, s_c, s_h, s_w = phase.strides
            taps = strided_view(
                phase, (c, -(-(kh - py) // sy), -(-(kw - px) // sx), n, oh, ow), (s_c, s_h, s_w, s_n, s_h, s_w)
            )
            cols[:, py::sy, px::sx] = taps


@op("Conv", 1)
def conv(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
    into: Any = None,
) -> Any:
    """``into`` (not an ONNX attribute): an output buffer of the compute dtype, as conv_nd's,
    for a split run's band (runtime/split/bands.py)."""
    y = conv_nd(
        xp,
        X,
        W,
        B,
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
        ctx=ctx,
        into=into,
    )
    return y.astype(X.dtype, copy=False) if y.dtype != X.dtype else y
