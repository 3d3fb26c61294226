"""A 1x1 convolution whose only reader is a depthwise convolution -> one PointwiseDepthwiseConv.

MobileNet-style blocks expand the channels with a 1x1 convolution (and ReLU6), then filter each
channel with a depthwise 3x3. The depthwise kernel copies its input into a zero-bordered
channels-last buffer first (ops/_depthwise.py): a full pass over the expanded tensor, the
largest of the block. Fused, the 1x1 GEMM writes that buffer directly, border included, since
a zero input row with a zero "bias column" gives exactly 0 (ops/fused.py,
pointwise_depthwise_conv).

Fused when, in float32 with static weight shapes:

- the 1x1 convolution has stride 1, no padding, no residual input, at most 8 groups (a grouped
  one, with or without ShuffleNet's channel shuffle, becomes one dense GEMM with block-diagonal
  weights) and an activation f with f(0) = 0 (none, Relu, LeakyRelu, Tanh, HardSwish, Swish,
  GELU, FakeQuant, or Clip whose range holds 0), since the border must stay 0 after it;
- its output is read by the depthwise convolution alone (group = channels, one input channel
  per group, a 2-D kernel larger than 1x1, dilation 1, no residual input, no shuffle).

The 1x1 convolution's output leaves the graph, so fetching it by name falls back to the
unoptimized graph, as for every fused intermediate.
"""

from __future__ import annotations

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, is_conv
from .fuse_activation import CONV_ATTRS, activation_of

# Activations that map 0 to 0 (Clip is checked against its bounds).
_ZERO_PRESERVING = frozenset({"", "Relu", "LeakyRelu", "Tanh", "HardSwish", "Swish", "Gelu", "Clip", "FakeQuant"})


# A grouped 1x1 convolution runs as a dense GEMM with block-diagonal weights: g times the
# multiply-adds, still cheap next to the g narrow GEMMs and the copies it saves for small g.
MAX_POINTWISE_GROUPS = 8
# ... and only on few input channels: in ShuffleNet the dense form paid off for its first unit
# (24 input channels, the stride-2 depthwise's input no longer transposed) and lost on the
# later ones (136 and more input channels): -5% on the model when fused everywhere.
MAX_GROUPED_INPUT_CHANNELS = 64


def _no_residual(conv: Node) -> bool:
    return not (len(conv.inputs) > 3 and conv.inputs[3])


def _plain(conv: Node) -> bool:
    """No residual input and no shuffle: the convolution's output is the convolution."""
    return _no_residual(conv) and not conv.attrs.get("shuffle_groups")


def _zero_preserving(conv: Node) -> bool:
    act = conv.attrs.get("activation", "")
    if act not in _ZERO_PRESERVING:
        return False
    if act == "Clip":
        lo, hi = (list(conv.attrs.get("activation_params", [])) + [None, None])[:2]
        return lo is not None and hi is not None and lo <= 0 <= hi
    return True


def _pointwise(graph: Graph, conv: Node) -> bool:
    w = graph.shape(conv.inputs[1])
    if w is None or len(w) != 4 or w[2:] != [1, 1] or not all(isinstance(d, int) for d in w):
        return False
    groups = int(conv.attrs.get("group", 1))
    if not 1 <= groups <= MAX_POINTWISE_GROUPS:
        return False
    if groups > 1 and w[1] * groups > MAX_GROUPED_INPUT_CHANNELS:
        return False
    if any(int(s) != 1 for s in conv.attrs.get("strides", []) or []):
        return False
    if conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return False
    return not any(int(p) for p in conv.attrs.get("pads", []) or [])


def _depthwise(graph: Graph, conv: Node, channels: int) -> bool:
    w = graph.shape(conv.inputs[1])
    if w is None or len(w) != 4 or not all(isinstance(d, int) for d in w):
        return False
    if w[0] != channels or w[1] != 1 or int(conv.attrs.get("group", 1)) != channels or w[2:] == [1, 1]:
        return False
    return all(int(d) == 1 for d in conv.attrs.get("dilations", []) or [])


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for pw in list(graph.nodes):
        if not is_conv(pw) or not sweep.fresh(pw) or not _no_residual(pw) or not _zero_preserving(pw):
            continue
        if graph.elem_type(pw.inputs[0]) != 1 or not _pointwise(graph, pw):
            continue
        mid = pw.outputs[0]
        dw = uses.only_reader(mid)
        if not is_conv(dw) or dw.inputs[0] != mid or not sweep.fresh(dw) or not _plain(dw):
            continue
        channels = graph.shape(pw.inputs[1])[0]  # type: ignore[index]
        if not _depthwise(graph, dw, channels):  # type: ignore[arg-type]
            continue
        # Wait while an activation after the depthwise convolution is still a separate node:
        # fuse_activation folds it into the FusedConv first, and this pass takes both next round.
        after = uses.only_reader(dw.outputs[0])
        if not dw.attrs.get("activation") and after is not None and activation_of(graph, after) is not None:
            continue
        attrs = {k: v for k, v in dw.attrs.items() if k in (*CONV_ATTRS, "activation", "activation_params")}
        if int(pw.attrs.get("group", 1)) > 1:
            attrs["group1"] = int(pw.attrs["group"])
        if pw.attrs.get("shuffle_groups"):
            attrs["shuffle_groups1"] = int(pw.attrs["shuffle_groups"])
        if pw.attrs.get("activation"):
            attrs["activation1"] = pw.attrs["activation"]
            if pw.attrs.get("activation_params"):
                attrs["activation1_params"] = list(pw.attrs["activation_params"])
        b1 = pw.inputs[2] if len(pw.inputs) > 2 else ""
        b = dw.inputs[2] if len(dw.inputs) > 2 else ""
        inputs = [pw.inputs[0], pw.inputs[1], b1, dw.inputs[1], b]
        fused = Node(
            "PointwiseDepthwiseConv",
            inputs if b else inputs[:4],
            [dw.outputs[0]],
            attrs,
            dw.name or pw.name,
            FUSED_DOMAIN,
            1,
        )
        sweep.replace(dw, fused)
        sweep.remove(pw)
    return sweep.finish()
