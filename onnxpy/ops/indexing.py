"""Indexing kernels: Gather(Elements/ND), Scatter(Elements/ND), TensorScatter, OneHot, NonZero,
Unique, Compress, ReverseSequence."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._compat import check_alloc, host_scalar, normalize_axis
from .registry import op

# -- shared helpers ------------------------------------------------------------------------------


def _check_indices(xp: Any, indices: Any, dim: int, what: str, axis: int | None = None) -> Any:
    """Indices as int64 with negatives wrapped; out-of-range ones raise naming the bad value."""
    if indices.dtype.kind not in "iu":
        raise TypeError(f"{what}: indices must be integers, got {indices.dtype}")
    lo = 0
    if indices.size:
        lo = int(indices.min())
        hi = int(indices.max())
        if lo < -dim or hi >= dim:
            bad = lo if lo < -dim else hi
            where = f"axis {axis}" if axis is not None else "an axis"
            raise IndexError(
                f"{what}: index {bad} is out of bounds for {where} of size {dim} (valid: [{-dim}, {dim - 1}])"
            )
    idx = indices.astype(np.int64, copy=False)
    if lo < 0:  # wrap negatives only where there are any (three passes saved in the usual case)
        idx = xp.where(idx < 0, idx + dim, idx)
    return idx


def _element_index(xp: Any, idx: Any, axis: int) -> tuple[Any, ...]:
    """Full advanced-index tuple addressing data[..., idx[i...], ...] at each position of ``idx``
    along ``axis`` (ScatterElements / GatherElements addressing)."""
    rank = idx.ndim
    parts: list[Any] = []
    for d in range(rank):
        if d == axis:
            parts.append(idx)
        else:
            shape = [1] * rank
            shape[d] = idx.shape[d]
            parts.append(xp.arange(idx.shape[d], dtype=np.int64).reshape(shape))
    return tuple(parts)


def _apply(xp: Any, out: Any, index: tuple[Any, ...], updates: Any, reduction: str, what: str) -> Any:
    """out[index] (op)= updates, with repeated indices accumulating for the reductions."""
    if reduction == "none":
        out[index] = updates
    elif reduction == "add":
        xp.add.at(out, index, updates)
    elif reduction == "mul":
        xp.multiply.at(out, index, updates)
    elif reduction == "max":
        xp.maximum.at(out, index, updates)
    elif reduction == "min":
        xp.minimum.at(out, index, updates)
    else:
        raise ValueError(f"{what}: reduction must be none, add, mul, max or min, got '{reduction}'")
    return out


# -- gathers -------------------------------------------------------------------------------------


@op("Gather", 1)
def gather(xp: Any, data: Any, indices: Any, *, axis: int = 0) -> Any:
    axis = normalize_axis(axis, data.ndim)
    if xp is np and indices.ndim == 0 and indices.dtype.kind in "iu":
        # One index (BERT's pooler takes token 0): a basic-indexing copy, no index arrays.
        i, dim = int(indices), data.shape[axis]
        if not -dim <= i < dim:
            raise IndexError(
                f"Gather: index {i} is out of bounds for axis {axis} of size {dim} (valid: [{-dim}, {dim - 1}])"
            )
        return data[(slice(None),) * axis + (i,)].copy()
    if xp is np and indices.dtype.kind in "iu":
        # numpy's take wraps negative indices and raises for out-of-range ones itself: the
        # checked path (two reductions) runs only to name the bad index.
        try:
            return np.take(data, indices, axis=axis)
        except IndexError:
            pass
    idx = _check_indices(xp, indices, data.shape[axis], "Gather", axis)
    return xp.take(data, idx, axis=axis)


@op("GatherElements", 11)
def gather_elements(xp: Any, data: Any, indices: Any, *, axis: int = 0) -> Any:
    axis = normalize_axis(axis, data.ndim)
    if indices.ndim != data.ndim:
        raise ValueError(f"GatherElements: indices rank {indices.ndim} must equal data rank {data.ndim}")
    for d in range(data.ndim):
        if d != axis and indices.shape[d] > data.shape[d]:
            raise ValueError(
                f"GatherElements: indices shape {list(indices.shape)} exceeds data shape {list(data.shape)} on axis {d}"
            )
    idx = _check_indices(xp, indices, data.shape[axis], "GatherElements", axis)
    if xp is np and idx.size and data.size:
        # One flat take: each element's offset in C order is idx * stride(axis) plus its other
        # coordinates' offsets, a small broadcast sum. numpy's advanced indexing with one index
        # array per axis costs more (1000x256 data, 300x256 indices: 335 -> 206 us; onnxruntime
        # 49).
        src = np.ascontiguousarray(data)
        strides = [st // src.itemsize for st in src.strides]
        base = np.zeros([1] * idx.ndim, dtype=np.int64)
        for d in range(idx.ndim):
            if d != axis:
                shape = [1] * idx.ndim
                shape[d] = idx.shape[d]
                base = base + (np.arange(idx.shape[d], dtype=np.int64) * strides[d]).reshape(shape)
        flat = idx * strides[axis]
        flat += base
        return np.take(src.reshape(-1), flat)
    return data[_element_index(xp, idx, axis)]


def _nd_prepare(data: Any, indices: Any, batch_dims: int, what: str) -> tuple[int, int]:
    """Validate GatherND / ScatterND shapes; returns (b, k)."""
    b = batch_dims
    if indices.ndim < 1 or data.ndim < 1:
        raise ValueError(f"{what}: data and indices need rank >= 1, got {data.ndim} and {indices.ndim}")
    if not 0 <= b < min(data.ndim, indices.ndim):
        raise ValueError(f"{what}: batch_dims {b} must be in [0, min(rank(data), rank(indices)))")
    if tuple(data.shape[:b]) != tuple(indices.shape[:b]):
        raise ValueError(
            f"{what}: the first {b} dims of data {list(data.shape)} and indices {list(indices.shape)} must match"
        )
    k = indices.shape[-1]
    if k > data.ndim - b:
        raise ValueError(
            f"{what}: indices.shape[-1] = {k} is larger than rank(data) - batch_dims = {data.ndim - b} "
            f"(data {list(data.shape)}, indices {list(indices.shape)})"
        )
    return b, k


def _nd_columns(xp: Any, idx: Any, dims: tuple[int, ...], what: str, first_axis: int) -> list[Any]:
    """The k index columns of idx (..., k), each checked and wrapped against its data dimension."""
    return [_check_indices(xp, idx[..., j], dims[j], what, first_axis + j) for j in range(len(dims))]


@op("GatherND", 11)
def gather_nd_11(xp: Any, data: Any, indices: Any) -> Any:
    return gather_nd(xp, data, indices, batch_dims=0)


@op("GatherND", 12)
def gather_nd(xp: Any, data: Any, indices: Any, *, batch_dims: int = 0) -> Any:
    b, k = _nd_prepare(data, indices, batch_dims, "GatherND")
    batch_shape = tuple(data.shape[:b])
    nb = int(np.prod(batch_shape, dtype=np.int64))
    mid_shape = tuple(indices.shape[b:-1])
    nm = int(np.prod(mid_shape, dtype=np.int64))
    rest = tuple(data.shape[b + k :])
    d = data.reshape((nb,) + tuple(data.shape[b:]))
    idx = indices.reshape(nb, nm, k)
    cols = _nd_columns(xp, idx, tuple(data.shape[b : b + k]), "GatherND", b)
    batch = xp.arange(nb, dtype=np.int64).reshape(nb, 1)
    if k == 0:
        got = xp.broadcast_to(d[:, None], (nb, nm) + tuple(data.shape[b:])).copy()  # not a read-only view
    else:
        got = d[(batch, *cols)]
    return got.reshape(batch_shape + mid_shape + rest)


@op("ScatterND", 11)
def scatter_nd_11(xp: Any, data: Any, indices: Any, updates: Any) -> Any:
    return scatter_nd(xp, data, indices, updates, reduction="none")


@op("ScatterND", 16)
def scatter_nd(xp: Any, data: Any, indices: Any, updates: Any, *, reduction: str = "none") -> Any:
    _, k = _nd_prepare(data, indices, 0, "ScatterND")
    want = tuple(indices.shape[:-1]) + tuple(data.shape[k:])
    if tuple(updates.shape) != want:
        raise ValueError(
            f"ScatterND: updates shape {list(updates.shape)} must be indices.shape[:-1] + data.shape[k:] = {list(want)}"
        )
    out = data.copy()
    cols = _nd_columns(xp, indices, tuple(data.shape[:k]), "ScatterND", 0)
    if k == 0:
        # Every update addresses the whole tensor: fold them in one reduction.
        upd = updates.reshape((-1,) + tuple(data.shape))
        if upd.shape[0] == 0:
            return out
        if reduction == "none":
            return upd[-1].copy()
        fold = {"add": xp.add, "mul": xp.multiply, "max": xp.maximum, "min": xp.minimum}.get(reduction)
        if fold is None:
            raise ValueError(f"ScatterND: reduction must be none, add, mul, max or min, got '{reduction}'")
        return fold(out, fold.reduce(upd, axis=0)).astype(data.dtype, copy=False)
    return _apply(xp, out, tuple(cols), updates, reduction, "ScatterND")


def _scatter_elements(xp: Any, data: Any, indices: Any, updates: Any, axis: int, reduction: str, what: str) -> Any:
    axis = normalize_axis(axis, data.ndim)
    if indices.ndim != data.ndim or tuple(indices.shape) != tuple(updates.shape):
        raise ValueError(
            f"{what}: indices {list(indices.shape)} and updates {list(updates.shape)} must have the same shape "
            f"and the rank of data {list(data.shape)}"
        )
    for d in range(data.ndim):
        if d != axis and indices.shape[d] > data.shape[d]:
            raise ValueError(f"{what}: indices shape {list(indices.shape)} exceeds data shape {list(data.shape)}")
    idx = _check_indices(xp, indices, data.shape[axis], what, axis)
    return _apply(xp, data.copy(), _element_index(xp, idx, axis), updates, reduction, what)


@op("Scatter", 9)
def scatter(xp: Any, data: Any, indices: Any, updates: Any, *, axis: int = 0) -> Any:
    return _scatter_elements(xp, data, indices, updates, axis, "none", "Scatter")


@op("ScatterElements", 11)
def scatter_elements_11(xp: Any, data: Any, indices: Any, updates: Any, *, axis: int = 0) -> Any:
    return _scatter_elements(xp, data, indices, updates, axis, "none", "ScatterElements")


@op("ScatterElements", 16)
def scatter_elements(xp: Any, data: Any, indices: Any, updates: Any, *, axis: int = 0, reduction: str = "none") -> Any:
    return _scatter_elements(xp, data, indices, updates, axis, reduction, "ScatterElements")


@op("TensorScatter", 24)
def tensor_scatter(
    xp: Any, past_cache: Any, update: Any, write_indices: Any = None, *, axis: int = -2, mode: str = "linear"
) -> Any:
    rank = past_cache.ndim
    axis = normalize_axis(axis, rank)
    if axis == 0:
        raise ValueError("TensorScatter: axis cannot be 0 (the batch dimension)")
    if mode not in ("linear", "circular"):
        raise ValueError(f"TensorScatter: mode must be 'linear' or 'circular', got '{mode}'")
    if update.ndim != rank or any(update.shape[d] != past_cache.shape[d] for d in range(rank) if d != axis):
        raise ValueError(
            f"TensorScatter: update {list(update.shape)} must match past_cache {list(past_cache.shape)} "
            f"except on axis {axis}"
        )
    batch, max_len, seq = past_cache.shape[0], past_cache.shape[axis], update.shape[axis]
    if seq > max_len:
        raise ValueError(f"TensorScatter: sequence length {seq} exceeds max_sequence_length {max_len}")
    if write_indices is None:
        starts = xp.zeros(batch, dtype=np.int64)
    else:
        starts = write_indices.reshape(-1).astype(np.int64, copy=False)
        if starts.shape[0] != batch:
            raise ValueError(f"TensorScatter: write_indices has {starts.shape[0]} entries for a batch of {batch}")
    pos = starts.reshape(batch, 1) + xp.arange(seq, dtype=np.int64).reshape(1, seq)
    if mode == "circular":
        pos = pos % max_len if max_len else pos
    elif pos.size:
        lo, hi = int(pos.min()), int(pos.max())
        if lo < 0 or hi >= max_len:
            raise IndexError(
                f"TensorScatter: write index {lo if lo < 0 else hi} is out of bounds for axis {axis} of size "
                f"{max_len} (linear mode needs write_indices + sequence_length <= max_sequence_length)"
            )
    # Place the (batch, seq) positions on axes 0 and `axis`, broadcast over the others.
    shape = [1] * rank
    shape[0], shape[axis] = batch, seq
    idx = xp.broadcast_to(pos.reshape(shape), update.shape)
    out = past_cache.copy()
    out[_element_index(xp, idx, axis)] = update
    return out


# -- building and selecting ----------------------------------------------------------------------


def _onehot(xp: Any, indices: Any, depth: Any, values: Any, axis: int, negative: bool, ctx: Any) -> Any:
    d = host_scalar(depth)
    depth_n = int(d)
    if depth_n < 1:
        raise ValueError(f"OneHot: depth must be >= 1, got {d}")
    vals = values.reshape(-1)
    if vals.shape[0] != 2:
        raise ValueError(f"OneHot: values must hold [off_value, on_value], got shape {list(values.shape)}")
    rank = indices.ndim + 1
    axis = normalize_axis(axis, rank)
    check_alloc(tuple(indices.shape[:axis]) + (depth_n,) + tuple(indices.shape[axis:]), values.dtype, ctx, "OneHot")
    idx = indices.astype(np.int64) if indices.dtype.kind in "iub" else xp.trunc(indices).astype(np.int64)
    if negative:
        idx = xp.where(idx < 0, idx + depth_n, idx)
    # Out-of-range indices match no position and so get off_value everywhere, as the spec says.
    hot_shape = [1] * rank
    hot_shape[axis] = depth_n
    positions = xp.arange(depth_n, dtype=np.int64).reshape(hot_shape)
    hit = xp.expand_dims(idx, axis) == positions
    # The values as 1-element arrays, not scalars: where() would turn string scalars into a
    # fixed-width unicode array, and string tensors are object arrays everywhere else.
    return xp.where(hit, vals[1:2], vals[0:1])


@op("OneHot", 9, host_inputs=(1,))
def onehot_9(xp: Any, indices: Any, depth: Any, values: Any, *, axis: int = -1, ctx: Any = None) -> Any:
    return _onehot(xp, indices, depth, values, axis, False, ctx)


@op("OneHot", 11, host_inputs=(1,))
def onehot(xp: Any, indices: Any, depth: Any, values: Any, *, axis: int = -1, ctx: Any = None) -> Any:
    return _onehot(xp, indices, depth, values, axis, True, ctx)


@op("NonZero", 9)
def nonzero(xp: Any, X: Any) -> Any:  # noqa: N803 - spec name
    if X.ndim == 0:
        # A scalar is treated as a 1-element vector: one row of coordinates.
        v = X.reshape(()).item() if X.dtype.hasobject else X.reshape(()) != 0
        return xp.zeros((1, int(bool(v))), dtype=np.int64)
    if X.dtype.hasobject:
        coords = np.nonzero(np.asarray(X) != "")  # strings: non-empty ones count
    else:
        coords = xp.nonzero(X) if X.dtype.kind == "b" else xp.nonzero(X != 0)
    if not coords:
        return xp.zeros((0, 0), dtype=np.int64)
    return xp.stack(coords).astype(np.int64, copy=False)


@op("Compress", 9)
def compress(xp: Any, input: Any, condition: Any, *, axis: int | None = None) -> Any:  # noqa: A002 - spec name
    cond = condition.reshape(-1).astype(bool, copy=False)
    data = input.reshape(-1) if axis is None else input
    ax = 0 if axis is None else normalize_axis(axis, input.ndim)
    n = data.shape[ax]
    if cond.shape[0] > n:
        # numpy.compress accepts a longer condition when its tail is all False.
        if bool(cond[n:].any()):
            raise IndexError(
                f"Compress: condition has length {cond.shape[0]} with a True at position >= {n}, "
                f"past the end of axis {ax} of size {n}"
            )
        cond = cond[:n]
    keep = xp.nonzero(cond)[0]
    return xp.take(data, keep, axis=ax)


@op("ReverseSequence", 10)
def reverse_sequence(
    xp: Any,
    input: Any,
    sequence_lens: Any,
    *,
    batch_axis: int = 1,
    time_axis: int = 0,  # noqa: A002 - spec name
) -> Any:
    rank = input.ndim
    if rank < 2:
        raise ValueError(f"ReverseSequence: input must have rank >= 2, got shape {list(input.shape)}")
    batch_axis = normalize_axis(batch_axis, rank, "batch_axis")
    time_axis = normalize_axis(time_axis, rank, "time_axis")
    if batch_axis == time_axis or {batch_axis, time_axis} - {0, 1}:
        raise ValueError(f"ReverseSequence: batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1")
    nb, nt = input.shape[batch_axis], input.shape[time_axis]
    lens = sequence_lens.reshape(-1).astype(np.int64, copy=False)
    if lens.shape[0] != nb:
        raise ValueError(f"ReverseSequence: sequence_lens has {lens.shape[0]} entries for a batch of {nb}")
    if lens.size:
        lo, hi = int(lens.min()), int(lens.max())
        if lo < 0 or hi > nt:
            raise IndexError(
                f"ReverseSequence: sequence length {lo if lo < 0 else hi} is out of range for time axis "
                f"{time_axis} of size {nt} (valid: [0, {nt}])"
            )
    t = xp.arange(nt, dtype=np.int64).reshape(1, nt)
    ln = lens.reshape(nb, 1)
    src = xp.where(t < ln, ln - 1 - t, t)  # (batch, time)
    if time_axis < batch_axis:
        src = src.T
    src = src.reshape(src.shape + (1,) * (rank - 2))
    return xp.take_along_axis(input, xp.broadcast_to(src, input.shape), axis=time_axis)


# -- Unique --------------------------------------------------------------------------------------


def _unique_flat(xp: Any, x: Any) -> tuple[Any, Any, Any, Any]:
    """Sorted unique values of a 1-D array with first indices, inverse and counts."""
    if x.dtype.hasobject:
        # Strings: numpy's unique sorts Python objects fine on the host.
        y, first, inv, counts = np.unique(np.asarray(x), return_index=True, return_inverse=True, return_counts=True)
        return y.astype(object), first, inv.reshape(-1), counts
    y, first, inv, counts = xp.unique(x, return_index=True, return_inverse=True, return_counts=True)
    return y, first, inv.reshape(-1), counts


def _unique_rows(xp: Any, rows: Any) -> tuple[Any, Any, Any, Any]:
    """Unique rows of a 2-D array (n, m) in lexicographic order, with first indices, inverse and counts."""
    n = rows.shape[0]
    if n == 0:
        empty = xp.zeros(0, dtype=np.int64)
        return rows, empty, empty, empty
    if rows.shape[1] == 0:
        return rows[:1], xp.zeros(1, dtype=np.int64), xp.zeros(n, dtype=np.int64), xp.asarray([n], dtype=np.int64)
    # Stable lexicographic sort: last key is the primary one for lexsort.
    keys = [rows[:, j] for j in range(rows.shape[1] - 1, -1, -1)]
    order = np.lexsort([np.asarray(k) for k in keys]) if rows.dtype.hasobject else xp.lexsort(xp.stack(keys))
    s = rows[order]
    new = xp.ones(n, dtype=bool)
    if n > 1:
        diff = s[1:] != s[:-1]
        if s.dtype.kind in "fc":
            # NaN equals NaN here, as in the flattened case (numpy's unique) and in onnxruntime.
            diff &= ~(xp.isnan(s[1:]) & xp.isnan(s[:-1]))
        new[1:] = diff.any(axis=1)
    group = xp.cumsum(new) - 1
    starts = xp.nonzero(new)[0]
    counts = xp.diff(xp.concatenate([starts, xp.asarray([n])]))
    inv = xp.empty(n, dtype=np.int64)
    inv[order] = group
    first = order[starts]  # the stable sort keeps the first occurrence at the start of each group
    return s[starts], first.astype(np.int64), inv, counts.astype(np.int64)


@op("Unique", 11)
def unique(xp: Any, X: Any, *, axis: int | None = None, sorted: int = 1) -> Any:  # noqa: A002, N803 - spec names
    if X.dtype.kind == "V":
        # ml_dtypes' types (bfloat16, float8) sort by a comparison that NaN breaks (no value was
        # merged): they are found in float32, which holds each value exactly, and cast back.
        results = unique(xp, X.astype(np.float32), axis=axis, sorted=sorted)
        return (results[0].astype(X.dtype),) + tuple(results[1:])
    if axis is None:
        y, first, inv, counts = _unique_flat(xp, X.reshape(-1))
        moved = None
    else:
        ax = normalize_axis(axis, X.ndim)
        moved = xp.moveaxis(X, ax, 0)
        # An explicit width: -1 cannot be inferred when the tensor holds no element.
        width = int(np.prod(moved.shape[1:], dtype=np.int64))
        rows = moved.reshape(moved.shape[0], width)
        y, first, inv, counts = _unique_rows(xp, rows)
    first = xp.asarray(first).astype(np.int64, copy=False)
    inv = xp.asarray(inv).astype(np.int64, copy=False)
    counts = xp.asarray(counts).astype(np.int64, copy=False)
    if not sorted:
        # Reorder the groups by first occurrence.
        order = xp.argsort(first, kind="stable")
        rank_of = xp.empty_like(order)
        rank_of[order] = xp.arange(order.shape[0], dtype=order.dtype)
        y, first, counts = y[order], first[order], counts[order]
        inv = rank_of[inv].astype(np.int64, copy=False)
    if moved is not None:
        y = xp.moveaxis(y.reshape((y.shape[0],) + tuple(moved.shape[1:])), 0, ax)
    return y, first, inv, counts
