"""A gated MLP's two products -> one (onnxpy.fused.GatedMatMul).

Llama, Mistral, Qwen, Gemma and T5 v1.1 compute their MLP's hidden layer as
act(x @ W_gate) * (x @ W_up): two products of the same input with weights of one shape, then a
Mul. After fuse_activation the gate is a FusedMatMul carrying the activation and the up
projection a MatMul (or a FusedMatMul with a bias). Packed, one product reads x once against
[W_gate | W_up] (one call: a decoder step streams both weights in one GEMV), and the activation
and the Mul run on its column halves in place.

Matched from the Mul: both its inputs read by it alone, products of the same float32 input
with constant 2-D weights of the same shape, no residual addend, constant biases if any, an
activation on one side only (whichever side, and in either order of the Mul's inputs).
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, constant


def _product(graph: Graph, uses: Uses, name: str, reader: Node) -> tuple[Node, np.ndarray, np.ndarray | None] | None:
    """(node, W, bias) of a MatMul / FusedMatMul (no residual) producing ``name`` for ``reader`` alone."""
    node = uses.producer.get(name)
    if node is None or uses.only_reader(name) is not reader:
        return None
    if node.op_type == "MatMul" and not node.domain and len(node.inputs) == 2:
        bias = None
    elif node.op_type == "FusedMatMul" and node.domain == FUSED_DOMAIN and len(node.inputs) <= 3:
        has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
        bias = constant(graph, node.inputs[2]) if has_bias else None
        if has_bias and bias is None:
            return None
    else:
        return None
    w = constant(graph, node.inputs[1])
    if w is None or w.ndim != 2 or w.dtype != np.float32 or graph.elem_type(node.inputs[0]) != 1:
        return None
    if bias is not None and (bias.shape != (w.shape[1],) or bias.dtype != np.float32):
        return None
    return node, w, bias


def _match(graph: Graph, uses: Uses, mul: Node) -> tuple[Node, list[Node], np.ndarray, np.ndarray | None] | None:
    if mul.op_type != "Mul" or mul.domain or len(mul.inputs) != 2 or mul.inputs[0] == mul.inputs[1]:
        return None
    sides = [_product(graph, uses, name, mul) for name in mul.inputs]
    if sides[0] is None or sides[1] is None:
        return None
    gated = [bool(s[0].attrs.get("activation")) for s in sides]
    if gated[0] == gated[1]:
        return None
    gate, up = (sides[0], sides[1]) if gated[0] else (sides[1], sides[0])
    if gate[0].inputs[0] != up[0].inputs[0] or gate[1].shape != up[1].shape:
        return None
    w = np.concatenate([gate[1], up[1]], axis=1)
    bias = None
    if gate[2] is not None or up[2] is not None:
        zeros = np.zeros(gate[1].shape[1], np.float32)
        bias = np.concatenate([zeros if gate[2] is None else gate[2], zeros if up[2] is None else up[2]])
    attrs = {"activation": gate[0].attrs["activation"]}
    if gate[0].attrs.get("activation_params"):
        attrs["activation_params"] = list(gate[0].attrs["activation_params"])
    fused = Node("GatedMatMul", [gate[0].inputs[0]], list(mul.outputs), attrs, mul.name, FUSED_DOMAIN, 1)
    return fused, [gate[0], up[0]], w, bias


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    for node in list(graph.nodes):
        if node.op_type != "Mul" or node.domain or not sweep.fresh(node):
            continue
        m = _match(graph, sweep.uses, node)
        if m is None or not sweep.fresh(*m[1]):
            continue
        fused, dead, w, bias = m
        wn = sweep.new_name(f"{dead[0].inputs[1]}_gated")
        graph.initializers[wn] = w
        fused.inputs.append(wn)
        if bias is not None:
            bn = sweep.new_name(f"{dead[0].inputs[1]}_gated_bias")
            graph.initializers[bn] = bias
            fused.inputs.append(bn)
        sweep.replace(node, fused)
        sweep.remove(*dead)
    return sweep.finish()
