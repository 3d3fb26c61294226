"""Vision kernels: Resize / Upsample, GridSample, AffineGrid, RoiAlign, NonMaxSuppression,
CenterCropPad, SpaceToDepth, DepthToSpace.

Resampling is separable: for every resized axis the output coordinates are mapped to input
coordinates on the host, turned into a few (index, weight) taps per output position, and the
tensor is gathered along that axis once per tap. No loop runs over tensor elements.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._compat import check_alloc, host_ints, host_scalar, normalize_axes
from .registry import memoized, op

# -- shared helpers ------------------------------------------------------------------------------


def _host_floats(x: Any) -> list[float] | None:
    """A float tensor read on the host; None for an omitted or empty tensor."""
    if x is None:
        return None
    arr = x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)
    if arr.size == 0:
        return None
    return [float(v) for v in arr.reshape(-1).astype(np.float32).tolist()]


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """The float type interpolation runs in: float32 but for double (and complex) inputs, as
    onnxruntime does, so integer results truncate the same way."""
    if dtype.kind == "c":
        return dtype
    if dtype == np.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _cast_result(xp: Any, y: Any, dtype: np.dtype) -> Any:
    """Interpolated values back to the input type; integers truncate toward zero (as onnxruntime),
    except a value within 1e-3 of an integer, which is that integer: weights summing to 1 over a
    constant 127 gave 126.99999 in float arithmetic, and truncating made it 126."""
    if y.dtype == dtype:
        return y
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        nearest = xp.rint(y)
        y = xp.where(xp.abs(y - nearest) < 1e-3, nearest, xp.trunc(y))
        y = xp.clip(y, float(info.min), float(info.max))
    elif dtype.kind == "b":
        return y != 0
    return y.astype(dtype)


def _cubic_weight(d: Any, a: float, xp: Any = np) -> Any:
    """Keys' cubic convolution kernel with coefficient ``a`` at distances ``d``."""
    d = xp.abs(d)
    near = ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
    far = ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
    return xp.where(d <= 1.0, near, xp.where(d < 2.0, far, 0.0))


def _linear_weight(d: np.ndarray) -> np.ndarray:
    return np.maximum(0.0, 1.0 - np.abs(d))


# -- Resize / Upsample ----------------------------------------------------------------------------

_COORD_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _source_coords(mode: str, out_len: int, in_len: int, scale: float, roi_start: float, roi_end: float) -> np.ndarray:
    """Input coordinate (pixel centres at integers) of every output index along one axis.

    ``length_resized`` in the spec's formulas is ``scale * in_len``: fractional when the output
    size came from a scale factor (onnx's own test data follow this for align_corners)."""
    resized = scale * in_len
    x = np.arange(out_len, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        # The output is centred on the input when the scaled length is not a whole number.
        adjustment = out_len / (scale * in_len)
        offset = in_len / 2.0 * (1.0 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_len)
    if mode == "align_corners":
        return x * (in_len - 1) / (resized - 1) if out_len > 1 else np.zeros(out_len)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if mode == "tf_crop_and_resize":
        if out_len > 1:
            return roi_start * (in_len - 1) + x * (roi_end - roi_start) * (in_len - 1) / (resized - 1)
        return np.full(out_len, 0.5 * (roi_start + roi_end) * (in_len - 1))
    raise ValueError(f"Resize: unknown coordinate_transformation_mode {mode!r} (expected one of {_COORD_MODES})")


def _on_half_steps(x: np.ndarray) -> np.ndarray:
    """Coordinates within float64 noise of a multiple of 0.5 put on it, where exact arithmetic
    puts them (7 -> 5 values at scale 0.75, half_pixel_symmetric: 3.0000000000000004 for 3.0).
    Nearest modes round or cut exactly there (ceil made that 4 where onnxruntime gives 3), and
    tf_crop_and_resize extrapolates just past the edges."""
    r = np.round(x * 2.0) / 2.0
    return np.where(np.abs(x - r) <= 1e-9 * np.maximum(1.0, np.abs(r)), r, x)


def _nearest_taps(xo: np.ndarray, in_len: int, nearest_mode: str, downsampling: bool) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        i = np.ceil(xo - 0.5)
    elif nearest_mode == "round_prefer_ceil":
        i = np.floor(xo + 0.5)
    elif nearest_mode == "floor":
        i = np.floor(xo)
    elif nearest_mode == "ceil":
        i = np.ceil(xo)
    elif nearest_mode == "simple":
        # Upsample and Resize-10: floor when enlarging, ceil when shrinking (onnxruntime's rule).
        i = np.ceil(xo) if downsampling else np.floor(xo)
    else:
        raise ValueError(f"Resize: unknown nearest_mode {nearest_mode!r} (expected one of {_NEAREST_MODES})")
    return np.clip(i, 0, in_len - 1).astype(np.int64)[:, None]


def _interp_taps(
    kind: str,
    xo: np.ndarray,
    in_len: int,
    scale: float,
    cubic_a: float,
    exclude_outside: bool,
    antialias: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each of shape (out_len, taps), for linear or cubic resampling."""
    support = 1.0 if kind == "linear" else 2.0
    if antialias and scale < 1.0:
        # The filter is stretched by 1/scale so every input pixel under it contributes.
        radius = support / scale
        n_taps = int(math.ceil(2 * radius)) + 1
        base = np.floor(xo - radius) + 1
        k = base[:, None] + np.arange(n_taps)[None, :]
        d = (k - xo[:, None]) * scale
        w = _linear_weight(d) if kind == "linear" else _cubic_weight(d, cubic_a)
        if exclude_outside:
            w = np.where((k >= 0) & (k <= in_len - 1), w, 0.0)
    else:
        i0 = np.floor(xo)
        t = xo - i0
        if kind == "linear":
            k = i0[:, None] + np.arange(2)[None, :]
            w = np.stack([1.0 - t, t], axis=1)
        else:
            k = i0[:, None] + np.arange(-1, 3)[None, :]
            w = _cubic_weight(k - xo[:, None], cubic_a)
        if exclude_outside:
            w = np.where((k >= 0) & (k <= in_len - 1), w, 0.0)
    if exclude_outside or (antialias and scale < 1.0):
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0.0, 1.0, total)
    idx = np.clip(k, 0, in_len - 1).astype(np.int64)
    return idx, w


def _gather_taps(xp: Any, x: Any, axis: int, taps: tuple[tuple[Any, Any], ...], out_len: int) -> Any:
    """sum over taps of w * take(x, idx, axis) (w None: the take alone), one gather per tap."""
    y = None
    for idx, w in taps:
        term = xp.take(x, idx, axis=axis)
        if w is None:
            return term
        term *= w
        if y is None:
            y = term
        else:
            y += term
    if y is None:
        out_shape = list(x.shape)
        out_shape[axis] = out_len
        y = xp.zeros(out_shape, dtype=x.dtype)
    return y


# Interpolation along an axis of at most this many input positions per tap runs as one product
# with the (output x input) matrix of its weights: each output costs n_in multiply-adds in BLAS
# instead of a gather, a multiply and an add per tap in numpy. LR-ASPP's 8x upsample of its
# 21x28x28 logits 2026 -> 648 us (onnxruntime 738), an FPN's 256x14x14 -> 28x28 571 -> 146,
# 21x28x28 bicubic 4295 -> 632. Linear (2 taps) 128 -> 256 on 3 channels was even and on 32
# channels 5037 -> 3109 us; 512 -> 256 four times slower: there most of the matrix is zeros.
_DENSE_IN_PER_TAP = 32


def _finite(x: np.ndarray) -> bool:
    """Whether ``x`` holds no NaN or infinity (the product's zero weights would spread them:
    0 * inf is NaN)."""
    return x.size == 0 or bool(np.isfinite(x.min()) and np.isfinite(x.max()))


def _dense_step(x: np.ndarray, axis: int, matrix: np.ndarray) -> np.ndarray:
    """Interpolation along ``axis`` as the product with ``matrix`` (output x input positions)."""
    shape = list(x.shape)
    before, n_in = math.prod(shape[:axis]), shape[axis]
    after = math.prod(shape[axis + 1 :])
    shape[axis] = matrix.shape[0]
    if after == 1:
        return np.matmul(x.reshape(before, n_in), matrix.T).reshape(shape)
    return np.matmul(matrix, x.reshape(before, n_in, after)).reshape(shape)


@dataclass(frozen=True)
class _ResizePlan:
    """What a Resize computes for one input shape and one set of roi / scales / sizes: the
    same for every run with them, so it is made once per node (it took about 100 us a call,
    most of a small Resize)."""

    out_shape: tuple[int, ...]
    empty: bool
    compute_dtype: np.dtype | None  # None: nearest, which works in the input's own type
    # (axis, output length, taps, matrix): shrinking axes first keeps the intermediate tensors
    # small; ``matrix`` (output length x input length, or None) is the step as one product
    steps: tuple[tuple[int, int, tuple[tuple[Any, Any], ...], np.ndarray | None], ...]
    mask: Any  # True where tf_crop_and_resize samples outside the input, or None


def _resize(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    roi: list[float] | None,
    scales: list[float] | None,
    sizes: list[int] | None,
    *,
    extrapolation_value: float,
    ctx: Any,
    what: str,
    **attrs: Any,
) -> Any:
    """Resize (and Upsample); ``attrs``: the other attributes, as _resize_plan takes them."""
    key = (
        tuple(X.shape),
        X.dtype,
        None if roi is None else tuple(roi),
        None if scales is None else tuple(scales),
        None if sizes is None else tuple(sizes),
    )
    plan: _ResizePlan = memoized(ctx, key, lambda: _resize_plan(xp, X, roi, scales, sizes, ctx=ctx, what=what, **attrs))
    if plan.empty:
        return xp.zeros(plan.out_shape, dtype=X.dtype)
    dtype = X.dtype
    x = X if plan.compute_dtype is None or dtype == plan.compute_dtype else X.astype(plan.compute_dtype)
    for axis, out_len, taps, matrix in plan.steps:
        if matrix is not None and _finite(x):
            x = _dense_step(x, axis, matrix)
        else:
            x = _gather_taps(xp, x, axis, taps, out_len)
    if x is X:
        x = X.copy()
    if plan.mask is not None:
        fill = np.asarray(extrapolation_value).astype(x.dtype) if x.dtype.kind not in "OUS" else ""
        x = xp.where(plan.mask, xp.asarray(fill, dtype=x.dtype), x)
    if plan.compute_dtype is not None:
        x = _cast_result(xp, x, dtype)
    return x


def _resize_plan(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    roi: list[float] | None,
    scales: list[float] | None,
    sizes: list[int] | None,
    *,
    axes: list[int] | None,
    mode: str,
    coordinate_transformation_mode: str,
    nearest_mode: str,
    cubic_coeff_a: float,
    exclude_outside: int,
    antialias: int,
    keep_aspect_ratio_policy: str,
    ctx: Any,
    what: str,
) -> _ResizePlan:
    rank = X.ndim
    in_shape = [int(d) for d in X.shape]
    ax = normalize_axes(axes, rank, f"{what} axes") if axes else list(range(rank))
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"{what}: unknown mode {mode!r} (expected 'nearest', 'linear' or 'cubic')")
    if coordinate_transformation_mode not in _COORD_MODES:
        raise ValueError(
            f"{what}: unknown coordinate_transformation_mode {coordinate_transformation_mode!r} "
            f"(expected one of {_COORD_MODES})"
        )
    if scales is not None and sizes is not None:
        raise ValueError(f"{what}: only one of 'scales' and 'sizes' may be given")
    if scales is None and sizes is None:
        raise ValueError(f"{what}: one of 'scales' and 'sizes' must be given")

    starts = [0.0] * rank
    ends = [1.0] * rank
    if roi is not None and coordinate_transformation_mode == "tf_crop_and_resize":
        if len(roi) != 2 * len(ax):
            raise ValueError(f"{what}: roi has {len(roi)} values, expected {2 * len(ax)} (start and end per axis)")
        if not all(math.isfinite(v) for v in roi):
            raise ValueError(f"{what}: roi must hold finite values for tf_crop_and_resize, got {list(roi)}")
        for i, a in enumerate(ax):
            starts[a] = roi[i]
            ends[a] = roi[len(ax) + i]

    out_shape = list(in_shape)
    axis_scale = [1.0] * rank
    if scales is not None:
        if len(scales) != len(ax):
            raise ValueError(f"{what}: scales has {len(scales)} values, expected {len(ax)} (one per axis)")
        for a, s in zip(ax, scales):
            if not s > 0:
                raise ValueError(f"{what}: scales must be positive, got {scales}")
            # Products in float32, as onnxruntime computes the output shape.
            out_shape[a] = int(np.floor(np.float32(s) * np.float32(in_shape[a])))
            axis_scale[a] = s
    else:
        assert sizes is not None
        if len(sizes) != len(ax):
            raise ValueError(f"{what}: sizes has {len(sizes)} values, expected {len(ax)} (one per axis)")
        if any(s < 0 for s in sizes):
            raise ValueError(f"{what}: sizes must not be negative, got {sizes}")
        if keep_aspect_ratio_policy == "stretch":
            for a, s in zip(ax, sizes):
                out_shape[a] = s
                axis_scale[a] = s / in_shape[a] if in_shape[a] else 1.0
        elif keep_aspect_ratio_policy in ("not_larger", "not_smaller"):
            # The ratio itself exact (sizes / in_size, in float64): rounded to float32 first, a
            # ratio of 1/3 put output 1 at source 2.99999994, which floor took to 2. The output
            # size is still computed in float32, as onnxruntime computes it.
            ratios = [s / in_shape[a] for a, s in zip(ax, sizes) if in_shape[a]]
            common = (min if keep_aspect_ratio_policy == "not_larger" else max)(ratios) if ratios else 1.0
            for a in ax:
                out_shape[a] = int(np.floor(np.float32(common) * np.float32(in_shape[a]) + np.float32(0.5)))
                axis_scale[a] = common
        else:
            raise ValueError(
                f"{what}: unknown keep_aspect_ratio_policy {keep_aspect_ratio_policy!r} "
                "(expected 'stretch', 'not_larger' or 'not_smaller')"
            )
    check_alloc(out_shape, X.dtype, ctx, what)
    if any(d == 0 for d in out_shape) or any(d == 0 for d in in_shape):
        if any(out_shape[a] and not in_shape[a] for a in range(rank)):
            raise ValueError(f"{what}: cannot resize an empty axis of shape {in_shape} to {out_shape}")
        return _ResizePlan(tuple(out_shape), True, None, (), None)

    dtype = X.dtype
    compute = None
    if mode != "nearest":
        if dtype.kind in "OUS":
            raise TypeError(f"{what}: mode {mode!r} needs a numeric input, got {dtype}")
        compute = _compute_dtype(dtype)
    weight_dtype = compute if compute is not None and compute.kind == "f" else np.float64

    crop = coordinate_transformation_mode == "tf_crop_and_resize"
    plans = []
    mask = None
    for a in range(rank):
        n_in, n_out = in_shape[a], out_shape[a]
        xo = _on_half_steps(
            _source_coords(coordinate_transformation_mode, n_out, n_in, axis_scale[a], starts[a], ends[a])
        )
        shape = [1] * rank
        shape[a] = -1
        if crop:
            oob = (xo < 0) | (xo > n_in - 1)
            if oob.any():
                m = xp.asarray(oob).reshape(shape)
                mask = m if mask is None else (mask | m)
        if n_out == n_in and np.array_equal(xo, np.arange(n_in)):
            continue  # identity along this axis
        if mode == "nearest":
            taps: tuple[tuple[Any, Any], ...] = (
                (xp.asarray(_nearest_taps(xo, n_in, nearest_mode, axis_scale[a] < 1.0)[:, 0]), None),
            )
        else:
            idx, w = _interp_taps(mode, xo, n_in, axis_scale[a], cubic_coeff_a, bool(exclude_outside), bool(antialias))
            taps = tuple(
                (xp.asarray(idx[:, t]), xp.asarray(w[:, t].astype(weight_dtype)).reshape(shape))
                for t in range(idx.shape[1])
                if w[:, t].any()
            )
        matrix = None
        if (
            xp is np
            and mode != "nearest"
            and compute in (np.float32, np.float64)
            and n_in <= _DENSE_IN_PER_TAP * len(taps)
        ):
            matrix = np.zeros((n_out, n_in), dtype=compute)
            for t in range(idx.shape[1]):
                np.add.at(matrix, (np.arange(n_out), idx[:, t]), w[:, t])
        plans.append((n_out / n_in, a, n_out, taps, matrix))
    steps = tuple((a, n_out, taps, matrix) for _, a, n_out, taps, matrix in sorted(plans, key=lambda p: p[0]))
    return _ResizePlan(tuple(out_shape), False, compute, steps, mask)


@op("Upsample", 7)
def upsample_7(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    mode: str = "nearest",
    scales: list[float],
    ctx: Any = None,
) -> Any:
    return _legacy_resize(xp, X, [float(np.float32(s)) for s in scales], mode, ctx, "Upsample", upsample=True)


@op("Upsample", 9, host_inputs=(1,))
def upsample_9(xp: Any, X: Any, scales: Any, *, mode: str = "nearest", ctx: Any = None) -> Any:  # noqa: N803
    return _legacy_resize(xp, X, _host_floats(scales) or [], mode, ctx, "Upsample", upsample=True)


@op("Resize", 10, host_inputs=(1,))
def resize_10(xp: Any, X: Any, scales: Any, *, mode: str = "nearest", ctx: Any = None) -> Any:  # noqa: N803
    return _legacy_resize(xp, X, _host_floats(scales) or [], mode, ctx, "Resize", upsample=False)


def _legacy_resize(xp: Any, X: Any, scales: list[float], mode: str, ctx: Any, what: str, upsample: bool) -> Any:  # noqa: N803
    """Upsample-7/9 and Resize-10: asymmetric coordinates, nearest or (multi)linear."""
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise ValueError(f"{what}: unknown mode {mode!r} (expected 'nearest' or 'linear')")
    if len(scales) != X.ndim:
        raise ValueError(f"{what}: scales has {len(scales)} values, expected one per input axis ({X.ndim})")
    if upsample and any(s < 1 for s in scales):
        raise ValueError(f"{what}: scales must be >= 1, got {scales}")
    return _resize(
        xp,
        X,
        None,
        scales,
        None,
        axes=None,
        mode=mode,
        coordinate_transformation_mode="asymmetric",
        nearest_mode="simple",
        cubic_coeff_a=-0.75,
        exclude_outside=0,
        extrapolation_value=0.0,
        antialias=0,
        keep_aspect_ratio_policy="stretch",
        ctx=ctx,
        what=what,
    )


def _scales_sizes(scales: Any, sizes: Any) -> tuple[list[float] | None, list[int] | None]:
    sc = _host_floats(scales)
    sz = host_ints(sizes) if sizes is not None and np.size(sizes) > 0 else None
    return sc, sz


@op("Resize", 11, host_inputs=(1, 2, 3))
def resize_11(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    roi: Any = None,
    scales: Any = None,
    sizes: Any = None,
    *,
    coordinate_transformation_mode: str = "half_pixel",
    cubic_coeff_a: float = -0.75,
    exclude_outside: int = 0,
    extrapolation_value: float = 0.0,
    mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
    ctx: Any = None,
) -> Any:
    sc, sz = _scales_sizes(scales, sizes)
    return _resize(
        xp,
        X,
        _host_floats(roi),
        sc,
        sz,
        axes=None,
        mode=mode,
        coordinate_transformation_mode=coordinate_transformation_mode,
        nearest_mode=nearest_mode,
        cubic_coeff_a=cubic_coeff_a,
        exclude_outside=exclude_outside,
        extrapolation_value=extrapolation_value,
        antialias=0,
        keep_aspect_ratio_policy="stretch",
        ctx=ctx,
        what="Resize",
    )


@op("Resize", 18, host_inputs=(1, 2, 3))
def resize_18(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    roi: Any = None,
    scales: Any = None,
    sizes: Any = None,
    *,
    antialias: int = 0,
    axes: list[int] | None = None,
    coordinate_transformation_mode: str = "half_pixel",
    cubic_coeff_a: float = -0.75,
    exclude_outside: int = 0,
    extrapolation_value: float = 0.0,
    keep_aspect_ratio_policy: str = "stretch",
    mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
    ctx: Any = None,
) -> Any:
    sc, sz = _scales_sizes(scales, sizes)
    return _resize(
        xp,
        X,
        _host_floats(roi),
        sc,
        sz,
        axes=axes,
        mode=mode,
        coordinate_transformation_mode=coordinate_transformation_mode,
        nearest_mode=nearest_mode,
        cubic_coeff_a=cubic_coeff_a,
        exclude_outside=exclude_outside,
        extrapolation_value=extrapolation_value,
        antialias=antialias,
        keep_aspect_ratio_policy=keep_aspect_ratio_policy,
        ctx=ctx,
        what="Resize",
    )


# -- GridSample -----------------------------------------------------------------------------------


def _reflect(xp: Any, x: Any, lo: float, hi: float) -> Any:
    """Fold coordinates into [lo, hi] by mirroring at the borders as often as needed."""
    span = hi - lo
    if span <= 0:
        return xp.zeros_like(x)
    t = xp.mod(xp.abs(x - lo), 2.0 * span)
    return lo + xp.where(t <= span, t, 2.0 * span - t)


def _grid_axis_taps(
    xp: Any, g: Any, size: int, kind: str, padding_mode: str, align_corners: int
) -> tuple[list[Any], list[Any | None], Any | None]:
    """Per spatial axis: tap indices, tap weights and (zeros padding) tap validity masks.

    ``g`` holds normalized coordinates in [-1, 1]; arrays keep g's shape.
    """
    if align_corners:
        x = (g + 1.0) / 2.0 * (size - 1)
    else:
        x = ((g + 1.0) * size - 1.0) / 2.0

    def pad_coord(c: Any) -> Any:
        if padding_mode == "border":
            return xp.clip(c, 0, size - 1)
        if padding_mode == "reflection":
            c = _reflect(xp, c, 0.0, size - 1.0) if align_corners else _reflect(xp, c, -0.5, size - 0.5)
            return xp.clip(c, 0, size - 1)
        return c

    if kind == "nearest":
        x = pad_coord(x)
        k = [xp.rint(x)]  # round half to even
        w: list[Any | None] = [None]
    elif kind == "linear":
        x = pad_coord(x)
        i0 = xp.floor(x)
        t = x - i0
        k = [i0, i0 + 1]
        w = [1.0 - t, t]
    else:
        # Cubic: the coordinate stays as is; each of the four taps is padded on its own.
        i0 = xp.floor(x)
        t = x - i0
        k = [i0 - 1, i0, i0 + 1, i0 + 2]
        w = [_cubic_weight(t + d, -0.75, xp) for d in (1.0, 0.0, -1.0, -2.0)]
        if padding_mode in ("border", "reflection"):
            k = [pad_coord(kk) for kk in k]
    valid = None
    if padding_mode == "zeros":
        valid = [(kk >= 0) & (kk <= size - 1) for kk in k]
    idx = [xp.clip(kk, 0, size - 1).astype(np.int64) for kk in k]
    return idx, w, valid


# Normalized grid coordinates this far out are outside any input (|x| >= 5e5 pixels per unit
# of size) and still exact in float64 through the pixel arithmetic.
_FAR_COORDINATE = 1e6


def _grid_sample(xp: Any, X: Any, grid: Any, mode: str, padding_mode: str, align_corners: int) -> Any:  # noqa: N803
    kind = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}.get(
        mode
    )
    if kind is None:
        raise ValueError(f"GridSample: unknown mode {mode!r} (expected 'linear', 'nearest' or 'cubic')")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"GridSample: unknown padding_mode {padding_mode!r} (expected zeros, border or reflection)")
    r = X.ndim - 2
    if r < 1 or grid.ndim != r + 2 or grid.shape[-1] != r or grid.shape[0] != X.shape[0]:
        raise ValueError(
            f"GridSample: grid of shape {list(grid.shape)} does not match input of shape {list(X.shape)} "
            f"(expected (N, *out_spatial, {r}))"
        )
    n, c = X.shape[0], X.shape[1]
    in_sp = [int(d) for d in X.shape[2:]]
    out_sp = [int(d) for d in grid.shape[1:-1]]
    q = int(np.prod(out_sp))
    g = grid.astype(np.float64).reshape(n, q, r)
    lost = None
    if not bool(np.isfinite(g).all()):
        # An infinite coordinate lies beyond every border: far, but finite, it samples as the
        # padding mode says (a border value, a reflection, zero) instead of reaching the
        # index arithmetic as inf (an IndexError, or NaN weights). A NaN coordinate samples
        # nothing: NaN (0 for integer inputs), as arithmetic on it would give.
        lost = np.isnan(g).any(axis=-1)
        g = np.where(np.isnan(g), 0.0, np.clip(g, -_FAR_COORDINATE, _FAR_COORDINATE))
    # grid's last axis lists coordinates innermost spatial axis first.
    taps = [_grid_axis_taps(xp, g[:, :, r - 1 - d], in_sp[d], kind, padding_mode, align_corners) for d in range(r)]
    strides = [int(np.prod(in_sp[d + 1 :])) for d in range(r)]
    dtype = X.dtype
    numeric = dtype.kind not in "OUS"
    # Channels last: every gathered sample is one contiguous row of C values.
    # An explicit size: -1 cannot be inferred from an empty batch (N = 0) or C = 0.
    xt = xp.ascontiguousarray(X.reshape(n, c, int(np.prod(in_sp))).transpose(0, 2, 1))
    if kind != "nearest":
        if not numeric:
            raise TypeError(f"GridSample: mode {mode!r} needs a numeric input, got {dtype}")
        xt = xt.astype(_compute_dtype(dtype), copy=False)
    wdtype = xt.dtype if xt.dtype.kind == "f" else np.float64
    # Samples gathered as whole rows of the (N * H * W, C) matrix by one take along its first
    # axis: numpy's advanced indexing with a broadcast batch index array took twice as long
    # (1x3136 rows of 64 float32: 84 -> 38 us a tap).
    rows = xt.reshape(n * xt.shape[1], c)
    batch = xp.arange(n)[:, None] * xt.shape[1]
    y = None
    for combo in itertools.product(*(range(len(t[0])) for t in taps)):
        flat = None
        weight = None
        valid = None
        for d, j in enumerate(combo):
            idx, w, ok = taps[d]
            part = idx[j] * strides[d]
            flat = part if flat is None else flat + part
            if w[j] is not None:
                weight = w[j] if weight is None else weight * w[j]
            if ok is not None:
                valid = ok[j] if valid is None else valid & ok[j]
        vals = xp.take(rows, (flat + batch).reshape(-1), axis=0).reshape(n, q, c)  # (N, Q, C)
        if kind == "nearest":
            if valid is not None:
                zero = xp.zeros((), dtype=vals.dtype) if numeric else ""
                vals = xp.where(valid[:, :, None], vals, zero)
            y = vals
            break
        if valid is not None:
            weight = xp.where(valid, weight, 0.0)
        vals *= weight[:, :, None].astype(wdtype)
        if y is None:
            y = vals
        else:
            y += vals
    assert y is not None
    if lost is not None and lost.any():
        y = y.copy() if not y.flags.writeable else y
        y[xp.asarray(lost)] = np.nan if y.dtype.kind in "fc" else (0 if numeric else "")
    y = y.transpose(0, 2, 1)
    y = y.reshape([n, c, *out_sp])
    if kind != "nearest":
        y = _cast_result(xp, y, dtype)
    elif y.dtype != dtype:
        y = y.astype(dtype)
    return y


@op("GridSample", 16)
def grid_sample_16(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    grid: Any,
    *,
    align_corners: int = 0,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
) -> Any:
    return _grid_sample(xp, X, grid, mode, padding_mode, align_corners)


@op("GridSample", 20)
def grid_sample_20(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    grid: Any,
    *,
    align_corners: int = 0,
    mode: str = "linear",
    padding_mode: str = "zeros",
) -> Any:
    return _grid_sample(xp, X, grid, mode, padding_mode, align_corners)


# -- RoiAlign -------------------------------------------------------------------------------------


def _roi_samples(
    start: float, length: float, bins: int, grid: int, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear sample positions along one axis of one RoI: (low, high, w_low, w_high, valid),
    each of shape (bins, grid)."""
    bin_len = length / bins
    pos = start + np.arange(bins)[:, None] * bin_len + (np.arange(grid)[None, :] + 0.5) * bin_len / grid
    valid = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    pos = np.where(at_end, low.astype(np.float64), pos)
    frac = pos - low
    w_low = np.where(valid, 1.0 - frac, 0.0)
    w_high = np.where(valid, frac, 0.0)
    return low, high, w_low, w_high, valid


def _roi_align(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    rois: Any,
    batch_indices: Any,
    *,
    half_pixel: bool,
    mode: str,
    output_height: int,
    output_width: int,
    sampling_ratio: int,
    spatial_scale: float,
    ctx: Any = None,
) -> Any:
    if mode not in ("avg", "max"):
        raise ValueError(f"RoiAlign: unknown mode {mode!r} (expected 'avg' or 'max')")
    if X.ndim != 4:
        raise ValueError(f"RoiAlign: X must be 4-D (N, C, H, W), got shape {list(X.shape)}")
    if rois.ndim != 2 or rois.shape[1] != 4:
        raise ValueError(f"RoiAlign: rois must have shape (num_rois, 4), got {list(rois.shape)}")
    if output_height < 1 or output_width < 1:
        raise ValueError(f"RoiAlign: output_height/output_width must be >= 1, got {output_height}x{output_width}")
    n, c, h, w = (int(d) for d in X.shape)
    boxes = np.asarray(rois.get() if hasattr(rois, "get") and not isinstance(rois, np.ndarray) else rois)
    boxes = boxes.astype(np.float64)
    batch = host_ints(batch_indices)
    if len(batch) != boxes.shape[0]:
        raise ValueError(f"RoiAlign: batch_indices has {len(batch)} entries for {boxes.shape[0]} rois")
    cdtype = _compute_dtype(X.dtype)
    check_alloc((boxes.shape[0], c, output_height, output_width), cdtype, ctx, "RoiAlign")
    y = xp.zeros((boxes.shape[0], c, output_height, output_width), dtype=cdtype)
    offset = 0.5 if half_pixel else 0.0
    for r in range(boxes.shape[0]):
        b = batch[r]
        if not 0 <= b < n:
            raise IndexError(f"RoiAlign: batch_indices[{r}] = {b} is out of range for a batch of {n}")
        x1, y1, x2, y2 = (float(v) * spatial_scale - offset for v in boxes[r])
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        gh = sampling_ratio if sampling_ratio > 0 else max(int(math.ceil(roi_h / output_height)), 0)
        gw = sampling_ratio if sampling_ratio > 0 else max(int(math.ceil(roi_w / output_width)), 0)
        if gh * gw == 0:
            continue  # no sample points: the bin stays 0
        # The sample grid grows with the RoI's size (data): a huge box must not allocate freely.
        check_alloc((output_height * gh + output_width * gw, 5), np.float64, ctx, "RoiAlign sample points")
        if mode == "max":
            check_alloc((c, output_height * gh, output_width * gw), cdtype, ctx, "RoiAlign samples")
        ylo, yhi, wylo, wyhi, _ = _roi_samples(y1, roi_h, output_height, gh, h)
        xlo, xhi, wxlo, wxhi, _ = _roi_samples(x1, roi_w, output_width, gw, w)
        img = X[b]
        if mode == "avg":
            # Separable: dense (bins x pixels) weight matrices over the rows/columns the RoI touches.
            r0, r1 = int(ylo.min()), int(yhi.max()) + 1
            c0, c1 = int(xlo.min()), int(xhi.max()) + 1
            ay = np.zeros((output_height, r1 - r0))
            ax = np.zeros((output_width, c1 - c0))
            rows = np.arange(output_height)[:, None]
            cols = np.arange(output_width)[:, None]
            np.add.at(ay, (np.broadcast_to(rows, ylo.shape), ylo - r0), wylo)
            np.add.at(ay, (np.broadcast_to(rows, yhi.shape), yhi - r0), wyhi)
            np.add.at(ax, (np.broadcast_to(cols, xlo.shape), xlo - c0), wxlo)
            np.add.at(ax, (np.broadcast_to(cols, xhi.shape), xhi - c0), wxhi)
            count = gh * gw
            wy_m = xp.asarray((ay / count).astype(cdtype))
            wx_m = xp.asarray(ax.T.astype(cdtype))
            if xp is np:
                # Two plain GEMMs, not a product per channel (numpy's matmul of a shared matrix
                # and a (C, rows, cols) stack calls BLAS once per channel): the window's rows
                # first, (rows, C * cols), then its columns over (oh * C, cols). 256 channels,
                # 100 RoIs of up to 50x50 pixels: 25.5 -> 22.0 ms (onnxruntime 6.4).
                rows_n, cols_n = r1 - r0, c1 - c0
                window = np.empty((rows_n, c, cols_n), dtype=cdtype)
                window[...] = img[:, r0:r1, c0:c1].transpose(1, 0, 2)
                tmp = wy_m @ window.reshape(rows_n, c * cols_n)  # (oh, C * cols)
                out = tmp.reshape(output_height * c, cols_n) @ wx_m  # (oh * C, ow)
                y[r] = out.reshape(output_height, c, output_width).transpose(1, 0, 2)
            else:
                window = img[:, r0:r1, c0:c1].astype(cdtype)
                y[r] = xp.matmul(xp.matmul(wy_m, window), wx_m)
        else:
            # Max of the weighted corner values over every sample of the bin (onnxruntime's rule).
            best = None
            for yi, wy in ((ylo, wylo), (yhi, wyhi)):
                for xi, wx in ((xlo, wxlo), (xhi, wxhi)):
                    vals = img[:, xp.asarray(yi.reshape(-1))][:, :, xp.asarray(xi.reshape(-1))]  # (C, oh*gh, ow*gw)
                    vals = vals.astype(cdtype)
                    wt = (wy.reshape(-1)[:, None] * wx.reshape(-1)[None, :]).astype(cdtype)
                    term = vals * xp.asarray(wt)
                    best = term if best is None else xp.maximum(best, term)
            assert best is not None
            best = best.reshape(c, output_height, gh, output_width, gw)
            y[r] = best.max(axis=(2, 4))
    return y.astype(X.dtype, copy=False)


@op("RoiAlign", 10)
def roi_align_10(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    rois: Any,
    batch_indices: Any,
    *,
    mode: str = "avg",
    output_height: int = 1,
    output_width: int = 1,
    sampling_ratio: int = 0,
    spatial_scale: float = 1.0,
    ctx: Any = None,
) -> Any:
    return _roi_align(
        xp,
        X,
        rois,
        batch_indices,
        half_pixel=False,
        mode=mode,
        output_height=output_height,
        output_width=output_width,
        sampling_ratio=sampling_ratio,
        spatial_scale=spatial_scale,
        ctx=ctx,
    )


@op("RoiAlign", 16)
def roi_align_16(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    rois: Any,
    batch_indices: Any,
    *,
    coordinate_transformation_mode: str = "half_pixel",
    mode: str = "avg",
    output_height: int = 1,
    output_width: int = 1,
    sampling_ratio: int = 0,
    spatial_scale: float = 1.0,
    ctx: Any = None,
) -> Any:
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ValueError(
            f"RoiAlign: unknown coordinate_transformation_mode {coordinate_transformation_mode!r} "
            "(expected 'half_pixel' or 'output_half_pixel')"
        )
    return _roi_align(
        xp,
        X,
        rois,
        batch_indices,
        half_pixel=coordinate_transformation_mode == "half_pixel",
        mode=mode,
        output_height=output_height,
        output_width=output_width,
        sampling_ratio=sampling_ratio,
        spatial_scale=spatial_scale,
        ctx=ctx,
    )


# -- NonMaxSuppression ----------------------------------------------------------------------------


def _to_host(x: Any) -> np.ndarray:
    return np.asarray(x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else x)


@op("NonMaxSuppression", 10, host_inputs=(2, 3, 4))
def non_max_suppression(
    xp: Any,
    boxes: Any,
    scores: Any,
    max_output_boxes_per_class: Any = None,
    iou_threshold: Any = None,
    score_threshold: Any = None,
    *,
    center_point_box: int = 0,
) -> Any:
    b = _to_host(boxes).astype(np.float32)
    s = _to_host(scores).astype(np.float32)
    if b.ndim != 3 or b.shape[2] != 4:
        raise ValueError(
            f"NonMaxSuppression: boxes must have shape (num_batches, spatial_dimension, 4), got {list(b.shape)}"
        )
    if s.ndim != 3 or s.shape[0] != b.shape[0] or s.shape[2] != b.shape[1]:
        raise ValueError(
            f"NonMaxSuppression: scores of shape {list(s.shape)} do not match boxes of shape {list(b.shape)} "
            "(expected (num_batches, num_classes, spatial_dimension))"
        )
    if center_point_box not in (0, 1):
        raise ValueError(f"NonMaxSuppression: center_point_box must be 0 or 1, got {center_point_box}")
    max_out = int(host_scalar(max_output_boxes_per_class)) if _present(max_output_boxes_per_class) else 0
    iou_thr = float(host_scalar(iou_threshold)) if _present(iou_threshold) else 0.0
    score_thr = float(host_scalar(score_threshold)) if _present(score_threshold) else None
    if not 0.0 <= iou_thr <= 1.0:
        raise ValueError(f"NonMaxSuppression: iou_threshold must be in [0, 1], got {iou_thr}")
    if center_point_box:
        half_w, half_h = b[..., 2] / 2, b[..., 3] / 2
        x0, x1 = b[..., 0] - half_w, b[..., 0] + half_w
        y0, y1 = b[..., 1] - half_h, b[..., 1] + half_h
    else:
        # Any two opposite corners: order them.
        y0, y1 = np.minimum(b[..., 0], b[..., 2]), np.maximum(b[..., 0], b[..., 2])
        x0, x1 = np.minimum(b[..., 1], b[..., 3]), np.maximum(b[..., 1], b[..., 3])
    area = (x1 - x0) * (y1 - y0)
    picked: list[np.ndarray] = []
    if max_out > 0:
        for bi in range(b.shape[0]):
            for ci in range(s.shape[1]):
                sc = s[bi, ci]
                cand = np.nonzero(sc > score_thr)[0] if score_thr is not None else np.arange(sc.shape[0])
                # Highest score first; equal scores keep the lower box index first.
                order = cand[np.argsort(-sc[cand], kind="stable")]
                corners = (x0[bi, order], x1[bi, order], y0[bi, order], y1[bi, order], area[bi, order])
                ranks = _nms_by_overlaps(corners, iou_thr, max_out)
                if ranks is None:
                    ranks = _nms_by_rounds(corners, iou_thr, max_out)
                keep = order[ranks].tolist()
                if keep:
                    rows = np.empty((len(keep), 3), dtype=np.int64)
                    rows[:, 0] = bi
                    rows[:, 1] = ci
                    rows[:, 2] = keep
                    picked.append(rows)
    out = np.concatenate(picked) if picked else np.zeros((0, 3), dtype=np.int64)
    return xp.asarray(out)


def _iou_over(i: Any, j: Any, corners: tuple[np.ndarray, ...], iou_thr: float) -> Any:
    """Whether boxes i and j (ranks, arrays or scalars) overlap by more than ``iou_thr``:
    NonMaxSuppression's test, in float32 as onnxruntime computes it; boxes without area never
    suppress or get suppressed."""
    x0, x1, y0, y1, area = corners
    iw = np.minimum(x1[i], x1[j]) - np.maximum(x0[i], x0[j])
    ih = np.minimum(y1[i], y1[j]) - np.maximum(y0[i], y0[j])
    inter = np.maximum(iw, 0) * np.maximum(ih, 0)
    union = area[i] + area[j] - inter
    ok = (area[i] > 0) & (area[j] > 0) & (union > 0)
    return np.where(ok, inter / np.where(ok, union, 1), 0) > iou_thr


def _nms_by_rounds(corners: tuple[np.ndarray, ...], iou_thr: float, max_out: int) -> np.ndarray:
    """Greedy NMS over boxes in rank order, one round per kept box, each comparing it with all
    boxes left: fast when each kept box suppresses many (heavily overlapping boxes)."""
    order = np.arange(corners[0].shape[0])
    keep: list[int] = []
    while order.size and len(keep) < max_out:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        order = rest[~_iou_over(i, rest, corners, iou_thr)]
    return np.array(keep, dtype=np.int64)


# Box pairs whose x-intervals overlap that _nms_by_overlaps tests, at most: beyond it the boxes
# overlap so much that rounds (each suppressing many) are the faster way.
NMS_PAIR_BUDGET = 16_000_000
_NMS_PAIR_CHUNK = 1_000_000


def _nms_by_overlaps(corners: tuple[np.ndarray, ...], iou_thr: float, max_out: int) -> np.ndarray | None:
    """The same greedy NMS from the pairs of boxes that overlap at all: a box is only ever
    suppressed by one whose x-interval overlaps its own, so the pairs come from the boxes
    sorted by their left edge (each box with those starting inside it), their IoU is tested
    in chunks, and one pass in rank order keeps a box no kept box suppressed. The rounds made
    about fifteen numpy calls over every remaining box for each kept one: 11 s for 27,000
    boxes of which 25,240 stay (a detector's random-weight output), against onnxruntime's
    0.5 s. None where more than NMS_PAIR_BUDGET pairs overlap in x."""
    x0, x1 = corners[0], corners[1]
    n = x0.shape[0]
    by_left = np.argsort(x0, kind="stable")
    left = x0[by_left]
    # Boxes at sorted positions p < q overlap in x only if left[q] < x1 of p (strictly: an
    # IoU above a threshold >= 0 needs a positive intersection).
    ends = np.searchsorted(left, x1[by_left], side="left")
    counts = np.maximum(ends - np.arange(n) - 1, 0)
    total = int(counts.sum())
    if total > NMS_PAIR_BUDGET:
        return None
    starts = np.cumsum(counts) - counts
    sources: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    p_lo = 0
    while p_lo < n:
        # positions [p_lo, p_hi) whose pairs fit one chunk (at least one position)
        p_hi = int(np.searchsorted(starts, starts[p_lo] + _NMS_PAIR_CHUNK, side="right"))
        p_hi = max(p_hi, p_lo + 1)
        c = counts[p_lo:p_hi]
        m = int(c.sum())
        if m:
            p = np.repeat(np.arange(p_lo, p_hi), c)
            q = p + 1 + (np.arange(m) - np.repeat(starts[p_lo:p_hi] - starts[p_lo], c))
            a, b = by_left[p], by_left[q]  # ranks
            hit = _iou_over(a, b, corners, iou_thr)
            a, b = a[hit], b[hit]
            sources.append(np.minimum(a, b))  # the better-ranked box of the pair suppresses
            targets.append(np.maximum(a, b))
        p_lo = p_hi
    if sources:
        src, dst = np.concatenate(sources), np.concatenate(targets)
        by_src = np.argsort(src, kind="stable")
        dst = dst[by_src]
        bounds = np.concatenate(([0], np.cumsum(np.bincount(src, minlength=n)))).tolist()
    else:
        dst = np.zeros(0, dtype=np.int64)
        bounds = [0] * (n + 1)
    suppressed = np.zeros(n, dtype=bool)
    keep: list[int] = []
    for r in range(n):
        if suppressed[r]:
            continue
        keep.append(r)
        if len(keep) >= max_out:
            break
        lo, hi = bounds[r], bounds[r + 1]
        if hi > lo:
            suppressed[dst[lo:hi]] = True
    return np.array(keep, dtype=np.int64)


def _present(x: Any) -> bool:
    return x is not None and np.size(x) > 0


# -- AffineGrid -----------------------------------------------------------------------------------


def _affine_base(n: int, align_corners: int) -> np.ndarray:
    """Evenly spaced normalized positions in [-1, 1] for ``n`` pixels."""
    i = np.arange(n, dtype=np.float64)
    if align_corners:
        # A single pixel sits at +1, as onnxruntime places it (the spec's function body divides
        # by zero there).
        return -1.0 + 2.0 * i / (n - 1) if n > 1 else np.ones(n)
    return (2.0 * i + 1.0) / n - 1.0


@op("AffineGrid", 20, host_inputs=(1,))
def affine_grid(xp: Any, theta: Any, size: Any, *, align_corners: int = 0, ctx: Any = None) -> Any:
    dims = host_ints(size)
    if len(dims) not in (4, 5):
        raise ValueError(f"AffineGrid: size must be (N, C, H, W) or (N, C, D, H, W), got {dims}")
    r = len(dims) - 2
    if theta.ndim != 3 or theta.shape[1] != r or theta.shape[2] != r + 1:
        raise ValueError(
            f"AffineGrid: theta of shape {list(theta.shape)} does not match size {dims} (expected (N, {r}, {r + 1}))"
        )
    if theta.shape[0] != dims[0]:
        raise ValueError(f"AffineGrid: theta has {theta.shape[0]} matrices for a batch of {dims[0]}")
    spatial = dims[2:]
    check_alloc([dims[0], *spatial, r], theta.dtype, ctx, "AffineGrid")
    # Homogeneous positions, innermost axis first: (x, y[, z], 1).
    axes = [_affine_base(d, align_corners) for d in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(int(np.prod(spatial)))], axis=1)
    cdtype = _compute_dtype(theta.dtype)
    grid = xp.einsum("nij,pj->npi", theta.astype(cdtype), xp.asarray(base.astype(cdtype)))
    return grid.reshape([dims[0], *spatial, r]).astype(theta.dtype, copy=False)


# -- CenterCropPad, SpaceToDepth, DepthToSpace ---------------------------------------------------


@op("CenterCropPad", 18, host_inputs=(1,))
def center_crop_pad(xp: Any, input_data: Any, shape: Any, *, axes: list[int] | None = None, ctx: Any = None) -> Any:
    target = host_ints(shape)
    rank = input_data.ndim
    ax = normalize_axes(axes, rank, "CenterCropPad axes") if axes else list(range(rank))
    if len(target) != len(ax):
        raise ValueError(f"CenterCropPad: shape has {len(target)} values for {len(ax)} axes")
    if any(t < 0 for t in target):
        raise ValueError(f"CenterCropPad: shape must not be negative, got {target}")
    out_shape = list(input_data.shape)
    src: list[slice] = [slice(None)] * rank
    dst: list[slice] = [slice(None)] * rank
    padded = False
    for a, t in zip(ax, target):
        d = int(input_data.shape[a])
        out_shape[a] = t
        if d >= t:
            start = (d - t) // 2
            src[a] = slice(start, start + t)
        else:
            start = (t - d) // 2
            dst[a] = slice(start, start + d)
            padded = True
    check_alloc(out_shape, input_data.dtype, ctx, "CenterCropPad")
    if not padded:
        return input_data[tuple(src)].copy()
    if input_data.dtype.kind == "O":
        out = np.full(out_shape, "", dtype=object)
    else:
        out = xp.zeros(out_shape, dtype=input_data.dtype)
    out[tuple(dst)] = input_data[tuple(src)]
    return out


def _check_blocks(what: str, x: Any, blocksize: int) -> tuple[int, int, int, int]:
    if x.ndim != 4:
        raise ValueError(f"{what}: input must be 4-D (N, C, H, W), got shape {list(x.shape)}")
    if blocksize < 1:
        raise ValueError(f"{what}: blocksize must be >= 1, got {blocksize}")
    b, c, h, w = (int(d) for d in x.shape)
    return b, c, h, w


def _depth_to_space(xp: Any, x: Any, blocksize: int, mode: str) -> Any:
    b, c, h, w = _check_blocks("DepthToSpace", x, blocksize)
    bs = blocksize
    if c % (bs * bs):
        raise ValueError(f"DepthToSpace: channels {c} are not divisible by blocksize^2 = {bs * bs}")
    if mode == "DCR":
        t = x.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        t = x.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"DepthToSpace: unknown mode {mode!r} (expected 'DCR' or 'CRD')")
    return xp.ascontiguousarray(t).reshape(b, c // (bs * bs), h * bs, w * bs)


@op("DepthToSpace", 1)
def depth_to_space_1(xp: Any, input: Any, *, blocksize: int) -> Any:  # noqa: A002 - spec name
    return _depth_to_space(xp, input, blocksize, "DCR")


@op("DepthToSpace", 11)
def depth_to_space_11(xp: Any, input: Any, *, blocksize: int, mode: str = "DCR") -> Any:  # noqa: A002
    return _depth_to_space(xp, input, blocksize, mode)


def _space_to_depth(xp: Any, x: Any, blocksize: int, mode: str) -> Any:
    b, c, h, w = _check_blocks("SpaceToDepth", x, blocksize)
    bs = blocksize
    if h % bs or w % bs:
        raise ValueError(f"SpaceToDepth: height {h} and width {w} must be divisible by blocksize {bs}")
    t = x.reshape(b, c, h // bs, bs, w // bs, bs)
    if mode == "DCR":
        t = t.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        t = t.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"SpaceToDepth: unknown mode {mode!r} (expected 'DCR' or 'CRD')")
    return xp.ascontiguousarray(t).reshape(b, c * bs * bs, h // bs, w // bs)


@op("SpaceToDepth", 1)
def space_to_depth_1(xp: Any, input: Any, *, blocksize: int) -> Any:  # noqa: A002 - spec name
    return _space_to_depth(xp, input, blocksize, "DCR")


@op("SpaceToDepth", 28)
def space_to_depth_28(xp: Any, input: Any, *, blocksize: int, mode: str = "DCR") -> Any:  # noqa: A002
    return _space_to_depth(xp, input, blocksize, mode)
