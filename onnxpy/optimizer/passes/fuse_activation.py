"""Fuse producers with what follows them so one kernel does the work of several:

- Conv -> Add/Sum(residual) becomes onnxpy.fused.FusedConv with the residual as its 4th input.
- Conv / FusedConv / ChannelAffine / Gemm / MatMul+bias followed by an activation (Relu,
  LeakyRelu, Clip with constant bounds, Sigmoid, Tanh, HardSigmoid, HardSwish, Swish and GELU
  (erf and tanh forms; all three also fused by fuse_patterns.py from their decomposed forms) and FakeQuant: a
  QuantizeLinear -> DequantizeLinear pair, see fuse_fake_quant.py) carry the activation
  as an attribute and apply it in place.
- MatMul followed by Add of a constant vector over the last axis becomes FusedMatMul(A, B, bias),
  and an Add after that (a residual, any float32 addend) its 4th input Z; a MatMul without bias
  (and without sibling products) takes its residual the same way, FusedMatMul(A, B, -, Z).
"""

from __future__ import annotations

from typing import Any

from ...ir.graph import Graph, Node
from ...ops.elementwise import GELU_TANH_BETA, GELU_TANH_KAPPA
from ..rewrite import FUSED_DOMAIN, Sweep, constant, is_conv, scalar_value
from .fold_batchnorm import per_channel

CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def activation_of(graph: Graph, node: Node) -> tuple[str, list[float]] | None:
    """(name, params) when ``node`` is an activation a fused kernel can apply in place."""
    if node.domain == FUSED_DOMAIN and node.op_type == "FakeQuant":
        return "FakeQuant", list(node.attrs["activation_params"])
    if node.domain == FUSED_DOMAIN and node.op_type == "Swish":
        return "Swish", [float(node.attrs.get("alpha", 1.0))]
    if node.op_type == "Gelu" and (
        (node.domain == FUSED_DOMAIN and float(node.attrs.get("scale", 1.0)) == 1.0)
        or (not node.domain and node.attrs.get("approximate", "none") == "none")
    ):
        return "Gelu", []
    if node.domain == FUSED_DOMAIN and node.op_type == "GeluTanh":
        return "GeluTanh", [float(node.attrs["beta"]), float(node.attrs["kappa"])]
    if node.op_type == "Gelu" and not node.domain and node.attrs.get("approximate") == "tanh":
        return "GeluTanh", [GELU_TANH_BETA, GELU_TANH_KAPPA]
    if node.domain:
        return None
    op = node.op_type
    if op in ("Relu", "Sigmoid", "Tanh", "HardSwish"):
        return op, []
    if op == "LeakyRelu":
        return op, [float(node.attrs.get("alpha", 0.01))]
    if op == "HardSigmoid":
        return op, [float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))]
    if op == "Clip":
        if node.opset < 11:
            return op, [
                float(node.attrs.get("min", -3.4028234663852886e38)),
                float(node.attrs.get("max", 3.4028234663852886e38)),
            ]
        lo = (
            scalar_value(constant(graph, node.inputs[1]))
            if len(node.inputs) > 1 and node.inputs[1]
            else -3.4028234663852886e38
        )
        hi = (
            scalar_value(constant(graph, node.inputs[2]))
            if len(node.inputs) > 2 and node.inputs[2]
            else 3.4028234663852886e38
        )
        if lo is None or hi is None:
            return None
        return op, [lo, hi]
    return None


def _bias_like(graph: Graph, conv: Node, other: str) -> bool:
    """Whether ``other`` is a constant that fold_batchnorm folds into ``conv``'s bias."""
    if conv.attrs.get("activation") or (len(conv.inputs) > 3 and conv.inputs[3]) or len(conv.inputs) < 2:
        return False
    w = constant(graph, conv.inputs[1])
    shape = graph.shape(conv.outputs[0])
    if w is None or shape is None:
        return False
    if len(conv.inputs) > 2 and conv.inputs[2] and constant(graph, conv.inputs[2]) is None:
        return False  # fold_batchnorm needs a constant bias to fold into
    return per_channel(constant(graph, other), w.shape[0], len(shape)) is not None


def _float32(graph: Graph, name: str) -> bool:
    return graph.elem_type(name) == 1


def _to_fused_conv(conv: Node) -> Node:
    if conv.domain == FUSED_DOMAIN:
        return conv
    attrs: dict[str, Any] = {k: v for k, v in conv.attrs.items() if k in CONV_ATTRS}
    return Node(
        op_type="FusedConv",
        inputs=list(conv.inputs) + [""] * (3 - len(conv.inputs)),
        outputs=list(conv.outputs),
        attrs=attrs,
        name=conv.name,
        domain=FUSED_DOMAIN,
        opset=1,
    )


def _alone(uses: Any, product: Node) -> bool:
    """No other MatMul reads ``product``'s first input (no sibling for pack_matmuls)."""
    return not any(
        r is not product and r.op_type == "MatMul" and not r.domain for r in uses.readers_of(product.inputs[0])
    )


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for node in list(graph.nodes):
        out = node.outputs[0] if node.outputs else ""
        if not out or not _float32(graph, out):
            continue
        nxt = uses.only_reader(out)
        if nxt is None or not sweep.fresh(node, nxt):
            continue
        conv_like = is_conv(node)
        # Residual add into a convolution without activation yet.
        if conv_like and not node.attrs.get("activation") and (len(node.inputs) < 4 or not node.inputs[3]):
            if not nxt.domain and nxt.op_type in ("Add", "Sum") and len(nxt.inputs) == 2 and nxt.outputs[0]:
                other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
                # The kernel adds in place when shapes agree and broadcasts otherwise. A constant
                # per-channel addend is no residual: fold_batchnorm folds it into the bias (on a
                # later round, once the convolution it just rewrote is fresh again).
                if other != out and graph.elem_type(other) in (None, 1) and not _bias_like(graph, node, other):
                    fused = _to_fused_conv(node)
                    fused.inputs = fused.inputs[:3] + [other]
                    fused.outputs = [nxt.outputs[0]]
                    sweep.replace(node, fused)
                    sweep.remove(nxt)
                    continue
        # Residual add after a MatMul and its bias (a transformer's skip connection).
        if (
            node.op_type == "FusedMatMul"
            and node.domain == FUSED_DOMAIN
            and not node.attrs.get("activation")
            and len(node.inputs) == 3
            and not nxt.domain
            and nxt.op_type == "Add"
            and len(nxt.inputs) == 2
            and nxt.outputs[0]
        ):
            other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
            if other != out and graph.elem_type(other) == 1:
                node.inputs = [*node.inputs, other]
                node.outputs = [nxt.outputs[0]]
                sweep.touch(node)
                sweep.remove(nxt)
                continue
        act = activation_of(graph, nxt)
        if act is not None:
            name, params = act
            if conv_like and not node.attrs.get("activation"):
                fused = _to_fused_conv(node)
            elif (
                node.domain == FUSED_DOMAIN
                and node.op_type in ("ChannelAffine", "FusedGemm", "FusedMatMul")
                and not node.attrs.get("activation")
            ):
                fused = node
            elif node.op_type == "Gemm" and not node.domain:
                fused = Node(
                    "FusedGemm", list(node.inputs), list(node.outputs), dict(node.attrs), node.name, FUSED_DOMAIN, 1
                )
            elif node.op_type == "MatMul" and not node.domain and len(node.inputs) == 2:
                # A product whose only reader is the activation has no bias coming (a QDQ
                # model's products and their FakeQuant; Llama's bias-free gate_proj and its
                # SiLU): applied in place on the fresh result. pack_matmuls leaves such
                # products to this pass.
                fused = Node("FusedMatMul", list(node.inputs), list(node.outputs), {}, node.name, FUSED_DOMAIN, 1)
            else:
                fused = None
            if fused is not None:
                fused.attrs["activation"] = name
                if params:
                    fused.attrs["activation_params"] = params
                fused.outputs = [nxt.outputs[0]]
                if fused is not node:
                    sweep.replace(node, fused)
                else:
                    sweep.touch(node)
                sweep.remove(nxt)
                continue
        # MatMul + constant bias over the last axis.
        if node.op_type == "MatMul" and not node.domain and not nxt.domain and nxt.op_type == "Add":
            other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
            bias = constant(graph, other)
            w = constant(graph, node.inputs[1])
            if bias is not None and w is not None and w.ndim == 2 and bias.ndim == 1 and bias.shape[0] == w.shape[1]:
                fused = Node(
                    "FusedMatMul",
                    [node.inputs[0], node.inputs[1], other],
                    [nxt.outputs[0]],
                    {},
                    node.name,
                    FUSED_DOMAIN,
                    1,
                )
                sweep.replace(node, fused)
                sweep.remove(nxt)
            elif (
                bias is None
                and w is not None
                and w.ndim == 2
                and other != out
                and graph.elem_type(other) == 1
                and _alone(uses, node)
            ):
                # A product by a constant weight without bias, and its residual (Llama's bias-free
                # o_proj and down_proj): FusedMatMul(A, B, -, Z) adds in place. Products of run-time
                # operands (attention's scores and their mask) stay for fuse_attention, products
                # sharing their input with other products for pack_matmuls.
                fused = Node("FusedMatMul", [*node.inputs, "", other], [nxt.outputs[0]], {}, node.name, FUSED_DOMAIN, 1)
                sweep.replace(node, fused)
                sweep.remove(nxt)
    return sweep.finish()
