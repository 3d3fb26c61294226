"""Function expansion: model-local functions and operators defined by a schema function body.

A node that calls a model-local function, or an operator onnxpy has no kernel for whose schema
defines it as a function (plain or context-dependent), is replaced by the function's nodes:

- formal inputs and outputs are renamed to the node's actual ones (an output the node omits
  becomes an internal value, since the body may still read it);
- every other name, including those inside subgraph attributes of body nodes, gets a prefix
  unique to this call, so two calls never collide and no subgraph name shadows an outer one;
- attribute references (``ref_attr_name``) take the node's attribute, else the function's
  default (``attribute_proto`` of a local function, the schema's default of an operator); a
  reference with neither is dropped, which leaves the inner node's own default in force.

Expanded nodes are themselves examined again, so functions calling functions work to any depth
(up to ``MAX_DEPTH``, which catches recursive definitions).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import onnx
from onnx import AttributeProto, FunctionProto, GraphProto, NodeProto, TypeProto

from ..api import errors
from ..api.errors import InvalidGraph
from .graph import Graph, Node, node_from_proto, normalize_domain

MAX_DEPTH = 64

FunctionKey = tuple[str, str, str]  # (domain, name, overload)


def local_function_table(functions: Iterable[FunctionProto]) -> dict[FunctionKey, FunctionProto]:
    table: dict[FunctionKey, FunctionProto] = {}
    for f in functions:
        key = (normalize_domain(f.domain), f.name, getattr(f, "overload", ""))
        if key in table:
            raise InvalidGraph(f"model-local function {f.domain}.{f.name} is defined twice")
        table[key] = f
    return table


class _Found:
    """A function body to inline, with the attribute defaults that go with it."""

    __slots__ = ("fn", "defaults")

    def __init__(self, fn: FunctionProto, defaults: dict[str, AttributeProto]) -> None:
        self.fn = fn
        self.defaults = defaults


def expand_functions(
    graph: Graph,
    local: dict[FunctionKey, FunctionProto],
    has_kernel: Callable[[Node], bool],
    _depth: int = 0,
    _counter: itertools.count[int] | None = None,
) -> None:
    """Inline function calls in ``graph`` (and its subgraphs) in place.

    Subgraphs are visited from a work list, not by recursion, so any nesting depth works.
    """
    # One counter for the whole model keeps every call's prefix unique across scopes.
    counter = itertools.count() if _counter is None else _counter
    graphs: list[tuple[Graph, int]] = [(graph, _depth)]
    while graphs:
        g, depth = graphs.pop()
        _expand_one(g, local, has_kernel, depth, counter, graphs)


def _expand_one(
    graph: Graph,
    local: dict[FunctionKey, FunctionProto],
    has_kernel: Callable[[Node], bool],
    base_depth: int,
    counter: itertools.count[int],
    subgraphs: list[tuple[Graph, int]],
) -> None:
    out: list[Node] = []
    work = list(reversed(graph.nodes))
    depth_of: dict[int, int] = {}
    while work:
        node = work.pop()
        depth = depth_of.pop(id(node), base_depth)
        found = _function_for(node, local, has_kernel, graph)
        if found is None:
            subgraphs.extend((g, depth) for g in node.subgraphs())
            out.append(node)
            continue
        if depth >= MAX_DEPTH:
            raise InvalidGraph(
                f"{node.describe()}: functions nest deeper than {MAX_DEPTH} levels (recursive function?)"
            )
        proto = node.proto
        if proto is None:
            raise errors.NotImplemented(
                f"{node.describe()}: cannot expand its function body (node has no source proto)"
            )
        prefix = f"{node.name or node.op_type}__{found.fn.name}_{next(counter)}__"
        new_nodes = _inline(node, proto, found, prefix, graph)
        for n in new_nodes:
            depth_of[id(n)] = depth + 1
        work.extend(reversed(new_nodes))
    graph.nodes = out


def _function_for(
    node: Node, local: dict[FunctionKey, FunctionProto], has_kernel: Callable[[Node], bool], graph: Graph
) -> _Found | None:
    overload = node.proto.overload if node.proto is not None else ""
    fn = local.get((node.domain, node.op_type, overload))
    if fn is not None:
        return _Found(fn, {a.name: a for a in fn.attribute_proto})
    if has_kernel(node):
        return None
    try:
        schema = onnx.defs.get_schema(node.op_type, max_inclusive_version=node.opset, domain=node.domain)
    except Exception:  # noqa: BLE001 - unknown op: resolution reports it later
        return None
    defaults = {
        name: a.default_value
        for name, a in schema.attributes.items()
        if a.default_value.type != AttributeProto.UNDEFINED
    }
    if schema.has_function:
        versions = [v for v in schema.function_opset_versions if v <= node.opset]
        if versions:
            fp = FunctionProto()
            fp.ParseFromString(schema.get_function_with_opset_version(max(versions)))
            return _Found(fp, defaults)
    if schema.has_context_dependent_function and node.proto is not None:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= node.opset]
        if versions:
            types = [_input_type(graph, name).SerializeToString() for name in node.inputs]
            try:
                data = schema.get_context_dependent_function_with_opset_version(
                    max(versions), node.proto.SerializeToString(), types
                )
            except Exception:  # noqa: BLE001 - the builder needs types we lack: no expansion
                return None
            if data:
                fp = FunctionProto()
                fp.ParseFromString(data)
                return _Found(fp, defaults)
    return None


def _input_type(graph: Graph, name: str) -> TypeProto:
    tp = graph.types.get(name) if name else None
    if tp is not None:
        return tp
    if name in graph.initializers:
        arr = graph.initializers[name]
        return onnx.helper.make_tensor_type_proto(onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)
    return TypeProto()


def _inline(node: Node, call: NodeProto, found: _Found, prefix: str, graph: Graph) -> list[Node]:
    fn = found.fn
    rename: dict[str, str] = {}
    for i, formal in enumerate(fn.input):
        rename[formal] = call.input[i] if i < len(call.input) else ""
    for i, formal in enumerate(fn.output):
        actual = call.output[i] if i < len(call.output) else ""
        # An omitted output stays a value inside the body, which other body nodes may read.
        rename[formal] = actual or prefix + formal
    actual_attrs = {a.name: a for a in call.attribute}
    opsets = dict(graph.opsets)
    for imp in fn.opset_import:
        opsets[normalize_domain(imp.domain)] = imp.version

    def name_of(n: str) -> str:
        if not n:
            return ""
        r = rename.get(n)
        if r is None:
            r = rename[n] = prefix + n
        return r

    def attribute_for(ref: str) -> AttributeProto | None:
        a = actual_attrs.get(ref)
        return a if a is not None else found.defaults.get(ref)

    result: list[Node] = []
    for inner in fn.node:
        p = NodeProto()
        p.CopyFrom(inner)
        del p.input[:]
        del p.output[:]
        p.input.extend(name_of(n) for n in inner.input)
        p.output.extend(name_of(n) for n in inner.output)
        p.name = prefix + (inner.name or inner.op_type)
        _resolve_attributes(p, inner.attribute, attribute_for, name_of, prefix)
        result.append(node_from_proto(p, opsets))
    return result


def _resolve_attributes(
    p: NodeProto,
    attributes: Iterable[AttributeProto],
    attribute_for: Callable[[str], AttributeProto | None],
    name_of: Callable[[str], str],
    prefix: str,
) -> None:
    """Set ``p``'s attributes from ``attributes``: references resolved, subgraphs renamed.

    Nested subgraphs are renamed from a work list, not by recursion."""
    graphs = _set_attributes(p, attributes, attribute_for)
    while graphs:
        graphs.extend(_rename_graph(graphs.pop(), attribute_for, name_of, prefix))


def _set_attributes(
    p: NodeProto, attributes: Iterable[AttributeProto], attribute_for: Callable[[str], AttributeProto | None]
) -> list[GraphProto]:
    """Replace ``p``'s attributes (references resolved); return the subgraphs of the body's own
    graph attributes, as they now live inside ``p``, still to be renamed."""
    resolved: list[AttributeProto] = []
    own: list[int] = []
    for a in attributes:
        na = AttributeProto()
        if a.ref_attr_name:
            src = attribute_for(a.ref_attr_name)
            if src is None:
                continue
            na.CopyFrom(src)
            na.name = a.name
            na.ref_attr_name = ""
            na.doc_string = a.doc_string
        else:
            na.CopyFrom(a)
            own.append(len(resolved))
        resolved.append(na)
    del p.attribute[:]
    p.attribute.extend(resolved)
    # The caller's attributes (references) keep the caller's names; the body's are renamed.
    return [g for i in own for g in _graphs_of(p.attribute[i])]


def _graphs_of(a: AttributeProto) -> list[GraphProto]:
    graphs: list[GraphProto] = []
    if a.HasField("g"):
        graphs.append(a.g)
    graphs.extend(a.graphs)
    return graphs


def _rename_graph(
    g: GraphProto,
    attribute_for: Callable[[str], AttributeProto | None],
    name_of: Callable[[str], str],
    prefix: str,
) -> list[GraphProto]:
    """Rename every value of a body node's subgraph through the call's mapping; return its
    nested subgraphs, still to be renamed.

    Function bodies are SSA across scopes (a subgraph never redefines an outer name), so one
    mapping serves local and outer names alike: locals get the call's prefix, reads of function
    inputs/outputs become the actual names.
    """
    for vi in (*g.input, *g.output, *g.value_info):
        vi.name = name_of(vi.name)
    for t in g.initializer:
        t.name = name_of(t.name)
    for sp in g.sparse_initializer:
        sp.values.name = name_of(sp.values.name)
        sp.indices.name = name_of(sp.indices.name)
    nested: list[GraphProto] = []
    for n in g.node:
        ins = [name_of(v) for v in n.input]
        outs = [name_of(v) for v in n.output]
        del n.input[:]
        del n.output[:]
        n.input.extend(ins)
        n.output.extend(outs)
        if n.name:
            n.name = prefix + n.name
        nested.extend(_set_attributes(n, list(n.attribute), attribute_for))
    return nested
