"""Small graph-editing helpers shared by the passes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..ir.graph import Graph, Node, free_names_of_subgraphs

#: the domain of onnxpy's own fused operators (written into optimized models as such)
FUSED_DOMAIN = "onnxpy.fused"


class Uses:
    """Who produces and who reads each value, computed once per pass invocation."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.producer: dict[str, Node] = {}
        self.readers: dict[str, list[Node]] = {}
        for n in graph.nodes:
            for o in n.outputs:
                if o:
                    self.producer[o] = n
            for i in n.inputs:
                if i:
                    self.readers.setdefault(i, []).append(n)
            for i in free_names_of_subgraphs(n):
                self.readers.setdefault(i, []).append(n)
        self.graph_outputs = set(graph.outputs)

    def readers_of(self, name: str) -> list[Node]:
        return self.readers.get(name, [])

    def only_reader(self, name: str) -> Node | None:
        """The single node reading ``name`` when nothing else (graph outputs included) does."""
        r = self.readers.get(name, [])
        if len(r) == 1 and name not in self.graph_outputs:
            return r[0]
        return None


def constant(graph: Graph, name: str) -> np.ndarray | None:
    """The value of ``name`` if it is an initializer that no caller can override."""
    if name and name in graph.initializers and name not in graph.inputs:
        return graph.initializers[name]
    return None


def rename_uses(graph: Graph, old: str, new: str, subgraphs: bool = True) -> None:
    """Make every reader of ``old`` read ``new`` instead (graph outputs are left alone)."""
    for n in graph.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]
        if subgraphs:
            for g in n.subgraphs():
                _rename_in_subgraph(g, old, new)


def _rename_in_subgraph(g: Graph, old: str, new: str) -> None:
    if old in g.defined_names():
        return  # shadowed (not valid ONNX, but never rename a local value)
    for n in g.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]
        for sub in n.subgraphs():
            _rename_in_subgraph(sub, old, new)
    g.outputs = [new if o == old else o for o in g.outputs]


def remove_nodes(graph: Graph, dead: Iterable[Node]) -> None:
    gone = {id(n) for n in dead}
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]


def prune_unused(graph: Graph) -> bool:
    """Drop nodes whose outputs nobody reads and initializers nobody uses."""
    changed = False
    while True:
        uses = Uses(graph)
        dead = [
            n
            for n in graph.nodes
            if n.outputs and all(not o or (not uses.readers_of(o) and o not in uses.graph_outputs) for o in n.outputs)
        ]
        if not dead:
            break
        remove_nodes(graph, dead)
        changed = True
    used = set(graph.outputs)
    for n in graph.nodes:
        used.update(n.inputs)
        used |= free_names_of_subgraphs(n)
    for name in list(graph.initializers):
        if name not in used and name not in graph.inputs:
            del graph.initializers[name]
            changed = True
    return changed


def fresh_name(graph: Graph, base: str) -> str:
    taken = graph.defined_names()
    if base not in taken:
        return base
    k = 1
    while f"{base}_{k}" in taken:
        k += 1
    return f"{base}_{k}"


def attr(node: Node, name: str, default: Any = None) -> Any:
    return node.attrs.get(name, default)


def scalar_value(arr: np.ndarray | None) -> float | None:
    if arr is None or arr.size != 1 or arr.dtype.kind not in "fiu":
        return None
    return float(arr.reshape(-1)[0])
