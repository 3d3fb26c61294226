"""Pattern fusions for exporter-decomposed operators:

- GELU: x * 0.5 * (1 + erf(x / sqrt(2))) in any of the orders exporters write it (Div by
  sqrt(2) or Mul by 1/sqrt(2); the 0.5 applied to x first or last) -> onnxpy.fused.Gelu.
- LayerNormalization decomposed as ReduceMean / Sub / Pow 2 / ReduceMean / Add eps / Sqrt / Div,
  optionally followed by Mul gamma and Add beta -> LayerNormalization (on the last axis).
- Transpose pairs: Transpose(Transpose(x, p), q) -> one Transpose (none if the composition is
  the identity).
"""

from __future__ import annotations

import math

import numpy as np

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Uses, constant, prune_unused, remove_nodes, scalar_value


def _near(value: float | None, target: float, tol: float = 1e-4) -> bool:
    return value is not None and abs(value - target) <= tol * max(1.0, abs(target))


def _other(node: Node, name: str) -> str:
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})


def _is(node: Node | None, op: str) -> bool:
    if node is None or node.domain or node.op_type != op:
        return False
    return len(node.inputs) == 2 if op in _BINARY else True


def _match_gelu(graph: Graph, uses: Uses, erf: Node) -> tuple[str, str, list[Node]] | None:
    """(x, output, nodes to remove) when ``erf`` sits in a GELU pattern."""
    pre = uses.producer.get(erf.inputs[0])
    if pre is None or uses.only_reader(erf.inputs[0]) is not erf:
        return None
    if _is(pre, "Div") and _near(scalar_value(constant(graph, pre.inputs[1])), math.sqrt(2)):
        x = pre.inputs[0]
    elif _is(pre, "Mul"):
        c0, c1 = scalar_value(constant(graph, pre.inputs[0])), scalar_value(constant(graph, pre.inputs[1]))
        if _near(c1, 1 / math.sqrt(2)):
            x = pre.inputs[0]
        elif _near(c0, 1 / math.sqrt(2)):
            x = pre.inputs[1]
        else:
            return None
    else:
        return None
    add = uses.only_reader(erf.outputs[0])
    if not _is(add, "Add") or not _near(scalar_value(constant(graph, _other(add, erf.outputs[0]))), 1.0):
        return None
    m1 = uses.only_reader(add.outputs[0])
    if not _is(m1, "Mul"):
        return None
    partner = _other(m1, add.outputs[0])
    if partner == x:
        # x * (1 + erf) then * 0.5
        m2 = uses.only_reader(m1.outputs[0])
        if not _is(m2, "Mul") or not _near(scalar_value(constant(graph, _other(m2, m1.outputs[0]))), 0.5):
            return None
        return x, m2.outputs[0], [pre, erf, add, m1, m2]
    half = uses.producer.get(partner)
    if _is(half, "Mul") and uses.only_reader(partner) is m1:
        if x in half.inputs and _near(scalar_value(constant(graph, _other(half, x))), 0.5):
            return x, m1.outputs[0], [pre, erf, add, half, m1]
    if _near(scalar_value(constant(graph, partner)), 0.5):
        # (1 + erf) * 0.5 then * x
        m2 = uses.only_reader(m1.outputs[0])
        if _is(m2, "Mul") and _other(m2, m1.outputs[0]) == x:
            return x, m2.outputs[0], [pre, erf, add, m1, m2]
    return None


def _axes_of(graph: Graph, node: Node) -> list[int] | None:
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(node.inputs) > 1 and node.inputs[1]:
        c = constant(graph, node.inputs[1])
        return None if c is None else [int(a) for a in c.reshape(-1)]
    return None


def _last_axis_mean(graph: Graph, node: Node | None) -> bool:
    if node is None or node.domain or node.op_type != "ReduceMean" or not node.attrs.get("keepdims", 1):
        return False
    axes = _axes_of(graph, node)
    rank = len(graph.shape(node.inputs[0]) or [])
    return axes is not None and len(axes) == 1 and (axes[0] == -1 or (rank and axes[0] == rank - 1))


def _match_layernorm(graph: Graph, uses: Uses, mean: Node) -> tuple[str, float, str, list[Node]] | None:
    """(x, epsilon, normalized output, nodes) for the decomposed normalization starting at ``mean``."""
    if not _last_axis_mean(graph, mean):
        return None
    x = mean.inputs[0]
    sub = uses.only_reader(mean.outputs[0])
    if not _is(sub, "Sub") or sub.inputs != [x, mean.outputs[0]]:
        return None
    d = sub.outputs[0]
    readers = uses.readers_of(d)
    if len(readers) != 2 or d in uses.graph_outputs:
        return None
    pow_ = next((r for r in readers if _is(r, "Pow") or (_is(r, "Mul") and r.inputs == [d, d])), None)
    div = next((r for r in readers if _is(r, "Div") and r.inputs[0] == d), None)
    if pow_ is None or div is None:
        return None
    if pow_.op_type == "Pow" and not _near(scalar_value(constant(graph, pow_.inputs[1])), 2.0):
        return None
    var = uses.only_reader(pow_.outputs[0])
    if not _last_axis_mean(graph, var):
        return None
    add = uses.only_reader(var.outputs[0])
    if not _is(add, "Add"):
        return None
    eps = scalar_value(constant(graph, _other(add, var.outputs[0])))
    if eps is None:
        return None
    sqrt = uses.only_reader(add.outputs[0])
    if sqrt is None or sqrt.domain or sqrt.op_type != "Sqrt" or div.inputs[1] != sqrt.outputs[0]:
        return None
    return x, eps, div.outputs[0], [mean, sub, pow_, var, add, sqrt, div]


def run(graph: Graph) -> bool:
    changed = False
    uses = Uses(graph)
    for node in list(graph.nodes):
        if node.domain:
            continue
        if node.op_type == "Erf" and graph.elem_type(node.inputs[0]) in (1, 10, 16, None):
            m = _match_gelu(graph, uses, node)
            if m is None:
                continue
            x, out, dead = m
            gelu = Node("Gelu", [x], [out], {}, node.name or "gelu", FUSED_DOMAIN, 1)
            graph.nodes[graph.nodes.index(dead[-1])] = gelu
            remove_nodes(graph, dead[:-1])
            uses = Uses(graph)
            changed = True
        elif node.op_type == "ReduceMean":
            m2 = _match_layernorm(graph, uses, node)
            if m2 is None:
                continue
            x, eps, out, dead = m2
            rank = graph.shape(x)
            if rank is None:
                continue
            width = rank[-1]
            if not isinstance(width, int):
                continue
            et = graph.elem_type(x)
            np_dtype = {1: np.float32, 11: np.float64, 10: np.float16}.get(et or 0)
            if np_dtype is None:
                continue
            # Absorb a following Mul(gamma) and Add(beta) with constant vectors.
            scale = np.ones(width, np_dtype)
            bias = None
            tail = dead[-1]
            mul = uses.only_reader(out)
            if _is(mul, "Mul"):
                g = constant(graph, _other(mul, out))
                if g is not None and g.shape[-1:] == (width,) and g.size == width:
                    scale = g.reshape(width).astype(np_dtype)
                    tail, out = mul, mul.outputs[0]
                    dead = [*dead, mul]
                    add = uses.only_reader(out)
                    if _is(add, "Add"):
                        b = constant(graph, _other(add, out))
                        if b is not None and b.size == width:
                            bias = b.reshape(width).astype(np_dtype)
                            tail, out = add, add.outputs[0]
                            dead = [*dead, add]
            sname = f"{node.name or 'layernorm'}_scale"
            while sname in graph.initializers:
                sname += "_"
            graph.initializers[sname] = scale
            inputs = [x, sname]
            if bias is not None:
                bname = sname + "_bias"
                while bname in graph.initializers:
                    bname += "_"
                graph.initializers[bname] = bias
                inputs.append(bname)
            ln = Node(
                "LayerNormalization",
                inputs,
                [out],
                {"axis": -1, "epsilon": float(eps)},
                node.name or "layernorm",
                "",
                17,
            )
            graph.nodes[graph.nodes.index(tail)] = ln
            remove_nodes(graph, [d for d in dead if d is not tail])
            uses = Uses(graph)
            changed = True
    changed |= _merge_transposes(graph)
    if changed:
        prune_unused(graph)
    return changed


def _merge_transposes(graph: Graph) -> bool:
    changed = False
    uses = Uses(graph)
    for node in list(graph.nodes):
        if node.domain or node.op_type != "Transpose" or "perm" not in node.attrs:
            continue
        first = uses.producer.get(node.inputs[0])
        if first is None or first.domain or first.op_type != "Transpose" or "perm" not in first.attrs:
            continue
        if uses.only_reader(first.outputs[0]) is not node:
            continue
        p, q = list(first.attrs["perm"]), list(node.attrs["perm"])
        if len(p) != len(q):
            continue
        combined = [p[i] for i in q]
        node.inputs = [first.inputs[0]]
        node.attrs = {"perm": combined}
        remove_nodes(graph, [first])
        if combined == list(range(len(combined))):
            node.op_type = "Identity"
            node.attrs = {}
        uses = Uses(graph)
        changed = True
    return changed
