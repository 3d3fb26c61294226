"""Fold inference-mode BatchNormalization and per-channel Mul/Add constants.

- Conv -> BatchNormalization: the normalization is folded into the convolution's weights and bias.
- Any other inference BatchNormalization with constant parameters becomes onnxpy.fused.ChannelAffine
  (y = x * k + s per channel: one pass instead of four).
- Conv or ChannelAffine followed by Mul / Add with a per-channel (or scalar) constant: folded in.
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, constant


def _bn_params(graph: Graph, bn: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(k, s) with BN(x) = x * k + s per channel, or None when BN is not foldable."""
    if bn.domain or bn.op_type != "BatchNormalization" or len(bn.inputs) < 5:
        return None
    if bn.attrs.get("training_mode", 0) or not bn.attrs.get("spatial", 1):
        return None
    if len([o for o in bn.outputs if o]) != 1:
        return None
    scale, bias, mean, var = (constant(graph, n) for n in bn.inputs[1:5])
    if scale is None or bias is None or mean is None or var is None:
        return None
    if not (scale.ndim == 1 and scale.shape == bias.shape == mean.shape == var.shape):
        return None  # malformed: left to the kernel, whose error names the node
    eps = float(bn.attrs.get("epsilon", 1e-5))
    k = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    s = bias.astype(np.float64) - mean.astype(np.float64) * k
    return k, s


def per_channel(value: np.ndarray | None, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts per output channel (axis 1 of an NC... tensor) -> shape (C,)."""
    if value is None or value.dtype.kind != "f":
        return None
    shape = list(value.shape)
    if len(shape) > rank:
        return None  # it would add leading dimensions to the result: not a per-channel constant
    if value.size == 1:
        return np.full(channels, float(value.reshape(-1)[0]))
    shape = [1] * (rank - len(shape)) + shape
    if shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return value.reshape(-1).astype(np.float64)


def _conv_wb(graph: Graph, conv: Node) -> tuple[np.ndarray, np.ndarray] | None:
    if len(conv.inputs) < 2:
        return None
    w = constant(graph, conv.inputs[1])
    if w is None or w.dtype.kind != "f":
        return None
    b = constant(graph, conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(w.shape[0], w.dtype)
    if b is None:
        return None
    return w, b


def _is_conv(node: Node) -> bool:
    return (node.op_type == "Conv" and not node.domain) or (
        node.domain == FUSED_DOMAIN
        and node.op_type == "FusedConv"
        and not node.attrs.get("activation")
        # A shuffled output (fold_shuffle) holds channel a * M/g + j at j * g + a: a per-channel
        # constant after it belongs to another row of W than its position says.
        and not node.attrs.get("shuffle_groups")
        and len(node.inputs) < 4
    )


def _set_conv_wb(graph: Graph, sweep: Sweep, conv: Node, w: np.ndarray, b: np.ndarray) -> None:
    wn = sweep.new_name(f"{conv.inputs[1]}_folded")
    bn = sweep.new_name(f"{conv.name or 'conv'}_bias_folded")
    graph.initializers[wn] = w
    graph.initializers[bn] = b
    conv.inputs = [conv.inputs[0], wn, bn, *conv.inputs[3:]]


def _rank(graph: Graph, name: str) -> int | None:
    s = graph.shape(name)
    return None if s is None else len(s)


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for node in list(graph.nodes):
        if not sweep.fresh(node):
            continue
        if node.op_type == "BatchNormalization" and not node.domain:
            params = _bn_params(graph, node)
            if params is None:
                continue
            k, s = params
            prod = uses.producer.get(node.inputs[0])
            wb = _conv_wb(graph, prod) if prod is not None and _is_conv(prod) and sweep.fresh(prod) else None
            if wb is not None and uses.only_reader(node.inputs[0]) is node:
                w, b = wb
                kk = k.reshape((-1,) + (1,) * (w.ndim - 1))
                _set_conv_wb(graph, sweep, prod, (w * kk).astype(w.dtype), (b * k + s).astype(w.dtype))
                prod.outputs = [node.outputs[0]]
                sweep.touch(prod)
                sweep.remove(node)
                continue
            if graph.elem_type(node.inputs[0]) not in (None, 1):
                continue  # keep BN for float16/double inputs (its own kernel handles them)
            kn = sweep.new_name(f"{node.name or 'bn'}_k")
            sn = sweep.new_name(f"{node.name or 'bn'}_s")
            graph.initializers[kn] = k.astype(np.float32)
            graph.initializers[sn] = s.astype(np.float32)
            affine = Node(
                op_type="ChannelAffine",
                inputs=[node.inputs[0], kn, sn],
                outputs=[node.outputs[0]],
                name=node.name,
                domain=FUSED_DOMAIN,
                opset=1,
            )
            sweep.replace(node, affine)
            continue
        if node.op_type in ("Mul", "Add") and not node.domain:
            # Conv/ChannelAffine -> Mul/Add by a per-channel constant.
            for pos in (0, 1):
                src, other = node.inputs[pos], node.inputs[1 - pos]
                prod = uses.producer.get(src)
                if prod is None or not sweep.fresh(prod) or uses.only_reader(src) is not node:
                    continue
                rank = _rank(graph, src)
                c = constant(graph, other)
                if rank is None or c is None or rank < 2:
                    continue
                if _is_conv(prod):
                    wb = _conv_wb(graph, prod)
                    if wb is None:
                        continue
                    w, b = wb
                    vec = per_channel(c, w.shape[0], rank)
                    if vec is None:
                        continue
                    if node.op_type == "Mul":
                        scaled = (w * vec.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
                        _set_conv_wb(graph, sweep, prod, scaled, (b * vec).astype(b.dtype))
                    else:
                        _set_conv_wb(graph, sweep, prod, w, (b + vec).astype(b.dtype))
                elif (
                    prod.domain == FUSED_DOMAIN and prod.op_type == "ChannelAffine" and not prod.attrs.get("activation")
                ):
                    k = graph.initializers[prod.inputs[1]]
                    s = graph.initializers[prod.inputs[2]]
                    vec = per_channel(c, k.shape[0], rank)
                    if vec is None:
                        continue
                    if node.op_type == "Mul":
                        k, s = k * vec, s * vec
                    else:
                        s = s + vec
                    kn = sweep.new_name(f"{prod.inputs[1]}_m")
                    sn = sweep.new_name(f"{prod.inputs[2]}_m")
                    graph.initializers[kn] = k.astype(np.float32)
                    graph.initializers[sn] = s.astype(np.float32)
                    prod.inputs = [prod.inputs[0], kn, sn]
                else:
                    continue
                prod.outputs = [node.outputs[0]]
                sweep.touch(prod)
                sweep.remove(node)
                break
    return sweep.finish()
