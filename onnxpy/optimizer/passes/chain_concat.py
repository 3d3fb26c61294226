"""Chains of channel Concats, each growing the one before -> ConcatAppend links.

DenseNet's blocks concatenate each layer's output onto everything before it:
cat_k = Concat(cat_{k-1}, y_k). As Concats each link copies the whole prefix again;
as ConcatAppend links (ops/concat_append.py) the chain's first link allocates the last
link's width once and every link writes only its new inputs, returning prefix views.

A chain: Concat nodes on axis 1 where each link's first input is the previous link's output
and no other Concat reads that output first (one appender), at least two links long, with
the last link's channel count static (it sizes the buffer). Other readers of a link's output
are fine: they see a view whose values never change.
"""

from __future__ import annotations

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep


def _channel_concat(graph: Graph, node: Node) -> bool:
    if node.domain or node.op_type != "Concat" or len(node.inputs) < 2 or not all(node.inputs):
        return False
    shape = graph.shape(node.outputs[0])
    if shape is None or len(shape) < 2:
        return False
    return int(node.attrs.get("axis", 0)) in (1, 1 - len(shape))


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    concats = [n for n in graph.nodes if _channel_concat(graph, n) and sweep.fresh(n)]
    # The link appending to each concat: the one Concat reading it as its first input.
    appender: dict[int, Node] = {}
    linked: set[int] = set()
    for node in concats:
        prev = uses.producer.get(node.inputs[0])
        if prev is None or not _channel_concat(graph, prev) or not sweep.fresh(prev):
            continue
        # Readers that append to prev, ConcatAppend links of an earlier sweep included.
        firsts = [
            r
            for r in uses.readers_of(prev.outputs[0])
            if (r.op_type == "Concat" and not r.domain) or (r.op_type == "ConcatAppend" and r.domain == FUSED_DOMAIN)
        ]
        if len(firsts) == 1 and node.inputs[0] == prev.outputs[0] and node.inputs.count(prev.outputs[0]) == 1:
            appender[id(prev)] = node
            linked.add(id(node))
    for head in concats:
        if id(head) in linked or id(head) not in appender:
            continue  # not a chain's first link
        chain = [head]
        while id(chain[-1]) in appender:
            chain.append(appender[id(chain[-1])])
        width = graph.shape(chain[-1].outputs[0])[1]  # type: ignore[index]
        if not isinstance(width, int) or width <= 0:
            continue
        for link in chain:
            sweep.replace(
                link,
                Node(
                    "ConcatAppend",
                    list(link.inputs),
                    list(link.outputs),
                    {"capacity": width},
                    link.name,
                    FUSED_DOMAIN,
                    1,
                ),
            )
    return sweep.finish()
