"""Type checks at session creation: every node's inputs and outputs against its schema.

onnxruntime refuses a model whose types contradict an operator's schema (an Add of a float and
an int64 tensor, a Relu of strings) when it loads it. onnxpy's kernels are numpy code, and
numpy promotes mixed types instead of failing: without this check such a model ran and
returned types the model does not declare (the Add above gave float64 for a declared float).

A schema names a type variable per formal parameter ("T"); every value bound to one variable
must have one type, and a parameter of a fixed type must have it. The variables' lists of
allowed types are not enforced: onnxpy's kernels run some types beyond them on purpose
(float16 Celu, string OneHot values), and a type no kernel handles fails there, naming the
node. Values whose type is unknown after inference are skipped, as are heterogeneous variadic
parameters (Loop's and Scan's state variables, each of its own type) and operators without a
schema here.
"""

from __future__ import annotations

from typing import Any

from onnx import defs

from ..api.errors import InvalidGraph
from ..ir.graph import Graph, Node, iter_graphs
from ..model import dtypes
from .binding import schema_for


def check_types(graph: Graph) -> None:
    """Raise InvalidGraph at the first node (in any subgraph) whose value types contradict
    its schema."""
    for g in iter_graphs(graph):
        for node in g.nodes:
            schema = schema_for(node)
            if schema is not None:
                _check_node(g, node, schema)


def _check_node(graph: Graph, node: Node, schema: Any) -> None:
    # onnx spells maps "map(int64, float)", onnxruntime "map(int64,float)": compared without spaces
    allowed = {c.type_param_str: {t.replace(" ", "") for t in c.allowed_type_strs} for c in schema.type_constraints}
    bound: dict[str, tuple[str, str]] = {}  # type variable -> (type, the first value that had it)
    for side, formals, names in (("input", schema.inputs, node.inputs), ("output", schema.outputs, node.outputs)):
        for formal, name in _bindings(formals, names):
            actual = _type_of(graph, name)
            if actual is None:
                continue
            want = formal.type_str.replace(" ", "")
            if want not in allowed:  # a fixed type, e.g. tensor(int64)
                if actual != want:
                    _fail(node, side, formal.name, name, actual, f"{want}")
                continue
            first = bound.setdefault(want, (actual, name))
            if first[0] != actual:
                _fail(node, side, formal.name, name, actual, f"{first[0]}, the type of '{first[1]}' (both are {want})")


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
    return None if "undefined" in text or not text else text.replace(" ", "")


def _fail(node: Node, side: str, formal: str, name: str, actual: str, expected: str) -> None:
    raise InvalidGraph(
        f"Type Error: {node.describe()}: {side} '{name}' ({formal}) is {actual}; expected {expected}. "
        "The model's types contradict the operator's schema"
    )
