"""Shape arithmetic read symbolically: what an int64 value computed from tensors' shapes holds.

Exporters compute reshape targets and slice bounds at run time from Shape nodes (Shape ->
Gather -> Unsqueeze -> Concat; x.size(-1) // 2). A pass that must know such a value reads it
here as a list of entries, each an integer or (name, axis), "dimension ``axis`` of ``name``" (an
integer where the graph knows that dimension), or None where the value is not provably of that
kind. Handled: constants, Shape (with start/end), Gather at constant indices, Slice with
constant bounds, Unsqueeze/Squeeze between a scalar and a one-entry vector, Concat, Cast to
int64, Identity, and Div of integers by a positive integer.
"""

from __future__ import annotations

from ..ir.graph import Graph
from .rewrite import Uses, constant, shape_window

# An entry of a symbolic shape vector: an integer, or (value name, axis) for a dimension of it.
Entry = int | tuple[str, int]

# Shape arithmetic followed this many nodes deep at most (exporters use 3-4).
_MAX_DEPTH = 8


def const_ints(graph: Graph, name: str) -> list[int] | None:
    c = constant(graph, name)
    if c is None or c.dtype.kind not in "iu" or c.ndim > 1:
        return None
    return [int(v) for v in c.reshape(-1)]


def dim_entry(graph: Graph, name: str, axis: int) -> Entry:
    """Dimension ``axis`` of ``name``: its static size where known, else symbolic."""
    shape = graph.shape(name)
    d = shape[axis] if shape is not None and axis < len(shape) else None
    return d if isinstance(d, int) else (name, axis)


def shape_entries(graph: Graph, uses: Uses, name: str, depth: int = 0) -> tuple[list[Entry], bool] | None:
    """(entries, is 0-d) of the int64 shape arithmetic value ``name``, or None where it is not
    provably a function of shapes and constants of the kinds handled."""
    c = constant(graph, name)
    if c is not None:
        values = const_ints(graph, name)
        return None if values is None else (list(values), c.ndim == 0)
    node = uses.producer.get(name)
    if node is None or node.domain or depth > _MAX_DEPTH:
        return None
    op = node.op_type
    if op == "Shape":
        shape = graph.shape(node.inputs[0])
        if shape is None:
            return None
        s, e = shape_window(node, len(shape))
        return [dim_entry(graph, node.inputs[0], i) for i in range(s, e)], False
    if op == "Div":
        a, b = (shape_entries(graph, uses, i, depth + 1) for i in node.inputs[:2])
        if a is None or b is None or len(a[0]) != len(b[0]) and len(b[0]) != 1:
            return None
        divisors = b[0] * len(a[0]) if len(b[0]) == 1 else b[0]
        quotients: list[Entry] = []
        for n, d in zip(a[0], divisors):
            if not (isinstance(n, int) and isinstance(d, int) and n >= 0 and d > 0):
                return None  # a symbolic dimension, or a sign where truncation and floor differ
            quotients.append(n // d)
        return quotients, a[1] and b[1]
    if op in ("Cast", "Identity"):
        if op == "Cast" and int(node.attrs.get("to", 0)) != 7:  # int64 only
            return None
        return shape_entries(graph, uses, node.inputs[0], depth + 1)
    if op == "Gather":
        data = shape_entries(graph, uses, node.inputs[0], depth + 1)
        idx = constant(graph, node.inputs[1])
        if data is None or data[1] or idx is None or idx.ndim > 1 or int(node.attrs.get("axis", 0)) != 0:
            return None
        n = len(data[0])
        picked = []
        for i in idx.reshape(-1):
            i = int(i)
            if not -n <= i < n:
                return None
            picked.append(data[0][i % n])
        return picked, idx.ndim == 0
    if op in ("Unsqueeze", "Squeeze"):
        inner = shape_entries(graph, uses, node.inputs[0], depth + 1)
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1:
            axes = const_ints(graph, node.inputs[1])
        if inner is None or axes is None or [int(a) for a in axes] not in ([0], [-1]) or len(inner[0]) != 1:
            return None
        # A scalar <-> a one-entry vector: the only forms shape arithmetic needs.
        if op == "Unsqueeze":
            return (inner[0], False) if inner[1] else None
        return (inner[0], True) if not inner[1] else None
    if op == "Concat":
        if int(node.attrs.get("axis", 0)) not in (0, -1):
            return None
        out: list[Entry] = []
        for i in node.inputs:
            part = shape_entries(graph, uses, i, depth + 1)
            if part is None or part[1]:
                return None
            out += part[0]
        return out, False
    if op == "Slice":
        data = shape_entries(graph, uses, node.inputs[0], depth + 1)
        bounds = [const_ints(graph, i) if i else None for i in node.inputs[1:5]]
        if data is None or data[1] or len(bounds) < 2 or bounds[0] is None or bounds[1] is None:
            return None
        axes = bounds[2] if len(bounds) > 2 and bounds[2] is not None else [0]
        steps = bounds[3] if len(bounds) > 3 and bounds[3] is not None else [1]
        if len(bounds[0]) != 1 or len(bounds[1]) != 1 or axes not in ([0], [-1]) or steps != [1]:
            return None
        return data[0][slice(bounds[0][0], bounds[1][0])], False
    return None
