"""Function expansion: model-local functions and operators defined by a schema function body.

A node that calls a model-local function, or an operator onnxpy has no kernel for whose schema
defines it as a function (plain or context-dependent), is replaced by the function's nodes:

- formal inputs and outputs are renamed to the node's actual ones (an output the node omits
  becomes an internal value, since the body may still read it);
- every other name, including those inside subgraph attributes of body nodes, gets a new name
  that no value of the model uses anywhere (any scope, any function body), so an inlined value
  never collides with nor shadows another one;
- attribute references (``ref_attr_name``) take the node's attribute, else the function's
  default (``attribute_proto`` of a local function, the schema's default of an operator); a
  reference with neither is dropped, which leaves the inner node's own default in force.

Expanded nodes are themselves examined again, so functions calling functions work to any depth;
each expanded node remembers the chain of calls it came from, and a function that appears twice
in its own chain (a real cycle in the call graph) is refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import onnx
from onnx import AttributeProto, FunctionProto, GraphProto, NodeProto, TypeProto

from ..api import errors
from ..api.errors import InvalidGraph
from .graph import Graph, Node, iter_graphs, node_from_proto, normalize_domain

FunctionKey = tuple[str, str, str]  # (domain, name, overload)

# Calls shown at most in a recursion error (a long cycle is cut in the middle).
MAX_CYCLE_SHOWN = 6


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

    __slots__ = ("fn", "defaults", "key", "local")

    def __init__(self, fn: FunctionProto, defaults: dict[str, AttributeProto], key: FunctionKey, local: bool) -> None:
        self.fn = fn
        self.defaults = defaults
        self.key = key
        self.local = local


class _Names:
    """Hands out value names no one uses: every name of the model is taken from the start, and
    every name handed out is taken from then on."""

    __slots__ = ("taken", "counter")

    def __init__(self, taken: set[str]) -> None:
        self.taken = taken
        self.counter = itertools.count()

    def fresh(self, want: str) -> str:
        name, k = want, 1
        while name in self.taken:
            name, k = f"{want}_{k}", k + 1
        self.taken.add(name)
        return name


class _Origin:
    """Where an expanded node comes from: the node of the original model whose expansion made
    it (its name prefixes every name made for it, so names do not pile up with depth) and the
    chain of functions it sits in, outermost first."""

    __slots__ = ("node", "chain")

    def __init__(self, node: Node | None, chain: tuple[FunctionKey, ...]) -> None:
        self.node = node
        self.chain = chain


_TOP = _Origin(None, ())


def expand_functions(graph: Graph, local: dict[FunctionKey, FunctionProto], has_kernel: Callable[[Node], bool]) -> None:
    """Inline function calls in ``graph`` (and its subgraphs) in place.

    Subgraphs are visited from a work list, not by recursion, so any nesting depth works.
    """
    names = _Names(_model_names(graph, local.values()))
    graphs: list[tuple[Graph, _Origin]] = [(graph, _TOP)]
    while graphs:
        g, origin = graphs.pop()
        _expand_one(g, local, has_kernel, origin, names, graphs)


def _model_names(graph: Graph, functions: Iterable[FunctionProto]) -> set[str]:
    """Every value name of the graph, its subgraphs and the local function bodies."""
    taken: set[str] = set()
    for g in iter_graphs(graph):
        taken.update(g.inputs, g.outputs, g.initializers, g.types)
        for n in g.nodes:
            taken.update(n.inputs, n.outputs)
    for fn in functions:
        taken.update(fn.input, fn.output)
        stack: list[Iterable[NodeProto]] = [fn.node]
        while stack:
            for p in stack.pop():
                taken.update(p.input, p.output)
                for a in p.attribute:
                    for sub in _graphs_of(a):
                        taken.update(v.name for v in (*sub.input, *sub.output, *sub.value_info))
                        taken.update(t.name for t in sub.initializer)
                        taken.update(sp.values.name for sp in sub.sparse_initializer)
                        stack.append(sub.node)
    taken.discard("")
    return taken


def _expand_one(
    graph: Graph,
    local: dict[FunctionKey, FunctionProto],
    has_kernel: Callable[[Node], bool],
    graph_origin: _Origin,
    names: _Names,
    subgraphs: list[tuple[Graph, _Origin]],
) -> None:
    out: list[Node] = []
    work = list(reversed(graph.nodes))
    origin_of: dict[int, _Origin] = {}
    while work:
        node = work.pop()
        origin = origin_of.pop(id(node), graph_origin)
        found = _function_for(node, local, has_kernel, graph)
        if found is None:
            subgraphs.extend((g, origin) for g in node.subgraphs())
            out.append(node)
            continue
        source = origin.node or node
        _check_not_recursive(source, origin.chain, found.key)
        proto = node.proto
        if proto is None:
            raise errors.NotImplemented(
                f"{node.describe()}: cannot expand its function body (node has no source proto)"
            )
        prefix = f"{source.name or source.op_type}__{found.fn.name}_{next(names.counter)}__"
        new_nodes = _inline(node, proto, found, prefix, graph, names)
        inner = _Origin(source, (*origin.chain, found.key))
        for n in new_nodes:
            origin_of[id(n)] = inner
        work.extend(reversed(new_nodes))
    graph.nodes = out


def _check_not_recursive(source: Node, chain: tuple[FunctionKey, ...], key: FunctionKey) -> None:
    """Refuse a call to a function already being expanded further out: the call graph has a cycle."""
    if key not in chain:
        return
    cycle = [_key_name(k) for k in chain[chain.index(key) :]] + [_key_name(key)]
    if len(cycle) > MAX_CYCLE_SHOWN:
        cycle = [*cycle[:3], "...", *cycle[-2:]]
    raise InvalidGraph(
        f"{source.describe()}: function {_key_name(key)} calls itself recursively ({' -> '.join(cycle)})"
    )


def _key_name(key: FunctionKey) -> str:
    domain, name, overload = key
    text = f"{domain or 'ai.onnx'}.{name}"
    return f"{text}:{overload}" if overload else text


def _function_for(
    node: Node, local: dict[FunctionKey, FunctionProto], has_kernel: Callable[[Node], bool], graph: Graph
) -> _Found | None:
    overload = node.proto.overload if node.proto is not None else ""
    key = (node.domain, node.op_type, overload)
    fn = local.get(key)
    if fn is not None:
        return _Found(fn, {a.name: a for a in fn.attribute_proto}, key, local=True)
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
            return _Found(fp, defaults, key, local=False)
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
                return _Found(fp, defaults, key, local=False)
    return None


def _input_type(graph: Graph, name: str) -> TypeProto:
    tp = graph.types.get(name) if name else None
    if tp is not None:
        return tp
    if name in graph.initializers:
        arr = graph.initializers[name]
        return onnx.helper.make_tensor_type_proto(onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)
    return TypeProto()


def _inline(node: Node, call: NodeProto, found: _Found, prefix: str, graph: Graph, names: _Names) -> list[Node]:
    fn = found.fn
    _check_call_arity(node, call, found)
    rename: dict[str, str] = {}
    for i, formal in enumerate(fn.input):
        rename[formal] = call.input[i] if i < len(call.input) else ""
    for i, formal in enumerate(fn.output):
        actual = call.output[i] if i < len(call.output) else ""
        # An omitted output stays a value inside the body, which other body nodes may read.
        rename[formal] = actual or names.fresh(prefix + formal)
    actual_attrs = {a.name: a for a in call.attribute}
    opsets = dict(graph.opsets)
    for imp in fn.opset_import:
        opsets[normalize_domain(imp.domain)] = imp.version

    def name_of(n: str) -> str:
        if not n:
            return ""
        r = rename.get(n)
        if r is None:
            r = rename[n] = names.fresh(prefix + n)
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
        if found.local:
            _check_model_opsets(node, found, p, graph.opsets, opsets)
        result.append(node_from_proto(p, opsets))
    return result


def _check_call_arity(node: Node, call: NodeProto, found: _Found) -> None:
    """A call may leave trailing inputs and outputs out, never pass more than the function declares
    (onnxruntime refuses it too; an extra input would be silently ignored)."""
    fn = found.fn
    for what, actual, formal in (("inputs", call.input, fn.input), ("outputs", call.output, fn.output)):
        if len(actual) > len(formal):
            raise InvalidGraph(
                f"{node.describe()} has {len(actual)} {what}; function {_key_name(found.key)} declares "
                f"{len(formal)} ({list(formal)})"
            )


def _check_model_opsets(node: Node, found: _Found, p: NodeProto, model: dict[str, int], own: dict[str, int]) -> None:
    """Refuse a body node (or a node of its subgraphs) that is not valid at the model's version
    of its domain, where the function imports another version of that domain.

    onnx's checker refuses any such import whose operator schema differs between the two
    versions, but onnxruntime (which inlines bodies at the model's versions) runs those that are
    still valid there; refusing only what is invalid at both matches onnxruntime.
    """
    from ..runtime.binding import _validate_proto  # late: the runtime imports this module

    stack = [p]
    while stack:
        q = stack.pop()
        for a in q.attribute:
            stack.extend(sub_node for sub in _graphs_of(a) for sub_node in sub.node)
        domain = normalize_domain(q.domain)
        if model.get(domain) in (None, own.get(domain)):
            continue
        try:
            _validate_proto(q, model)
        except (InvalidGraph, errors.NotImplemented) as e:
            raise InvalidGraph(
                f"{node.describe()}: function {_key_name(found.key)} imports opset {own[domain]} of domain "
                f"'{domain or 'ai.onnx'}', not compatible with the model's opset {model[domain]}: {e}"
            ) from None


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
