"""Constant folding: evaluate nodes whose inputs are all constants, once, at session creation.

This is what turns the light models' ConstantOfShape weight subgraphs into plain initializers,
and folds shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat chains) when the shapes are
statically known. Shape and Size of a value whose shape is fully known fold too, and so do a
Gather or Slice of a Shape that picks only known dimensions of a partly known shape: torch's
export of scaled_dot_product_attention computes its scale from q.shape[-1] of a (batch, heads,
seq, 32) query, which then folds to a constant the attention fusion can read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir.graph import Graph, Node
from ...providers import CPU
from ...runtime.binding import bind_node
from ..rewrite import constant, prune_unused

# Ops whose result must not be computed once for all runs.
NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
)


def _no_subgraph(_g: Graph, node: Node, attr: str) -> Any:
    raise ValueError(f"{node.describe()}: nodes with subgraphs are not folded")


def _static_shape(graph: Graph, name: str) -> list[int] | None:
    shape = graph.shape(name)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return [int(d) for d in shape]


def _fold_shape_of(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """Shape/Size of a value whose shape inference fully knows."""
    if node.domain or not node.inputs or not node.inputs[0]:
        return None
    shape = _static_shape(graph, node.inputs[0])
    if shape is None:
        return None
    if node.op_type == "Shape":
        r = len(shape)
        start = int(node.attrs.get("start", 0))
        end = node.attrs.get("end")
        s = min(max(start + r if start < 0 else start, 0), r)
        e = r if end is None else min(max(int(end) + r if int(end) < 0 else int(end), 0), r)
        return [np.array(shape[s:e], dtype=np.int64)]
    if node.op_type == "Size":
        return [np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
    return None


def _partial_shape(graph: Graph, node: Node) -> np.ndarray | None:
    """What Shape ``node`` gives for a value of known rank, its unknown dimensions as -1."""
    shape = graph.shape(node.inputs[0]) if node.inputs and node.inputs[0] else None
    if shape is None:
        return None
    dims = [int(d) if isinstance(d, int) else -1 for d in shape]
    r = len(dims)
    start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
    s = min(max(start + r if start < 0 else start, 0), r)
    e = r if end is None else min(max(int(end) + r if int(end) < 0 else int(end), 0), r)
    return np.array(dims[s:e], dtype=np.int64)


def _evaluate(graph: Graph, node: Node, shapes: dict[str, Node] | None = None) -> list[Any] | None:
    if node.op_type in NONDETERMINISTIC or any(True for _ in node.subgraphs()):
        return None
    if node.op_type in ("Shape", "Size"):
        return _fold_shape_of(graph, node)
    args = []
    partial = False
    for pos, name in enumerate(node.inputs):
        if not name:
            args.append(None)
            continue
        v = constant(graph, name)
        if (
            v is None
            and pos == 0
            and shapes
            and name in shapes
            and node.op_type in ("Gather", "Slice")
            and not node.domain
        ):
            v, partial = _partial_shape(graph, shapes[name]), True
        if v is None:
            return None
        args.append(v)
    if not node.outputs:
        return None
    try:
        # Folded values follow IEEE rules silently, as at run time (session.run's errstate): a
        # constant Log(0) neither warns at session creation nor, under warnings-as-errors,
        # stays unfolded.
        with np.errstate(all="ignore"):
            bound = bind_node(node, graph, CPU, _no_subgraph)
            result = bound.fn(*args)
    except Exception:  # noqa: BLE001 - anything that fails now fails (with context) at run time
        return None
    results = list(result) if isinstance(result, tuple) else [result]
    if len(results) < len([o for o in node.outputs if o]):
        return None
    if partial and not all(
        isinstance(r, (np.ndarray, np.generic)) and bool((np.asarray(r) >= 0).all()) for r in results
    ):
        return None  # it picked an unknown dimension
    out = []
    for r in results[: len(node.outputs)]:
        if not isinstance(r, (np.ndarray, np.generic)):
            return None  # sequences and optionals stay runtime values
        # A view (a folded Transpose) is copied in C order, not in its own (np.array's "K"): a
        # product reading a transposed weight F-ordered streams it worse from memory (GPT-2's
        # tied lm_head, 256 x 8192 for one token, cold: 390 against 162 us).
        arr = np.array(r, copy=True, order="C") if not isinstance(r, np.ndarray) or not r.flags.owndata else r
        arr.flags.writeable = False
        out.append(arr)
    return out


def run(graph: Graph) -> bool:
    changed = False
    folded: list[Node] = []
    shapes = {n.outputs[0]: n for n in graph.nodes if n.op_type == "Shape" and not n.domain and n.outputs}
    for node in graph.nodes:
        values = _evaluate(graph, node, shapes)
        if values is None:
            continue
        for name, v in zip(node.outputs, values):
            if name:
                graph.initializers[name] = v
        folded.append(node)
        changed = True
    if folded:
        gone = {id(n) for n in folded}
        graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    if changed:
        prune_unused(graph)
    return changed
