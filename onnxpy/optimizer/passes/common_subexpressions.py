"""Nodes that compute the same thing from the same inputs merge into one (common subexpression
elimination, as at onnxruntime's basic level).

Two nodes compute the same thing when they have the same domain, op type and opset, equal
attributes, the same outputs present, and the same inputs. An input is the same when it is the
same value (after earlier merges), or a small constant of equal dtype, shape and contents:
exporters write one constant per use, so BERT's attention mask, Where(mask, 0, -inf), is
computed once per layer from two constants per layer. The later node's readers are renamed to
the earlier node's outputs and the later node goes.

Never merged: nodes with subgraphs, random generators and Dropout (each call draws anew), and
a node one of whose outputs is a graph output (graph outputs keep their names).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TypeProto

from ...ir.graph import Graph, Node
from ..rewrite import constant, remove_nodes, rename_all

# Constants up to this many elements (scalars, shapes, axes) are compared by value; larger
# ones (weights) by name: equal weights under two names happen only in models whose weights
# repeat one value (onnx's light models), and merging those would not hold for real ones.
_VALUE_KEYED = 64

_RANDOM = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
)


def _frozen(value: Any) -> Any:
    """A hashable stand-in for an attribute value; None where the node must not merge."""
    if isinstance(value, (bool, int, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, float):
        return ("float", repr(value))  # NaN equals NaN here: the same attribute
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, TypeProto):
        return ("type", value.SerializeToString())
    if isinstance(value, (list, tuple)):
        items = [_frozen(v) for v in value]
        return None if any(i is None for i in items) else ("list", tuple(items))
    return None  # a subgraph, or something this pass does not know how to compare


def _input_key(graph: Graph, name: str, canonical: dict[str, str]) -> Any:
    if not name:
        return ""
    value = constant(graph, name)
    if value is not None and value.size <= _VALUE_KEYED:
        return ("const", value.dtype.str, value.shape, value.tobytes())
    return canonical.get(name, name)


def _key(graph: Graph, node: Node, canonical: dict[str, str]) -> Any:
    if node.op_type in _RANDOM and not node.domain:
        return None
    attrs = []
    for name in sorted(node.attrs):
        frozen = _frozen(node.attrs[name])
        if frozen is None:
            return None
        attrs.append((name, frozen))
    inputs = tuple(_input_key(graph, i, canonical) for i in node.inputs)
    present = tuple(bool(o) for o in node.outputs)
    return (node.domain, node.op_type, node.opset, tuple(attrs), inputs, present)


def run(graph: Graph) -> bool:
    outputs = set(graph.outputs)
    seen: dict[Any, Node] = {}
    canonical: dict[str, str] = {}  # a merged node's output -> the kept node's output
    dead: list[Node] = []
    for node in graph.nodes:
        key = _key(graph, node, canonical)
        if key is None:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        if any(o in outputs for o in node.outputs if o):
            continue
        for mine, theirs in zip(node.outputs, first.outputs, strict=True):
            if mine:
                canonical[mine] = theirs
        dead.append(node)
    if not dead:
        return False
    remove_nodes(graph, dead)
    rename_all(graph, canonical)
    return True
