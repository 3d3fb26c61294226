"""float16 and bfloat16 graphs computed in float32 between their boundaries.

numpy has no half-precision arithmetic: each float16 kernel converted its inputs to float32,
computed, and converted back, and numpy's conversions run at 2-3 ns a value (15-25x a copy;
it does not use the CPU's F16C instructions). A float16 MobileNet-v2 spent two thirds of its
277 ms converting, and none of the float32 fusions applied.

onnxruntime's CPU provider computes such graphs in float32 too: nodes without a half-precision
kernel are wrapped in Casts, and the Casts between two of them cancel. On a float16
Conv -> Conv -> Sigmoid -> Mul chain its outputs equal float32 arithmetic rounded once at the
end for 96% of values, and per-node rounding for 38% (at every optimization level).

So here every node whose op computes the same function in any float type (CONVERTIBLE) and
whose half-precision values all have a known type reads and writes float32 versions of them:

- a half initializer no caller can override gets a float32 copy (the half one is dropped when
  nothing else reads it);
- a half value produced outside the converted nodes (a graph input, a Cast the model has, an
  operator not listed) is cast to float32 once, where converted nodes read it;
- a half value produced by a converted node keeps its name only through a Cast back to its
  type, where a graph output or an unconverted node needs it; converted nodes then read that
  rounded value too, so no node sees the value both rounded and not. Fetching its name
  otherwise gives the unoptimized graph's value, as for any value an optimization removes.

Explicit Casts of the model stay: a Cast to float16 still rounds there. Host sessions only.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import AttributeProto, TensorProto, TypeProto

from ...ir.graph import Graph, Node
from ..rewrite import Uses, constant

HALF = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})

# Standard operators whose result in float32 is the half-precision one before its rounding:
# arithmetic, activations, normalizations, convolutions, pools, reductions and data movement.
# Not: Cast/CastLike (a type is their meaning), random generators, ops with a dtype attribute,
# control flow, IsInf (a value past 65504 is infinite in float16 only), and anything outside
# the default domain but the com.microsoft operators below.
CONVERTIBLE = frozenset(
    {
        # elementwise
        "Abs", "Neg", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid",
        "HardSwish", "Swish", "Tanh", "Softplus", "Softsign", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Gelu",
        "Mish", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Clip", "Identity", "ThresholdedRelu",
        "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where",
        "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "IsNaN",
        # linear algebra, normalization, convolution, pooling
        "MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "BatchNormalization", "InstanceNormalization",
        "LayerNormalization", "GroupNormalization", "LRN", "Softmax", "LogSoftmax", "Hardmax",
        "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool",
        "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
        "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "CumSum", "TopK",
        # data movement
        "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
        "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Pad", "Shape", "Size",
        "DepthToSpace", "SpaceToDepth", "Resize", "Upsample",
    }
)  # fmt: skip

# com.microsoft operators (as onnxruntime's transformer optimizer writes them) that compute
# the same function in any float type; their half values must have known types, like the rest.
CONVERTIBLE_CONTRIB = frozenset(
    {
        "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
        "LayerNormalization", "BiasGelu", "FastGelu", "Gelu", "QuickGelu", "BiasAdd", "BiasSplitGelu",
        "FusedMatMul", "FusedGemm", "Attention", "MultiHeadAttention", "EmbedLayerNormalization",
        "RotaryEmbedding",
    }
)  # fmt: skip

_SUFFIX = "_as_float"
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def _half(graph: Graph, name: str) -> bool:
    return graph.elem_type(name) in HALF


def _known(graph: Graph, name: str) -> bool:
    return not name or graph.elem_type(name) is not None


def _convertible(graph: Graph, node: Node) -> bool:
    """A listed op of the default domain with a half value among its inputs or outputs, and a
    known type for every value (an unknown one might be half at run time and meet float32)."""
    listed = node.op_type in (CONVERTIBLE_CONTRIB if node.domain == "com.microsoft" else CONVERTIBLE)
    if (node.domain and node.domain != "com.microsoft") or not listed or node.subgraphs():
        return False
    if node.op_type == "Clip" and not _both_bounds(node):
        return False  # an omitted bound is the type's finite limit: 65504 for float16
    names = [n for n in (*node.inputs, *node.outputs) if n]
    return all(_known(graph, n) for n in names) and any(_half(graph, n) for n in names)


def _both_bounds(clip: Node) -> bool:
    if clip.opset < 11:
        return "min" in clip.attrs and "max" in clip.attrs
    return len(clip.inputs) >= 3 and bool(clip.inputs[1]) and bool(clip.inputs[2])


def _float_type(graph: Graph, name: str) -> TypeProto:
    tp = TypeProto()
    known = graph.types.get(name)
    if known is not None:
        tp.CopyFrom(known)
    tp.tensor_type.elem_type = TensorProto.FLOAT
    return tp


def _cast(graph: Graph, src: str, dst: str, to: int, name: str) -> Node:
    return Node(
        "Cast",
        [src],
        [dst],
        {"to": to},
        name,
        "",
        graph.opsets.get("", 13),
        attr_types={"to": AttributeProto.INT},
    )


def _has_half(graph: Graph) -> bool:
    """Whether any value is known to be half precision (most graphs: no, found in one scan)."""
    half_dtypes = {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}
    return any(tp.HasField("tensor_type") and tp.tensor_type.elem_type in HALF for tp in graph.types.values()) or any(
        a.dtype in half_dtypes for a in graph.initializers.values()
    )


def run(graph: Graph) -> bool:
    if not _has_half(graph):
        return False
    converted = [n for n in graph.nodes if _convertible(graph, n)]
    if not converted:
        return False
    inside = {id(n) for n in converted}
    uses = Uses(graph)
    taken = graph.defined_names()

    def fresh(base: str) -> str:
        name, k = base + _SUFFIX, 1
        while name in taken:
            name, k = f"{base}{_SUFFIX}_{k}", k + 1
        taken.add(name)
        return name

    as_float: dict[str, str] = {}  # half value -> its float32 version
    added: list[Node] = []
    # Outputs of converted nodes: written in float32. Where something outside (an unconverted
    # reader, a subgraph, a graph output) needs the half value, a Cast rounds it back to its
    # name, and converted readers then read that rounded value too (cast up again below): the
    # unrounded one must not meet the rounded one, as in GreaterOrEqual(Dropout(a), a).
    for node in converted:
        for i, out in enumerate(node.outputs):
            if not out or not _half(graph, out):
                continue
            f = fresh(out)
            graph.types[f] = _float_type(graph, out)
            node.outputs[i] = f
            outside = out in uses.graph_outputs or any(id(r) not in inside for r in uses.readers_of(out))
            if outside:
                added.append(_cast(graph, f, out, graph.elem_type(out) or TensorProto.FLOAT16, f"{out}{_SUFFIX}_back"))
            else:
                as_float[out] = f
    # Inputs of converted nodes not produced by one: a float32 copy of a constant, or a Cast.
    for node in converted:
        for i, name in enumerate(node.inputs):
            if not name or not _half(graph, name):
                continue
            if node.op_type in _SHAPE_ONLY and name not in as_float:
                continue  # reads the shape alone: no conversion for it
            if name not in as_float:
                f = as_float[name] = fresh(name)
                graph.types[f] = _float_type(graph, name)
                value = constant(graph, name)
                if value is not None:
                    graph.initializers[f] = value.astype(np.float32)
                else:
                    added.append(_cast(graph, name, f, TensorProto.FLOAT, f"{name}{_SUFFIX}"))
            node.inputs[i] = as_float[name]
    graph.nodes.extend(added)  # the manager's topological sort puts them in place
    return True
