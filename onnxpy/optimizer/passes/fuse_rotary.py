"""Rotary position embedding by halves (Llama's rotate_half) -> onnxpy.fused.RotaryHalf.

transformers' Llama, Mistral, Qwen and GPT-NeoX apply rotary embeddings as

    q * cos + cat(-q[..., h:], q[..., :h]) * sin        with h = q.shape[-1] // 2

which torch exports as two Slices of q along the last axis (their bounds computed from
Shape(q)), Neg, Concat, two Muls and an Add: seven steps for each of q and k in every layer.
Matched from the Add, with the split point read symbolically (optimizer/shape_arith.py) and
checked against q's static last dimension, they become one RotaryHalf(q, cos, sin; half=h),
which computes the same expression in four passes. cos and sin may broadcast to q as in the
graph (the result has the Add's shape).
"""

from __future__ import annotations

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, is_plain
from ..shape_arith import shape_entries

# torch writes "to the end" as int64's maximum.
_TO_THE_END = 2**62


def _last_axis_slice(graph: Graph, uses: Uses, node: Node | None, x: str, width: int) -> tuple[int, int] | None:
    """(start, end) of a step-1 Slice of ``x`` along its last axis (of ``width``), bounds clamped."""
    if not is_plain(node, "Slice") or node is None or node.inputs[0] != x or len(node.inputs) < 3:
        return None
    rank = len(graph.shape(x) or [])
    bounds = []
    for i in range(1, 5):
        if i >= len(node.inputs) or not node.inputs[i]:
            bounds.append(None)
            continue
        value = shape_entries(graph, uses, node.inputs[i])
        if value is None or len(value[0]) != 1 or not isinstance(value[0][0], int):
            return None
        bounds.append(value[0][0])
    start, end, axis, step = bounds
    if axis is None or axis not in (-1, rank - 1) or step not in (None, 1) or start is None or end is None:
        return None
    start = min(max(start + width if start < 0 else start, 0), width)
    end = min(max(end + width if end < 0 else end, 0), width) if end < _TO_THE_END else width
    return start, end


def _match(graph: Graph, uses: Uses, add: Node) -> tuple[Node, list[Node]] | None:
    """(the fused node, the nodes it replaces) for the rotary expression ending at ``add``."""
    if not is_plain(add, "Add") or len(add.inputs) != 2:
        return None
    for first, second in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        direct, rotated = uses.producer.get(first), uses.producer.get(second)
        if not (is_plain(direct, "Mul") and is_plain(rotated, "Mul")) or direct is rotated:
            continue
        assert direct is not None and rotated is not None
        if uses.only_reader(first) is not add or uses.only_reader(second) is not add:
            continue
        for x, cos in ((direct.inputs[0], direct.inputs[1]), (direct.inputs[1], direct.inputs[0])):
            for cat_name, sin in ((rotated.inputs[0], rotated.inputs[1]), (rotated.inputs[1], rotated.inputs[0])):
                found = _rotate_half(graph, uses, uses.producer.get(cat_name), x, rotated)
                if found is None:
                    continue
                half, nodes = found
                fused = Node("RotaryHalf", [x, cos, sin], list(add.outputs), {"half": half}, add.name, FUSED_DOMAIN, 1)
                return fused, [direct, rotated, *nodes, add]
    return None


def _rotate_half(graph: Graph, uses: Uses, cat: Node | None, x: str, reader: Node) -> tuple[int, list[Node]] | None:
    """(h, nodes) when ``cat``, read by ``reader`` alone, is Concat(-x[..., h:], x[..., :h])
    along x's last axis, x of a static last dimension and a float type."""
    shape = graph.shape(x)
    if not is_plain(cat, "Concat") or cat is None or shape is None or not shape or not isinstance(shape[-1], int):
        return None
    if graph.elem_type(x) not in (1, 11, None) or uses.only_reader(cat.outputs[0]) is not reader:
        return None
    width, rank = shape[-1], len(shape)
    if len(cat.inputs) != 2 or int(cat.attrs.get("axis", 0)) not in (-1, rank - 1):
        return None
    neg, low = uses.producer.get(cat.inputs[0]), uses.producer.get(cat.inputs[1])
    if not is_plain(neg, "Neg") or neg is None or uses.only_reader(cat.inputs[0]) is not cat:
        return None
    high = uses.producer.get(neg.inputs[0])
    if uses.only_reader(neg.inputs[0]) is not neg or uses.only_reader(cat.inputs[1]) is not cat:
        return None
    low_bounds = _last_axis_slice(graph, uses, low, x, width)
    high_bounds = _last_axis_slice(graph, uses, high, x, width)
    if low_bounds is None or high_bounds is None:
        return None
    h = low_bounds[1]
    if low_bounds[0] != 0 or high_bounds != (h, width) or not 0 < h < width:
        return None
    assert low is not None and high is not None
    return h, [low, high, neg, cat]


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    for node in list(graph.nodes):
        if not is_plain(node, "Add") or not sweep.fresh(node):
            continue
        m = _match(graph, sweep.uses, node)
        if m is None or not sweep.fresh(*m[1]):
            continue
        fused, dead = m
        sweep.replace(node, fused)
        sweep.remove(*[d for d in dead if d is not node])
    return sweep.finish()
