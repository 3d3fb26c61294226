"""Type checks at session creation: every node's inputs and outputs against its schema.

onnxruntime refuses a model whose types contradict an operator's schema (an Add of a float and
an int64 tensor, a Relu of strings) when it loads it. onnxpy's kernels are numpy code, and
numpy promotes mixed types instead of failing: without this check such a model ran and
returned types the model does not declare (the Add above gave float64 for a declared float).

A schema names a type variable per formal parameter ("T"); every value bound to one variable
must have one type, and a parameter of a fixed type must have it. A variable's type must be one
some version of the operator allows: the kernels serve every version (float16 Celu, which
onnx 1.23 added, also runs at opset 12), while a type no version allows is refused, as
onnxruntime refuses it -- numpy would have run it and answered wrongly (Det of int8 gave 23 for
24, Sigmoid of int32 zeros). EXTENSIONS lists the few types onnxpy runs beyond every version on
purpose. Values whose type is unknown after inference are skipped, as are heterogeneous
variadic parameters (Loop's and Scan's state variables, each of its own type) and operators
without a schema here.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from onnx import defs

from ..api.errors import InvalidGraph
from ..ir.graph import Graph, Node, iter_graphs
from ..model import dtypes
from .binding import schema_for, schema_versions

# Types onnxpy runs beyond every version of a schema on purpose, where the kernel computes
# them exactly as their float32 values: (op_type, type variable) -> types.
EXTENSIONS: dict[tuple[str, str], frozenset[str]] = {
    ("NonZero", "T"): frozenset(
        f"tensor({t})" for t in ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")
    ),
    ("Shrink", "T"): frozenset({"tensor(bfloat16)"}),
}


@functools.cache
def _types_at_any_version(domain: str, op_type: str, side: str, formal: str) -> frozenset[str]:
    """The types any version of the operator allows for one formal parameter (by name: its
    type variable is renamed between versions): the kernels serve the operator, not one of
    its versions."""
    found: set[str] = set()
    for s in schema_versions(domain, op_type):
        variables = {c.type_param_str: c.allowed_type_strs for c in s.type_constraints}
        for f in s.inputs if side == "input" else s.outputs:
            if f.name == formal:
                found.update(_normal(t) for t in variables.get(f.type_str, [f.type_str]))
    return frozenset(found)


def _allowed_elsewhere(schema: Any, op_type: str, side: str, formal: Any, actual: str) -> bool:
    """A type another version of the operator allows (bfloat16 TopK at opset 11), or one onnxpy
    extends the operator to: run. A type no version allows (Det of int8, Sigmoid of int32,
    whose kernels gave wrong values) is refused, as onnxruntime refuses it."""
    if actual in EXTENSIONS.get((op_type, formal.type_str), ()):
        return True
    return actual in _types_at_any_version(schema.domain, op_type, side, formal.name)


@functools.lru_cache(maxsize=4096)  # bounded: type strings also come from models
def _normal(type_str: str) -> str:
    """onnx spells a map's values "map(int64, float)", onnxpy "map(int64,tensor(float))": one
    spelling, without spaces."""
    return re.sub(r"map\((\w+),tensor\((\w+)\)\)", r"map(\1,\2)", type_str.replace(" ", ""))


def check_types(graph: Graph) -> None:
    """Raise InvalidGraph at the first node (in any subgraph) whose value types contradict
    its schema."""
    for g in iter_graphs(graph):
        for node in g.nodes:
            schema = schema_for(node)
            if schema is not None:
                _check_node(g, node, schema)
            if node.op_type == "If" and not node.domain:
                _check_branches(node)


@functools.lru_cache(maxsize=4096)
def _allowed_types(domain: str, op_type: str, since_version: int) -> dict[str, frozenset[str]]:
    """A schema's type variables and the types each allows, spelt as _normal spells them (onnx
    spells maps "map(int64, float)", onnxruntime "map(int64,float)"). Once per schema: building
    it per node was a fifth of DenseNet-121's type check."""
    schema = defs.get_schema(op_type, since_version, domain)
    return {c.type_param_str: frozenset(_normal(t) for t in c.allowed_type_strs) for c in schema.type_constraints}


def _check_node(graph: Graph, node: Node, schema: Any) -> None:
    allowed = _allowed_types(schema.domain, schema.name, schema.since_version)
    bound: dict[str, tuple[str, str]] = {}  # type variable -> (type, the first value that had it)
    for side, formals, names in (("input", schema.inputs, node.inputs), ("output", schema.outputs, node.outputs)):
        for formal, name in _bindings(formals, names):
            actual = _type_of(graph, name)
            if actual is None:
                continue
            want = _normal(formal.type_str)
            if want not in allowed:  # a fixed type, e.g. tensor(int64)
                if actual != want:
                    _fail(node, side, formal.name, name, actual, f"{want}")
                continue
            if actual not in allowed[want] and not _allowed_elsewhere(schema, node.op_type, side, formal, actual):
                listed = ", ".join(sorted(allowed[want]))
                _fail(node, side, formal.name, name, actual, f"one of {want}'s types: {listed}")
            first = bound.setdefault(want, (actual, name))
            if first[0] != actual:
                _fail(node, side, formal.name, name, actual, f"{first[0]}, the type of '{first[1]}' (both are {want})")


def _check_branches(node: Node) -> None:
    """If's branches return the same types: otherwise the output's type would depend on the
    condition's value at run time (onnxruntime refuses such a model too)."""
    then, other = node.attrs.get("then_branch"), node.attrs.get("else_branch")
    if not isinstance(then, Graph) or not isinstance(other, Graph):
        return
    for i, (a, b) in enumerate(zip(then.outputs, other.outputs)):
        ta, tb = _type_of(then, a), _type_of(other, b)
        if ta is not None and tb is not None and ta != tb:
            raise InvalidGraph(
                f"Type Error: {node.describe()}: output {i} is {ta} in then_branch ('{a}') and {tb} in "
                f"else_branch ('{b}'); both branches must return the same types"
            )


def _bindings(formals: Any, names: list[str]) -> list[tuple[Any, str]]:
    """(formal parameter, value name) pairs; a variadic parameter takes every remaining value,
    and is left out where its values may differ in type."""
    pairs = []
    variadic = defs.OpSchema.FormalParameterOption.Variadic
    for i, name in enumerate(names):
        if not formals:
            break
        formal = formals[min(i, len(formals) - 1)]
        if i >= len(formals) and formal.option != variadic:
            break
        if formal.option == variadic and not formal.is_homogeneous:
            continue
        if name:
            pairs.append((formal, name))
    return pairs


def _type_of(graph: Graph, name: str) -> str | None:
    """The value's type string (tensor(float), seq(tensor(int64)), ...), None where inference
    left any part of it unknown."""
    tp = graph.types.get(name)
    if tp is not None and tp.WhichOneof("value") is not None:
        text = dtypes.type_string(tp)
    elif name in graph.initializers:
        try:
            text = dtypes.dtype_string(graph.initializers[name].dtype)
        except ValueError:
            return None
    else:
        return None
    return None if "undefined" in text or not text else _normal(text)


def _fail(node: Node, side: str, formal: str, name: str, actual: str, expected: str) -> None:
    raise InvalidGraph(
        f"Type Error: {node.describe()}: {side} '{name}' ({formal}) is {actual}; expected {expected}. "
        "The model's types contradict the operator's schema"
    )
