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


class Sweep:
    """One linear pass of rewrites over a graph against a fixed ``Uses`` snapshot.

    Replacing a node keeps its position (O(1)); removals are applied once at the end. A rewrite
    marks the nodes it touched, and later candidates involving a touched node are skipped: the
    snapshot says nothing true about them any more. The manager runs passes to a fixpoint, so
    skipped rewrites happen in the next sweep. Every sweep is linear in the graph's size.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.uses = Uses(graph)
        self._pos = {id(n): i for i, n in enumerate(graph.nodes)}
        self._dead: set[int] = set()
        self.touched: set[int] = set()
        self.changed = False
        self._names: set[str] | None = None

    def new_name(self, base: str) -> str:
        """A value name not used anywhere in the graph (looked up in one set, not a scan)."""
        if self._names is None:
            self._names = self.graph.defined_names() | set(self.graph.initializers)
        name, k = base, 1
        while name in self._names:
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        return name

    def fresh(self, *nodes: Node | None) -> bool:
        """None of ``nodes`` has been touched by an earlier rewrite of this sweep."""
        return all(n is None or id(n) not in self.touched for n in nodes)

    def replace(self, old: Node, new: Node) -> None:
        i = self._pos[id(old)]
        self.graph.nodes[i] = new
        self._pos[id(new)] = i
        self.touched.update((id(old), id(new)))
        self.changed = True

    def add(self, node: Node) -> None:
        """Append a new node; the manager's topological sort after the pass puts it in place."""
        self.graph.nodes.append(node)
        self._pos[id(node)] = len(self.graph.nodes) - 1
        self.touched.add(id(node))
        self.changed = True

    def remove(self, *nodes: Node) -> None:
        for n in nodes:
            self._dead.add(id(n))
            self.touched.add(id(n))
        self.changed = True

    def touch(self, *nodes: Node) -> None:
        self.touched.update(id(n) for n in nodes)
        self.changed = True

    def finish(self) -> bool:
        if self._dead:
            self.graph.nodes = [n for n in self.graph.nodes if id(n) not in self._dead]
        if self.changed:
            prune_unused(self.graph)
        return self.changed


def is_plain(node: Node | None, op: str) -> bool:
    """``node`` is the standard ONNX operator ``op`` (default domain), not a fused one."""
    return node is not None and not node.domain and node.op_type == op


def is_conv(node: Node | None) -> bool:
    """An ONNX Conv or onnxpy's FusedConv (what convolution rewrites may take as their producer)."""
    return node is not None and (
        (node.op_type == "Conv" and not node.domain) or (node.op_type == "FusedConv" and node.domain == FUSED_DOMAIN)
    )


def pointwise_reader(graph: Graph, node: Node | None, src: str, group_one: bool = False) -> bool:
    """``node`` is a Conv / FusedConv reading ``src`` once, as X, with a constant floating 1x1
    kernel and no padding (of group 1 with ``group_one``). Its bias, residual and activation come
    after the product, so a rewrite of what X holds per channel may fold into its weights and
    bias."""
    if node is None or not is_conv(node) or not node.inputs or node.inputs[0] != src:
        return False
    if node.inputs.count(src) != 1 or len(node.inputs) < 2:
        return False
    w = constant(graph, node.inputs[1])
    if w is None or w.dtype.kind != "f" or w.ndim < 3 or any(d != 1 for d in w.shape[2:]):
        return False
    if group_one and int(node.attrs.get("group", 1)) != 1:
        return False
    # A 1x1 kernel needs no padding under any auto_pad; explicit pads must be zero.
    return not any(int(p) for p in node.attrs.get("pads", []) or [])


def constant(graph: Graph, name: str) -> np.ndarray | None:
    """The value of ``name`` if it is an initializer that no caller can override."""
    if name and name in graph.initializers and name not in graph.inputs:
        return graph.initializers[name]
    return None


def rename_all(graph: Graph, mapping: dict[str, str]) -> None:
    """Apply ``old -> new`` renames to every reader at once (graph outputs are left alone)."""
    if not mapping:
        return
    for n in graph.nodes:
        if any(i in mapping for i in n.inputs):
            n.inputs = [mapping.get(i, i) for i in n.inputs]
        for g in n.subgraphs():
            for old, new in mapping.items():
                _rename_in_subgraph(g, old, new)


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
    """Drop nodes nothing needs (their outputs reach no graph output) and unused initializers.

    One walk back from the graph outputs through producers: linear in the graph's size, and
    indifferent to node order (a fusion may have left the order momentarily broken).
    """
    producer: dict[str, Node] = {}
    for n in graph.nodes:
        for o in n.outputs:
            if o:
                producer[o] = n
    keep: set[int] = {id(n) for n in graph.nodes if not any(n.outputs)}
    needed: set[str] = set()
    stack = list(graph.outputs)
    for n in graph.nodes:
        if id(n) in keep:
            stack.extend(n.inputs)
    while stack:
        name = stack.pop()
        if not name or name in needed:
            continue
        needed.add(name)
        node = producer.get(name)
        if node is not None and id(node) not in keep:
            keep.add(id(node))
            stack.extend(node.inputs)
            stack.extend(free_names_of_subgraphs(node))
    changed = False
    if len(keep) != len(graph.nodes):
        graph.nodes = [n for n in graph.nodes if id(n) in keep]
        changed = True
    for name in list(graph.initializers):
        if name not in needed and name not in graph.inputs:
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


def shape_window(node: Node, rank: int) -> tuple[int, int]:
    """A Shape node's start and end (opset 15) resolved for an input of ``rank``: negatives
    count from the end, both clamped to [0, rank]."""
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    s = min(max(start + rank if start < 0 else start, 0), rank)
    e = rank if end is None else min(max(int(end) + rank if int(end) < 0 else int(end), 0), rank)
    return s, e


def attr(node: Node, name: str, default: Any = None) -> Any:
    return node.attrs.get(name, default)


# Views a Shape may read through (torch's scaled_dot_product_attention takes the causal mask's
# size from the keys after a permute that the product reads merged with the transpose).
_SHAPE_VIEWS = ("Transpose", "Reshape", "Squeeze", "Unsqueeze")


def shapes_only(uses: Uses, reader: Node, depth: int = 0) -> bool:
    """``reader`` is a Shape node, or a view whose result only Shape nodes read (through views):
    it reads its input for the input's shape alone."""
    if not reader.domain and reader.op_type == "Shape":
        return True
    if depth >= 3 or reader.domain or reader.op_type not in _SHAPE_VIEWS or len(reader.outputs) != 1:
        return False
    out = reader.outputs[0]
    readers = uses.readers_of(out)
    return bool(readers) and out not in uses.graph_outputs and all(shapes_only(uses, r, depth + 1) for r in readers)


def scalar_value(arr: np.ndarray | None) -> float | None:
    if arr is None or arr.size != 1 or arr.dtype.kind not in "fiu":
        return None
    return float(arr.reshape(-1)[0])
