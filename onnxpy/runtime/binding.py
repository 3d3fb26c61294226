"""Binding: one kernel per node, attributes decoded and applied once at session creation."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import onnx

from ..api import errors
from ..api.errors import InvalidGraph
from ..ir.graph import Graph, Node, free_names, normalize_domain
from ..ops import registry
from ..planner.build import BoundNode
from ..providers.base import Provider

SubgraphCompiler = Callable[[Graph, Node, str], Any]


def schema_for(node: Node) -> Any:
    return _schema(node.op_type, node.opset, node.domain)


@functools.lru_cache(maxsize=4096)  # bounded: op names come from untrusted models
def _schema(op_type: str, opset: int, domain: str) -> Any:
    try:
        return onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain=domain)
    except Exception:  # noqa: BLE001 - onnx raises SchemaError for unknown ops
        return None


@functools.cache
def schema_versions(domain: str, op_type: str) -> tuple[Any, ...]:
    """Every version of an operator's schema (scanning onnx's history takes about 20 ms, so it
    is done once per operator, and only when a check needs it)."""
    return tuple(
        s
        for s in onnx.defs.get_all_schemas_with_history()
        if s.name == op_type and normalize_domain(s.domain) == normalize_domain(domain)
    )


_UNBOUNDED = 2**31 - 1


def _check_arity(node: Node, opdef: registry.OpDef, schema: Any) -> None:
    """Input and output counts the schema and the kernel accept, and no required input left
    empty: checked at creation, so a malformed node never reaches a kernel as a TypeError."""
    if schema is not None:
        _check_schema_arity(node, schema)
    n_in = len(node.inputs)  # an empty name still fills its position (the kernel gets None)
    lo, hi = _kernel_arity(opdef.fn)
    if n_in < lo or (hi is not None and n_in > hi):
        raise InvalidGraph(
            f"{node.describe()} has {n_in} inputs; onnxpy's {opdef.qualified_name} kernel takes {_range(lo, hi)}"
        )


def _check_schema_arity(node: Node, schema: Any) -> None:
    n_in, n_out = len(node.inputs), len(node.outputs)
    what = f"the {node.op_type} schema (opset {node.opset})"
    lo, hi = schema.min_input, schema.max_input
    if n_in > hi:
        raise InvalidGraph(f"{node.describe()} has {n_in} inputs; {what} takes {_range(lo, hi)}")
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for i, formal in enumerate(schema.inputs[:n_in]):
        if formal.option == single and not node.inputs[i]:
            raise InvalidGraph(f"{node.describe()}: input {i} ('{formal.name}') is required but was left empty")
    if n_in < lo:  # as onnx's checker counts: an empty optional input fills its position
        raise InvalidGraph(f"{node.describe()} has {n_in} inputs; {what} takes {_range(lo, hi)}")
    lo, hi = schema.min_output, schema.max_output
    if n_out > hi or n_out < lo:
        raise InvalidGraph(f"{node.describe()} has {n_out} outputs; {what} makes {_range(lo, hi)}")


def validate_protos(model: onnx.ModelProto, opsets: dict[str, int]) -> None:
    """Schema checks on the protobuf, before anything else reads the model -- in particular
    before onnx's C++ shape inference, whose operator functions assume well-formed nodes (a
    required input left empty crashes some of them): input and output counts, required inputs
    and attributes present, attribute types, control-flow body signatures. Walks every graph,
    subgraph and local function body without recursion."""
    stack: list[tuple[onnx.GraphProto | onnx.FunctionProto, dict[str, int]]] = [(model.graph, opsets)]
    for fn in model.functions:
        own = dict(opsets)
        own.update({normalize_domain(i.domain): i.version for i in fn.opset_import})
        stack.append((fn, own))
    local = {(normalize_domain(f.domain), f.name) for f in model.functions}
    while stack:
        g, versions = stack.pop()
        for p in g.node:
            if (normalize_domain(p.domain), p.op_type) not in local:
                _validate_proto(p, versions)
            for a in p.attribute:
                if a.HasField("g"):
                    stack.append((a.g, versions))
                stack.extend((sub, versions) for sub in a.graphs)


def _describe_proto(p: onnx.NodeProto) -> str:
    dom = f"{p.domain}." if p.domain and p.domain != "ai.onnx" else ""
    return f"node '{p.name}' ({dom}{p.op_type})" if p.name else f"unnamed {dom}{p.op_type} node"


def _validate_proto(p: onnx.NodeProto, versions: dict[str, int]) -> None:
    domain = normalize_domain(p.domain)
    if domain not in versions:
        # No version to read its semantics at (onnxruntime: "Missing opset in the model").
        raise InvalidGraph(
            f"{_describe_proto(p)}: the model imports no opset of domain '{domain or 'ai.onnx'}' (opset_import)"
        )
    opset = versions[domain]
    schema = _schema(p.op_type, opset, domain)
    if schema is None:
        later = _schema(p.op_type, 1 << 30, domain)
        if later is not None and registry.resolve(domain, p.op_type, opset) is None:
            # An onnx operator used at an opset where it does not exist yet (or an opset that is
            # not one): never runnable, and unchecked by the schema -- refuse it now. (A kernel
            # registered that early is onnxruntime's own ai.onnx version: LayerNormalization-1.)
            first = min(s.since_version for s in schema_versions(domain, p.op_type))
            raise errors.NotImplemented(
                f"{_describe_proto(p)}: operator {p.op_type} does not exist at opset {opset} of domain "
                f"'{domain or 'ai.onnx'}' (it first appears at opset {first})"
            )
        return  # unknown here (a local function, a contrib op): checked once resolved
    what = f"the {p.op_type} schema (opset {opset})"
    n_in, n_out = len(p.input), len(p.output)
    if n_in > schema.max_input:
        raise InvalidGraph(
            f"{_describe_proto(p)} has {n_in} inputs; {what} takes {_range(schema.min_input, schema.max_input)}"
        )
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for i, formal in enumerate(schema.inputs[:n_in]):
        if formal.option == single and not p.input[i]:
            raise InvalidGraph(f"{_describe_proto(p)}: input {i} ('{formal.name}') is required but was left empty")
    if n_in < schema.min_input:  # as onnx's checker counts: an empty optional input fills its position
        raise InvalidGraph(
            f"{_describe_proto(p)} has {n_in} inputs; {what} takes {_range(schema.min_input, schema.max_input)}"
        )
    if n_out > schema.max_output or n_out < schema.min_output:
        raise InvalidGraph(
            f"{_describe_proto(p)} has {n_out} outputs; {what} makes {_range(schema.min_output, schema.max_output)}"
        )
    seen: set[str] = set()
    names = onnx.AttributeProto.AttributeType.Name
    for a in p.attribute:
        if a.name in seen:
            raise InvalidGraph(f"{_describe_proto(p)} has attribute '{a.name}' twice")
        seen.add(a.name)
    for a in p.attribute:
        declared = schema.attributes.get(a.name)
        if a.ref_attr_name or not a.type:
            continue  # checked where references and types are read, with their own messages
        if declared is None:
            # An attribute the operator does not define is a mistake the kernel would ignore
            # (ReduceSum-13 given axes=[1] reduced every axis); onnxruntime refuses it too.
            known = sorted(schema.attributes)
            raise InvalidGraph(
                f"{_describe_proto(p)}: unrecognized attribute '{a.name}' for {what}"
                + (f" (its attributes: {known})" if known else " (it takes no attributes)")
            )
        want = int(declared.type)
        if want and a.type != want:
            raise InvalidGraph(
                f"{_describe_proto(p)}: attribute '{a.name}' has type {_type_name(names, a.type)}, "
                f"{what} declares {names(want)}"
            )
    missing = sorted(k for k, v in schema.attributes.items() if v.required and k not in seen)
    if missing:
        raise InvalidGraph(f"{_describe_proto(p)} is missing required attribute(s) {missing}")
    if not domain and p.op_type in ("If", "Loop", "Scan"):
        _check_body_protos(p, opset)
    if not domain and p.op_type == "Optional" and not (n_in and p.input[0]) and "type" not in seen:
        # Nothing says what the empty optional holds (onnxruntime refuses it at load too).
        raise InvalidGraph(f"{_describe_proto(p)}: an Optional needs either an input or the 'type' attribute")


def _type_name(names: Callable[[int], str], t: int) -> str:
    try:
        return names(t)
    except ValueError:
        return f"an unknown type ({t})"


def _check_body_protos(p: onnx.NodeProto, opset: int) -> None:
    bodies = {a.name: a.g for a in p.attribute if a.HasField("g")}
    n_in, n_out = len(p.input), len(p.output)
    if p.op_type == "If":
        for key in ("then_branch", "else_branch"):
            g = bodies.get(key)
            if g is not None and len(g.output) != n_out:
                raise InvalidGraph(
                    f"{_describe_proto(p)}: its {key} returns {len(g.output)} values, the node has {n_out} outputs"
                )
        return
    body = bodies.get("body")
    if body is None:
        return
    if p.op_type == "Loop":
        carried = max(n_in - 2, 0)
        if len(body.input) != 2 + carried:
            raise InvalidGraph(
                f"{_describe_proto(p)}: the body takes {len(body.input)} inputs, expected 2 + {carried} "
                "(iteration, condition and the loop-carried values)"
            )
        if n_out < carried or len(body.output) != 1 + n_out:
            raise InvalidGraph(
                f"{_describe_proto(p)}: the body returns {len(body.output)} values; with {carried} loop-carried "
                f"values and {n_out} node outputs it must return {1 + n_out}"
            )
    else:
        explicit = n_in - (1 if opset < 9 else 0)
        if len(body.input) != explicit:
            raise InvalidGraph(
                f"{_describe_proto(p)}: the body takes {len(body.input)} inputs, the node gives it {explicit}"
            )
        if len(body.output) != n_out:
            raise InvalidGraph(
                f"{_describe_proto(p)}: the body returns {len(body.output)} values, the node has {n_out} outputs"
            )


def validate_node(node: Node) -> None:
    """The structural checks that need no provider: attribute types and input/output counts
    against the schema, input counts against the generic kernel, required inputs present,
    control-flow body signatures. Run on every node before the optimizer, whose passes may
    assume a well-formed node."""
    opdef = registry.resolve(node.domain, node.op_type, node.opset)
    schema = schema_for(node)
    for key in node.attrs:
        _check_attribute_type(node, key)
    if opdef is not None:
        _check_arity(node, opdef, schema)
    elif schema is not None:
        _check_schema_arity(node, schema)
    _check_subgraph_arity(node)


def _range(lo: int, hi: int | None) -> str:
    if hi is None or hi >= _UNBOUNDED:
        return f"at least {lo}"
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


@functools.cache
def _kernel_arity(fn: Callable[..., Any]) -> tuple[int, int | None]:
    """(required, most) positional inputs of a kernel after ``xp`` (most: None for *args)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    return required, None if varargs else len(positional)


def _check_subgraph_arity(node: Node) -> None:
    """Body signatures of the control-flow ops against the node (checked at creation, not at
    the first run that takes that branch)."""
    if node.domain:
        return
    n_in, n_out = len(node.inputs), len(node.outputs)
    if node.op_type == "If":
        for key in ("then_branch", "else_branch"):
            g = node.attrs.get(key)
            if isinstance(g, Graph) and len(g.outputs) != n_out:
                raise InvalidGraph(
                    f"{node.describe()}: its {key} returns {len(g.outputs)} values, the node has {n_out} outputs"
                )
    elif node.op_type == "Loop":
        body = node.attrs.get("body")
        if isinstance(body, Graph):
            carried = max(n_in - 2, 0)
            if len(body.inputs) != 2 + carried:
                raise InvalidGraph(
                    f"{node.describe()}: the body takes {len(body.inputs)} inputs, expected 2 + {carried} "
                    "(iteration, condition and the loop-carried values)"
                )
            if n_out < carried or len(body.outputs) != 1 + n_out:
                raise InvalidGraph(
                    f"{node.describe()}: the body returns {len(body.outputs)} values; with {carried} loop-carried "
                    f"values and {n_out} node outputs it must return {1 + n_out}"
                )
    elif node.op_type == "Scan":
        body = node.attrs.get("body")
        if isinstance(body, Graph):
            explicit = n_in - (1 if node.opset < 9 else 0)
            if len(body.inputs) != explicit:
                raise InvalidGraph(
                    f"{node.describe()}: the body takes {len(body.inputs)} inputs, the node gives it {explicit}"
                )
            if len(body.outputs) != n_out:
                raise InvalidGraph(
                    f"{node.describe()}: the body returns {len(body.outputs)} values, the node has {n_out} outputs"
                )


def resolve_kernel(node: Node, provider_name: str | None) -> registry.OpDef:
    opdef = registry.resolve(node.domain, node.op_type, node.opset, provider_name)
    if opdef is not None:
        return opdef
    domain = node.domain or "ai.onnx"
    have = registry.versions(node.domain, node.op_type)
    if have:
        detail = f"onnxpy implements it from opset {have[0]} (versions {have}), the model uses opset {node.opset}"
    elif domain == "com.microsoft.nchwc":
        detail = (
            "a blocked-layout operator onnxruntime writes at ORT_ENABLE_ALL for the CPU it ran on; "
            "save the optimized model at ORT_ENABLE_EXTENDED instead (onnxpy runs that level's operators)"
        )
    elif schema_for(node) is None:
        detail = f"no operator '{node.op_type}' exists in domain '{domain}' at opset {node.opset}"
    else:
        detail = "onnxpy has no kernel for it yet"
    raise errors.NotImplemented(
        f"Could not find an implementation for {node.op_type}({node.opset}) node with name '{node.name}' "
        f"(domain '{domain}', opset {node.opset}): {detail}"
    )


def _check_attribute_type(node: Node, key: str) -> None:
    """An attribute whose type disagrees with the schema (an INT where FLOATS are declared...)."""
    schema = schema_for(node)
    if schema is None or key not in schema.attributes:
        return
    declared = int(schema.attributes[key].type)
    given = node.attr_types.get(key)
    if given is not None and declared and given != declared:
        names = onnx.AttributeProto.AttributeType.Name
        raise InvalidGraph(
            f"{node.describe()}: attribute '{key}' has type {names(given)}, the {node.op_type} schema "
            f"(opset {node.opset}) declares {names(declared)}"
        )


@functools.cache
def _required_attributes(fn: Callable[..., Any]) -> frozenset[str]:
    sig = inspect.signature(fn)
    return frozenset(
        p.name
        for p in sig.parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
        and p.default is inspect.Parameter.empty
        and p.name not in registry.RUNTIME_PARAMS
    )


def bind_node(
    node: Node,
    graph: Graph,
    provider: Provider,
    compile_subgraph: SubgraphCompiler,
    session_facts: Any = None,
) -> BoundNode:
    """Resolve the node's kernel for ``provider`` and bind its array namespace and attributes:
    the result's ``fn(*inputs)`` is all the executor calls."""
    opdef = resolve_kernel(node, provider.name)
    _check_arity(node, opdef, schema_for(node))
    _check_subgraph_arity(node)
    kwargs: dict[str, Any] = {}
    schema = None
    for key, value in node.attrs.items():
        _check_attribute_type(node, key)
        if key not in opdef.attributes and not opdef.open_attributes:
            schema = schema or schema_for(node)
            known = schema is not None and key in schema.attributes
            if known:
                raise errors.NotImplemented(
                    f"{node.describe()}: attribute '{key}' is not supported by onnxpy's {opdef.qualified_name} kernel"
                )
            # Attributes unknown to the schema (old exporters' leftovers such as 'is_test' or
            # 'consumed_inputs') carry no meaning the kernel could honour; onnx's checker
            # flags them, we ignore them.
            continue
        if isinstance(value, Graph):
            value = compile_subgraph(value, node, key)
        elif isinstance(value, list) and value and isinstance(value[0], Graph):
            value = [compile_subgraph(g, node, key) for g in value]
        kwargs[key] = value
    missing = _required_attributes(opdef.fn) - set(kwargs)
    if missing:
        raise InvalidGraph(f"{node.describe()} is missing required attribute(s) {sorted(missing)}")
    implicit = tuple(sorted(_implicit_inputs(node, kwargs)))
    if opdef.wants_ctx:
        kwargs["ctx"] = registry.NodeContext(
            name=node.name,
            op_type=node.op_type,
            domain=node.domain,
            opset=node.opset,
            n_inputs=len(node.inputs),
            n_outputs=len(node.outputs),
            outputs_used=tuple(bool(o) for o in node.outputs),
            input_elem_types=tuple(graph.elem_type(i) or 0 if i else 0 for i in node.inputs),
            output_elem_types=tuple(graph.elem_type(o) or 0 if o else 0 for o in node.outputs),
            input_shapes=tuple(_shape_tuple(graph, i) for i in node.inputs),
            output_shapes=tuple(_shape_tuple(graph, o) for o in node.outputs),
            implicit_inputs=implicit,
            session=session_facts,
        )
    fn = functools.partial(opdef.fn, provider.xp, **kwargs)
    return BoundNode(
        fn=fn,
        op_type=node.op_type,
        domain=node.domain,
        name=node.name,
        describe=node.describe(),
        inputs=(*node.inputs, *implicit),
        outputs=tuple(node.outputs),
        single_output=len(node.outputs) == 1,
        may_inplace=tuple(opdef.may_inplace.items()),
        accepts_out=opdef.accepts_out,
        out_checked=opdef.out_checked,
    )


def _implicit_inputs(node: Node, kwargs: dict[str, Any]) -> set[str]:
    """Outer-scope names the node's subgraphs read. Compiled subgraphs already know theirs
    (asking them saves walking every nested level again at each level: deep models)."""
    names: set[str] = set()
    for key, value in node.attrs.items():
        compiled = kwargs.get(key)
        subs = compiled if isinstance(compiled, list) else [compiled]
        graphs = value if isinstance(value, list) else [value]
        if not graphs or not isinstance(graphs[0], Graph):
            continue
        for g, c in zip(graphs, subs):
            outer = getattr(c, "outer_names", None)
            names.update(outer if outer is not None else free_names(g))
    return names


def _shape_tuple(graph: Graph, name: str) -> tuple[Any, ...] | None:
    if not name:
        return None
    s = graph.shape(name)
    return None if s is None else tuple(s)
