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

Phi-3 and ChatGLM project gate and up in one product and split it (``gate_up_proj`` then
``chunk(2)``): act(Slice(P, 0:h)) * Slice(P, h:2h) of the last axis, P = x @ W. That is the
same kernel over W itself (its halves swapped where the activation takes the second).
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, constant
from ..shape_arith import const_ints
from .fuse_activation import activation_of


def _product(
    graph: Graph, uses: Uses, name: str, reader: Node | None, readers: int = 1
) -> tuple[Node, np.ndarray, np.ndarray | None] | None:
    """(node, W, bias) of a MatMul / FusedMatMul (no residual, no activation) producing
    ``name`` for ``reader`` alone (or, with ``reader`` None, for exactly ``readers`` nodes)."""
    node = uses.producer.get(name)
    if node is None:
        return None
    if reader is not None and uses.only_reader(name) is not reader:
        return None
    if reader is None and (len(uses.readers_of(name)) != readers or name in uses.graph_outputs):
        return None
    if reader is None and node.attrs.get("activation"):
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


def _half(graph: Graph, uses: Uses, name: str, reader: Node, width: int) -> tuple[Node, str, int] | None:
    """(the Slice, its input, 0 or 1) where ``name``, read by ``reader`` alone, is the first or the
    second half of its input's last axis of ``width`` values, by a step-1 Slice with constant bounds."""
    node = uses.producer.get(name)
    if node is None or node.op_type != "Slice" or node.domain or uses.only_reader(name) is not reader:
        return None
    if len(node.inputs) < 4 or (len(node.inputs) > 4 and node.inputs[4] and const_ints(graph, node.inputs[4]) != [1]):
        return None
    starts, ends, axes = (const_ints(graph, node.inputs[i]) for i in (1, 2, 3))
    rank = len(graph.shape(node.inputs[0]) or [])
    if starts is None or ends is None or axes is None or len(starts) != 1 or len(ends) != 1:
        return None
    if axes != [-1] and not (rank and axes == [rank - 1]):
        return None
    half = width // 2
    start, end = starts[0] + width if starts[0] < 0 else starts[0], min(ends[0], width)
    if (start, end) == (0, half):
        return node, node.inputs[0], 0
    if (start, end) == (half, width):
        return node, node.inputs[0], 1
    return None


def _match_chunked(
    graph: Graph, uses: Uses, mul: Node
) -> tuple[Node, list[Node], np.ndarray, np.ndarray | None] | None:
    """act(Slice(x @ W, first half)) * Slice(x @ W, second half), or the halves the other way."""
    if mul.op_type != "Mul" or mul.domain or len(mul.inputs) != 2 or mul.inputs[0] == mul.inputs[1]:
        return None
    for act_side in (0, 1):
        act = uses.producer.get(mul.inputs[act_side])
        found = None if act is None else activation_of(graph, act)
        if found is None or act is None or uses.only_reader(mul.inputs[act_side]) is not mul or len(act.inputs) != 1:
            continue
        sliced = uses.producer.get(act.inputs[0])
        if sliced is None or sliced.op_type != "Slice" or sliced.domain:
            continue
        product_name = sliced.inputs[0]
        product = _product(graph, uses, product_name, reader=None, readers=2)
        if product is None:
            continue
        node, w, bias = product
        gate = _half(graph, uses, act.inputs[0], act, w.shape[1])
        up = _half(graph, uses, mul.inputs[1 - act_side], mul, w.shape[1])
        if gate is None or up is None or gate[1] != product_name or up[1] != product_name or gate[2] == up[2]:
            continue
        if w.shape[1] % 2:
            continue
        if gate[2] == 1:  # the activation takes the second half: swap the halves
            h = w.shape[1] // 2
            w = np.concatenate([w[:, h:], w[:, :h]], axis=1)
            bias = None if bias is None else np.concatenate([bias[h:], bias[:h]])
        attrs: dict[str, object] = {"activation": found[0]}
        if found[1]:
            attrs["activation_params"] = list(found[1])
        fused = Node("GatedMatMul", [node.inputs[0]], list(mul.outputs), attrs, mul.name, FUSED_DOMAIN, 1)
        return fused, [node, gate[0], up[0], act], w, bias
    return None


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    for node in list(graph.nodes):
        if node.op_type != "Mul" or node.domain or not sweep.fresh(node):
            continue
        m = _match(graph, sweep.uses, node) or _match_chunked(graph, sweep.uses, node)
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
