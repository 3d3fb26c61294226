"""A decoder's new keys or values split into heads and appended to its cache -> one step.

    present = Concat(past, Transpose<0,2,1,3>(Reshape(new, shape)), axis=2)

becomes onnxpy.fused.AppendHeads(past, new, shape) (``ops/append_heads.py``), writing the
concatenation from the reshaped view of ``new``. GPT-2 as torch.onnx exports it with its past
makes two per layer (keys and values), each three nodes of microseconds of Python in a step
that is mostly per-node costs (4-layer, 256-wide: 16 steps of 90 fewer).

The Reshape's and the Transpose's outputs must be read by the chain alone (not by Shape nodes,
not graph outputs); Concat's axis is 2 or -2 (the Transpose makes the rank 4). Reshape's
``allowzero`` goes with it. Concat already requires its inputs to be of one type.
"""

from __future__ import annotations

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, is_plain

_HEADS = [0, 2, 1, 3]


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for node in list(graph.nodes):
        if not is_plain(node, "Concat") or len(node.inputs) != 2 or not node.outputs[0] or not sweep.fresh(node):
            continue
        if int(node.attrs.get("axis", 0)) not in (2, -2):
            continue
        past, heads = node.inputs
        transpose = uses.producer.get(heads)
        if not is_plain(transpose, "Transpose") or [int(p) for p in transpose.attrs.get("perm", [])] != _HEADS:
            continue
        reshape = uses.producer.get(transpose.inputs[0])
        if not is_plain(reshape, "Reshape") or len(reshape.inputs) != 2 or not reshape.inputs[1]:
            continue
        if uses.only_reader(heads) is not node or uses.only_reader(transpose.inputs[0]) is not transpose:
            continue
        if not sweep.fresh(transpose, reshape):
            continue
        attrs = {"allowzero": int(reshape.attrs.get("allowzero", 0))}
        fused = Node(
            op_type="AppendHeads",
            inputs=[past, reshape.inputs[0], reshape.inputs[1]],
            outputs=[node.outputs[0]],
            attrs=attrs,
            name=node.name,
            domain=FUSED_DOMAIN,
            opset=1,
        )
        sweep.replace(node, fused)
        sweep.remove(transpose, reshape)
    return sweep.finish()
