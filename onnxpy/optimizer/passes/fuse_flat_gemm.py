"""Reshape -> Gemm -> Reshape that flattens x's leading axes and restores them -> FusedMatMul.

transformers' Conv1D (GPT-2's attention and MLP projections) computes
``addmm(bias, x.view(-1, x.size(-1)), weight).view(x.size()[:-1] + (nf,))``, exported as a
Reshape of x to [-1, K], a Gemm, and a Reshape back to x's leading sizes and N, the targets
computed from x's shape at run time (Shape -> Gather -> Unsqueeze -> Concat). MatMul keeps
leading axes as they are, so when the two targets are provably that flattening and its inverse,
the three nodes are one FusedMatMul(x, W, bias): two kernel calls less per projection, and
their shape arithmetic goes too. fuse_activation then gives the product its activation (the
MLP's GELU) and residual Add, as for a MatMul.

The proof reads the targets symbolically: each entry is an integer or "dimension i of x",
through Shape, Gather, Slice, Unsqueeze, Squeeze, Concat, Cast and constants (``_entries``).
The first target must be [-1, K], the second x's dimensions but the last, then N. A dimension
of x that is 0 at run time (an empty batch) passes through the MatMul; the Reshape pair would
have refused some such shapes.
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, constant, shape_window

# An entry of a symbolic shape vector: an integer, or (value name, axis) for a dimension of it.
Entry = int | tuple[str, int]

# Shape arithmetic followed this many nodes deep at most (exporters use 3-4).
_MAX_DEPTH = 8


def _ints(graph: Graph, name: str) -> list[int] | None:
    c = constant(graph, name)
    if c is None or c.dtype.kind not in "iu" or c.ndim > 1:
        return None
    return [int(v) for v in c.reshape(-1)]


def _dim(graph: Graph, name: str, axis: int) -> Entry:
    """Dimension ``axis`` of ``name``: its static size where known, else symbolic."""
    shape = graph.shape(name)
    d = shape[axis] if shape is not None and axis < len(shape) else None
    return d if isinstance(d, int) else (name, axis)


def _entries(graph: Graph, uses: Uses, name: str, depth: int = 0) -> tuple[list[Entry], bool] | None:
    """(entries, is 0-d) of the int64 shape arithmetic value ``name``, or None where it is not
    provably a function of shapes and constants of the kinds handled."""
    c = constant(graph, name)
    if c is not None:
        values = _ints(graph, name)
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
        return [_dim(graph, node.inputs[0], i) for i in range(s, e)], False
    if op in ("Cast", "Identity"):
        if op == "Cast" and int(node.attrs.get("to", 0)) != 7:  # int64 only
            return None
        return _entries(graph, uses, node.inputs[0], depth + 1)
    if op == "Gather":
        data = _entries(graph, uses, node.inputs[0], depth + 1)
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
        inner = _entries(graph, uses, node.inputs[0], depth + 1)
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1:
            axes = _ints(graph, node.inputs[1])
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
            part = _entries(graph, uses, i, depth + 1)
            if part is None or part[1]:
                return None
            out += part[0]
        return out, False
    if op == "Slice":
        data = _entries(graph, uses, node.inputs[0], depth + 1)
        bounds = [_ints(graph, i) if i else None for i in node.inputs[1:5]]
        if data is None or data[1] or len(bounds) < 2 or bounds[0] is None or bounds[1] is None:
            return None
        axes = bounds[2] if len(bounds) > 2 and bounds[2] is not None else [0]
        steps = bounds[3] if len(bounds) > 3 and bounds[3] is not None else [1]
        if len(bounds[0]) != 1 or len(bounds[1]) != 1 or axes not in ([0], [-1]) or steps != [1]:
            return None
        return data[0][slice(bounds[0][0], bounds[1][0])], False
    return None


def _is_dim_of(entry: Entry, graph: Graph, x: str, axis: int) -> bool:
    return entry == (x, axis) or entry == _dim(graph, x, axis)


def _flattening(graph: Graph, uses: Uses, first: Node, second: Node, k: int, n: int) -> bool:
    """``first`` reshapes its input x to [-1, K] and ``second`` reshapes the product back to
    x's dimensions but the last, then N."""
    x = first.inputs[0]
    shape = graph.shape(x)
    if shape is None or len(shape) < 2 or _dim(graph, x, len(shape) - 1) != k:
        return False
    if int(first.attrs.get("allowzero", 0)) or int(second.attrs.get("allowzero", 0)):
        return False
    flat = _entries(graph, uses, first.inputs[1])
    if flat is None or flat[1] or len(flat[0]) != 2 or flat[0][0] != -1:
        return False
    if not (flat[0][1] == k or _is_dim_of(flat[0][1], graph, x, len(shape) - 1)):
        return False
    back = _entries(graph, uses, second.inputs[1])
    if back is None or back[1] or len(back[0]) != len(shape) or back[0][-1] != n:
        return False
    return all(_is_dim_of(e, graph, x, i) for i, e in enumerate(back[0][:-1]))


def _gemm_operands(graph: Graph, sweep: Sweep, gemm: Node) -> tuple[str, str | None] | None:
    """(W, bias) as FusedMatMul's inputs for a Gemm of a flattened x: W (K, N) and a bias
    vector (N,), new initializers where alpha, beta or transB change them."""
    if int(gemm.attrs.get("transA", 0)):
        return None
    w = constant(graph, gemm.inputs[1])
    if w is None or w.ndim != 2 or w.dtype not in (np.float32, np.float64):
        return None
    alpha, beta = float(gemm.attrs.get("alpha", 1.0)), float(gemm.attrs.get("beta", 1.0))
    trans_b = int(gemm.attrs.get("transB", 0))
    n = w.shape[0] if trans_b else w.shape[1]
    c_name = gemm.inputs[2] if len(gemm.inputs) > 2 and gemm.inputs[2] and beta != 0.0 else None
    c = constant(graph, c_name) if c_name else None
    if c_name is not None and (c is None or c.dtype != w.dtype or not (c.size == 1 or c.shape in ((n,), (1, n)))):
        return None  # a bias FusedMatMul cannot take (a run-time C, or one per row)
    w_name = gemm.inputs[1]
    if trans_b or alpha != 1.0:
        new_w = np.ascontiguousarray(w.T if trans_b else w)
        if alpha != 1.0:
            new_w = (new_w * w.dtype.type(alpha)).astype(w.dtype)
        w_name = sweep.new_name(f"{gemm.inputs[1]}_flat_gemm")
        graph.initializers[w_name] = new_w
    if c is None:
        return w_name, None
    if c.shape == (n,) and beta == 1.0:
        return w_name, c_name
    b_name = sweep.new_name(f"{c_name}_flat_gemm")
    graph.initializers[b_name] = np.ascontiguousarray(
        np.broadcast_to(c.reshape(-1), (n,)) * w.dtype.type(beta), w.dtype
    )
    return w_name, b_name


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for gemm in list(graph.nodes):
        if gemm.domain or gemm.op_type != "Gemm" or len(gemm.inputs) < 2 or not sweep.fresh(gemm):
            continue
        first = uses.producer.get(gemm.inputs[0])
        second = uses.only_reader(gemm.outputs[0])
        if (
            first is None
            or first.domain
            or first.op_type != "Reshape"
            or uses.only_reader(first.outputs[0]) is not gemm
        ):
            continue
        if second is None or second.domain or second.op_type != "Reshape" or second.inputs[0] != gemm.outputs[0]:
            continue
        if not sweep.fresh(first, second) or gemm.inputs[1] == gemm.inputs[0]:
            continue
        w = constant(graph, gemm.inputs[1])
        if w is None or w.ndim != 2:
            continue
        trans_b = int(gemm.attrs.get("transB", 0))
        k, n = (w.shape[1], w.shape[0]) if trans_b else w.shape
        if not _flattening(graph, uses, first, second, int(k), int(n)):
            continue
        operands = _gemm_operands(graph, sweep, gemm)
        if operands is None:
            continue
        w_name, bias = operands
        inputs = [first.inputs[0], w_name] + ([bias] if bias else [])
        fused = Node("FusedMatMul", inputs, list(second.outputs), {}, gemm.name, FUSED_DOMAIN, 1)
        sweep.replace(second, fused)
        sweep.remove(first, gemm)
    return sweep.finish()
