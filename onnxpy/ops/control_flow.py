"""Control flow: If, Loop, Scan.

Bodies arrive compiled (:class:`onnxpy.runtime.compiled.Subgraph`). A node holding subgraphs
receives the outer-scope values its bodies read as extra positional inputs after its explicit
ones, named by ``ctx.implicit_inputs``; the kernels hand them to ``Subgraph.run`` as a dict.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model import dtypes
from ._compat import alloc_budget, host_ints, host_scalar, normalize_axis
from .registry import op


def _outer(ctx: Any, implicit: tuple[Any, ...]) -> dict[str, Any]:
    names = ctx.implicit_inputs if ctx is not None else ()
    if len(names) != len(implicit):
        raise ValueError(f"expected {len(names)} outer-scope values, got {len(implicit)}")
    return dict(zip(names, implicit))


def _truth(x: Any, what: str) -> bool:
    if x is None:
        raise ValueError(f"{what} is missing")
    if getattr(x, "size", 1) != 1:
        raise ValueError(f"{what} must hold a single boolean, got shape {list(x.shape)}")
    return bool(host_scalar(x))


def _empty_stack(xp: Any, body: Any, out_name: str, axis: int = 0) -> Any:
    """A scan output of zero iterations: element type and trailing dims from the body's types."""
    g = body.graph
    et = g.elem_type(out_name)
    dtype = dtypes.np_dtype(et) if et else np.float32
    shape = g.shape(out_name)
    if shape is None:
        return xp.zeros((0,), dtype=dtype)
    # The rank is known: a dim the body leaves symbolic has no value to take, so it is 0, as in
    # onnxruntime (a body output [N, 3] gives [0, 0, 3]).
    dims = [d if isinstance(d, int) else 0 for d in shape]
    dims.insert(normalize_axis(axis, len(dims) + 1, "scan_output_axes"), 0)
    return xp.zeros(tuple(dims), dtype=dtype)


# -- If ---------------------------------------------------------------------------------------


@op("If", 1, host_inputs=(0,))
def if_(xp: Any, cond: Any, *implicit: Any, then_branch: Any, else_branch: Any, ctx: Any = None) -> Any:
    branch = then_branch if _truth(cond, "If condition") else else_branch
    outs = branch.run([], _outer(ctx, implicit))
    n = ctx.n_outputs if ctx is not None else len(outs)
    if len(outs) != n:
        raise ValueError(f"the chosen branch returns {len(outs)} values, the node has {n} outputs")
    return tuple(outs)


# -- Loop -------------------------------------------------------------------------------------


@op("Loop", 1, host_inputs=(0, 1))
def loop(xp: Any, M: Any, cond: Any, *rest: Any, body: Any, ctx: Any = None) -> Any:
    n_explicit = (ctx.n_inputs if ctx is not None else len(rest) + 2) - 2
    carried = list(rest[:n_explicit])
    outer = _outer(ctx, rest[n_explicit:])
    n_carried = len(carried)
    if body.num_inputs != 2 + n_carried:
        raise ValueError(f"the body takes {body.num_inputs} inputs, expected 2 + {n_carried} loop-carried values")
    n_scan = body.num_outputs - 1 - n_carried
    if n_scan < 0:
        raise ValueError(f"the body returns {body.num_outputs} values, expected at least 1 + {n_carried}")
    max_trip = None if M is None else int(host_scalar(M))
    keep_going = True if cond is None else _truth(cond, "Loop condition")
    cond_value = xp.asarray(keep_going) if cond is None else cond
    scans: list[list[Any]] = [[] for _ in range(n_scan)]
    # Scan outputs are stacked into one tensor each at the end: check the running total against
    # the allocation budget as they accumulate, so a loop whose trip count comes from data
    # cannot grow them without bound first.
    budget = alloc_budget(ctx)
    scan_bytes = [0] * n_scan
    run = body.run
    i = 0
    while keep_going and (max_trip is None or i < max_trip):
        outs = run([xp.asarray(i, dtype=xp.int64), cond_value, *carried], outer)
        cond_value = outs[0]
        carried = outs[1 : 1 + n_carried]
        for k in range(n_scan):
            item = outs[1 + n_carried + k]
            scans[k].append(item)
            scan_bytes[k] += int(getattr(item, "nbytes", 0))
            if scan_bytes[k] > budget:
                raise MemoryError(
                    f"Loop: scan output {k} reaches {scan_bytes[k]} bytes after {i + 1} iterations, over the "
                    f"session's allocation budget of {budget} bytes (session config 'session.max_allocation_bytes')"
                )
        i += 1
        keep_going = _truth(cond_value, "the body's condition output")
    results: list[Any] = list(carried)
    for k in range(n_scan):
        if scans[k]:
            results.append(_stack(xp, scans[k], 0, f"scan output {k}"))
        else:
            results.append(_empty_stack(xp, body, body.output_names[1 + n_carried + k]))
    return tuple(results)


def _stack(xp: Any, items: list[Any], axis: int, what: str) -> Any:
    first = items[0]
    if isinstance(first, list) or first is None:
        raise TypeError(f"{what}: a scan output must be a tensor, got {type(first).__name__}")
    shape = first.shape
    for k, it in enumerate(items):
        if it.shape != shape:
            raise ValueError(f"{what}: iteration {k} gives shape {list(it.shape)}, iteration 0 gave {list(shape)}")
    return xp.stack(items, axis=axis)


# -- Scan -------------------------------------------------------------------------------------


def _scan_once(
    xp: Any,
    body: Any,
    states: list[Any],
    scan_inputs: list[Any],
    in_axes: list[int],
    in_dirs: list[int],
    out_axes: list[int],
    out_dirs: list[int],
    outer: dict[str, Any],
    length: int | None = None,
) -> tuple[list[Any], list[Any]]:
    n_state = len(states)
    n_out = body.num_outputs - n_state
    if n_out < 0:
        raise ValueError(f"the body returns {body.num_outputs} values, fewer than the {n_state} state variables")
    if scan_inputs:
        lengths = {int(x.shape[a]) for x, a in zip(scan_inputs, in_axes)}
        if len(lengths) != 1:
            raise ValueError(f"scan inputs disagree on the sequence length: {sorted(lengths)}")
        seq_len = lengths.pop()
    else:
        seq_len = 0
    if length is not None:
        seq_len = min(seq_len, length)
    # Move each scan axis to the front once so a step is a plain x[t].
    fronts = [xp.moveaxis(x, a, 0) if a != 0 else x for x, a in zip(scan_inputs, in_axes)]
    n_seq = len(fronts)
    collected: list[list[Any]] = [[] for _ in range(n_out)]
    run = body.run
    for t in range(seq_len):
        slices = [fronts[j][seq_len - 1 - t if in_dirs[j] else t] for j in range(n_seq)]
        outs = run([*states, *slices], outer)
        states = outs[:n_state]
        for k in range(n_out):
            collected[k].append(outs[n_state + k])
    results: list[Any] = []
    for k in range(n_out):
        items = collected[k]
        name = body.output_names[n_state + k]
        if not items:
            results.append(_empty_stack(xp, body, name, out_axes[k]))
            continue
        if out_dirs[k]:
            items = items[::-1]
        rank = items[0].ndim + 1
        results.append(_stack(xp, items, normalize_axis(out_axes[k], rank, "scan_output_axes"), f"scan output {k}"))
    return list(states), results


def _per_input(values: list[int] | None, n: int, what: str) -> list[int]:
    if values is None or len(values) == 0:
        return [0] * n
    if len(values) != n:
        raise ValueError(f"{what} has {len(values)} entries, expected {n}")
    return [int(v) for v in values]


@op("Scan", 9)
def scan(
    xp: Any,
    *inputs: Any,
    body: Any,
    num_scan_inputs: int,
    scan_input_axes: list[int] | None = None,
    scan_input_directions: list[int] | None = None,
    scan_output_axes: list[int] | None = None,
    scan_output_directions: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    n_explicit = ctx.n_inputs if ctx is not None else len(inputs)
    explicit = list(inputs[:n_explicit])
    outer = _outer(ctx, inputs[n_explicit:])
    n_state = n_explicit - num_scan_inputs
    if n_state < 0:
        raise ValueError(f"num_scan_inputs {num_scan_inputs} exceeds the {n_explicit} inputs")
    states, scan_inputs = explicit[:n_state], explicit[n_state:]
    in_axes = [
        normalize_axis(a, x.ndim, "scan_input_axes")
        for a, x in zip(_per_input(scan_input_axes, num_scan_inputs, "scan_input_axes"), scan_inputs)
    ]
    in_dirs = _per_input(scan_input_directions, num_scan_inputs, "scan_input_directions")
    n_out = body.num_outputs - n_state
    out_axes = _per_input(scan_output_axes, n_out, "scan_output_axes")
    out_dirs = _per_input(scan_output_directions, n_out, "scan_output_directions")
    final, outs = _scan_once(xp, body, states, scan_inputs, in_axes, in_dirs, out_axes, out_dirs, outer)
    return (*final, *outs)


@op("Scan", 8)
def scan8(
    xp: Any,
    sequence_lens: Any,
    *inputs: Any,
    body: Any,
    num_scan_inputs: int,
    directions: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    # Opset 8: axis 0 is a batch axis run one sample at a time; axis 1 is the sequence.
    n_explicit = (ctx.n_inputs if ctx is not None else len(inputs) + 1) - 1
    explicit = list(inputs[:n_explicit])
    outer = _outer(ctx, inputs[n_explicit:])
    n_state = n_explicit - num_scan_inputs
    if n_state < 0:
        raise ValueError(f"num_scan_inputs {num_scan_inputs} exceeds the {n_explicit} inputs")
    states, scan_inputs = explicit[:n_state], explicit[n_state:]
    batch = int((states or scan_inputs)[0].shape[0])
    for x in explicit:
        if int(x.shape[0]) != batch:
            raise ValueError(f"inputs disagree on the batch size: {int(x.shape[0])} != {batch}")
    max_len = int(scan_inputs[0].shape[1]) if scan_inputs else 0
    lens = host_ints(sequence_lens) if sequence_lens is not None else [max_len] * batch
    if len(lens) != batch:
        raise ValueError(f"sequence_lens has {len(lens)} entries for a batch of {batch}")
    if any(n < 0 or n > max_len for n in lens):
        raise ValueError(f"sequence_lens {lens} must lie in [0, {max_len}]")
    in_dirs = _per_input(directions, num_scan_inputs, "directions")
    n_out = body.num_outputs - n_state
    zeros = [0] * n_out
    final_by_batch: list[list[Any]] = []
    outs_by_batch: list[list[Any]] = []
    for b in range(batch):
        final, outs = _scan_once(
            xp,
            body,
            [s[b] for s in states],
            [x[b] for x in scan_inputs],
            [0] * num_scan_inputs,
            in_dirs,
            zeros,
            zeros,
            outer,
            length=lens[b],
        )
        final_by_batch.append(final)
        outs_by_batch.append(outs)
    results: list[Any] = [xp.stack([final_by_batch[b][k] for b in range(batch)]) for k in range(n_state)]
    for k in range(n_out):
        parts = [outs_by_batch[b][k] for b in range(batch)]
        # Shorter sequences are padded with zeros up to the longest.
        tail = next((p.shape[1:] for p in parts if p.shape[0] > 0), None)
        dtype = parts[0].dtype
        padded = []
        for p in parts:
            if tail is None:
                padded.append(xp.zeros((max_len,), dtype=dtype))
                continue
            if p.shape[0] < max_len:
                pad = xp.zeros((max_len - p.shape[0], *tail), dtype=dtype)
                p = xp.concatenate([p.reshape((p.shape[0], *tail)), pad])
            padded.append(p)
        results.append(xp.stack(padded))
    return tuple(results)
