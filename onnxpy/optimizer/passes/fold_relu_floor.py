"""ReLU after a per-channel affine, feeding a 1x1 convolution: one pass instead of three.

DenseNet-style blocks run BatchNormalization -> ReLU -> 1x1 Conv on every concatenation, and the
optimizer leaves them as ChannelAffine(activation=Relu): relu(x * k + s), three passes over the
largest tensors of the model. With every k > 0,

    relu(x * k + s) = k * max(x, -s / k) + s            (per channel)

so the 1x1 convolution reading it computes W @ relu(x * k + s) = (W * k) @ max(x, f) + W @ s:
the scale folds into the convolution's weights (per input channel), the shift into its bias
(a 1x1 convolution without padding sees the shift at every position), and what remains is
ChannelMax(x, f), a single pass. Not applied when some k <= 0 (the identity needs k > 0) or
when the reader is not a plain 1x1 convolution of group 1 that is the value's only reader.

An average pool between the two changes nothing where each window averages input values alone
(no padded position counted): the mean of k * v + s is k * mean(v) + s, so the pool passes
max(x, f) on and the convolution after it still absorbs k and s. DenseNet's transitions read
their BatchNormalization -> ReLU that way once their 1x1 convolution has moved after the 2x2
pool (``swap_pool_pointwise``); ChannelAffine's three passes over the largest maps of the model
(256x56x56: 520 us in the model) become ChannelMax's two.
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ...model import dtypes
from ..rewrite import FUSED_DOMAIN, Sweep, constant, pointwise_reader
from .fold_batchnorm import _conv_wb, _set_conv_wb
from .swap_pool_pointwise import _pool_attrs, _weights_sum_to_one


def _averaging_pool(node: Node | None) -> bool:
    """``node`` is an AveragePool whose every window averages input values only."""
    if node is None or node.domain or node.op_type != "AveragePool":
        return False
    attrs = _pool_attrs(node)
    return attrs is not None and _weights_sum_to_one(node, attrs["pads"])


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for node in list(graph.nodes):
        if node.domain != FUSED_DOMAIN or node.op_type != "ChannelAffine" or not sweep.fresh(node):
            continue
        if node.attrs.get("activation") != "Relu" or len(node.inputs) != 3:
            continue
        out = node.outputs[0]
        conv, src = uses.only_reader(out), out
        if conv is not None and _averaging_pool(conv) and len(conv.inputs) == 1:
            src = conv.outputs[0]
            conv = uses.only_reader(src)
        if not pointwise_reader(graph, conv, src, group_one=True) or not sweep.fresh(conv):
            continue
        k, s = constant(graph, node.inputs[1]), constant(graph, node.inputs[2])
        wb = _conv_wb(graph, conv)
        if k is None or s is None or wb is None:
            continue
        w, b = wb
        c = w.shape[1]
        if k.shape != (c,) or s.shape != (c,) or not np.all(np.isfinite(k)) or not np.all(k > 0):
            continue
        if graph.elem_type(node.inputs[0]) != dtypes.elem_type(k.dtype) or w.dtype != k.dtype:
            continue  # ChannelMax(x, floor) must keep x's dtype: floor and x agree, or no fold
        k64, s64 = k.astype(np.float64), s.astype(np.float64)
        w64 = w.astype(np.float64)
        folded_w = (w64 * k64.reshape((1, c) + (1,) * (w.ndim - 2))).astype(w.dtype)
        folded_b = (b.astype(np.float64) + w64.reshape(w.shape[0], c) @ s64).astype(b.dtype)
        floor_name = sweep.new_name(f"{node.name or 'affine'}_floor")
        graph.initializers[floor_name] = (-s64 / k64).astype(k.dtype)
        _set_conv_wb(graph, sweep, conv, folded_w, folded_b)
        sweep.replace(
            node,
            Node(
                op_type="ChannelMax",
                inputs=[node.inputs[0], floor_name],
                outputs=[out],
                name=node.name,
                domain=FUSED_DOMAIN,
                opset=1,
            ),
        )
        sweep.touch(conv)
    return sweep.finish()
