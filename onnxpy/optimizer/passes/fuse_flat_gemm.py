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
through Shape, Gather, Slice, Unsqueeze, Squeeze, Concat, Cast and constants
(``optimizer/shape_arith.py``).
The first target must be [-1, K], the second x's dimensions but the last, then N. A dimension
of x that is 0 at run time (an empty batch) passes through the MatMul; the Reshape pair would
have refused some such shapes.
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, constant
from ..shape_arith import Entry, dim_entry, shape_entries


def _is_dim_of(entry: Entry, graph: Graph, x: str, axis: int) -> bool:
    return entry == (x, axis) or entry == dim_entry(graph, x, axis)


def _flattening(graph: Graph, uses: Uses, first: Node, second: Node, k: int, n: int) -> bool:
    """``first`` reshapes its input x to [-1, K] and ``second`` reshapes the product back to
    x's dimensions but the last, then N."""
    x = first.inputs[0]
    shape = graph.shape(x)
    if shape is None or len(shape) < 2 or dim_entry(graph, x, len(shape) - 1) != k:
        return False
    if int(first.attrs.get("allowzero", 0)) or int(second.attrs.get("allowzero", 0)):
        return False
    flat = shape_entries(graph, uses, first.inputs[1])
    if flat is None or flat[1] or len(flat[0]) != 2 or flat[0][0] != -1:
        return False
    if not (flat[0][1] == k or _is_dim_of(flat[0][1], graph, x, len(shape) - 1)):
        return False
    back = shape_entries(graph, uses, second.inputs[1])
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
