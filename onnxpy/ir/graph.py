"""The in-memory graph every later stage works on: plain, mutable, easy to test.

Values are named by strings here (as in ONNX); the planner turns names into integer ids.
Attributes are decoded once, when the graph is built: ints, floats, str, numpy arrays, lists of
those, ``Graph`` for subgraphs and ``TypeProto`` for type attributes.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import AttributeProto, GraphProto, NodeProto, TensorProto, TypeProto, ValueInfoProto, numpy_helper

from ..api.errors import Fail, InvalidGraph
from ..model import dtypes


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


@dataclass(eq=False)  # nodes are compared by identity: two equal-looking nodes are distinct
class Node:
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""
    # Version of this node's domain in the scope it came from (a function body has its own).
    opset: int = 0
    # AttributeProto type of each attribute, kept so the graph can be written back out.
    attr_types: dict[str, int] = field(default_factory=dict)
    doc_string: str = ""
    # The NodeProto this node was read from (function expansion needs its raw attributes).
    proto: NodeProto | None = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        """How errors name a node: its name (when it has one) and op type."""
        dom = f"{self.domain}." if self.domain else ""
        return f"node '{self.name}' ({dom}{self.op_type})" if self.name else f"unnamed {dom}{self.op_type} node"

    def subgraphs(self) -> list[Graph]:
        # Asked of every node by every optimizer pass: a list built by class checks costs a
        # third of the generator it replaced (DenseNet-121's session creation: 54,576 calls).
        out: list[Graph] = []
        for v in self.attrs.values():
            cls = v.__class__
            if cls is Graph:
                out.append(v)
            elif cls is list and v and isinstance(v[0], Graph):  # an attribute's list is of one kind
                out.extend(v)
        return out


@dataclass
class Graph:
    name: str
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    initializers: dict[str, np.ndarray]
    # Type of each value known from the model or shape inference (inputs, outputs, intermediates).
    types: dict[str, TypeProto]
    opsets: dict[str, int]
    doc_string: str = ""

    def clone(self) -> Graph:
        """A copy whose nodes, lists and dicts can be changed freely; arrays are shared (never
        modified in place by anyone). Nested subgraphs are copied too, without recursion."""
        top = self._shallow_copy()
        stack = [top]
        while stack:
            g = stack.pop()
            for n in g.nodes:
                for k, v in n.attrs.items():
                    if isinstance(v, Graph):
                        n.attrs[k] = c = v._shallow_copy()
                        stack.append(c)
                    elif isinstance(v, list) and v and isinstance(v[0], Graph):
                        n.attrs[k] = cs = [x._shallow_copy() for x in v]
                        stack.extend(cs)
        return top

    def _shallow_copy(self) -> Graph:
        """Own nodes, lists and dicts; subgraph attributes still the original objects."""
        return Graph(
            name=self.name,
            nodes=[_clone_node(n) for n in self.nodes],
            inputs=list(self.inputs),
            outputs=list(self.outputs),
            initializers=dict(self.initializers),
            types=dict(self.types),
            opsets=dict(self.opsets),
            doc_string=self.doc_string,
        )

    # -- queries ------------------------------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
            for name in free_names_of_subgraphs(n):
                out.setdefault(name, []).append(n)
        return out

    def defined_names(self) -> set[str]:
        names = set(self.inputs) | set(self.initializers)
        for n in self.nodes:
            names.update(o for o in n.outputs if o)
        return names

    def elem_type(self, name: str) -> int | None:
        tp = self.types.get(name)
        if tp is not None and tp.HasField("tensor_type") and tp.tensor_type.elem_type:
            return tp.tensor_type.elem_type
        if name in self.initializers:
            try:
                return dtypes.elem_type(self.initializers[name].dtype)
            except ValueError:
                return None
        return None

    def shape(self, name: str) -> list[int | str | None] | None:
        """Static shape: ints for fixed dims, str for named ones, None for unknown; None if rank unknown."""
        if name in self.initializers:
            return list(self.initializers[name].shape)
        tp = self.types.get(name)
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
            return None
        return [
            d.dim_value if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None)
            for d in tp.tensor_type.shape.dim
        ]


def _clone_node(n: Node) -> Node:
    return Node(
        op_type=n.op_type,
        inputs=list(n.inputs),
        outputs=list(n.outputs),
        attrs=dict(n.attrs),
        name=n.name,
        domain=n.domain,
        opset=n.opset,
        attr_types=dict(n.attr_types),
        doc_string=n.doc_string,
        proto=n.proto,
    )


def iter_graphs(graph: Graph) -> Iterator[Graph]:
    """``graph`` and every subgraph nested in it, each parent before its children (no recursion:
    hostile models nest thousands of levels deep)."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        for n in g.nodes:
            stack.extend(n.subgraphs())


def nesting_depth(graph: Graph) -> int:
    """How many levels of subgraphs ``graph`` holds (0: none)."""
    deepest = 0
    stack = [(graph, 0)]
    while stack:
        g, d = stack.pop()
        deepest = max(deepest, d)
        for n in g.nodes:
            stack.extend((sub, d + 1) for sub in n.subgraphs())
    return deepest


def free_names(graph: Graph) -> set[str]:
    """Names a (sub)graph reads but does not define: the values it takes from outer scopes."""
    return free_names_table(graph)[id(graph)]


def free_names_table(graph: Graph) -> dict[int, set[str]]:
    """free_names of ``graph`` and of every subgraph in it, by ``id(subgraph)``, in one pass."""
    # Children before parents, so each graph folds in its subgraphs' results (no recursion).
    order = list(iter_graphs(graph))
    free: dict[int, set[str]] = {}
    for g in reversed(order):
        used: set[str] = set(g.outputs)
        for n in g.nodes:
            used.update(i for i in n.inputs if i)
            for sub in n.subgraphs():
                used |= free[id(sub)]
        free[id(g)] = used - g.defined_names()
    return free


def free_names_of_subgraphs(node: Node) -> set[str]:
    out: set[str] = set()
    if not node.attrs:
        return out  # the common case, asked once per node by every pass
    for g in node.subgraphs():
        out |= free_names(g)
    return out


# -- building from protobuf ----------------------------------------------------------------------


def detached(message: Any) -> Any:
    """A copy of a protobuf sub-message that holds nothing of its parent. With the upb backend a
    live sub-message keeps the whole parent message's memory (a model's weight bytes
    included) alive: what a Graph keeps beyond building must be such a copy."""
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def release_protos(graph: Graph) -> None:
    """Drop every node's reference to the NodeProto it was built from (function expansion's
    last use of it), so the model's protobuf memory can go (see ``detached``)."""
    for g in iter_graphs(graph):
        for node in g.nodes:
            node.proto = None


def tensor_to_array(t: TensorProto, what: str = "") -> np.ndarray:
    """Decode a TensorProto, with a clear error when its data disagree with its shape."""
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001 - any decoding failure is a bad model
        raise Fail(
            f"cannot decode tensor '{t.name or what}' ({dtypes.tensor_type_string(t.data_type)}, dims {list(t.dims)}): {e}"
        ) from None
    expected = tuple(int(d) for d in t.dims)
    if any(d < 0 for d in expected):
        raise Fail(f"tensor '{t.name or what}' has a negative dimension: {list(t.dims)}")
    if arr.shape != expected:
        raise Fail(
            f"tensor '{t.name or what}': its data hold {arr.size} elements but dims {list(expected)} need {int(np.prod(expected))}"
        )
    return arr


# Most bytes a sparse tensor may expand to (it is stored densely): a tiny model must not be
# able to ask for terabytes. Half of physical memory, like the session's allocation budget.
def _dense_limit() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


MAX_DENSE_BYTES = _dense_limit()


def sparse_to_array(sp: Any, what: str = "") -> np.ndarray:
    name = what or sp.values.name or "<unnamed>"
    values = tensor_to_array(sp.values, what).reshape(-1)
    indices = tensor_to_array(sp.indices, what)
    dims = tuple(int(d) for d in sp.dims)
    if any(d < 0 for d in dims):
        raise Fail(f"sparse tensor '{name}' has a negative dimension: {list(dims)}")
    count = 1
    for d in dims:
        count *= d
    if count * values.dtype.itemsize > MAX_DENSE_BYTES:
        raise Fail(
            f"sparse tensor '{name}': dims {list(dims)} of {values.dtype} need {count * values.dtype.itemsize} bytes "
            f"once dense, over the limit of {MAX_DENSE_BYTES}"
        )
    if indices.dtype.kind not in "iu":
        raise Fail(f"sparse tensor '{name}': indices must be integers, got {indices.dtype}")
    indices = indices.astype(np.int64)
    if indices.ndim == 2 and indices.shape[1] != len(dims):
        raise Fail(
            f"sparse tensor '{name}': indices of shape {list(indices.shape)} do not index a tensor of rank {len(dims)}"
        )
    if indices.ndim not in (1, 2) or indices.shape[0] != values.size:
        raise Fail(
            f"sparse tensor '{name}': {values.size} values but indices of shape {list(indices.shape)} "
            "(expected [NNZ] or [NNZ, rank])"
        )
    dense = np.zeros(dims, dtype=values.dtype)
    flat = dense.reshape(-1)
    if indices.ndim == 2:
        if indices.size and (indices.min() < 0 or np.any(indices >= np.array(dims, dtype=np.int64))):
            raise Fail(f"sparse tensor '{name}': an index lies outside dims {list(dims)}")
        lin = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else indices.reshape(-1)
    else:
        if indices.size and (indices.min() < 0 or indices.max() >= flat.size):
            raise Fail(f"sparse tensor '{name}': an index lies outside dims {list(dims)}")
        lin = indices
    flat[lin] = values
    return dense


# A subgraph attribute whose Graph is built later: (proto, where the Graph goes, key in it).
_Pending = list[tuple[GraphProto, Any, Any]]


def decode_attribute(a: AttributeProto, opsets: dict[str, int], inferred: dict[str, TypeProto] | None = None) -> Any:
    pending: _Pending = []
    value = _decode(a, pending)
    if isinstance(value, _Slot):  # a GRAPH attribute: its one pending entry goes here
        holder: dict[str, Any] = {}
        pending[0] = (pending[0][0], holder, "value")
        _build_pending(pending, opsets, inferred or {})
        return holder["value"]
    _build_pending(pending, opsets, inferred or {})
    return value


class _Slot:
    """Placeholder for a subgraph not built yet."""


def _decode(a: AttributeProto, pending: _Pending) -> Any:
    t = a.type
    if t == AttributeProto.FLOAT:
        return float(a.f)
    if t == AttributeProto.INT:
        return int(a.i)
    if t == AttributeProto.STRING:
        return _decode_str(a.s)
    if t == AttributeProto.TENSOR:
        return tensor_to_array(a.t, a.name)
    if t == AttributeProto.GRAPH:
        pending.append((a.g, None, None))  # the caller says where it goes
        return _Slot()
    if t == AttributeProto.SPARSE_TENSOR:
        return sparse_to_array(a.sparse_tensor, a.name)
    if t == AttributeProto.TYPE_PROTO:
        return a.tp
    if t == AttributeProto.FLOATS:
        return [float(x) for x in a.floats]
    if t == AttributeProto.INTS:
        return [int(x) for x in a.ints]
    if t == AttributeProto.STRINGS:
        return [_decode_str(s) for s in a.strings]
    if t == AttributeProto.TENSORS:
        return [tensor_to_array(x, a.name) for x in a.tensors]
    if t == AttributeProto.GRAPHS:
        out: list[Any] = [None] * len(a.graphs)
        pending.extend((g, out, i) for i, g in enumerate(a.graphs))
        return out
    if t == AttributeProto.SPARSE_TENSORS:
        return [sparse_to_array(x, a.name) for x in a.sparse_tensors]
    if t == AttributeProto.TYPE_PROTOS:
        return [detached(tp) for tp in a.type_protos]
    raise Fail(f"attribute '{a.name}' has an undefined type ({t})")


def _decode_str(b: bytes) -> str | bytes:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


def node_from_proto(p: NodeProto, opsets: dict[str, int], inferred: dict[str, TypeProto] | None = None) -> Node:
    pending: _Pending = []
    node = _node(p, opsets, pending)
    _build_pending(pending, opsets, inferred or {})
    return node


def _node(p: NodeProto, opsets: dict[str, int], pending: _Pending) -> Node:
    domain = normalize_domain(p.domain)
    attrs: dict[str, Any] = {}
    attr_types: dict[str, int] = {}
    for a in p.attribute:
        if a.ref_attr_name:
            raise InvalidGraph(
                f"node '{p.name}' ({p.op_type}): attribute '{a.name}' refers to '{a.ref_attr_name}' outside a function body"
            )
        if a.name in attrs:
            raise InvalidGraph(f"node '{p.name}' ({p.op_type}) has attribute '{a.name}' twice")
        n_pending = len(pending)
        value = _decode(a, pending)
        if isinstance(value, _Slot):
            gp = pending[n_pending][0]
            pending[n_pending] = (gp, attrs, a.name)
            value = None
        attrs[a.name] = value
        attr_types[a.name] = a.type
    return Node(
        op_type=p.op_type,
        inputs=list(p.input),
        outputs=list(p.output),
        attrs=attrs,
        name=p.name,
        domain=domain,
        opset=opsets.get(domain, 0),
        attr_types=attr_types,
        doc_string=p.doc_string,
        proto=p,
    )


def graph_from_proto(
    gp: GraphProto,
    opsets: dict[str, int],
    inferred: dict[str, TypeProto],
    release_data: bool = False,
    arrays: dict[str, np.ndarray] | None = None,
) -> Graph:
    """Build a Graph and its subgraphs. ``release_data`` clears each top-level initializer's
    bytes from ``gp`` once decoded (for a proto the caller owns and will not use again).
    ``arrays``: top-level initializers already read (model/load.py), taken from there by name.

    Subgraphs are built from a work list, not by recursion, so any nesting depth works.
    """
    pending: _Pending = []
    holder: dict[str, Any] = {}
    pending.append((gp, holder, "graph"))
    _build_pending(pending, opsets, inferred, release_data, arrays)
    return holder["graph"]


def _build_pending(
    pending: _Pending,
    opsets: dict[str, int],
    inferred: dict[str, TypeProto],
    release_top: bool = False,
    arrays: dict[str, np.ndarray] | None = None,
) -> None:
    built: list[Graph] = []
    first = True
    while pending:
        gp, slot, key = pending.pop()
        g = _graph(gp, opsets, pending, release_top and first, arrays if first else None)
        first = False
        slot[key] = g
        built.append(g)
    if inferred:
        _add_inferred_types(built, inferred)


def _graph(
    gp: GraphProto, opsets: dict[str, int], pending: _Pending, release_data: bool, arrays: dict[str, np.ndarray] | None
) -> Graph:
    initializers: dict[str, np.ndarray] = {}
    for t in gp.initializer:
        if t.name in initializers:
            raise InvalidGraph(f"graph '{gp.name}': initializer '{t.name}' is defined twice")
        if arrays is not None and t.name in arrays:
            initializers[t.name] = arrays.pop(t.name)  # read from its file already
            continue
        initializers[t.name] = tensor_to_array(t)
        if release_data:
            # The array holds a copy now: drop the proto's bytes so weights exist once at a time.
            t.ClearField("raw_data")
    for sp in gp.sparse_initializer:
        if sp.values.name in initializers:
            raise InvalidGraph(f"graph '{gp.name}': initializer '{sp.values.name}' is defined twice")
        initializers[sp.values.name] = sparse_to_array(sp, sp.values.name)
    types: dict[str, TypeProto] = {}
    for vi in _value_infos(gp):
        if vi.HasField("type"):
            types[vi.name] = detached(vi.type)
    nodes = [_node(p, opsets, pending) for p in gp.node]
    return Graph(
        name=gp.name,
        nodes=nodes,
        inputs=[i.name for i in gp.input],
        outputs=[o.name for o in gp.output],
        initializers=initializers,
        types=types,
        opsets=dict(opsets),
        doc_string=gp.doc_string,
    )


def _add_inferred_types(built: list[Graph], inferred: dict[str, TypeProto]) -> None:
    """Give each graph the inferred types of the names it sees: its own values and the outer
    ones it (or a subgraph of it) reads. Looking up only those keeps the work linear in the
    model's size however many subgraphs it has."""
    # ``built`` lists parents before children: walk it backwards to fold in children's free names.
    free: dict[int, set[str]] = {}
    for g in reversed(built):
        names = set(g.inputs) | set(g.outputs) | set(g.initializers)
        outer: set[str] = set()
        for n in g.nodes:
            names.update(n.inputs)
            names.update(n.outputs)
            for sub in n.subgraphs():
                outer |= free.get(id(sub), set())
        local = g.defined_names()
        free[id(g)] = (names | outer) - local
        types = g.types
        for name in names | outer:
            tp = inferred.get(name)
            if tp is None or not name:
                continue
            if name not in types or not _has_shape(types[name]):
                types[name] = tp
            else:
                types[name] = merge_shapes(types[name], tp)


def merge_shapes(declared: TypeProto, inferred: TypeProto) -> TypeProto:
    """Combine a declared tensor type with the inferred one, dimension by dimension, as
    onnxruntime reports them: an inferred size beats a declared name; a declared size or name
    beats an inferred name; an inferred name fills a dimension declared unknown."""
    if not (_has_shape(declared) and _has_shape(inferred)):
        return declared
    ddims = declared.tensor_type.shape.dim
    idims = inferred.tensor_type.shape.dim
    if len(ddims) != len(idims):
        return declared
    out = TypeProto()
    out.CopyFrom(declared)
    for d, i in zip(out.tensor_type.shape.dim, idims):
        if i.HasField("dim_value"):
            d.dim_value = i.dim_value
        elif d.HasField("dim_value") or d.HasField("dim_param"):
            continue
        elif i.HasField("dim_param"):
            d.dim_param = i.dim_param
    return out


def _has_shape(tp: TypeProto) -> bool:
    return tp.HasField("tensor_type") and tp.tensor_type.HasField("shape")


def _value_infos(gp: GraphProto) -> Iterable[ValueInfoProto]:
    yield from gp.input
    yield from gp.output
    yield from gp.value_info


# -- ordering and checks ---------------------------------------------------------------------


def topological_sort(graph: Graph, outer: set[str] | frozenset[str] = frozenset()) -> None:
    """Order nodes so each comes after the producers of its inputs; raise on cycles or undefined inputs.

    Also checks that no value is defined twice. Subgraphs are sorted too (from a work list, not
    by recursion): the names a subgraph takes from outer scopes are checked at the node that
    holds it, so inside the subgraph any name it does not define itself comes from outside.
    """
    free = free_names_table(graph)  # once: sorting changes no names
    _sort_one(graph, set(outer) | set(graph.inputs) | set(graph.initializers), free)
    stack = [sub for n in graph.nodes for sub in n.subgraphs()]
    while stack:
        g = stack.pop()
        _sort_one(g, None, free)
        stack.extend(sub for n in g.nodes for sub in n.subgraphs())


def _sort_one(graph: Graph, available: set[str] | None, free: dict[int, set[str]]) -> None:
    """Sort one graph's nodes. ``available``: the names defined outside its nodes (None for a
    subgraph, whose outer names were checked by the enclosing graph)."""
    producer: dict[str, int] = {}
    for idx, n in enumerate(graph.nodes):
        for o in n.outputs:
            if not o:
                continue
            if o in producer:
                raise InvalidGraph(
                    f"value '{o}' is produced by two nodes: {graph.nodes[producer[o]].describe()} and {n.describe()}"
                )
            if o in graph.inputs or o in graph.initializers:
                raise InvalidGraph(f"{n.describe()} writes '{o}', which is already a graph input or initializer")
            producer[o] = idx
    waiting: list[int] = []
    users: list[list[int]] = [[] for _ in graph.nodes]
    for idx, n in enumerate(graph.nodes):
        need: set[int] = set()
        for name in n.inputs:
            if name:
                _dependency(graph, n, name, available, producer, need, None)
        for sub in n.subgraphs():
            for name in free[id(sub)]:
                _dependency(graph, n, name, available, producer, need, n)
        for d in need:
            users[d].append(idx)
        waiting.append(len(need))
    # A heap of indices keeps the model's own order wherever it is already valid.
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(graph.nodes):
        stuck = [graph.nodes[i].describe() for i in range(len(graph.nodes)) if waiting[i] > 0][:5]
        raise InvalidGraph(f"graph '{graph.name}' has a cycle; nodes on or after it: {', '.join(stuck)}")
    graph.nodes = [graph.nodes[i] for i in order]
    if available is not None:
        for o in graph.outputs:
            if o not in available and o not in producer:
                raise InvalidGraph(f"graph output '{o}' is not produced by any node and is not an input or initializer")


def _dependency(
    graph: Graph,
    node: Node,
    name: str,
    available: set[str] | None,
    producer: dict[str, int],
    need: set[int],
    holder: Node | None,
) -> None:
    p = producer.get(name)
    if p is not None:
        need.add(p)
        return
    if available is None or name in available:
        return
    reader = node.describe() if holder is None else _inner_reader(holder, name)
    raise InvalidGraph(f"{reader} reads '{name}', which no node, graph input or initializer defines")


def _inner_reader(holder: Node, name: str) -> str:
    """Which node inside ``holder``'s subgraphs reads the undefined ``name`` (for the error)."""
    for g in (g for sub in holder.subgraphs() for g in iter_graphs(sub)):
        for n in g.nodes:
            if name in n.inputs:
                return f"{n.describe()} (in a subgraph of {holder.describe()})"
        if name in g.outputs:
            return f"subgraph '{g.name}' of {holder.describe()} (as an output)"
    return holder.describe()
