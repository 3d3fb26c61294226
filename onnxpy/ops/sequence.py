"""Sequence and optional kernels.

A sequence value is a Python list of arrays; an empty optional is None. Kernels never change a
list they receive: they build a new one (other nodes may still read the old).
"""

from __future__ import annotations

from typing import Any

from ._compat import host_ints, host_scalar, normalize_axis
from .registry import op


def _seq(x: Any, what: str) -> list[Any]:
    if not isinstance(x, list):
        raise TypeError(f"{what} must be a sequence, got {type(x).__name__}")
    return x


def _position(pos: Any, n: int, allow_end: bool) -> int:
    p = int(host_scalar(pos))
    hi = n if allow_end else n - 1
    if not -n <= p <= hi:
        raise IndexError(f"position {p} is out of range for a sequence of {n} tensors (expected [{-n}, {hi}])")
    return p + n if p < 0 else p


def _check_dtype(seq: list[Any], t: Any, what: str) -> None:
    if seq and hasattr(t, "dtype") and seq[0].dtype != t.dtype:
        raise TypeError(f"{what}: tensor of {t.dtype} does not match the sequence's {seq[0].dtype}")


@op("SequenceConstruct", 11)
def sequence_construct(xp: Any, *inputs: Any) -> list[Any]:
    if not inputs:
        raise ValueError("SequenceConstruct needs at least one input")
    dt = inputs[0].dtype
    for i, t in enumerate(inputs):
        if t.dtype != dt:
            raise TypeError(f"input {i} is {t.dtype}, input 0 is {dt}: a sequence holds one element type")
    return list(inputs)


@op("SequenceEmpty", 11)
def sequence_empty(xp: Any, *, dtype: int = 1) -> list[Any]:
    return []


@op("SequenceAt", 11, host_inputs=(1,))
def sequence_at(xp: Any, input_sequence: Any, position: Any) -> Any:
    seq = _seq(input_sequence, "input_sequence")
    return seq[_position(position, len(seq), allow_end=False)]


@op("SequenceInsert", 11, host_inputs=(2,))
def sequence_insert(xp: Any, input_sequence: Any, tensor: Any, position: Any = None) -> list[Any]:
    seq = _seq(input_sequence, "input_sequence")
    _check_dtype(seq, tensor, "SequenceInsert")
    out = list(seq)
    if position is None:
        out.append(tensor)
    else:
        out.insert(_position(position, len(seq), allow_end=True), tensor)
    return out


@op("SequenceErase", 11, host_inputs=(1,))
def sequence_erase(xp: Any, input_sequence: Any, position: Any = None) -> list[Any]:
    seq = _seq(input_sequence, "input_sequence")
    if not seq:
        raise IndexError("cannot erase from an empty sequence")
    out = list(seq)
    del out[-1 if position is None else _position(position, len(seq), allow_end=False)]
    return out


@op("SequenceLength", 11)
def sequence_length(xp: Any, input_sequence: Any) -> Any:
    return xp.asarray(len(_seq(input_sequence, "input_sequence")), dtype=xp.int64)


@op("SplitToSequence", 11, host_inputs=(1,))
def split_to_sequence(xp: Any, input: Any, split: Any = None, *, axis: int = 0, keepdims: int = 1) -> list[Any]:
    ax = normalize_axis(axis, input.ndim)
    length = int(input.shape[ax])
    if split is None:
        parts = [xp.take(input, i, axis=ax) if not keepdims else _slice(input, ax, i, i + 1) for i in range(length)]
        return parts
    sizes = host_ints(split)
    if getattr(split, "ndim", 1) == 0:
        step = sizes[0]
        if step <= 0:
            raise ValueError(f"split must be positive, got {step}")
        bounds = list(range(0, length, step)) + [length]
    else:
        if any(s < 0 for s in sizes) or sum(sizes) != length:
            raise ValueError(f"split {sizes} must be non-negative and sum to the axis length {length}")
        bounds = [0]
        for s in sizes:
            bounds.append(bounds[-1] + s)
    return [_slice(input, ax, a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _slice(x: Any, axis: int, start: int, stop: int) -> Any:
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


@op("ConcatFromSequence", 11)
def concat_from_sequence(xp: Any, input_sequence: Any, *, axis: int, new_axis: int = 0) -> Any:
    seq = _seq(input_sequence, "input_sequence")
    if not seq:
        raise ValueError("cannot concatenate an empty sequence")
    rank = seq[0].ndim
    if new_axis:
        return xp.stack(seq, axis=normalize_axis(axis, rank + 1))
    return xp.concatenate(seq, axis=normalize_axis(axis, rank))


@op("SequenceMap", 17)
def sequence_map(xp: Any, input_sequence: Any, *rest: Any, body: Any, ctx: Any = None) -> Any:
    n_explicit = (ctx.n_inputs if ctx is not None else len(rest) + 1) - 1
    extra = rest[:n_explicit]
    names = ctx.implicit_inputs if ctx is not None else ()
    outer = dict(zip(names, rest[n_explicit:]))
    seq = _seq(input_sequence, "input_sequence")
    n = len(seq)
    for k, e in enumerate(extra):
        if isinstance(e, list) and len(e) != n:
            raise ValueError(f"additional input {k} has {len(e)} elements, the first sequence has {n}")
    outs: list[list[Any]] = [[] for _ in range(body.num_outputs)]
    for i in range(n):
        args = [seq[i], *(e[i] if isinstance(e, list) else e for e in extra)]
        for k, r in enumerate(body.run(args, outer)):
            outs[k].append(r)
    return tuple(outs)


# -- optionals --------------------------------------------------------------------------------


@op("Optional", 15)
def optional(xp: Any, input: Any = None, *, type: Any = None) -> Any:
    return input


@op("OptionalHasElement", 15)
def optional_has_element(xp: Any, input: Any = None) -> Any:
    return xp.asarray(input is not None)


@op("OptionalGetElement", 15)
def optional_get_element(xp: Any, input: Any) -> Any:
    if input is None:
        raise ValueError("the optional input is empty")
    return input
