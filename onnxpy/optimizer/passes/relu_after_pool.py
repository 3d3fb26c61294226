"""Move a convolution's fused ReLU past the MaxPool that reads it.

ReLU is non-decreasing, so it commutes with a maximum: MaxPool(Relu(y)) = Relu(MaxPool(y)) for
every window that holds at least one input element. Applied after a strided pool, the ReLU pass
runs over the pooled tensor (a quarter of the elements for 3x3/2) instead of the convolution's
whole output: the stems of SqueezeNet, VGG and Inception, and VGG's every stage.

The pool becomes a FusedMaxPool (ops/fused.py), which applies the ReLU to each block of its
result while it is in cache: no pass and no node of its own.

Only for a float32 FusedConv with activation Relu (no residual input), or a ConcatConv whose
members all end in Relu (SqueezeNet's fire modules before a pool), whose output is read by a
MaxPool alone, without the Indices output, with a stride above 1 (otherwise nothing is saved),
and whose every window holds an input element: a window wholly in the padding would give the
lowest value, not 0. That holds without padding, and with padding narrower than the kernel when
the windows are undilated and not extended by ceil_mode (ResNet-50's and DenseNet's 3x3/2 stem
pools with one pixel of padding).
"""

from __future__ import annotations

from typing import Any

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep


def _strided_pool_of_full_windows(pool: Node) -> bool:
    if pool.domain or pool.op_type != "MaxPool" or len([o for o in pool.outputs if o]) != 1:
        return False
    if pool.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return False
    if not any(int(s) > 1 for s in pool.attrs.get("strides", []) or []):
        return False
    pads = [int(p) for p in pool.attrs.get("pads", []) or []]
    if not any(pads):
        return True
    # Padded: each window starts at most pad-before positions before the input and ends at most
    # pad-after positions past it, so a pad narrower than the kernel leaves an input element in
    # every window (undilated windows; ceil_mode can add a window that starts in the padding).
    kernel = [int(k) for k in pool.attrs.get("kernel_shape", []) or []]
    dilated = any(int(d) != 1 for d in pool.attrs.get("dilations", []) or [])
    if dilated or int(pool.attrs.get("ceil_mode", 0)) or len(pads) != 2 * len(kernel):
        return False
    return all(p < kernel[i % len(kernel)] for i, p in enumerate(pads))


def _without_relu(conv: Node) -> dict[str, Any] | None:
    """The producer's attributes with its ReLU dropped, or None when it is not a FusedConv
    with activation Relu and no residual input, or a ConcatConv whose members all end in Relu."""
    if conv.op_type == "FusedConv":
        if conv.attrs.get("activation") != "Relu" or (len(conv.inputs) > 3 and conv.inputs[3]):
            return None
        return {k: v for k, v in conv.attrs.items() if k not in ("activation", "activation_params")}
    if conv.op_type == "ConcatConv":
        activations = list(conv.attrs.get("activations", []) or [])
        if not activations or any(a != "Relu" for a in activations):
            return None
        return {**conv.attrs, "activations": [""] * len(activations)}
    return None


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for conv in list(graph.nodes):
        if conv.domain != FUSED_DOMAIN or not sweep.fresh(conv):
            continue
        attrs = _without_relu(conv)
        if attrs is None:
            continue
        y = conv.outputs[0]
        pool = uses.only_reader(y)
        if pool is None or not _strided_pool_of_full_windows(pool) or not sweep.fresh(pool):
            continue
        if graph.elem_type(y) != 1:
            continue
        # A new name for the value that changes meaning: the convolution's output is no longer
        # rectified. Its old name leaves the optimized graph, so a caller fetching it gets the
        # original values (from the unoptimized graph). The pool's output keeps its name and
        # its values: FusedMaxPool applies the ReLU to each block of the pooled result.
        raw = sweep.new_name(f"{y}_before_relu")
        sweep.replace(conv, Node(conv.op_type, list(conv.inputs), [raw], attrs, conv.name, conv.domain, conv.opset))
        pool_attrs = {k: v for k, v in pool.attrs.items() if k != "storage_order"}
        sweep.replace(
            pool,
            Node(
                "FusedMaxPool",
                [raw],
                list(pool.outputs),
                {**pool_attrs, "activation": "Relu"},
                pool.name,
                FUSED_DOMAIN,
                1,
            ),
        )
    return sweep.finish()
