"""Dynamically quantized products -> DynamicQuantizeShifted + ShiftedIntegerMatMul.

onnxruntime's quantize_dynamic (the usual way to quantize a transformer) turns each MatMul into

    xq, xs, xz = DynamicQuantizeLinear(x)
    y = Mul(Cast(MatMulInteger(xq, W, xz, wz), to=float), scale)   [then Add(y, bias)]

with scale = xs * ws computed by a Mul of its own. When every reader of xq is such a chain with
xz as its zero point and a constant 2-D W, the DynamicQuantizeLinear becomes
DynamicQuantizeShifted (xq - xz as float32 integers) and each chain one ShiftedIntegerMatMul
(ops/fused_quant.py), a constant bias Add included: bit for bit the unfused numbers, in two
passes fewer per input and four per product. Not taken where a sum could leave int32's range
(255 * max column sum of |W - wz| >= 2**31), where MatMulInteger would wrap.
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, constant

_INT32_LIMIT = float(2**31)


def _weights_fit(b: np.ndarray, zero_point: np.ndarray | None) -> bool:
    if b.ndim != 2 or b.dtype not in (np.uint8, np.int8):
        return False
    shifted = b.astype(np.float64)
    if zero_point is not None:
        if zero_point.size not in (1, b.shape[1]) or zero_point.dtype != b.dtype:
            return False
        shifted -= zero_point.astype(np.float64).reshape(-1 if zero_point.size > 1 else ())
    return 255.0 * float(np.abs(shifted).sum(axis=0).max(initial=0.0)) < _INT32_LIMIT


def _chain(graph: Graph, uses: Uses, mmi: Node, zero_point: str) -> tuple[list[str], list[Node]] | None:
    """(inputs after v, the nodes replaced) for MatMulInteger -> Cast -> Mul [-> Add bias]."""
    if mmi.op_type != "MatMulInteger" or mmi.domain or len(mmi.inputs) < 3 or mmi.inputs[2] != zero_point:
        return None
    b = constant(graph, mmi.inputs[1])
    bz_name = mmi.inputs[3] if len(mmi.inputs) > 3 else ""
    bz = constant(graph, bz_name) if bz_name else None
    if b is None or (bz_name and bz is None) or not _weights_fit(b, bz):
        return None
    cast = uses.only_reader(mmi.outputs[0])
    if cast is None or cast.op_type != "Cast" or cast.domain or int(cast.attrs.get("to", 0)) != 1:
        return None
    mul = uses.only_reader(cast.outputs[0])
    if mul is None or mul.op_type != "Mul" or mul.domain or len(mul.inputs) != 2:
        return None
    scale = mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0]
    shape = graph.shape(scale)
    n = b.shape[1]
    if scale == cast.outputs[0] or graph.elem_type(scale) != 1 or shape is None or shape not in ([], [1], [n]):
        return None
    inputs, replaced = [mmi.inputs[1], bz_name, scale], [mmi, cast, mul]
    add = uses.only_reader(mul.outputs[0])
    if add is not None and add.op_type == "Add" and not add.domain and len(add.inputs) == 2:
        other = add.inputs[1] if add.inputs[0] == mul.outputs[0] else add.inputs[0]
        bias = constant(graph, other)
        if bias is not None and bias.dtype == np.float32 and bias.shape == (n,):
            inputs.append(other)
            replaced.append(add)
    return inputs, replaced


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for dql in list(graph.nodes):
        if dql.op_type != "DynamicQuantizeLinear" or dql.domain or len(dql.outputs) != 3 or not sweep.fresh(dql):
            continue
        xq, xs, xz = dql.outputs
        if not (xq and xs and xz) or xq in uses.graph_outputs or graph.elem_type(dql.inputs[0]) != 1:
            continue
        readers = uses.readers_of(xq)
        chains = [
            _chain(graph, uses, r, xz) if r.inputs[0] == xq and r.inputs.count(xq) == 1 else None for r in readers
        ]
        if not readers or any(c is None for c in chains) or not sweep.fresh(*[n for c in chains for n in c[1]]):  # type: ignore[index]
            continue
        shifted = sweep.new_name(f"{xq}_shifted")
        sweep.replace(
            dql, Node("DynamicQuantizeShifted", list(dql.inputs), [shifted, xs, xz], {}, dql.name, FUSED_DOMAIN, 1)
        )
        for inputs, replaced in chains:  # type: ignore[misc]
            fused = Node(
                "ShiftedIntegerMatMul",
                [shifted, *inputs],
                [replaced[-1].outputs[0]],
                {},
                replaced[0].name,
                FUSED_DOMAIN,
                1,
            )
            sweep.replace(replaced[0], fused)
            sweep.remove(*replaced[1:])
    return sweep.finish()
