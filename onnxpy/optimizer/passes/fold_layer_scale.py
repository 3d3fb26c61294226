"""A constant per-feature scale after a product folds into its weight: layer scale.

BEiT's gamma_1 / gamma_2, timm's LayerScale (``x * gamma``, ViT/DeiT-III/EVA's ls1 and ls2) and
ConvNeXt's NHWC gamma multiply the output of a Linear by a constant vector before the residual
Add: gamma * (x @ W + b). That is x @ (W * gamma) + b * gamma, with gamma scaling W's columns.
Folded, the Mul's pass over the activations goes, and fuse_activation (which runs after this
pass) can give the product its residual: the Mul stood between them.

Matched: a MatMul, a FusedMatMul without activation or residual, or a Gemm, with a constant
weight and a constant bias if any, whose output only a Mul reads, by a constant gamma of the
product's float type that varies along the last axis alone (shape [N], [1, N], ... or a single
element) and adds no axes to the result. New initializers hold the scaled weight and bias: the
old ones may have other readers. A product without bias stays without.
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ...model import dtypes
from ..rewrite import FUSED_DOMAIN, Sweep, constant

# FusedMatMul's attributes this pass understands (an activation must be absent or empty).
_FUSED_MATMUL_ATTRS = frozenset({"activation", "activation_params"})


def _weight_axis(node: Node) -> int | None:
    """The axis of the product's weight that indexes output columns (-1 for W (K, N), -2 for a
    Gemm's transposed W (N, K)); None when ``node`` is no product this pass folds into."""
    if len(node.inputs) < 2 or len(node.outputs) != 1:
        return None
    if node.op_type == "MatMul" and not node.domain and len(node.inputs) == 2:
        return -1
    if node.op_type == "FusedMatMul" and node.domain == FUSED_DOMAIN:
        if len(node.inputs) > 3 and any(node.inputs[3:]):
            return None  # a residual addend: gamma would have to scale it too
        if set(node.attrs) - _FUSED_MATMUL_ATTRS or node.attrs.get("activation"):
            return None
        return -1
    if node.op_type == "Gemm" and not node.domain:
        return -2 if int(node.attrs.get("transB", 0)) else -1
    return None


def _weights(graph: Graph, node: Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(W, bias or None) of ``node`` when both are constant floats of one type."""
    w = constant(graph, node.inputs[1])
    if w is None or w.dtype.kind != "f" or w.ndim < 2 or (node.op_type == "Gemm" and w.ndim != 2):
        return None
    bias_name = node.inputs[2] if len(node.inputs) > 2 else ""
    if not bias_name:
        return w, None
    bias = constant(graph, bias_name)
    if bias is None or bias.dtype != w.dtype:
        return None
    return w, bias


def _gamma(graph: Graph, mul: Node, out: str, columns: int, dtype: np.dtype) -> np.ndarray | None:
    """The Mul's constant factor as a [columns] or [1] vector, when multiplying ``out`` by it
    scales each output column alone and leaves the result's shape as it is."""
    if mul.domain or mul.op_type != "Mul" or len(mul.inputs) != 2 or len(mul.outputs) != 1:
        return None
    other = mul.inputs[1] if mul.inputs[0] == out else mul.inputs[0]
    if other == out:
        return None
    g = constant(graph, other)
    if g is None or g.dtype != dtype:
        return None
    if g.ndim > 1:
        shape = graph.shape(out)  # a [1, N] gamma against a 1-D product would add an axis
        if shape is None or g.ndim > len(shape):
            return None
    if any(d != 1 for d in g.shape[:-1]) or (g.ndim and g.shape[-1] not in (1, columns)):
        return None
    return g.reshape(-1)


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


def _fold(sweep: Sweep, node: Node, mul: Node, axis: int, w: np.ndarray, b: np.ndarray | None, g: np.ndarray) -> None:
    graph = sweep.graph
    # gamma along W's column axis: the last for (K, N), the first of a Gemm's transposed (N, K).
    scaled_w = w * (g if axis == -1 else g[:, None])
    w_name = sweep.new_name(f"{node.inputs[1]}_layer_scaled")
    graph.initializers[w_name] = _frozen(scaled_w.astype(w.dtype, copy=False))
    inputs = [node.inputs[0], w_name, *node.inputs[2:]]
    if b is not None:
        b_name = sweep.new_name(f"{node.inputs[2]}_layer_scaled")
        graph.initializers[b_name] = _frozen((b * g).astype(b.dtype, copy=False))
        inputs[2] = b_name
    fused = Node(node.op_type, inputs, [mul.outputs[0]], dict(node.attrs), node.name, node.domain, node.opset)
    sweep.replace(node, fused)
    sweep.remove(mul)


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for node in list(graph.nodes):
        axis = _weight_axis(node)
        if axis is None:
            continue
        out = node.outputs[0]
        mul = uses.only_reader(out)
        if mul is None or not sweep.fresh(node, mul):
            continue
        found = _weights(graph, node)
        if found is None:
            continue
        w, b = found
        try:
            same_type = graph.elem_type(out) in (None, dtypes.elem_type(w.dtype))
        except ValueError:
            same_type = False
        g = _gamma(graph, mul, out, w.shape[axis], w.dtype) if same_type else None
        if g is not None:
            _fold(sweep, node, mul, axis, w, b, g)
    return sweep.finish()
