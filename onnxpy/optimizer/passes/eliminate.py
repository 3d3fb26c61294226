"""Remove nodes that compute nothing: Identity, inference-mode Dropout, Cast to the same type, and
Mul / Div by a constant one.

x * 1 and x / 1 are exact in IEEE arithmetic for every x (NaN, -0 and infinities included), so
the result is bit-identical. transformers' rotary embedding scales cos and sin by
attention_scaling (1.0 for default rope), BART its embeddings by embed_scale = 1.0 and BLOOM's
baddbmm exports beta * alibi with beta = 1: full-size products that change nothing. The one must
be of x's element type and must not broadcast x to a larger shape: all its dimensions 1 and its
rank at most x's (known) rank, or 0-d.

A node whose output is a graph output stays (the output keeps its name). No-op Reshape, Squeeze
and the like are not removed here.
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Graph, Node
from ...model import dtypes
from ..rewrite import Uses, constant, prune_unused, remove_nodes, rename_all

# A Constant node's value attributes, with the dtype each implies when not a tensor.
_CONSTANT_ATTRS = {
    "value": None,
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
}


def _constant_value(graph: Graph, uses: Uses, name: str) -> np.ndarray | None:
    """The value of ``name`` when it is a constant: an initializer no caller can override, or the
    output of a Constant node (still there when constant folding is disabled)."""
    value = constant(graph, name)
    if value is not None:
        return value
    node = uses.producer.get(name)
    if node is None or node.domain or node.op_type != "Constant":
        return None
    for key, dtype in _CONSTANT_ATTRS.items():
        if node.attrs.get(key) is not None:
            return np.asarray(node.attrs[key], dtype=dtype)
    return None


def _is_neutral_one(graph: Graph, x: str, one: np.ndarray | None) -> bool:
    """``one`` is all ones, of ``x``'s element type, and broadcasting it leaves x's shape as is."""
    if one is None or one.dtype.kind not in "fiuc" or not bool(np.all(one == 1)):
        return False
    try:
        if graph.elem_type(x) != dtypes.elem_type(one.dtype):
            return False
    except ValueError:
        return False
    if any(d != 1 for d in one.shape):
        return False
    if one.ndim == 0:
        return True
    shape = graph.shape(x)  # a [1] one against a 0-d x would make a 1-D result
    return shape is not None and one.ndim <= len(shape)


def _times_one(graph: Graph, node: Node, uses: Uses) -> str | None:
    """x for Mul(x, 1), Mul(1, x) and Div(x, 1); None otherwise (1 / x is not x)."""
    if len(node.inputs) != 2 or len(node.outputs) != 1 or not all(node.inputs):
        return None
    a, b = node.inputs
    if _is_neutral_one(graph, a, _constant_value(graph, uses, b)):
        return a
    if node.op_type == "Mul" and _is_neutral_one(graph, b, _constant_value(graph, uses, a)):
        return b
    return None


def _passthrough(graph: Graph, node: Node, uses: Uses) -> str | None:
    """The input a node merely forwards, or None."""
    if node.domain:
        return None
    op = node.op_type
    if op == "Identity" and len(node.inputs) == 1:
        return node.inputs[0]
    if op == "Dropout":
        mask = node.outputs[1] if len(node.outputs) > 1 else ""
        if mask and (uses.readers_of(mask) or mask in uses.graph_outputs):
            return None  # the mask is used
        if len(node.inputs) >= 3 and node.inputs[2]:
            training = constant(graph, node.inputs[2])
            if training is None or bool(training.reshape(-1)[0]):
                return None
        return node.inputs[0]
    if op == "Cast":
        src = graph.elem_type(node.inputs[0])
        if src is not None and src == node.attrs.get("to"):
            return node.inputs[0]
    if op in ("Mul", "Div"):
        return _times_one(graph, node, uses)
    return None


def run(graph: Graph) -> bool:
    uses = Uses(graph)
    dead: list[Node] = []
    mapping: dict[str, str] = {}
    for node in graph.nodes:
        src = _passthrough(graph, node, uses)
        if src is None:
            continue
        out = node.outputs[0]
        if out in uses.graph_outputs:
            continue  # a graph output keeps its name: the node stays
        mapping[out] = src
        dead.append(node)
    if not dead:
        return False
    # Chains (Identity of an Identity...) resolve to their first source; one rename pass.
    for out in list(mapping):
        src = mapping[out]
        seen = {out}
        while src in mapping and src not in seen:
            seen.add(src)
            src = mapping[src]
        mapping[out] = src
    remove_nodes(graph, dead)
    rename_all(graph, mapping)
    if any(n.op_type in ("Mul", "Div") for n in dead):
        prune_unused(graph)  # a Constant node that held the one reads nothing now
    return True
