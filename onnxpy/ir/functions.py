"""Function expansion: model-local functions and operators defined by a schema function body.

A node that calls a model-local function, or an operator onnxpy has no kernel for whose schema
defines it as a function, is replaced by the function's nodes: formal inputs and outputs renamed
to the node's actual ones, internal values given unique names, and attribute references
(``ref_attr_name``) replaced by the node's attributes or the function's defaults.
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


def expand_functions(
    graph: Graph,
    local: dict[FunctionKey, FunctionProto],
    has_kernel: Callable[[Node], bool],
    _depth: int = 0,
) -> None:
    """Inline function calls in ``graph`` (and its subgraphs) in place."""
    counter = itertools.count()
    out: list[Node] = []
    work = list(reversed(graph.nodes))
    depth_of: dict[int, int] = {}
    while work:
        node = work.pop()
        depth = depth_of.pop(id(node), _depth)
        fn = _function_for(node, local, has_kernel, graph)
        if fn is None:
            for g in node.subgraphs():
                expand_functions(g, local, has_kernel, depth)
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
        new_nodes = _inline(node, proto, fn, next(counter), graph)
        for n in new_nodes:
            depth_of[id(n)] = depth + 1
        work.extend(reversed(new_nodes))
    graph.nodes = out


def _function_for(
    node: Node, local: dict[FunctionKey, FunctionProto], has_kernel: Callable[[Node], bool], graph: Graph
) -> FunctionProto | None:
    key = (node.domain, node.op_type, "")
    if key in local:
        return local[key]
    if has_kernel(node):
        return None
    try:
        schema = onnx.defs.get_schema(node.op_type, max_inclusive_version=node.opset, domain=node.domain)
    except Exception:  # noqa: BLE001 - unknown op: resolution reports it later
        return None
    if schema.has_function:
        versions = [v for v in schema.function_opset_versions if v <= node.opset]
        if versions:
            fp = FunctionProto()
            fp.ParseFromString(schema.get_function_with_opset_version(max(versions)))
            return fp
    if schema.has_context_dependent_function:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= node.opset]
        if versions:
            types: list[bytes] = []
            for name in node.inputs:
                tp = graph.types.get(name) if name else None
                if tp is None and name in graph.initializers:
                    tp = onnx.helper.make_tensor_type_proto(
                        onnx.helper.np_dtype_to_tensor_dtype(graph.initializers[name].dtype),
                        graph.initializers[name].shape,
                    )
                if tp is None:
                    tp = TypeProto()
                types.append(tp.SerializeToString())
            if node.proto is None:
                return None
            data = schema.get_context_dependent_function_with_opset_version(
                max(versions), node.proto.SerializeToString(), types
            )
            if data:
                fp = FunctionProto()
                fp.ParseFromString(data)
                return fp
    return None


def _inline(node: Node, call: NodeProto, fn: FunctionProto, serial: int, graph: Graph) -> list[Node]:
    prefix = f"{node.name or node.op_type}__{fn.name}_{serial}__"
    rename: dict[str, str] = {}
    for i, formal in enumerate(fn.input):
        rename[formal] = call.input[i] if i < len(call.input) else ""
    for i, formal in enumerate(fn.output):
        rename[formal] = call.output[i] if i < len(call.output) else ""
    actual_attrs = {a.name: a for a in call.attribute}
    defaults = {a.name: a for a in fn.attribute_proto}
    opsets = dict(graph.opsets)
    for imp in fn.opset_import:
        opsets[normalize_domain(imp.domain)] = imp.version

    def name_of(n: str) -> str:
        if not n:
            return ""
        if n not in rename:
            rename[n] = prefix + n
        return rename[n]

    result: list[Node] = []
    for inner in fn.node:
        p = NodeProto()
        p.CopyFrom(inner)
        del p.input[:]
        del p.output[:]
        p.input.extend(name_of(n) for n in inner.input)
        p.output.extend(name_of(n) for n in inner.output)
        p.name = prefix + (inner.name or inner.op_type)
        del p.attribute[:]
        for a in inner.attribute:
            if a.ref_attr_name:
                src = actual_attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue
                na = AttributeProto()
                na.CopyFrom(src)
                na.name = a.name
                p.attribute.append(na)
            else:
                na = AttributeProto()
                na.CopyFrom(a)
                _rename_in_attribute(na, name_of, actual_attrs, defaults)
                p.attribute.append(na)
        result.append(node_from_proto(p, opsets))
    return result


def _rename_in_attribute(
    a: AttributeProto,
    name_of: Callable[[str], str],
    actual: dict[str, AttributeProto],
    defaults: dict[str, AttributeProto],
) -> None:
    graphs: list[GraphProto] = []
    if a.HasField("g"):
        graphs.append(a.g)
    graphs.extend(a.graphs)
    for g in graphs:
        local = {i.name for i in g.input} | {t.name for t in g.initializer}
        for n in g.node:
            local.update(n.output)
        for n in g.node:
            for k, v in enumerate(n.input):
                if v and v not in local:
                    n.input[k] = name_of(v)
            for sub in n.attribute:
                if sub.ref_attr_name:
                    src = actual.get(sub.ref_attr_name) or defaults.get(sub.ref_attr_name)
                    if src is not None:
                        name = sub.name
                        sub.CopyFrom(src)
                        sub.name = name
                else:
                    _rename_in_attribute(sub, name_of, actual, defaults)
        for o in g.output:
            if o.name not in local:
                o.name = name_of(o.name)
