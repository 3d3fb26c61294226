"""Pooling kernels on strided slices: one vectorized pass per kernel offset.

Each operator version whose attribute set changed gets its own thin registration so a model can
only pass the attributes its opset defines; they all share one implementation.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, NamedTuple

import numpy as np

from ._clamp import floor_at
from ._compat import check_alloc, host_ints
from ._layout import is_channels_last
from ._spatial import geometry, pad_input, window_slices, windows_view
from .registry import memoized, op


def _lowest(dtype: np.dtype) -> Any:
    if dtype.kind == "f" or not np.issubdtype(dtype, np.integer):
        return -np.inf
    return np.iinfo(dtype).min


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    """Accumulate sums of half-precision (and bfloat16) inputs in float32."""
    if dtype == np.float64 or dtype == np.float32:
        return np.dtype(dtype)
    return np.dtype(np.float32)


def _setup(
    x: Any,
    kernel_shape: list[int],
    strides: list[int] | None,
    dilations: list[int] | None,
    pads: list[int] | None,
    auto_pad: str,
    ceil_mode: int,
    ctx: Any = None,
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    """(begin, end, out, strides, dilations, kernel extents), checked; once per node and input
    shape (the node's memo), since it depends on nothing else."""
    key = (
        None
        if ctx is None
        else (
            x.shape,
            x.dtype,
            tuple(kernel_shape),
            None if strides is None else tuple(strides),
            None if dilations is None else tuple(dilations),
            None if pads is None else tuple(pads),
            auto_pad,
            ceil_mode,
        )
    )
    return memoized(  # type: ignore[no-any-return]
        ctx, key, lambda: _checked_setup(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, ctx)
    )


def _checked_setup(
    x: Any,
    kernel_shape: list[int],
    strides: list[int] | None,
    dilations: list[int] | None,
    pads: list[int] | None,
    auto_pad: str,
    ceil_mode: int,
    ctx: Any,
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    nd = x.ndim - 2
    if nd < 1:
        raise ValueError(f"pooling needs an input of rank >= 3, got shape {list(x.shape)}")
    kernel_shape = list(kernel_shape)
    if len(kernel_shape) != nd:
        raise ValueError(f"kernel_shape {kernel_shape} must have {nd} entries for input shape {list(x.shape)}")
    if any(k <= 0 for k in kernel_shape):
        raise ValueError(f"kernel_shape {kernel_shape} must be positive")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    begin, end, out = geometry(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    ext = [(k - 1) * d + 1 for k, d in zip(kernel_shape, dilations)]
    # Pads and kernel attributes size the padded copy and the output: check before allocating.
    padded = [*x.shape[:2], *(n + b + e + k for n, b, e, k in zip(x.shape[2:], begin, end, ext))]
    check_alloc(padded, x.dtype, ctx, "pooling (padded input)")
    check_alloc([*x.shape[:2], *out], x.dtype, ctx, "pooling (output)")
    return begin, end, out, strides, dilations, ext


def _no_windows(xp: Any, x: Any, out: list[int]) -> Any:
    """The empty result of a pool whose output has no window along some axis (ceil_mode on a
    map the kernel overhangs by less than a stride, as onnx's shape inference and onnxruntime
    give): the window loops would wrap their slices around instead."""
    return xp.empty((*x.shape[:2], *out), dtype=x.dtype)


def _axis_positions(
    axis: int, offset: int, begin: list[int], strides: list[int], dilations: list[int], out: list[int], nd: int
) -> np.ndarray:
    """Unpadded input coordinate along ``axis`` of the element under kernel ``offset``, per window."""
    pos = np.arange(out[axis], dtype=np.int64) * strides[axis] + offset * dilations[axis] - begin[axis]
    return pos.reshape((-1,) + (1,) * (nd - 1 - axis))


# -- MaxPool -------------------------------------------------------------------------------------


def _max_pool(
    xp: Any,
    x: Any,
    kernel_shape: list[int],
    strides: list[int] | None,
    dilations: list[int] | None,
    pads: list[int] | None,
    auto_pad: str,
    ceil_mode: int,
    storage_order: int,
    want_indices: bool,
    ctx: Any = None,
    floor: float | None = None,
) -> Any:
    """MaxPool; with ``floor`` max(MaxPool(x), floor) (FusedMaxPool's ReLU, floor 0), applied
    to each block of the result while it is in cache."""
    begin, end, out, strides, dilations, ext = _setup(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, ctx
    )
    if 0 in out:
        y = _no_windows(xp, x, out)
        return (y, xp.empty(y.shape, dtype=np.int64)) if want_indices else y
    nd = x.ndim - 2
    if not want_indices:
        y = _separable_clipped(xp, x, kernel_shape, strides, dilations, begin, out, xp.maximum, floor)
        if y is not None:
            return y
    xpad = pad_input(xp, x, begin, end, out, ext, strides, _lowest(x.dtype))
    offsets_all = list(itertools.product(*(range(k) for k in kernel_shape)))
    if not want_indices:
        y = _separable(xp, xpad, kernel_shape, strides, dilations, out, xp.maximum)
        return y if floor is None else floor_at(xp, y, floor, out=y)
    # With Indices: the first maximal element in kernel order wins (strict '>'); padded
    # positions never win, which only depends on positions, so it is tracked on the host.
    key = ("indices", x.shape, storage_order)
    geo = memoized(
        ctx, key, lambda: _index_geometry(x.shape, kernel_shape, begin, strides, dilations, out, storage_order)
    )
    if xp is np and not (x.dtype.kind in "fc" and np.isnan(x).any()):
        return _max_pool_argmax(x, xpad, kernel_shape, strides, dilations, out, geo)
    # Tap by tap (NaN inputs, device arrays): a NaN wins only as a window's first element.
    n, c = x.shape[:2]
    base = (np.arange(n * c, dtype=np.int64) * math.prod(x.shape[2:])).reshape((n, c) + (1,) * nd)
    y = xp.full((n, c, *out), _lowest(x.dtype), dtype=x.dtype)
    idx = xp.zeros((n, c, *out), dtype=np.int64)
    seen = np.zeros(out, dtype=bool)
    for t, offsets in enumerate(offsets_all):
        valid = geo.valid[:, t].reshape(out)
        if not valid.any():
            continue
        v = xpad[window_slices(offsets, dilations, strides, out)]
        first = xp.asarray(valid & ~seen)
        better = ((v > y) & xp.asarray(valid)) | first
        y = xp.where(better, v, y)
        idx = xp.where(better, xp.asarray(base + geo.flat[:, t].reshape(out)), idx)
        seen |= valid
    return y, idx


class _IndexGeometry(NamedTuple):
    """Per output position p and kernel tap t (kernel order) of a MaxPool with Indices: the
    flat spatial index under the tap (in the storage order), whether it is inside the input,
    and the first tap inside it (0 where none is)."""

    flat: np.ndarray  # (P, K) int64
    valid: np.ndarray  # (P, K) bool
    any_padded: bool
    first_valid: np.ndarray  # (P,) int64
    none_valid: np.ndarray | None  # (P,) bool, None when every window holds an input element


def _index_geometry(
    shape: tuple[int, ...],
    kernel_shape: list[int],
    begin: list[int],
    strides: list[int],
    dilations: list[int],
    out: list[int],
    storage_order: int,
) -> _IndexGeometry:
    nd = len(shape) - 2
    spatial = shape[2:]
    taps = list(itertools.product(*(range(k) for k in kernel_shape)))
    flat = np.zeros((math.prod(out), len(taps)), dtype=np.int64)
    valid = np.ones_like(flat, dtype=bool)
    for t, offsets in enumerate(taps):
        coords = [_axis_positions(a, offsets[a], begin, strides, dilations, out, nd) for a in range(nd)]
        inside = np.ones([1] * nd, dtype=bool)
        for a in range(nd):
            inside = inside & (coords[a] >= 0) & (coords[a] < spatial[a])
        f = np.zeros([1] * nd, dtype=np.int64)
        for a in range(nd) if storage_order == 0 else reversed(range(nd)):
            f = f * spatial[a] + coords[a]
        flat[:, t] = np.broadcast_to(f, out).reshape(-1)
        valid[:, t] = np.broadcast_to(inside, out).reshape(-1)
    any_valid = valid.any(axis=1)
    return _IndexGeometry(flat, valid, not valid.all(), valid.argmax(axis=1), None if any_valid.all() else ~any_valid)


def _max_pool_argmax(
    x: np.ndarray,
    xpad: np.ndarray,
    kernel_shape: list[int],
    strides: list[int],
    dilations: list[int],
    out: list[int],
    geo: _IndexGeometry,
) -> tuple[np.ndarray, np.ndarray]:
    """MaxPool with Indices as one argmax over every window's taps (the tap-by-tap loop below
    made about ten numpy calls a tap: 0.6 ms for a 2x2 map). argmax picks the first maximum in
    kernel order, as the loop's strict '>' does; where that is a padded tap, every element
    of the window equals the padding's lowest value and the first tap inside wins. Inputs with
    NaN keep the loop, which lets a NaN win only as a window's first element."""
    n, c = x.shape[:2]
    positions, k = geo.flat.shape
    windows = windows_view(np, xpad, kernel_shape, strides, dilations, out).reshape(n * c, positions, k)
    arg = windows.argmax(axis=-1)  # (n*c, P)
    y = np.take_along_axis(windows, arg[..., None], axis=-1)[..., 0]
    rows = np.arange(positions)
    if geo.any_padded:
        arg = np.where(geo.valid[rows, arg], arg, geo.first_valid)
    idx = geo.flat[rows, arg]
    idx += (np.arange(n * c, dtype=np.int64) * math.prod(x.shape[2:]))[:, None]
    if geo.none_valid is not None:
        idx[:, geo.none_valid] = 0
    return y.reshape(n, c, *out), idx.reshape(n, c, *out)


@op("MaxPool", 1)
def max_pool_1(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    return _max_pool(xp, X, kernel_shape, strides, None, pads, auto_pad, 0, 0, False, ctx=ctx)


@op("MaxPool", 8)
def max_pool_8(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    kernel_shape: list[int],
    pads: list[int] | None = None,
    storage_order: int = 0,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    want = ctx is not None and ctx.n_outputs > 1 and ctx.outputs_used[1]
    return _max_pool(xp, X, kernel_shape, strides, None, pads, auto_pad, 0, storage_order, want, ctx=ctx)


@op("MaxPool", 10)
def max_pool(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    storage_order: int = 0,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    want = ctx is not None and ctx.n_outputs > 1 and ctx.outputs_used[1]
    return _max_pool(xp, X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, storage_order, want, ctx=ctx)


# -- AveragePool / LpPool ------------------------------------------------------------------------


def _separable(
    xp: Any, xpad: Any, kernel: list[int], strides: list[int], dilations: list[int], out: list[int], combine: Any
) -> Any:
    """Reduce rectangular windows one spatial axis at a time (max and sum are separable):
    sum(k) passes over shrinking arrays instead of prod(k) passes over the output."""
    cur = xpad
    for a, (k, s, d, o) in enumerate(zip(kernel, strides, dilations, out)):
        idx: list[slice] = [slice(None)] * xpad.ndim
        idx[2 + a] = slice(0, (o - 1) * s + 1, s)
        acc = cur[tuple(idx)].copy()
        for offset in range(1, k):
            idx[2 + a] = slice(offset * d, offset * d + (o - 1) * s + 1, s)
            combine(acc, cur[tuple(idx)], out=acc)
        cur = acc
    return cur


@functools.lru_cache(maxsize=1024)
def _tap_ranges(n: int, k: int, s: int, d: int, b: int, o: int) -> tuple[tuple[int, int], ...]:
    """Per kernel tap j, the output positions [lo, hi) whose window puts tap j inside the
    unpadded input (input index q*s - b + j*d within [0, n))."""
    ranges = []
    for j in range(k):
        off = j * d - b
        lo = -(off // s) if off < 0 else 0
        hi = min(o, (n - 1 - off) // s + 1) if n - 1 - off >= 0 else 0
        lo = min(lo, o)
        ranges.append((lo, max(lo, hi)))
    return tuple(ranges)


def _separable_clipped(
    xp: Any,
    x: Any,
    kernel: list[int],
    strides: list[int],
    dilations: list[int],
    begin: list[int],
    out: list[int],
    combine: Any,
    floor: float | None = None,
) -> Any:
    """Window max / sum one axis at a time, straight from the unpadded input: a tap that falls in
    the padding is skipped for those windows, which for max (padding is -inf) and sum (padding is
    0) is what padding would have given. This saves the padded copy, the largest array of the
    padded way, and starts each axis with a two-tap combine instead of a copy.

    Needs, per axis, one tap inside the input for every window (true unless pads exceed the
    kernel's reach, as ceil_mode can make them); returns None otherwise. What to do is planned
    once per geometry (``_clipped_plan``): a small pool is mostly Python around its ~10 numpy
    calls, and a plan replays them from prepared index tuples. ``floor``: the result is
    max(result, floor) (max pools only)."""
    # Channels-last input (a depthwise or channels-last 1x1 result): pooled in its own memory
    # order, (N, H, W, C) with the spatial axes first, and returned channels-last.
    channels_last = xp is np and is_channels_last(x)
    src = x.transpose(0, 2, 3, 1) if channels_last else x
    plan = _clipped_plan(
        tuple(src.shape),
        x.dtype.itemsize,
        xp is np and src.flags.c_contiguous,
        xp is np,
        tuple(kernel),
        tuple(strides),
        tuple(dilations),
        tuple(begin),
        tuple(out),
        1 if channels_last else 2,
        _current_limits(),
    )
    if plan is None:
        return None
    if isinstance(plan, _BlockedPlan):
        return _run_blocked(x, plan, combine, floor)
    if isinstance(plan, _ChannelBlocks):
        return _run_channel_blocks(x, plan, out, combine, floor)
    cur = src
    for p in plan:
        cur = _run_pass(xp, cur, p, combine)
    if floor is not None:
        floor_at(xp, cur, floor, out=cur)
    return cur.transpose(0, 3, 1, 2) if channels_last else cur


class _AxisTaps(NamedTuple):
    """One axis of a window reduction: per tap the windows [lo, hi) where it is inside the
    input, a tap inside for every window (``base``), the other taps inside for some, and the
    kernel size, stride, dilation, begin padding and output size along the axis."""

    ranges: tuple[tuple[int, int], ...]
    base: int
    others: tuple[int, ...]
    k: int
    s: int
    d: int
    b: int
    o: int


# One step of a pass: (kind, destination index, first source index, second source index).
# Kind 0 copies src[a] to dst[d], 1 writes combine(src[a], src[b]) to dst[d], 2 combines src[b]
# into dst[d].
_Step = tuple[int, tuple[slice | int, ...], tuple[slice | int, ...] | None, tuple[slice | int, ...] | None]


class _PassPlan(NamedTuple):
    """One axis's pass, ready to replay. ``kind``: "axis" (``steps`` over the arrays, strided
    views along the axis), "flat" (``steps`` over the flattened arrays) or "subsampled"
    (``steps`` from the flattened input into a line, then every s-th position gathered:
    ``gather`` = (rows, outputs per row, row length, stride, values per position)). ``edges``
    then recompute, on the arrays, the positions where a flat pass read across the axis's
    ends."""

    kind: str
    shape: tuple[int, ...]
    steps: tuple[_Step, ...]
    edges: tuple[_Step, ...] = ()
    gather: tuple[int, int, int, int, int] | None = None


class _BlockedPlan(NamedTuple):
    """Both axes' strided passes, replayed on ``per_block`` channels of one image at a time
    (``_run_blocked``)."""

    first: tuple[_Step, ...]
    second: tuple[_Step, ...]
    per_block: int
    out: tuple[int, int]
    #: the second (innermost) axis's pass as the subsampled flat one, for a full block and for
    #: the last (shorter) one, where that applies (strided windows of 3+ taps: 7-12% faster
    #: than the strided steps); None where it does not
    subsampled: _PassPlan | None
    subsampled_last: _PassPlan | None
    #: the same for the first (rows) axis, on a contiguous input; None where it does not apply
    first_subsampled: _PassPlan | None = None
    first_subsampled_last: _PassPlan | None = None


class _ChannelBlocks(NamedTuple):
    """A stride-1 2-D reduction replayed on ``per_block`` whole channels of one image at a
    time (``_run_channel_blocks``): ``full`` the passes of a full block, ``last`` those of the
    last, shorter one (``full`` again where the blocks divide the channels)."""

    per_block: int
    full: tuple[_PassPlan, ...]
    last: tuple[_PassPlan, ...]


# A 2-D window reduction over more than this many bytes runs a block of planes at a time, each
# block's passes in L2: a whole-array pass runs from L3 at about 25 GB/s on the benchmark
# machine, a pass over 256 KB in L2 at about 57. SqueezeNet's first 3x3/2 max pool (64x111x111)
# takes 660 us this way against 820 through whole-array passes; each model run alone, SqueezeNet
# ran 9% faster, Inception v1/v2 6-8%, ResNet-50 3% (in the benchmark's run of every model the
# effect is within noise: docs/benchmark.md, the fourth night).
_BLOCKED_MIN_BYTES = 1 << 20
_BLOCK_BYTES = 512 << 10

# Stride-1 2-D reductions over more than this many bytes run a block of whole channels at a
# time: a block of an NCHW image is one contiguous run, so each block takes the flat passes
# (long contiguous loops) while its array and the temporaries stay in L2. Strided views of a
# whole block (the plane blocks above) cut every pass into loops one row long, which for a
# stride-1 pool costs more than the cache saves: 3x3/1 max pools on 288x35x35 815 -> 283 us,
# 480x28x28 861 -> 310, 832x28x28 1487 -> 528 (whole-array flat passes: 453, 544, ...; Xeon,
# 2 MB L2, measured alone, hot). Below about 1 MB the whole-array passes are as
# fast (0.6-0.9 MB: within 5%); at 1.0 MB (Inception v2's 320x28x28) blocks gain 254 -> 200.
_CHANNEL_BLOCKED_MIN_BYTES = 960 << 10
_CHANNEL_BLOCK_BYTES = 512 << 10

# The subsampled pass moves twice the elements: it pays while they stay in L2. In-model,
# light SqueezeNet's 96x54x109 (2.2 MB) pass made the model 19% slower.
_SUBSAMPLED_MAX_BYTES = 1 << 20


class _Limits(NamedTuple):
    """The byte limits above as a call read them: part of a plan's cache key, so that changed
    limits (a test, benchmarks/knob_ab.py) are never answered from a plan made under others."""

    blocked_min: int
    block: int
    channel_blocked_min: int
    channel_block: int
    subsampled_max: int


def _current_limits() -> _Limits:
    return _Limits(
        _BLOCKED_MIN_BYTES, _BLOCK_BYTES, _CHANNEL_BLOCKED_MIN_BYTES, _CHANNEL_BLOCK_BYTES, _SUBSAMPLED_MAX_BYTES
    )


@functools.lru_cache(maxsize=1024)
def _clipped_plan(
    shape: tuple[int, ...],
    itemsize: int,
    contiguous: bool,
    host: bool,
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    begin: tuple[int, ...],
    out: tuple[int, ...],
    first: int,
    limits: _Limits,
) -> _BlockedPlan | _ChannelBlocks | tuple[_PassPlan, ...] | None:
    """How ``_separable_clipped`` reduces an input of ``shape`` whose spatial axes start at
    ``first`` (2 for NCHW, 1 for channels-last NHWC): per axis the cheapest pass that applies
    (subsampled, flat, else strided views); for large 2-D NCHW host inputs those passes on
    blocks of whole channels (stride 1) or the plane-blocked form (strided windows); None
    where some window has no tap inside the input."""
    axes = []
    for a, n in enumerate(shape[first : first + len(kernel)]):
        ranges = _tap_ranges(n, kernel[a], strides[a], dilations[a], begin[a], out[a])
        full = [j for j, (lo, hi) in enumerate(ranges) if (lo, hi) == (0, out[a])]
        if not full:
            return None
        others = tuple(j for j in range(kernel[a]) if j != full[0] and ranges[j][0] < ranges[j][1])
        axes.append(_AxisTaps(ranges, full[0], others, kernel[a], strides[a], dilations[a], begin[a], out[a]))
    plane_bytes = math.prod(shape[2:]) * itemsize
    if (
        host
        and first == 2
        and len(shape) == 4
        and all(st == 1 for st in strides)
        and math.prod(shape) * itemsize > limits.channel_blocked_min
        and shape[1] > (per_block := max(1, limits.channel_block // max(1, plane_bytes)))
    ):
        last = shape[1] % per_block or per_block
        taps = tuple(axes)
        full = _passes((1, per_block, *shape[2:]), itemsize, contiguous, host, taps, first, limits.subsampled_max)
        if last != per_block:
            return _ChannelBlocks(
                per_block,
                full,
                _passes((1, last, *shape[2:]), itemsize, contiguous, host, taps, first, limits.subsampled_max),
            )
        return _ChannelBlocks(per_block, full, full)
    if host and first == 2 and len(shape) == 4 and math.prod(shape) * itemsize > limits.blocked_min:
        per_block = max(1, limits.block // max(1, shape[2] * shape[3] * itemsize))
        last = shape[1] % per_block or min(shape[1], per_block)

        def subsampled(planes: int) -> _PassPlan | None:
            return _subsampled_plan((1, planes, out[0], shape[3]), itemsize, True, 3, axes[1], limits.subsampled_max)

        def first_subsampled(planes: int) -> _PassPlan | None:
            return _subsampled_plan((1, planes, *shape[2:]), itemsize, contiguous, 2, axes[0], limits.subsampled_max)

        return _BlockedPlan(
            _axis_steps(axes[0], 2),
            _axis_steps(axes[1], 3),
            per_block,
            (out[0], out[1]),
            subsampled(min(shape[1], per_block)),
            subsampled(last),
            first_subsampled(min(shape[1], per_block)),
            first_subsampled(last),
        )
    return _passes(shape, itemsize, contiguous, host, tuple(axes), first, limits.subsampled_max)


def _passes(
    shape: tuple[int, ...],
    itemsize: int,
    contiguous: bool,
    host: bool,
    axes: tuple[_AxisTaps, ...],
    first: int,
    subsampled_max: int,
) -> tuple[_PassPlan, ...]:
    """Per axis the cheapest pass that applies to an input of ``shape``: subsampled (on arrays
    of at most ``subsampled_max`` bytes), flat, else strided views."""
    passes = []
    cur = shape
    for a, taps in enumerate(axes):
        p = None
        axis = first + a
        if taps.others and host:
            # Rows subsampled only in NCHW: channels-last rows are long runs already.
            rows = axis == len(cur) - 1 or first == 2
            sub = _subsampled_plan(cur, itemsize, contiguous, axis, taps, subsampled_max) if rows else None
            p = sub or _flat_plan(cur, contiguous, axis, taps)
        if p is None:
            p = _PassPlan("axis", _shape_along(cur, axis, taps.o), _axis_steps(taps, axis))
        passes.append(p)
        cur, contiguous = p.shape, True  # each pass's result is a fresh C-contiguous array
    return tuple(passes)


def _shape_along(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]:
    return (*shape[:axis], size, *shape[axis + 1 :])


def _run_pass(xp: Any, x: Any, plan: _PassPlan, combine: Any, acc: Any = None) -> Any:
    """One pass of ``x`` into a fresh array, or into ``acc`` (C-contiguous, plan.shape)."""
    if acc is None:
        acc = xp.empty(plan.shape, dtype=x.dtype)
    if plan.kind == "axis":
        _run_steps(x, acc, plan.steps, combine)
        return acc
    src = x.reshape(-1)
    if plan.kind == "flat":
        _run_steps(src, acc.reshape(-1), plan.steps, combine)
    else:
        _run_subsampled(x, acc, plan, np.empty(src.size, dtype=x.dtype), combine)
        return acc
    _run_steps(x, acc, plan.edges, combine)
    return acc


def _run_subsampled(x: np.ndarray, acc: np.ndarray, plan: _PassPlan, line: np.ndarray, combine: Any) -> None:
    """A "subsampled" pass of contiguous ``x`` into contiguous ``acc``, through ``line`` (at
    least x.size values): every tap combined at stride 1, then every s-th position kept, then
    the edge positions recomputed."""
    src = x.reshape(-1)
    work = line[: src.size]
    _run_steps(src, work, plan.steps, combine)
    # Flat position (row * n + q * s) * inner + i now holds the window of output q in that row.
    rows, o, n, s, inner = plan.gather  # type: ignore[misc]
    item = work.itemsize
    if inner == 1:
        acc.reshape(rows, o)[...] = np.ndarray((rows, o), x.dtype, work, 0, (n * item, s * item))
    else:
        acc.reshape(rows, o, inner)[...] = np.ndarray(
            (rows, o, inner), x.dtype, work, 0, (n * inner * item, s * inner * item, item)
        )
    _run_steps(x, acc, plan.edges, combine)


def _run_blocked(x: np.ndarray, plan: _BlockedPlan, combine: Any, floor: float | None = None) -> np.ndarray:
    """Both strided passes on one block of channels of one image at a time, the second writing
    straight into the result (then max(block, floor) with a floor)."""
    n, c, h, w = x.shape
    per_block = plan.per_block
    y = np.empty((n, c, *plan.out), dtype=x.dtype)
    mid = np.empty((1, min(c, per_block), plan.out[0], w), dtype=x.dtype)
    # The flat line holds a block's rows pass at stride 1 (h rows) where that pass is subsampled.
    flat_rows = h if plan.first_subsampled or plan.first_subsampled_last else plan.out[0]
    line = np.empty(min(c, per_block) * flat_rows * w, dtype=x.dtype)
    for i in range(n):
        for c0 in range(0, c, per_block):
            block = (slice(i, i + 1), slice(c0, c0 + per_block))
            m = mid[:, : min(c, c0 + per_block) - c0]
            first = plan.first_subsampled if c0 + per_block < c else plan.first_subsampled_last
            if first is None:
                _run_steps(x[block], m, plan.first, combine)
            else:
                _run_subsampled(x[block], m, first, line, combine)
            dst = y[block]
            sub = plan.subsampled if c0 + per_block < c else plan.subsampled_last
            if sub is None:
                _run_steps(m, dst, plan.second, combine)
            else:
                _run_subsampled(m, dst, sub, line, combine)
            if floor is not None:
                floor_at(np, dst, floor, out=dst)
    return y


def _run_channel_blocks(
    x: np.ndarray, plan: _ChannelBlocks, out: list[int], combine: Any, floor: float | None = None
) -> np.ndarray:
    """The passes on ``plan.per_block`` channels of one image at a time, the last pass of each
    block writing straight into its channels of the result (then max(block, floor) with a
    floor, while the block is in cache)."""
    n, c = x.shape[:2]
    y = np.empty((n, c, *out), dtype=x.dtype)
    for i in range(n):
        for c0 in range(0, c, plan.per_block):
            c1 = min(c, c0 + plan.per_block)
            passes = plan.full if c1 - c0 == plan.per_block else plan.last
            cur = x[i : i + 1, c0:c1]
            for p in passes[:-1]:
                cur = _run_pass(np, cur, p, combine)
            dst = y[i : i + 1, c0:c1]  # whole channels of one image: C-contiguous
            _run_pass(np, cur, passes[-1], combine, dst)
            if floor is not None:
                floor_at(np, dst, floor, out=dst)
    return y


def _run_steps(src: Any, dst: Any, steps: tuple[_Step, ...], combine: Any) -> None:
    for kind, d, a, b in steps:
        if kind == 0:
            dst[d] = src[a]
        elif kind == 1:
            combine(src[a], src[b], out=dst[d])
        else:
            part = dst[d]
            combine(part, src[b], out=part)


@functools.lru_cache(maxsize=1024)
def _axis_steps(taps: _AxisTaps, axis: int) -> tuple[_Step, ...]:
    """One axis's pass by strided views: the base tap (inside the input for every window)
    combined with each other tap over the windows where that tap is inside too."""
    ranges, base, others, _k, s, d, b, o = taps
    lead = (slice(None),) * axis

    def view(j: int, lo: int, hi: int) -> tuple[slice, ...]:
        start = lo * s - b + j * d
        return (*lead, slice(start, start + (hi - lo - 1) * s + 1, s))

    def part(lo: int, hi: int) -> tuple[slice, ...]:
        return (*lead, slice(lo, hi))

    if not others:
        return ((0, part(0, o), view(base, 0, o), None),)
    # The widest other tap combines with the base tap straight into acc; windows outside its
    # range take the base tap alone.
    first = max(others, key=lambda j: ranges[j][1] - ranges[j][0])
    lo, hi = ranges[first]
    steps: list[_Step] = [(1, part(lo, hi), view(base, lo, hi), view(first, lo, hi))]
    if lo > 0:
        steps.append((0, part(0, lo), view(base, 0, lo), None))
    if hi < o:
        steps.append((0, part(hi, o), view(base, hi, o), None))
    for j in others:
        if j != first:
            lo, hi = ranges[j]
            steps.append((2, part(lo, hi), None, view(j, lo, hi)))
    return tuple(steps)


@functools.lru_cache(maxsize=1024)
def _flat_plan(shape: tuple[int, ...], contiguous: bool, axis: int, taps: _AxisTaps) -> _PassPlan | None:
    """One axis's pass over the whole array as a single flat line, so each combine is one long
    contiguous (or evenly strided) loop: numpy runs those several times faster than the short
    per-row loops of a sliced view. A tap then reads across the ends of the axis (into the
    neighbouring row or plane), so the few edge positions where some tap lies in the padding
    are recomputed exactly afterwards.

    Needs x contiguous, and output position p along the flat line to read input s*p + offset:
    on the innermost axis that holds when the windows tile each row (o * s == n), on an outer
    axis when the pass keeps the size at stride 1. None otherwise."""
    ranges, base, others, k, s, d, b, o = taps
    n = shape[axis]
    inner = math.prod(shape[axis + 1 :])
    size = math.prod(shape)
    if not contiguous or size == 0 or not others:
        return None
    if inner == 1:
        if o * s != n:
            return None
    elif s != 1 or o != n:
        return None
    out_shape = _shape_along(shape, axis, o)
    total = math.prod(out_shape)

    def span(j: int) -> tuple[int, int]:
        # Flat outputs p whose tap j (input s*p + off) stays inside the flat input.
        off = (j * d - b) * inner
        p0 = min(total, -(off // s)) if off < 0 else 0
        p1 = min(total, (size - 1 - off) // s + 1)
        return p0, max(p0, p1)

    def tap(j: int, p0: int, p1: int) -> tuple[slice]:
        start = s * p0 + (j * d - b) * inner
        return (slice(start, start + (p1 - p0 - 1) * s + 1, s),)

    if span(base) != (0, total):
        return None
    lo, hi = span(others[0])
    steps: list[_Step] = [(1, (slice(lo, hi),), tap(base, lo, hi), tap(others[0], lo, hi))]
    if lo > 0:
        steps.append((0, (slice(0, lo),), tap(base, 0, lo), None))
    if hi < total:
        steps.append((0, (slice(hi, total),), tap(base, hi, total), None))
    for j in others[1:]:
        lo, hi = span(j)
        steps.append((2, (slice(lo, hi),), None, tap(j, lo, hi)))
    return _PassPlan("flat", out_shape, tuple(steps), _edge_steps(taps, axis))


@functools.lru_cache(maxsize=1024)
def _subsampled_plan(
    shape: tuple[int, ...], itemsize: int, contiguous: bool, axis: int, taps: _AxisTaps, max_bytes: int
) -> _PassPlan | None:
    """The pass along the innermost axis or the one before it (rows) for strided windows of 3
    taps or more: every tap combined at stride 1 over the whole array as one flat line
    (contiguous loops, which numpy runs with SIMD), then every s-th position (row) kept,
    instead of one strided loop per tap (per row). Twice the elements per combine, but
    measured 5-25% faster on 3x3/2 max pools (64x112x112: 800 -> 595 us); slower for 2-tap
    windows, which keep the strided form. Positions whose window
    crosses the axis's ends are recomputed (``_edge_steps``). None where it does not apply,
    including arrays over ``max_bytes`` (_SUBSAMPLED_MAX_BYTES)."""
    ranges, base, others, k, s, d, b, o = taps
    total = math.prod(shape)
    if axis < len(shape) - 2 or s == 1 or k < 3 or not contiguous or not 0 < total * itemsize <= max_bytes:
        return None
    n = shape[axis]
    # On the rows axis (second to last) a tap is a shift by whole rows, and every s-th row is
    # kept: the strided form's loops are one row long (55-112 values for the pools that matter),
    # where numpy's per-loop cost outweighs the doubled elements (64x111x111 3x3/2: 740 -> 550
    # us). Outputs are then rows of ``inner`` values.
    inner = math.prod(shape[axis + 1 :])
    offsets = [(j * d - b) * inner for j in (base, *others)]
    p0, p1 = max(0, -min(offsets)), total - max(0, max(offsets))  # every tap inside src
    if p1 <= p0:
        return None
    span = (slice(p0, p1),)
    steps: list[_Step] = [
        (1, span, (slice(p0 + offsets[0], p1 + offsets[0]),), (slice(p0 + offsets[1], p1 + offsets[1]),))
    ]
    steps += [(2, span, None, (slice(p0 + off, p1 + off),)) for off in offsets[2:]]
    return _PassPlan(
        "subsampled",
        _shape_along(shape, axis, o),
        tuple(steps),
        _edge_steps(taps, axis),
        (total // (n * inner), o, n, s, inner),
    )


def _edge_steps(taps: _AxisTaps, axis: int) -> tuple[_Step, ...]:
    """Steps recomputing the output positions along ``axis`` where some tap lies outside the
    input (a flat pass read across the axis's ends there) from the taps really inside."""
    ranges, _base, others, k, s, d, b, o = taps
    edges = sorted({q for j in others for q in (*range(0, ranges[j][0]), *range(ranges[j][1], o))})
    lead = (slice(None),) * axis
    steps: list[_Step] = []
    for q in edges:
        taps_in = [(*lead, q * s - b + j * d) for j in range(k) if ranges[j][0] <= q < ranges[j][1]]
        if len(taps_in) == 1:
            steps.append((0, (*lead, q), taps_in[0], None))
            continue
        # The first two taps combine straight into the output (no copy first).
        steps.append((1, (*lead, q), taps_in[0], taps_in[1]))
        steps += [(2, (*lead, q), None, t) for t in taps_in[2:]]
    return tuple(steps)


@functools.lru_cache(maxsize=256)
def _reciprocal_counts(key: tuple[Any, ...], dtype: str) -> np.ndarray:
    """1 / window count per output position; a window entirely in padding (possible only with
    ceil_mode) averages to 0, not NaN."""
    count = _window_counts_cached(*key)
    r = (1.0 / np.maximum(count, 1)).astype(dtype)
    r.flags.writeable = False
    return r


@functools.lru_cache(maxsize=256)
def _window_counts_cached(
    spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    begin: tuple[int, ...],
    end: tuple[int, ...],
    out: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    include_pad: int,
) -> np.ndarray | None:
    counts = _window_counts(
        spatial, list(kernel), list(begin), list(end), list(out), list(strides), list(dilations), [], include_pad
    )
    if counts is not None:
        counts.flags.writeable = False
    return counts


def _window_counts(
    spatial: tuple[int, ...],
    kernel: list[int],
    begin: list[int],
    end: list[int],
    out: list[int],
    strides: list[int],
    dilations: list[int],
    ext: list[int],
    include_pad: int,
) -> np.ndarray | None:
    """Per-window element counts (None when every window holds the full kernel).

    Counted per axis and multiplied: a window is a product of per-axis index sets."""
    nd = len(spatial)
    full = True
    counts = np.ones([1] * nd, dtype=np.float64)
    for a, (n, b, e, o, k, s, d) in enumerate(zip(spatial, begin, end, out, kernel, strides, dilations)):
        hi = n + b + e if include_pad else n + b
        lo = 0 if include_pad else b
        starts = np.arange(o) * s
        taps = starts[:, None] + np.arange(k)[None, :] * d  # padded coordinates
        c = ((taps >= lo) & (taps < hi)).sum(axis=1).astype(np.float64)
        if np.any(c != k):
            full = False
        counts = counts * c.reshape((-1,) + (1,) * (nd - 1 - a))
    return None if full else counts


def _sum_pool(
    xp: Any,
    x: Any,
    kernel_shape: list[int],
    strides: list[int],
    dilations: list[int],
    begin: list[int],
    end: list[int],
    out: list[int],
    ext: list[int],
    power: int | None,
) -> Any:
    """Window sums in the accumulation dtype (of |x|**power when given)."""
    acc = _acc_dtype(x.dtype)
    src = x.astype(acc, copy=False)
    if power is not None:
        src = xp.abs(src) if power == 1 else (src * src if power == 2 else xp.abs(src) ** acc.type(power))
    summed = _separable_clipped(xp, src, kernel_shape, strides, dilations, begin, out, xp.add)
    if summed is not None:
        return summed
    xpad = pad_input(xp, src, begin, end, out, ext, strides, 0)
    return _separable(xp, xpad, kernel_shape, strides, dilations, out, xp.add)


def _average_pool(
    xp: Any,
    x: Any,
    kernel_shape: list[int],
    strides: list[int] | None,
    dilations: list[int] | None,
    pads: list[int] | None,
    auto_pad: str,
    ceil_mode: int,
    count_include_pad: int,
    ctx: Any = None,
    products: bool = True,
) -> Any:
    """AveragePool. With ``products`` False the windows are summed by numpy's passes on every
    device, never inside a BLAS product (_tiled_mean, _small_map_mean), whose order of additions
    is BLAS's: the same rounding wherever it runs, which QLinearAveragePool needs, as its
    rounding to integers turns a last-bit difference at a tie into a step."""
    begin, end, out, strides, dilations, ext = _setup(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, ctx
    )
    if 0 in out:
        return _no_windows(xp, x, out)
    whole = _whole_map_mean(xp, x, kernel_shape, dilations, begin, out, count_include_pad)
    if whole is not None:
        return whole
    tiled = _tiled_mean(xp, x, kernel_shape, strides, dilations, begin, out) if products else None
    if tiled is not None:
        return tiled
    key = (
        tuple(x.shape[2:]),
        tuple(kernel_shape),
        tuple(begin),
        tuple(end),
        tuple(out),
        tuple(strides),
        tuple(dilations),
        int(count_include_pad),
    )
    small = _small_map_mean(xp, x, key, tuple(ext)) if products else None
    if small is not None:
        return small
    return _window_mean(xp, x, key, ext)


def _window_mean(xp: Any, x: Any, key: tuple[Any, ...], ext: list[int]) -> Any:
    """The average pool described by ``key`` (see _average_pool) as window sums, then each
    divided by its count."""
    _, kernel_shape, begin, end, out, strides, dilations, _ = key
    total = _sum_pool(
        xp, x, list(kernel_shape), list(strides), list(dilations), list(begin), list(end), list(out), ext, None
    )
    return _divided_by_counts(xp, total, key).astype(x.dtype, copy=False)


def _divided_by_counts(xp: Any, total: Any, key: tuple[Any, ...]) -> Any:
    """Window sums ``total`` divided, in place, by their windows' counts."""
    if _window_counts_cached(*key) is None:
        total /= total.dtype.type(math.prod(key[1]))
    else:
        # Multiplying by cached reciprocals is a cheaper pass than dividing (<= 1 ulp apart).
        total *= xp.asarray(_reciprocal_counts(key, total.dtype.str))
    return total


# Input positions times output positions (per channel) up to which an average pool on a small
# map runs as one product with its (positions x outputs) matrix (_small_map_mean): Inception
# v2's 3x3/1 pool on 128x7x7 (2,401) 70 -> 46 us in the model, ShuffleNet's 3x3/2 on 272x14x14
# (9,604) 96 -> 64. At 14x14 stride 1 (38,416) the model's pools came out 15 us faster on 96
# channels and 15 us slower on 128 (knob_ab.py); at 28x28 the product is 3-5x slower alone.
_SMALL_MAP_MEAN_MAX_ENTRIES = 20_000


def _small_map_mean(xp: Any, x: Any, key: tuple[Any, ...], ext: tuple[int, ...]) -> Any:
    """An average pool on a small map as one product, then the division by the counts: each
    channel's plane (P values) times a (P, outputs) matrix of ones where an output's window
    holds a position. The matrix is the window sums of the P unit planes (``_sum_pool``), so
    padding, ceil_mode and dilations mean exactly what they mean there, and the counts divide
    as in ``_window_mean`` (sums, then their division: with weights of 1/count every product
    rounds, and the mean of nine 100s came out 100.00001). numpy's separable passes on such
    maps are a dozen calls on a few thousand values; BLAS takes all channels at once. None
    where it does not apply."""
    if xp is not np or x.dtype not in (np.float32, np.float64) or x.ndim < 3 or x.size == 0:
        return None
    plane, outputs = math.prod(x.shape[2:]), math.prod(key[4])
    if plane * outputs > _SMALL_MAP_MEAN_MAX_ENTRIES:
        return None
    windows = _small_map_windows(key, ext, x.dtype.str)
    total = np.matmul(x.reshape(-1, plane), windows).reshape(*x.shape[:2], *key[4])
    return _divided_by_counts(np, total, key)


@functools.lru_cache(maxsize=64)
def _small_map_windows(key: tuple[Any, ...], ext: tuple[int, ...], dtype: str) -> np.ndarray:
    """(positions, outputs): 1 where the output's window of ``key`` holds the position."""
    spatial, kernel_shape, begin, end, out, strides, dilations, _ = key
    plane = math.prod(spatial)
    basis = np.eye(plane, dtype=dtype).reshape(plane, 1, *spatial)
    sums = _sum_pool(
        np,
        basis,
        list(kernel_shape),
        list(strides),
        list(dilations),
        list(begin),
        list(end),
        list(out),
        list(ext),
        None,
    )
    windows = np.ascontiguousarray(sums.reshape(plane, -1))
    windows.flags.writeable = False
    return windows


# Input rows per tiled-mean product row (kh * W) up to which the product beats the separable
# passes: 2x2/2 pools, cold input (Xeon): 256x56x56 443 -> 306 us, 512x28x28 227 -> 141,
# 1024x14x14 128 -> 62 (DenseNet-121's transitions); on 64x112x112 (224 values a row) 424 -> 405,
# where the product does twice the multiply-adds per output.
_TILED_MEAN_MAX_ROW = 128


def _tiled_mean(
    xp: Any, x: Any, kernel: list[int], strides: list[int], dilations: list[int], begin: list[int], out: list[int]
) -> Any:
    """A 2-D average pool whose windows tile the map (kernel == stride, no window touching the
    padding, the rows used up exactly) as one matrix product: each run of kh input rows,
    (kh * W) values, times a (kh * W, ow) matrix marking where a value lies in an output's
    window (with 1 / (kh * kw), or with 1 and the division after). numpy's passes for such a
    pool are one short loop per row (for 2x2/2: two adds over rows of W and W/2 values, then the
    scaling); BLAS streams the whole map once. None where it does not apply."""
    if xp is not np or x.ndim != 4 or x.dtype not in (np.float32, np.float64) or not x.flags.c_contiguous:
        return None
    kh, kw = kernel
    n, c, h, w = x.shape
    if list(strides) != [kh, kw] or any(d != 1 for d in dilations) or any(begin) or out[0] * kh != h:
        return None
    if out[1] * kw > w or kh * w > _TILED_MEAN_MAX_ROW or x.size == 0:
        return None
    count = kh * kw
    # A power-of-two count's reciprocal is exact: it rides in the weights. Otherwise the product
    # sums and the count divides after, rounding as the window sums do (weights of 1/9 made
    # the mean of nine 100s 100.00001; the sum, then the division, give 100).
    exact = count & (count - 1) == 0
    weights = _tiled_mean_weights(kh, kw, w, out[1], x.dtype.str, 1.0 / count if exact else 1.0)
    y = np.matmul(x.reshape(n * c * out[0], kh * w), weights)
    if not exact:
        y /= y.dtype.type(count)
    return y.reshape(n, c, out[0], out[1])


@functools.lru_cache(maxsize=64)
def _tiled_mean_weights(kh: int, kw: int, w: int, ow: int, dtype: str, value: float) -> np.ndarray:
    """(kh * w, ow): ``value`` at row r * w + kw * j + q (r < kh, q < kw), column j."""
    m = np.zeros((kh, w, ow), dtype=np.float64)
    for j in range(ow):
        m[:, kw * j : kw * (j + 1), j] = value
    weights = m.reshape(kh * w, ow).astype(dtype)
    weights.flags.writeable = False
    return weights


def _whole_map_mean(
    xp: Any, x: Any, kernel: list[int], dilations: list[int], begin: list[int], out: list[int], count_include_pad: int
) -> Any:
    """A single window over the whole map (the global pooling of classifier heads written as
    AveragePool, e.g. 7x7 on 7x7): one mean per channel instead of a separable pass per axis
    (ResNet-50's took 241 us for 2048 channels). None when the pool is not one,
    or when padded positions would count in the average."""
    spatial = x.shape[2:]
    if any(o != 1 for o in out) or any(d != 1 for d in dilations) or x.size == 0:
        return None
    # The one window, [-b, -b + k) per axis, must hold the whole axis [0, n).
    if any(k - b < n for k, b, n in zip(kernel, begin, spatial)):
        return None
    if count_include_pad and list(kernel) != list(spatial):
        return None  # padding counted: the divisor is not the map's size
    return _spatial_mean(xp, x)


@op("AveragePool", 7)
def average_pool_7(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    count_include_pad: int = 0,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    return _average_pool(xp, X, kernel_shape, strides, None, pads, auto_pad, 0, count_include_pad, ctx=ctx)


@op("AveragePool", 10)
def average_pool_10(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    return _average_pool(xp, X, kernel_shape, strides, None, pads, auto_pad, ceil_mode, count_include_pad, ctx=ctx)


@op("AveragePool", 19)
def average_pool(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    return _average_pool(xp, X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, count_include_pad, ctx=ctx)


def _lp_finish(xp: Any, total: Any, p: int, dtype: np.dtype) -> Any:
    if p == 1:
        y = total
    elif p == 2:
        y = xp.sqrt(total)
    else:
        y = total ** total.dtype.type(1.0 / p)
    return y.astype(dtype, copy=False)


def _lp_pool(
    xp: Any,
    x: Any,
    kernel_shape: list[int],
    strides: list[int] | None,
    dilations: list[int] | None,
    pads: list[int] | None,
    auto_pad: str,
    ceil_mode: int,
    p: int,
    ctx: Any = None,
) -> Any:
    if p <= 0:
        raise ValueError(f"LpPool p must be positive, got {p}")
    begin, end, out, strides, dilations, ext = _setup(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, ctx
    )
    if 0 in out:
        return _no_windows(xp, x, out)
    total = _sum_pool(xp, x, kernel_shape, strides, dilations, begin, end, out, ext, int(p))
    return _lp_finish(xp, total, int(p), x.dtype)


@op("LpPool", 2)
def lp_pool_2(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    kernel_shape: list[int],
    p: int = 2,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    return _lp_pool(xp, X, kernel_shape, strides, None, pads, auto_pad, 0, p, ctx=ctx)


@op("LpPool", 18)
def lp_pool(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    p: int = 2,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    return _lp_pool(xp, X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, p, ctx=ctx)


# -- global pools --------------------------------------------------------------------------------


def _spatial_axes(x: Any, what: str) -> tuple[int, ...]:
    if x.ndim < 2:
        raise ValueError(f"{what} needs an input of rank >= 2 (N, C, ...), got shape {list(x.shape)}")
    return tuple(range(2, x.ndim))


@op("GlobalAveragePool", 1)
def global_average_pool(xp: Any, X: Any) -> Any:  # noqa: N803 - spec name
    _spatial_axes(X, "GlobalAveragePool")
    return _spatial_mean(xp, X)


# Most values per mean that _spatial_mean sums in one BLAS dot product.
MATVEC_MEAN_MAX = 4096


def _spatial_mean(xp: Any, x: Any) -> Any:
    """The mean over every axis after the first two, keeping them as size 1. On the host, for
    maps of up to MATVEC_MEAN_MAX values (classifier heads), the sums as one matrix-vector
    product with ones, then divided by the count: 7 us against numpy's mean's 50 for 2048 x 7
    x 7. (Weights of 1/count instead were rounded, and with BLAS's fused multiply-adds a
    mean of 120 values of 1.5 came out 1.5000001, one of 3.4e38 and -3.4e38 -2e30.) Larger
    maps keep numpy's pairwise sums, whose rounding error grows more slowly."""
    count = math.prod(x.shape[2:])
    acc = _acc_dtype(x.dtype)
    kept = x.shape[:2] + (1,) * (x.ndim - 2)
    if xp is np and x.size and 0 < count <= MATVEC_MEAN_MAX:
        ones = np.ones(count, dtype=acc)
        work = x.astype(acc, copy=False)
        if work.flags.c_contiguous:
            sums = work.reshape(-1, count) @ ones
        else:
            last = work.transpose(0, *range(2, x.ndim), 1)  # channels-last results (depthwise chains)
            sums = ones @ last.reshape(x.shape[0], count, x.shape[1]) if last.flags.c_contiguous else None
        if sums is not None:
            sums /= acc.type(count)
            return sums.reshape(kept).astype(x.dtype, copy=False)
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=acc).astype(x.dtype, copy=False)


@op("GlobalMaxPool", 1)
def global_max_pool(xp: Any, X: Any) -> Any:  # noqa: N803 - spec name
    axes = _spatial_axes(X, "GlobalMaxPool")
    if any(X.shape[a] == 0 for a in axes):
        raise ValueError(f"GlobalMaxPool over an empty spatial extent (input shape {list(X.shape)})")
    return X.max(axis=axes, keepdims=True)


@op("GlobalLpPool", 2)
def global_lp_pool(xp: Any, X: Any, *, p: int = 2) -> Any:  # noqa: N803 - spec name
    axes = _spatial_axes(X, "GlobalLpPool")
    if p <= 0:
        raise ValueError(f"GlobalLpPool p must be positive, got {p}")
    src = X.astype(_acc_dtype(X.dtype), copy=False)
    if p == 2:
        total = (src * src).sum(axis=axes, keepdims=True)
    else:
        total = (xp.abs(src) ** src.dtype.type(p)).sum(axis=axes, keepdims=True)
    return _lp_finish(xp, total, int(p), X.dtype)


# -- MaxUnpool -----------------------------------------------------------------------------------


@op("MaxUnpool", 9, host_inputs=(2,))
def max_unpool(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    I: Any,  # noqa: N803, E741 - spec name
    output_shape: Any = None,
    *,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    nd = X.ndim - 2
    if nd < 1:
        raise ValueError(f"MaxUnpool needs X of rank >= 3, got shape {list(X.shape)}")
    if tuple(I.shape) != tuple(X.shape):
        raise ValueError(f"MaxUnpool: I shape {list(I.shape)} must equal X shape {list(X.shape)}")
    if len(kernel_shape) != nd:
        raise ValueError(f"kernel_shape {kernel_shape} must have {nd} entries for X shape {list(X.shape)}")
    strides = list(strides) if strides else [1] * nd
    p = list(pads) if pads else [0] * (2 * nd)
    if len(p) != 2 * nd:
        raise ValueError(f"pads {p} must have {2 * nd} entries")
    if output_shape is not None:
        shape = host_ints(output_shape)
        if len(shape) != X.ndim:
            raise ValueError(f"MaxUnpool output_shape {shape} must have rank {X.ndim}")
        if shape[:2] != list(X.shape[:2]):
            raise ValueError(f"MaxUnpool output_shape {shape} must keep X's batch and channels {list(X.shape[:2])}")
    else:
        spatial = [(X.shape[2 + i] - 1) * strides[i] + kernel_shape[i] - p[i] - p[nd + i] for i in range(nd)]
        shape = [*X.shape[:2], *spatial]
    check_alloc(shape, X.dtype, ctx, "MaxUnpool")
    total = math.prod(shape)
    flat_idx = I.reshape(-1)
    if flat_idx.size:
        lo, hi = int(flat_idx.min()), int(flat_idx.max())
        if lo < 0 or hi >= total:
            raise IndexError(f"MaxUnpool: indices in [{lo}, {hi}] fall outside the output of {total} elements {shape}")
    y = xp.zeros(total, dtype=X.dtype)
    y[flat_idx] = X.reshape(-1)
    return y.reshape(shape)


# -- MaxRoiPool ----------------------------------------------------------------------------------


def _round_half_away(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


@op("MaxRoiPool", 1)
def max_roi_pool(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    rois: Any,
    *,
    pooled_shape: list[int],
    spatial_scale: float = 1.0,
) -> Any:
    if X.ndim != 4:
        raise ValueError(f"MaxRoiPool needs X of shape (N, C, H, W), got {list(X.shape)}")
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise ValueError(f"MaxRoiPool needs rois of shape (num_rois, 5), got {list(rois.shape)}")
    if len(pooled_shape) != 2 or min(pooled_shape) <= 0:
        raise ValueError(f"MaxRoiPool pooled_shape must be two positive ints, got {pooled_shape}")
    n, c, h, w = X.shape
    ph, pw = pooled_shape
    r = rois.get() if hasattr(rois, "get") and not isinstance(rois, np.ndarray) else np.asarray(rois)
    r = r.astype(np.float64)
    y = xp.zeros((r.shape[0], c, ph, pw), dtype=X.dtype)
    lowest = _lowest(X.dtype)
    for i in range(r.shape[0]):
        b = int(r[i, 0])
        if not 0 <= b < n:
            raise IndexError(f"MaxRoiPool: roi {i} has batch index {b}, X has batch {n}")
        x1, y1, x2, y2 = (int(v) for v in _round_half_away(r[i, 1:] * spatial_scale))
        rh = max(y2 - y1 + 1, 1)
        rw = max(x2 - x1 + 1, 1)
        bh, bw = rh / ph, rw / pw
        # Column bins as a (pw, W) membership mask: one masked max per pooled row.
        ws = np.clip(np.floor(np.arange(pw) * bw).astype(np.int64) + x1, 0, w)
        we = np.clip(np.ceil((np.arange(pw) + 1) * bw).astype(np.int64) + x1, 0, w)
        cols = np.arange(w)
        colmask = (cols[None, :] >= ws[:, None]) & (cols[None, :] < we[:, None])  # (pw, W)
        colempty = xp.asarray(~colmask.any(axis=1))
        colmask_x = xp.asarray(colmask)
        for j in range(ph):
            hs = min(max(int(math.floor(j * bh)) + y1, 0), h)
            he = min(max(int(math.ceil((j + 1) * bh)) + y1, 0), h)
            if he <= hs:
                continue
            rowmax = X[b, :, hs:he, :].max(axis=1)  # (C, W)
            vals = xp.where(colmask_x[None, :, :], rowmax[:, None, :], lowest).max(axis=2)  # (C, pw)
            y[i, :, j, :] = xp.where(colempty[None, :], 0, vals)
    return y
