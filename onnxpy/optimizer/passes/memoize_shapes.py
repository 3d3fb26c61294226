"""Memoize shape computations per input shape.

Exported transformers compute their reshape targets, masks and position ids from the input's
shape at run time: Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains, Range, Expand...
(the shared BERT has 105 such nodes out of 176). Each is a tiny kernel call, and together they
cost as much as the attention. Their values depend only on the shapes of a few tensors, so this
pass groups them into ``onnxpy.fused::ShapeMemo`` nodes: the group runs as a subgraph the first
time a set of shapes is seen, and later runs with the same shapes reuse its outputs.

Which values qualify ("shape-derived"): initializers (with no sources), outputs of Shape and
Size (their source is the tensor whose shape they read), and outputs of deterministic standard
ops whose inputs all qualify (their sources: the union). Nodes are grouped by their exact set
of sources; a group's every output then depends on the shapes of all its sources, so whoever
reads a group's output comes after all those sources, and the memo nodes keep the graph acyclic.
Values from other groups enter a group as inputs but not in its cache key: they are functions
of shapes of a subset of its sources, which the key already holds.

Runs once, after the fixpoint passes, and only for host sessions (on a GPU the sources would be
device tensors and their shape-only reads are placed separately).
"""

from __future__ import annotations

from onnx import AttributeProto

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, remove_nodes

# Fewer nodes than this in a group: the memo node's key and lookup cost about what they save.
MIN_GROUP = 3

_SHAPE_READERS = frozenset({"Shape", "Size"})
# Standard ops whose output is not a function of their inputs alone.
_NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
)


# onnxpy's own ops that compute on shapes alone (shape_of_views.py writes them).
_FUSED_SHAPE_OPS = frozenset({"ReshapeShape", "ExpandShape", "UnsqueezeShape", "SqueezeShape"})


def _sources(graph: Graph) -> dict[int, frozenset[str]]:
    """Per shape-derived node (by id), the tensors whose shapes its outputs depend on."""
    derived: dict[str, frozenset[str]] = {name: frozenset() for name in graph.initializers}
    by_node: dict[int, frozenset[str]] = {}
    for node in graph.nodes:
        shape_op = node.domain == FUSED_DOMAIN and node.op_type in _FUSED_SHAPE_OPS
        if (node.domain and not shape_op) or node.op_type in _NONDETERMINISTIC or any(True for _ in node.subgraphs()):
            continue
        if node.op_type in _SHAPE_READERS:
            src = node.inputs[0] if node.inputs else ""
            if not src:
                continue
            found = derived.get(src, frozenset([src]))
        else:
            ins = [i for i in node.inputs if i]
            if not ins or any(i not in derived for i in ins):
                continue
            found = frozenset().union(*(derived[i] for i in ins))
        for o in node.outputs:
            if o:
                derived[o] = found
        by_node[id(node)] = found
    return by_node


def _merge_feeders(groups: dict[frozenset[str], list[Node]], readers: dict[str, list[Node]], outside: set[str]) -> None:
    """A group whose outputs feed exactly one other group, and nothing else, joins it when the
    other's sources include its own: its nodes then run inside that memo (whose key already
    holds the shapes they read) instead of as steps of their own, as a lone Shape node would."""
    merged = True
    while merged:
        merged = False
        group_of = {id(n): key for key, nodes in groups.items() for n in nodes}
        for key, members in groups.items():
            targets: set[frozenset[str]] = set()
            for o in (o for n in members for o in n.outputs if o):
                found = {group_of.get(id(r)) for r in readers.get(o, ())}
                if o in outside or None in found:
                    break  # read outside the shape computations: the group stays a step
                targets |= found - {key}
            else:
                if len(targets) == 1 and key <= next(iter(targets)):
                    groups[next(iter(targets))].extend(members)
                    del groups[key]
                    merged = True
                    break


def run(graph: Graph) -> bool:
    sources = _sources(graph)
    groups: dict[frozenset[str], list[Node]] = {}
    for node in graph.nodes:
        found = sources.get(id(node))
        if found:  # an empty set is a constant: constant folding's business
            groups.setdefault(found, []).append(node)
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for i in node.inputs:
            if i:
                readers.setdefault(i, []).append(node)
    subgraph_reads: set[str] = set()
    from ...ir.graph import free_names_of_subgraphs

    for node in graph.nodes:
        subgraph_reads.update(free_names_of_subgraphs(node))
    graph_outputs = set(graph.outputs)
    _merge_feeders(groups, readers, graph_outputs | subgraph_reads)
    groups = {k: v for k, v in groups.items() if len(v) >= MIN_GROUP}
    if not groups:
        return False
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    removed: list[Node] = []
    for count, (keyed, members) in enumerate(sorted(groups.items(), key=lambda kv: sorted(kv[0]))):
        inside = {id(n) for n in members}
        made = {o for n in members for o in n.outputs if o}
        keys = sorted(keyed)
        extra: list[str] = []
        for n in members:
            for i in n.inputs:
                if i and i not in made and i not in graph.initializers and i not in keys and i not in extra:
                    extra.append(i)
        exported = [
            o
            for n in members
            for o in n.outputs
            if o and (o in graph_outputs or o in subgraph_reads or any(id(r) not in inside for r in readers.get(o, ())))
        ]
        if not exported:
            continue
        members.sort(key=lambda n: order[id(n)])  # merged groups: keep the graph's order
        body = Graph(
            name=f"shape_memo_{count}",
            nodes=members,
            inputs=keys + extra,
            outputs=exported,
            initializers={},
            types={k: v for k, v in graph.types.items() if k in made or k in keys or k in extra},
            opsets=dict(graph.opsets),
        )
        memo = Node(
            op_type="ShapeMemo",
            inputs=keys + extra,
            outputs=list(exported),
            attrs={"body": body, "keyed": len(keys)},
            name=f"shape_memo_{count}",
            domain=FUSED_DOMAIN,
            opset=1,
            attr_types={"body": AttributeProto.GRAPH, "keyed": AttributeProto.INT},
        )
        removed.extend(members)
        graph.nodes.append(memo)
    if not removed:
        return False
    remove_nodes(graph, removed)
    return True
