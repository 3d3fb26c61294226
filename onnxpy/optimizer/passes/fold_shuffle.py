"""ShuffleNet's channel shuffle after a convolution -> the convolution's ``shuffle_groups``.

    y = Conv(...)                                  (N, M, H, W)
    Reshape(y, [N, g, M/g, H, W]) -> Transpose<0,2,1,3,4> -> Reshape(., [N, M, H, W])

is a fixed permutation of the output channels (a * M/g + j -> j * g + a), which the Reshape of a
transposed view pays for with a copy of the whole tensor. The convolution can produce its
channels in that order instead: a grouped 1x1 convolution with g groups has BLAS write each
group's rows straight into place (ops/conv.py, _conv_shuffled), so the copy disappears.

Folded when the shapes are static and the two Reshapes are exactly that split and merge (0 and
-1 resolved as Reshape does), every intermediate is read by the next node alone, and the
convolution has no residual input (the shuffle would come after the residual add).
"""

from __future__ import annotations

from typing import Any

from ...ir.graph import Graph, Node
from ..rewrite import Sweep, Uses, constant, is_conv
from .fuse_activation import _to_fused_conv


def _resolve(shape_in: list[int], target: Any) -> list[int] | None:
    """Reshape's output shape for ``target`` (0 copies a dimension, one -1 is inferred)."""
    if target is None or target.ndim != 1:
        return None
    dims = [int(d) for d in target]
    out = []
    for i, d in enumerate(dims):
        if d == 0:
            if i >= len(shape_in):
                return None
            d = shape_in[i]
        out.append(d)
    total = 1
    for d in shape_in:
        total *= d
    if out.count(-1) > 1 or any(d < -1 for d in out):
        return None
    if -1 in out:
        known = 1
        for d in out:
            if d != -1:
                known *= d
        if known == 0 or total % known:
            return None
        out[out.index(-1)] = total // known
    return out


def _next(uses: Uses, name: str, op: str) -> Node | None:
    node = uses.only_reader(name)
    if node is None or node.domain or node.op_type != op or node.inputs[0] != name:
        return None
    return node


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for conv in list(graph.nodes):
        if not is_conv(conv) or not sweep.fresh(conv) or conv.attrs.get("shuffle_groups"):
            continue
        if len(conv.inputs) > 3 and conv.inputs[3]:
            continue  # a residual input: the shuffle follows the add
        y = conv.outputs[0]
        if graph.elem_type(conv.inputs[0]) != 1:
            continue  # FusedConv computes and returns float32
        shape = graph.shape(y)
        if shape is None or len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in shape):
            continue
        n, m, h, w = shape  # type: ignore[misc]
        split = _next(uses, y, "Reshape")
        if split is None or split.attrs.get("allowzero", 0):
            continue
        five = _resolve(list(shape), constant(graph, split.inputs[1]))  # type: ignore[arg-type]
        if five is None or len(five) != 5 or five[0] != n or five[3:] != [h, w] or five[1] * five[2] != m:
            continue
        g = five[1]
        swap = _next(uses, split.outputs[0], "Transpose")
        if swap is None or list(swap.attrs.get("perm", [])) != [0, 2, 1, 3, 4]:
            continue
        merge = _next(uses, swap.outputs[0], "Reshape")
        if merge is None or merge.attrs.get("allowzero", 0):
            continue
        four = _resolve([n, five[2], g, h, w], constant(graph, merge.inputs[1]))
        if four != [n, m, h, w] or not sweep.fresh(split, swap, merge):
            continue
        base = _to_fused_conv(conv)
        fused = Node(
            op_type=base.op_type,
            inputs=list(base.inputs),
            outputs=[merge.outputs[0]],
            attrs={**base.attrs, "shuffle_groups": g},
            name=base.name,
            domain=base.domain,
            opset=base.opset,
        )
        sweep.replace(conv, fused)
        sweep.remove(split, swap, merge)
    return sweep.finish()
