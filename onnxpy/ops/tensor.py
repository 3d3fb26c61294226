"""Shape and layout kernels: Reshape, Flatten, (Un)Squeeze, Transpose, Concat, Split, Slice,
Shape, Size, Constant(OfShape), Identity, Cast(Like), Range, Expand, Tile, Pad."""

from __future__ import annotations

import math
import re
from typing import Any

import ml_dtypes
import numpy as np

from ..model import dtypes
from . import _half
from ._compat import check_alloc, host_ints, host_scalar, normalize_axes, normalize_axis
from ._layout import is_channels_last
from .registry import memoized, op

# -- views ---------------------------------------------------------------------------------------


def _reshape_target(shape_in: tuple[int, ...], shape: list[int], allowzero: int) -> list[int]:
    out = list(shape)
    if not allowzero:
        for i, d in enumerate(out):
            if d == 0:
                if i >= len(shape_in):
                    raise ValueError(f"shape {shape} copies dimension {i} (0) but the input has rank {len(shape_in)}")
                out[i] = shape_in[i]
    if out.count(-1) > 1:
        raise ValueError(f"shape {shape} has more than one -1")
    if any(d < -1 for d in out):
        raise ValueError(f"shape {shape} has a negative dimension other than -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        total = math.prod(shape_in)
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape {list(shape_in)} to {shape}: {total} elements do not divide into {known}")
        out[out.index(-1)] = total // known
    if math.prod(out) != math.prod(shape_in):
        raise ValueError(
            f"cannot reshape {list(shape_in)} ({math.prod(shape_in)} elements) to {shape} ({math.prod(out)} elements)"
        )
    return out


@op("Reshape", 5, alias={0: 0}, host_inputs=(1,))
def reshape(xp: Any, data: Any, shape: Any, *, allowzero: int = 0, ctx: Any = None) -> Any:
    if shape.__class__ is np.ndarray and shape.ndim == 1:
        # Remembered per node and input shape: transformers reshape the same few shapes every
        # call (16 Reshapes a Llama decoder step); 3.4 -> 1.2 us a call.
        requested = tuple(shape.tolist())
        target = memoized(
            ctx,
            ("reshape", data.shape, requested, allowzero),
            lambda: tuple(_reshape_target(data.shape, list(requested), allowzero)),
        )
        return data.reshape(target)
    return data.reshape(_reshape_target(data.shape, host_ints(shape), allowzero))


@op("Flatten", 1, alias={0: 0})
def flatten(xp: Any, input: Any, *, axis: int = 1) -> Any:  # noqa: A002 - spec name
    if not -input.ndim <= axis <= input.ndim:
        raise ValueError(
            f"Flatten axis {axis} is out of range for rank {input.ndim} (expected [{-input.ndim}, {input.ndim}])"
        )
    if axis < 0:
        axis += input.ndim
    rows = math.prod(input.shape[:axis])
    return input.reshape(rows, math.prod(input.shape[axis:]))


@op("Squeeze", 1, alias={0: 0})
def squeeze_1(xp: Any, data: Any, *, axes: list[int] | None = None) -> Any:
    return squeeze(xp, data, axes)


@op("Squeeze", 13, alias={0: 0}, host_inputs=(1,))
def squeeze(xp: Any, data: Any, axes: Any = None) -> Any:
    ax = normalize_axes(host_ints(axes), data.ndim)
    if not ax:
        # No axes (absent or empty) squeezes every dimension of size 1.
        return data.reshape([d for d in data.shape if d != 1])
    for a in ax:
        if data.shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of shape {list(data.shape)}: its size is {data.shape[a]}, not 1")
    return data.reshape([d for i, d in enumerate(data.shape) if i not in ax])


@op("Unsqueeze", 1, alias={0: 0})
def unsqueeze_1(xp: Any, data: Any, *, axes: list[int]) -> Any:
    return unsqueeze(xp, data, axes)


@op("Unsqueeze", 13, alias={0: 0}, host_inputs=(1,))
def unsqueeze(xp: Any, data: Any, axes: Any) -> Any:
    rank = data.ndim + len(host_ints(axes))
    ax = sorted(normalize_axes(host_ints(axes), rank))
    shape = list(data.shape)
    for a in ax:
        shape.insert(a, 1)
    return data.reshape(shape)


@op("Transpose", 1, alias={0: 0})
def transpose(xp: Any, data: Any, *, perm: list[int] | None = None) -> Any:
    if perm is None:
        return data.transpose()
    if sorted(perm) != list(range(data.ndim)):
        raise ValueError(f"perm {perm} is not a permutation of the {data.ndim} axes of shape {list(data.shape)}")
    return data.transpose(perm)


@op("Identity", 1, alias={0: 0})
def identity(xp: Any, input: Any) -> Any:  # noqa: A002 - spec name
    return input


# -- joining and splitting -----------------------------------------------------------------------


@op("Concat", 4)
def concat(xp: Any, *inputs: Any, axis: int) -> Any:
    if not inputs:
        raise ValueError("Concat needs at least one input")
    rank = inputs[0].ndim
    if rank == 0:
        # A scalar has no axis to join along (the spec's shape inference refuses it).
        raise ValueError(f"Concat: inputs must have rank >= 1, got rank 0 (shapes {[list(i.shape) for i in inputs]})")
    axis = normalize_axis(axis, rank)
    for x in inputs[1:]:
        if x.ndim != rank:
            raise ValueError(f"Concat inputs must have the same rank, got shapes {[list(i.shape) for i in inputs]}")
    if xp is np and rank == 4 and axis == 1 and _mostly_channels_last(inputs):
        # Channels-last inputs (ShuffleNet's branches): joined in channels-last memory, where
        # each input's copy runs along its own rows, and the result stays channels-last.
        return np.concatenate([x.transpose(0, 2, 3, 1) for x in inputs], axis=3).transpose(0, 3, 1, 2)
    return xp.concatenate(inputs, axis=axis)


def _mostly_channels_last(inputs: tuple[Any, ...]) -> bool:
    """Whether channels-last arrays hold at least half the channels of these same-shaped (but
    for channels) 4-D numpy inputs."""
    first = inputs[0].shape
    if any(x.__class__ is not np.ndarray or x.shape[0] != first[0] or x.shape[2:] != first[2:] for x in inputs):
        return False
    last = sum(x.shape[1] for x in inputs if is_channels_last(x))
    return last > 0 and 2 * last >= sum(x.shape[1] for x in inputs)


def _split_sizes(length: int, split: list[int] | None, n_outputs: int, num_outputs: int | None) -> list[int]:
    if split:
        if sum(split) != length or any(s < 0 for s in split):
            raise ValueError(f"split sizes {split} do not add up to the axis length {length}")
        return split
    n = num_outputs or n_outputs
    if num_outputs is not None:
        chunk = -(-length // n)
        sizes = [chunk] * (n - 1) + [length - chunk * (n - 1)]
        if sizes[-1] < 0:
            raise ValueError(f"cannot split length {length} into {n} outputs")
        return sizes
    if length % n:
        raise ValueError(f"axis length {length} does not split evenly into {n} outputs")
    return [length // n] * n


def _split(xp: Any, x: Any, axis: int, sizes: list[int], n_outputs: int | None = None) -> tuple[Any, ...]:
    axis = normalize_axis(axis, x.ndim)
    if n_outputs is not None and len(sizes) != n_outputs:
        raise ValueError(f"Split makes {len(sizes)} parts (sizes {sizes}) but the node has {n_outputs} outputs")
    out = []
    start = 0
    for s in sizes:
        idx = [slice(None)] * x.ndim
        idx[axis] = slice(start, start + s)
        out.append(x[tuple(idx)])
        start += s
    return tuple(out)


@op("Split", 2)
def split_2(xp: Any, input: Any, *, axis: int = 0, split: list[int] | None = None, ctx: Any) -> Any:  # noqa: A002
    return _split(
        xp,
        input,
        axis,
        _split_sizes(input.shape[normalize_axis(axis, input.ndim)], split, ctx.n_outputs, None),
        ctx.n_outputs,
    )


@op("Split", 13, host_inputs=(1,))
def split_13(xp: Any, input: Any, split: Any = None, *, axis: int = 0, ctx: Any) -> Any:  # noqa: A002
    sizes = host_ints(split) if split is not None else None
    return _split(
        xp,
        input,
        axis,
        _split_sizes(input.shape[normalize_axis(axis, input.ndim)], sizes, ctx.n_outputs, None),
        ctx.n_outputs,
    )


@op("Split", 18, host_inputs=(1,))
def split(xp: Any, input: Any, split: Any = None, *, axis: int = 0, num_outputs: int | None = None, ctx: Any) -> Any:  # noqa: A002
    sizes = host_ints(split) if split is not None else None
    if sizes is not None and num_outputs is not None:
        raise ValueError("Split takes either the 'split' input or the 'num_outputs' attribute, not both")
    return _split(
        xp,
        input,
        axis,
        _split_sizes(input.shape[normalize_axis(axis, input.ndim)], sizes, ctx.n_outputs, num_outputs),
        ctx.n_outputs,
    )


# -- slicing -------------------------------------------------------------------------------------


def _slice(x: Any, starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None) -> Any:
    if x.ndim == 0:  # the spec's starts/ends index axes: a scalar has none (onnxruntime refuses it too)
        raise ValueError("Slice: the input is a scalar (rank 0), which has no axis to slice")
    if axes is None:
        axes = list(range(len(starts)))
    axes = normalize_axes(axes, x.ndim)
    if steps is None:
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must have the same length")
    idx: list[slice] = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ValueError("slice step cannot be 0")
        dim = x.shape[a]
        # Clamp as the spec says: start to [0, dim] (forward) or [0, dim - 1] (backward),
        # end to [0, dim] (forward) or [-1, dim - 1] (backward, -1 meaning "past the front").
        if s < 0:
            s += dim
        if e < 0:
            e += dim
        if st > 0:
            idx[a] = slice(min(max(s, 0), dim), min(max(e, 0), dim), st)
        elif dim == 0:
            idx[a] = slice(0, 0)
        else:
            s = min(max(s, 0), dim - 1)
            e = min(max(e, -1), dim - 1)
            idx[a] = slice(s, e if e >= 0 else None, st)
    return x[tuple(idx)]


@op("Slice", 1, alias={0: 0})
def slice_1(xp: Any, data: Any, *, starts: list[int], ends: list[int], axes: list[int] | None = None) -> Any:
    return _slice(data, starts, ends, axes, None)


@op("Slice", 10, alias={0: 0}, host_inputs=(1, 2, 3, 4))
def slice_(xp: Any, data: Any, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> Any:
    return _slice(
        data,
        host_ints(starts),
        host_ints(ends),
        None if axes is None else host_ints(axes),
        None if steps is None else host_ints(steps),
    )


# -- shapes and constants ------------------------------------------------------------------------


@op("Shape", 1)
def shape(xp: Any, data: Any, *, start: int = 0, end: int | None = None) -> Any:
    dims = list(data.shape)
    r = len(dims)
    s = min(max(start + r if start < 0 else start, 0), r)
    e = r if end is None else min(max(end + r if end < 0 else end, 0), r)
    return xp.asarray(dims[s:e], dtype=np.int64)


@op("Size", 1)
def size(xp: Any, data: Any) -> Any:
    return xp.asarray(int(math.prod(data.shape)), dtype=np.int64)


@op("ConstantOfShape", 9, host_inputs=(0,))
def constant_of_shape(xp: Any, input: Any, *, value: Any = None, ctx: Any = None) -> Any:  # noqa: A002
    dims = host_ints(input)
    fill = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value).reshape(-1)
    if fill.size != 1:
        raise ValueError(f"ConstantOfShape 'value' must hold one element, it holds {fill.size}")
    check_alloc(dims, fill.dtype, ctx, "ConstantOfShape")
    return xp.full(dims, fill[0], dtype=fill.dtype)


@op("Constant", 1)
def constant(
    xp: Any,
    *,
    value: Any = None,
    sparse_value: Any = None,
    value_float: float | None = None,
    value_floats: list[float] | None = None,
    value_int: int | None = None,
    value_ints: list[int] | None = None,
    value_string: str | None = None,
    value_strings: list[str] | None = None,
) -> Any:
    given = [
        (k, v)
        for k, v in (
            ("value", value),
            ("sparse_value", sparse_value),
            ("value_float", value_float),
            ("value_floats", value_floats),
            ("value_int", value_int),
            ("value_ints", value_ints),
            ("value_string", value_string),
            ("value_strings", value_strings),
        )
        if v is not None
    ]
    if len(given) != 1:
        raise ValueError(f"Constant needs exactly one value attribute, got {[k for k, _ in given] or 'none'}")
    key, v = given[0]
    if key in ("value", "sparse_value"):
        arr = np.asarray(v)
    elif key == "value_float":
        arr = np.asarray(v, dtype=np.float32)
    elif key == "value_floats":
        arr = np.asarray(v, dtype=np.float32)
    elif key == "value_int":
        arr = np.asarray(v, dtype=np.int64)
    elif key == "value_ints":
        arr = np.asarray(v, dtype=np.int64)
    elif key == "value_string":
        arr = np.asarray(v, dtype=object)
    else:
        arr = np.asarray(v, dtype=object)
    if arr.dtype.hasobject:
        return arr
    return xp.asarray(arr)


# -- casting -------------------------------------------------------------------------------------

# float8 types whose conversion honours `saturate` (clip to +-max instead of inf / NaN).
_SATURATING = frozenset(dtypes.np_dtype(e) for e in (17, 18, 19, 20))
_E8M0 = dtypes.ELEM_TO_NP.get(24)  # float8e8m0, when onnx / ml_dtypes know it
_BF16 = np.dtype(ml_dtypes.bfloat16)
_F64 = np.dtype(np.float64)


def _host(x: Any) -> np.ndarray:
    return np.asarray(x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else x)


def cast_array(xp: Any, x: Any, target: np.dtype, saturate: int = 1, round_mode: str = "up") -> Any:
    """Cast ``x`` to ``target`` following ONNX Cast: float8 saturation, float8e8m0 rounding,
    bool as != 0, and string <-> number conversions."""
    target = np.dtype(target)
    if x.dtype == target:
        return x
    if target.hasobject:
        return _to_strings(x)
    if x.dtype.hasobject:
        return cast_array(xp, xp.asarray(_parse_strings(_host(x), target)), target, saturate, round_mode)
    if target == np.bool_:
        return x != 0
    if _E8M0 is not None and target == _E8M0:
        return _to_e8m0(xp, x, saturate, round_mode)
    if target in _SATURATING and saturate and x.dtype != np.bool_:
        # Clip in a type wide enough for the source (float32 covers half types and float8 / 4).
        wide = x.dtype if x.dtype in (np.float32, _F64) else (_F64 if x.dtype.itemsize >= 4 else np.float32)
        limit = float(ml_dtypes.finfo(target).max)
        x = xp.clip(x.astype(wide, copy=False), -limit, limit)
    if xp is np:  # numpy's half casts are scalar loops
        if x.dtype == np.float32 and target == np.float16 and x.size >= _half.MIN_VALUES_TO_HALF:
            return _half.float32_to_float16(x)
        if x.dtype == np.float16 and target == np.float32 and x.size >= _half.MIN_VALUES_FROM_HALF:
            return _half.float16_to_float32(x)
        if x.dtype == _BF16 and target == np.float32 and x.size >= _half.MIN_VALUES_FROM_HALF:
            return _half.bfloat16_to_float32(x)
    with np.errstate(invalid="ignore", over="ignore"):
        # NaN / out-of-range floats to integers are undefined by the spec: no warning noise.
        return x.astype(target)


def _to_e8m0(xp: Any, x: Any, saturate: int, round_mode: str) -> Any:
    """float8e8m0 holds only a biased exponent: 2**(code - 127), code 255 is NaN. Negative inputs
    are unspecified by the spec; their magnitude is used."""
    v = xp.abs(x.astype(_F64))
    m, e = xp.frexp(v)  # v = m * 2**e with m in [0.5, 1), so floor(log2 v) = e - 1
    if round_mode == "up":
        k = e - 1 + (m > 0.5)
    elif round_mode == "down":
        k = e - 1
    elif round_mode == "nearest":
        k = e - 1 + (m >= 0.75)  # the midpoint between 2**j and 2**(j+1) is 1.5 * 2**j; ties go up
    else:
        raise ValueError(f"Cast: round_mode must be 'up', 'down' or 'nearest', got '{round_mode}'")
    code = k.astype(np.int64) + 127
    zero = v == 0
    inf = xp.isinf(v)
    if saturate:
        code = xp.where(inf, 254, xp.clip(code, 0, 254))
        code = xp.where(zero, 0, code)
    else:
        # Rounding up brings any positive value below the smallest power up to it; zero, overflow
        # and (for down / nearest) underflow have no representation.
        if round_mode == "up":
            code = xp.maximum(code, 0)
        code = xp.where(zero | inf | (code < 0) | (code > 254), 255, code)
    code = xp.where(xp.isnan(v), 255, code)
    return code.astype(np.uint8).view(_E8M0)


def _float_text(f: float) -> str:
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "INF" if f > 0 else "-INF"
    return "%.8g" % f  # noqa: UP031 - printf formatting is the point: 8 significant digits


def _to_strings(x: Any) -> np.ndarray:
    """Numbers as text the way onnxruntime writes them: 8 significant digits for floats, 1 / 0 for bool."""
    host = _host(x)
    out = np.empty(host.shape, dtype=object)
    flat = out.reshape(-1)
    if host.dtype == np.bool_:
        flat[:] = ["1" if v else "0" for v in host.reshape(-1).tolist()]
    elif host.dtype.kind in "iu" or _is_int_type(host.dtype):
        flat[:] = [str(v) for v in host.astype(np.int64 if host.dtype.kind != "u" else np.uint64).reshape(-1).tolist()]
    elif host.dtype.kind == "c":
        flat[:] = [str(v) for v in host.reshape(-1).tolist()]
    else:
        flat[:] = [_float_text(v) for v in host.astype(_F64).reshape(-1).tolist()]
    return out


def _is_int_type(dt: np.dtype) -> bool:
    try:
        ml_dtypes.iinfo(dt)
    except (ValueError, TypeError):
        return False
    return True


# The number forms the spec names (plain and scientific) and C's strtod also reads: inf,
# infinity and nan in any case, and hexadecimal with its 0x. ASCII digits only: Python's
# float() also takes '1_000' and Arabic-Indic digits, and fromhex() read 'abc' as 2748.
_DECIMAL = re.compile(r"\s*[+-]?(\d+\.?\d*(e[+-]?\d+)?|\.\d+(e[+-]?\d+)?|inf(inity)?|nan)\s*", re.IGNORECASE | re.ASCII)
_INTEGER = re.compile(r"\s*[+-]?\d+\s*", re.ASCII)
_HEX = re.compile(r"\s*[+-]?0x[0-9a-f]*\.?[0-9a-f]*(p[+-]?\d+)?\s*", re.IGNORECASE | re.ASCII)


def _parse_float(s: str) -> float:
    if _DECIMAL.fullmatch(s):
        return float(s)
    if _HEX.fullmatch(s):
        try:
            return float.fromhex(s.strip())
        except ValueError:
            pass
    raise ValueError(f"Cast: cannot convert string {s!r} to a number")


def _parse_int(s: str) -> int:
    try:
        if not _INTEGER.fullmatch(s):
            raise ValueError(s)
        return int(s.strip())
    except ValueError:
        f = _parse_float(s)  # "1e3" or "2.7": undefined by the spec; truncate like a float cast
        return int(f) if math.isfinite(f) else 0


def _parse_strings(host: np.ndarray, target: np.dtype) -> np.ndarray:
    """Parse a string tensor into float64 (float targets), bool, or int64 / uint64 (integer targets)."""
    texts = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in host.reshape(-1)]
    if target == np.bool_:
        vals: list[Any] = [
            t.strip().lower() == "true" or (t.strip().lower() != "false" and _parse_float(t) != 0) for t in texts
        ]
        return np.array(vals, dtype=np.bool_).reshape(host.shape)
    if target.kind in "iu" or _is_int_type(target):
        ints = [_parse_int(t) for t in texts]
        if target.kind == "u":
            return np.array([i % (1 << 64) for i in ints], dtype=np.uint64).reshape(host.shape)
        # Out-of-range values wrap like a fixed-point cast.
        return np.array([((i + (1 << 63)) % (1 << 64)) - (1 << 63) for i in ints], dtype=np.int64).reshape(host.shape)
    return np.array([_parse_float(t) for t in texts], dtype=_F64).reshape(host.shape)


@op("Cast", 6)
def cast(xp: Any, input: Any, *, to: int, round_mode: str = "up", saturate: int = 1) -> Any:  # noqa: A002
    return cast_array(xp, input, dtypes.np_dtype(to), saturate, round_mode)


@op("CastLike", 15)
def cast_like(xp: Any, input: Any, target_type: Any, *, round_mode: str = "up", saturate: int = 1) -> Any:  # noqa: A002
    return cast_array(xp, input, target_type.dtype, saturate, round_mode)


# -- generators and broadcasting -----------------------------------------------------------------


@op("Range", 11)
def range_(xp: Any, start: Any, limit: Any, delta: Any, *, stash_type: int = 1, ctx: Any = None) -> Any:
    dt = start.dtype
    if limit.dtype != dt or delta.dtype != dt:
        raise TypeError(f"Range: start, limit and delta must share a type, got {dt}, {limit.dtype}, {delta.dtype}")
    s, l, d = host_scalar(start), host_scalar(limit), host_scalar(delta)
    if d == 0:
        raise ValueError("Range: delta cannot be 0")
    if dt.kind in "iu":
        n = max(-((s - l) // d), 0)  # exact ceil((limit - start) / delta) for integers
        check_alloc([n], dt, ctx, "Range")
        return xp.asarray(s + d * np.arange(n, dtype=np.int64), dtype=dt)
    # Floats: successive additions (start, start + delta, ...) as the spec's loop does; half types
    # accumulate in the stash_type (float32 by default).
    work = dt if dt in (np.float32, np.float64) else dtypes.np_dtype(stash_type)
    sw, lw, dw = (np.asarray(v, dtype=dt).astype(work) for v in (s, l, d))
    q = (float(lw) - float(sw)) / float(dw)
    n = max(int(math.ceil(q)), 0) if math.isfinite(q) else -1
    if n < 0:
        raise ValueError(f"Range: start {s}, limit {l} and delta {d} give no finite number of elements")
    check_alloc([n], dt, ctx, "Range")
    if n == 0:
        return xp.zeros(0, dtype=dt)
    steps = xp.full(n, dw, dtype=work)
    steps[0] = sw
    return xp.cumsum(steps, dtype=work).astype(dt, copy=False)


@op("Expand", 8, host_inputs=(1,))
def expand(xp: Any, input: Any, shape: Any, *, ctx: Any = None) -> Any:  # noqa: A002
    dims = host_ints(shape)
    try:
        out_shape = np.broadcast_shapes(tuple(input.shape), tuple(dims))
    except ValueError:
        raise ValueError(f"cannot expand shape {list(input.shape)} to {dims}") from None
    if out_shape == tuple(input.shape):
        return input.view()  # nothing to broadcast (a transformer's mask, often): no copy
    check_alloc(out_shape, input.dtype, ctx, "Expand")
    return xp.broadcast_to(input, out_shape).copy()


@op("Tile", 6, host_inputs=(1,))
def tile(xp: Any, input: Any, repeats: Any, *, ctx: Any = None) -> Any:  # noqa: A002
    reps = host_ints(repeats)
    if len(reps) != input.ndim:
        raise ValueError(f"repeats {reps} must have one entry per axis of shape {list(input.shape)}")
    if any(r < 0 for r in reps):
        raise ValueError(f"repeats {reps} must not be negative")
    check_alloc([d * r for d, r in zip(input.shape, reps)], input.dtype, ctx, "Tile")
    return xp.tile(input, reps)


def _pad(xp: Any, x: Any, pads: list[int], mode: str, value: Any, axes: list[int] | None, ctx: Any = None) -> Any:
    rank = x.ndim
    axes = list(range(rank)) if axes is None else normalize_axes(axes, rank)
    if len(pads) != 2 * len(axes):
        raise ValueError(f"pads {pads} must have 2 entries per padded axis ({len(axes)} axes)")
    begin = [0] * rank
    end = [0] * rank
    for i, a in enumerate(axes):
        begin[a] = pads[i]
        end[a] = pads[i + len(axes)]
    out_shape = [d + b + e for d, b, e in zip(x.shape, begin, end)]
    for k, o in enumerate(out_shape):
        if o < 0:
            raise ValueError(
                f"Pad: pads ({begin[k]}, {end[k]}) on axis {k} of size {x.shape[k]} give it the negative size {o}"
            )
    if rank == 0:
        return x.copy()  # a scalar takes no pads: nothing to do in any mode
    if 0 in out_shape:
        check_alloc(out_shape, x.dtype, ctx, "Pad")
        return xp.empty(out_shape, dtype=x.dtype)  # no values to compute (in any mode)
    if any(max(-b, 0) + max(-e, 0) > d for d, b, e in zip(x.shape, begin, end)):
        # A crop reaching past the data into the other side's padding: pad, then crop.
        width = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
        padded = _pad(xp, x, [w for w, _ in width] + [w for _, w in width], mode, value, None, ctx)
        crop = tuple(slice(max(-b, 0), n - max(-e, 0)) for n, b, e in zip(padded.shape, begin, end))
        return padded[crop].copy()
    # Negative pads crop first (the crop stays inside the data).
    crop = tuple(slice(max(-b, 0), x.shape[k] - max(-e, 0)) for k, (b, e) in enumerate(zip(begin, end)))
    x = x[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    check_alloc([d + b + e for d, (b, e) in zip(x.shape, width)], x.dtype, ctx, "Pad")
    if mode == "constant":
        return xp.pad(x, width, mode="constant", constant_values=value)
    if mode == "reflect":
        for k, (b, e) in enumerate(width):
            if max(b, e) > x.shape[k] - 1 and max(b, e) > 0:
                raise ValueError(
                    f"Pad reflect: pads ({b}, {e}) on axis {k} must be smaller than the axis size {x.shape[k]} "
                    "(after negative pads crop it)"
                )
        return xp.pad(x, width, mode="reflect")
    if mode in ("edge", "wrap"):
        for k, (b, e) in enumerate(width):
            if x.shape[k] == 0 and max(b, e) > 0:
                # Both modes copy values of the axis itself: an empty one has none to copy.
                raise ValueError(
                    f"Pad {mode}: cannot pad axis {k} by ({b}, {e}): it has size 0 (after negative pads crop it)"
                )
        return xp.pad(x, width, mode=mode)
    raise ValueError(f"Pad mode must be constant, reflect, edge or wrap, got '{mode}'")


@op("Pad", 2)
def pad_2(xp: Any, data: Any, *, pads: list[int], mode: str = "constant", value: float = 0.0, ctx: Any = None) -> Any:
    return _pad(xp, data, pads, mode, data.dtype.type(value), None, ctx)


@op("Pad", 11, host_inputs=(1, 2, 3))
def pad(
    xp: Any,
    data: Any,
    pads: Any,
    constant_value: Any = None,
    axes: Any = None,
    *,
    mode: str = "constant",
    ctx: Any = None,
) -> Any:
    if constant_value is None or constant_value.size == 0:
        v = "" if data.dtype.hasobject else data.dtype.type(0)  # 0, False or the empty string
    else:
        v = constant_value.reshape(())
    return _pad(xp, data, host_ints(pads), mode, v, None if axes is None else host_ints(axes), ctx)
