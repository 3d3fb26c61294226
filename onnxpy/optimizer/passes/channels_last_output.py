"""A convolution read only by depthwise convolutions writes its result channels-last.

The depthwise kernel runs in channels-last memory (ops/_depthwise.py) and starts by copying its
input into a zero-bordered channels-last buffer. From NCHW that copy is a transpose, which numpy
makes element by element (0.4-0.6 ns a value); from channels-last memory it copies whole rows.
The im2col convolution can write channels-last for free: its GEMM computes Y^T = cols^T W^T
instead of Y = W cols, BLAS reading both operands transposed in place (ops/conv.py).
MobileNet-v2's stem (3 -> 32, 3x3 stride 2, read by the first depthwise layer) and that layer:
1458 -> 1323 us; the model 0.985-0.995 (alternating runs in one process). Where only a pool read the stem (SqueezeNet,
ShuffleNet) the gain did not survive the layers after the pool, and for 7x7 stems (ResNet,
Inception) the transposed GEMM was slower, so only depthwise readers qualify.

Marks a FusedConv (attribute ``channels_last`` = 1) with a 2-D kernel larger than 1x1, group 1,
whose output is not a graph output and is read only as the input X of depthwise convolutions
(Conv or FusedConv with as many groups as input and output channels, one input channel per
group) or of PointwiseDepthwiseConv nodes. Values are unchanged, only their memory order: the
kernel honours the mark where it runs im2col for one image and ignores it elsewhere.

Host sessions only (numpy kernels; CuPy arrays keep NCHW).
"""

from __future__ import annotations

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Uses, constant, is_conv


def _depthwise(graph: Graph, node: Node) -> bool:
    if not is_conv(node):
        return False
    w = constant(graph, node.inputs[1]) if len(node.inputs) > 1 else None
    if w is None or w.ndim != 4 or w.shape[1] != 1 or w.shape[2] * w.shape[3] == 1:
        return False
    return int(node.attrs.get("group", 1)) == w.shape[0] > 1


def _reads_channels_last(graph: Graph, reader: Node, value: str) -> bool:
    """``reader`` takes ``value`` as its input X only, and is better fed channels-last."""
    if not reader.inputs or reader.inputs[0] != value or value in reader.inputs[1:]:
        return False
    if reader.op_type == "PointwiseDepthwiseConv" and reader.domain == FUSED_DOMAIN:
        return True
    return _depthwise(graph, reader)


def _candidate(graph: Graph, node: Node) -> bool:
    if node.op_type != "FusedConv" or node.domain != FUSED_DOMAIN or node.attrs.get("channels_last"):
        return False
    if int(node.attrs.get("group", 1)) != 1 or node.attrs.get("shuffle_groups"):
        return False
    w = constant(graph, node.inputs[1]) if len(node.inputs) > 1 else None
    return w is not None and w.ndim == 4 and w.shape[2] * w.shape[3] > 1


def run(graph: Graph) -> bool:
    uses = Uses(graph)
    changed = False
    for i, node in enumerate(graph.nodes):
        if not _candidate(graph, node) or not node.outputs or node.outputs[0] in uses.graph_outputs:
            continue
        y = node.outputs[0]
        readers = uses.readers_of(y)
        if readers and all(_reads_channels_last(graph, r, y) for r in readers):
            graph.nodes[i] = Node(
                node.op_type,
                list(node.inputs),
                list(node.outputs),
                {**node.attrs, "channels_last": 1},
                node.name,
                node.domain,
                node.opset,
            )
            changed = True
    return changed
