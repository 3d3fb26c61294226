"""1x1 convolutions that read the same input -> one convolution over their stacked weights,
split into the members' outputs (``onnxpy.fused::SiblingConv``).

Inception blocks open with two to four 1x1 convolutions of the block's input (the 1x1 branch and
the reductions before the 3x3 and 5x5 branches), ResNet's first block with its main 1x1 and its
projection shortcut. Each is a GEMM with a few dozen to a few hundred rows over the same
input: stacked, they make one GEMM with all the rows, which BLAS runs nearer its peak, and the
input is read once. The members' outputs are channel slices of the result, views (no copy
for one image).

The members with Relu come first, so one in-place Relu covers their leading channels, as a
fused one would have (ResNet's main branch has a Relu, its shortcut none).

Members: Conv or FusedConv with constant float32 weights (and bias), a 1x1 kernel, group 1, no
residual input or channel shuffle, activation none or Relu, and the same strides, pads and
dilations. Runs once after the other passes (their folds change weights, biases and
activations first).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, constant, is_conv

_SPATIAL_ATTRS = ("strides", "pads", "dilations", "auto_pad", "kernel_shape")


def _member(graph: Graph, conv: Node, x: str) -> tuple[Any, ...] | None:
    """A key grouping the convolutions that can stack with ``conv`` (which reads ``x``), or None."""
    if not is_conv(conv) or conv.inputs[0] != x or len(conv.outputs) != 1:
        return None
    if (len(conv.inputs) > 3 and conv.inputs[3]) or conv.attrs.get("shuffle_groups"):
        return None
    if int(conv.attrs.get("group", 1)) != 1 or conv.attrs.get("activation", "") not in ("", "Relu"):
        return None
    w = constant(graph, conv.inputs[1])
    if w is None or w.dtype != np.float32 or w.ndim < 3 or any(d != 1 for d in w.shape[2:]):
        return None
    if len(conv.inputs) > 2 and conv.inputs[2]:
        b = constant(graph, conv.inputs[2])
        if b is None or b.dtype != np.float32 or b.shape != (w.shape[0],):
            return None
    if graph.elem_type(x) != 1:
        return None
    rank = w.ndim - 2
    strides = tuple(int(v) for v in conv.attrs.get("strides", []) or [1] * rank)
    pads = tuple(int(v) for v in conv.attrs.get("pads", []) or [0] * (2 * rank))
    return (strides, pads, conv.attrs.get("auto_pad", "NOTSET"), w.ndim, w.shape[1])


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for x, readers in list(uses.readers.items()):
        groups: dict[tuple[Any, ...], list[Node]] = defaultdict(list)
        for r in readers:
            key = _member(graph, r, x)
            if key is not None and sweep.fresh(r):
                groups[key].append(r)
        for members in groups.values():
            if len(members) > 1:
                _merge(graph, sweep, x, members)
    return sweep.finish()


def _merge(graph: Graph, sweep: Sweep, x: str, members: list[Node]) -> None:
    # Members with Relu first: one Relu then covers one leading slice.
    members = sorted(members, key=lambda n: n.attrs.get("activation", "") != "Relu")
    relu = [n.attrs.get("activation", "") == "Relu" for n in members]
    weights = [constant(graph, n.inputs[1]) for n in members]
    biases = [
        constant(graph, n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else np.zeros(w.shape[0], np.float32)  # type: ignore[union-attr]
        for n, w in zip(members, weights)
    ]
    rows = [int(w.shape[0]) for w in weights]  # type: ignore[union-attr]
    first = members[0]
    base = first.name or "conv"
    wn = sweep.new_name(f"{base}_siblings_w")
    bn = sweep.new_name(f"{base}_siblings_b")
    graph.initializers[wn] = np.concatenate(weights, axis=0)  # type: ignore[arg-type]
    graph.initializers[bn] = np.concatenate(biases, axis=0)  # type: ignore[arg-type]
    attrs: dict[str, Any] = {k: v for k, v in first.attrs.items() if k in _SPATIAL_ATTRS}
    attrs["splits"] = rows
    attrs["relu_channels"] = sum(r for r, on in zip(rows, relu) if on)
    outputs = [n.outputs[0] for n in members]
    sweep.replace(first, Node("SiblingConv", [x, wn, bn], outputs, attrs, f"{base}_siblings", FUSED_DOMAIN, 1))
    for n in members[1:]:
        sweep.remove(n)
