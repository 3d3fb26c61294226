"""Concat(axis=1) of convolutions -> one ConcatConv whose members write their channels in place.

SqueezeNet's fire modules and Inception's blocks end in a Concat of convolution outputs: each
convolution writes a fresh tensor, and the Concat copies them all once more. ConcatConv
(ops/fused.py) runs the member convolutions itself, each writing its slice of the result
(for one image a channel range is contiguous, so BLAS or the path's last pass writes it in
place): the copy disappears.

Fused when every input of a float32 4-D Concat on axis 1 is the only output of a
convolution read by nothing else (and once), with explicit padding (NOTSET or VALID), no
residual input, no channel shuffle, and no activation or one applied in place, and all the
convolutions read the same input (SqueezeNet's expand layers). The members then run where
the Concat was. Inception's branches read different inputs; fused, their convolutions ran
after all the branches' other work, away from the inputs they had just read, and Inception
v1 came out 2.6% slower (A/B), so those stay as they are.
"""

from __future__ import annotations

from typing import Any

from ...ir.graph import Graph, Node
from ...ops.fused import IN_PLACE_ACTIVATIONS
from ..rewrite import FUSED_DOMAIN, Sweep, is_conv

# Activation parameters kept per member (FakeQuant has three: scale and its two bounds).
PARAMS_PER_MEMBER = 3


def _member(graph: Graph, conv: Node) -> dict[str, Any] | None:
    """The member's attributes as ConcatConv lists, or None if it cannot be one."""
    if (len(conv.inputs) > 3 and conv.inputs[3]) or conv.attrs.get("shuffle_groups"):
        return None
    w = graph.shape(conv.inputs[1])
    if w is None or len(w) != 4 or not all(isinstance(d, int) for d in w):
        return None
    auto_pad = conv.attrs.get("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID", ""):
        return None
    pads = [0, 0, 0, 0] if auto_pad == "VALID" else [int(p) for p in conv.attrs.get("pads", []) or [0, 0, 0, 0]]
    act = conv.attrs.get("activation", "")
    if act and act not in IN_PLACE_ACTIVATIONS:
        return None
    params = [float(p) for p in conv.attrs.get("activation_params", []) or []]
    if len(params) > PARAMS_PER_MEMBER or len(pads) != 4:
        return None
    return {
        "kernel_shapes": list(w[2:]),
        "pads": pads,
        "strides": [int(s) for s in conv.attrs.get("strides", []) or [1, 1]],
        "dilations": [int(d) for d in conv.attrs.get("dilations", []) or [1, 1]],
        "groups": [int(conv.attrs.get("group", 1))],
        "activations": [act],
        "activation_params": params + [0.0] * (PARAMS_PER_MEMBER - len(params)),
    }


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for cat in list(graph.nodes):
        if cat.domain or cat.op_type != "Concat" or len(cat.inputs) < 2 or not sweep.fresh(cat):
            continue
        out = cat.outputs[0]
        shape = graph.shape(out)
        if shape is None or len(shape) != 4 or int(cat.attrs.get("axis", 0)) not in (1, -3):
            continue
        if graph.elem_type(out) != 1 or len(set(cat.inputs)) != len(cat.inputs):
            continue
        convs = [uses.producer.get(name) for name in cat.inputs]
        if not all(is_conv(c) and uses.only_reader(c.outputs[0]) is cat for c in convs):  # type: ignore[union-attr]
            continue
        if not sweep.fresh(*convs) or len({c.inputs[0] for c in convs}) != 1:  # type: ignore[union-attr]
            continue
        attrs: dict[str, list[Any]] = {}
        inputs: list[str] = []
        for conv in convs:
            assert conv is not None
            member = _member(graph, conv)
            if member is None or graph.elem_type(conv.inputs[0]) != 1:
                break
            for key, values in member.items():
                attrs.setdefault(key, []).extend(values)
            inputs += [conv.inputs[0], conv.inputs[1], conv.inputs[2] if len(conv.inputs) > 2 else ""]
        else:
            sweep.replace(cat, Node("ConcatConv", inputs, [out], attrs, cat.name, FUSED_DOMAIN, 1))
            sweep.remove(*convs)  # type: ignore[arg-type]
    return sweep.finish()
