"""QuantizeLinear -> DequantizeLinear on a float32 value becomes one FakeQuant step.

onnxruntime's quantizer writes QDQ models: every activation goes through a QuantizeLinear and a
DequantizeLinear with the same per-tensor scale s and zero point z, and the float operators
between them run on the dequantized values. Computed as written that is two kernels and an
integer tensor per activation (eleven numpy passes with the casts), and the pair sits between a
convolution and the next one, so no convolution fuses with anything. For an integer type of
range [qmin, qmax]:

    DQ(Q(x)) = (clip(rint(x / s) + z, qmin, qmax) - z) * s
             = clip(rint(x / s), qmin - z, qmax - z) * s

bit for bit in float32: x / s is the same division, rint of it is an integer, the clip bounds
are small integers, and (q - z) converted to float32 is that integer. FakeQuant(s, lo, hi)
computes the right-hand side in place (four passes) and is an activation like Relu
(fuse_activation.py): fused into the convolution or product before it, applied to each block of
its output while the block is in cache. It maps 0 to 0 (z lies in [qmin, qmax]), so the
pointwise-depthwise fusion takes it too.

FakeQuant is idempotent bit for bit (y = k * s rounded gives rint(y / s) = k back for every
|k| < 2**16), so one whose input already holds values of its own grid is dropped: the input
produced by a FakeQuant with the same parameters (or a node applying it as its activation),
directly or through operators that only move or select values (Reshape, Transpose, MaxPool,
Concat...). onnxruntime's quantizer puts a Q/DQ pair after each of those too.

Taken when the scale is a positive finite float32 constant scalar, the zero point (if any) a
constant integer scalar, the Q's only reader a DQ with the same constants, and Q's integer output
no graph output. A NaN stays NaN here, where the integer path casts it to some integer: the
specification leaves NaN's quantization undefined.
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ...model import dtypes
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, constant, remove_nodes, rename_all

_QUANTIZE_DOMAINS = ("", "com.microsoft")


def _scalar(graph: Graph, node: Node, index: int) -> np.ndarray | None:
    """The constant scalar at input ``index`` of ``node`` (None when absent or not constant)."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    v = constant(graph, node.inputs[index])
    if v is None or v.size != 1 or v.ndim > 1:
        return None
    return v.reshape(())


def _params(graph: Graph, node: Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(scale, zero point) of a per-tensor Q or DQ node, or None when it is not one."""
    if int(node.attrs.get("block_size", 0) or 0) != 0:
        return None
    scale = _scalar(graph, node, 1)
    if scale is None or scale.dtype != np.float32:
        return None
    has_zero_point = len(node.inputs) > 2 and bool(node.inputs[2])
    zero_point = _scalar(graph, node, 2)
    if has_zero_point and zero_point is None:
        return None  # a zero point that is not a constant scalar
    return scale, zero_point


def _integer_range(elem_type: int | None) -> tuple[int, int] | None:
    if elem_type is None:
        return None
    dt = dtypes.ELEM_TO_NP.get(elem_type)
    if dt is None or np.dtype(dt).kind not in "iu":
        return None  # float8 outputs round differently; int4 and friends are rare in activations
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def fake_quant_params(graph: Graph, q: Node, dq: Node) -> list[float] | None:
    """[scale, lo, hi] when ``dq`` (reading ``q``'s output) undoes ``q`` up to rounding, else None."""
    if q.op_type != "QuantizeLinear" or q.domain not in _QUANTIZE_DOMAINS:
        return None
    if dq.op_type != "DequantizeLinear" or dq.domain not in _QUANTIZE_DOMAINS:
        return None
    if int(q.attrs.get("precision", 0) or 0) not in (0, 1) or int(dq.attrs.get("output_dtype", 0) or 0) not in (0, 1):
        return None
    # A DequantizeLinear's output has its scale's type (float32, checked below); contrib
    # nodes carry no inferred types.
    x_type = graph.elem_type(q.inputs[0])
    if x_type is None and q.domain == "com.microsoft":
        x_type = 1  # its x has its scale's type (checked float32 below); untyped after contrib nodes
    if x_type != 1 or graph.elem_type(dq.outputs[0]) not in (None, 1):
        return None
    qp, dqp = _params(graph, q), _params(graph, dq)
    if qp is None or dqp is None or not _same(qp[0], dqp[0]) or not _same(qp[1], dqp[1]):
        return None
    scale, zero_point = qp
    s = float(scale)
    if not (np.isfinite(s) and s > 0):
        return None
    elem_type = graph.elem_type(q.outputs[0])
    if elem_type is None:  # contrib nodes: the zero point's type, uint8 without one
        elem_type = dtypes.NP_TO_ELEM.get(zero_point.dtype) if zero_point is not None else 2
    rng = _integer_range(elem_type)
    if rng is None:
        return None
    z = int(zero_point) if zero_point is not None else 0
    if not rng[0] <= z <= rng[1]:
        return None
    return [s, float(rng[0] - z), float(rng[1] - z)]


# Operators whose outputs hold only values of their (first, or every) data input, so a grid the
# input's values lie on holds for the output too.
_SELECTING = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Expand", "MaxPool", "Tile"}
)
_SELECTING_ALL_INPUTS = frozenset({"Concat"})


def _grid_of(uses: Uses, name: str, depth: int = 0) -> list[float] | None:
    """FakeQuant parameters every value of ``name`` is known to lie on, or None."""
    node = uses.producer.get(name)
    if node is None or depth > 8:
        return None
    if node.domain == FUSED_DOMAIN and (node.op_type == "FakeQuant" or node.attrs.get("activation") == "FakeQuant"):
        if node.op_type != "FakeQuant" and (node.outputs[0] != name or len(node.outputs) != 1):
            return None
        return list(node.attrs.get("activation_params", []))
    if node.domain:
        return None
    if node.op_type == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
        return None  # its indices output is not a value of the input
    if node.op_type in _SELECTING and node.outputs[0] == name:
        return _grid_of(uses, node.inputs[0], depth + 1)
    if node.op_type in _SELECTING_ALL_INPUTS:
        grids = [_grid_of(uses, i, depth + 1) for i in node.inputs]
        return grids[0] if grids and all(g is not None and g == grids[0] for g in grids) else None
    return None


def _drop_repeated(graph: Graph) -> bool:
    """Remove FakeQuant nodes whose input already lies on their grid."""
    uses = Uses(graph)
    mapping: dict[str, str] = {}
    dead: list[Node] = []
    for node in graph.nodes:
        if node.domain != FUSED_DOMAIN or node.op_type != "FakeQuant" or node.outputs[0] in uses.graph_outputs:
            continue
        if _grid_of(uses, node.inputs[0]) == list(node.attrs["activation_params"]):
            mapping[node.outputs[0]] = node.inputs[0]
            dead.append(node)
    if not dead:
        return False
    for out, src in mapping.items():  # chains (a dropped node reading another) to their source
        while src in mapping:
            src = mapping[src]
        mapping[out] = src
    remove_nodes(graph, dead)
    rename_all(graph, mapping)
    return True


def run(graph: Graph) -> bool:
    changed = _drop_repeated(graph)
    return _fuse_pairs(graph) or changed


def _fuse_pairs(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for q in list(graph.nodes):
        if q.op_type != "QuantizeLinear" or len(q.outputs) != 1 or not sweep.fresh(q):
            continue
        mid = q.outputs[0]
        dq = uses.only_reader(mid)
        if dq is None or mid in uses.graph_outputs or not sweep.fresh(dq) or dq.inputs[0] != mid:
            continue
        params = fake_quant_params(graph, q, dq)
        if params is None:
            continue
        sweep.replace(
            q,
            Node(
                op_type="FakeQuant",
                inputs=[q.inputs[0]],
                outputs=[dq.outputs[0]],
                attrs={"activation_params": params},
                name=q.name or dq.name,
                domain=FUSED_DOMAIN,
                opset=1,
            ),
        )
        sweep.remove(dq)
    return sweep.finish()
