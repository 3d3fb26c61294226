"""Function expansion (onnxpy/ir/functions.py): model-local functions built with
onnx.helper.make_function (attribute references and defaults, overloads, nesting, other opsets,
subgraphs reading function values, omitted outputs, recursion) and operators defined by a schema
function, checked against onnxruntime or a numpy oracle."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import onnxpy
from onnxpy.ir.graph import Graph
from onnxpy.runtime.compile import build_graph

F = TP.FLOAT
DOM = "custom.fn"


def vi(name: str, elem: int = F, shape: list[Any] | None = None) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, shape)


def fn_model(
    nodes: list[onnx.NodeProto],
    functions: list[onnx.FunctionProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    opset: int = 18,
    ir_version: int = 10,
) -> onnx.ModelProto:
    g = oh.make_graph(nodes, "g", inputs, outputs)
    return oh.make_model(
        g,
        functions=functions,
        opset_imports=[oh.make_opsetid("", opset), oh.make_opsetid(DOM, 1)],
        ir_version=ir_version,
    )


def ours(m: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    return onnxpy.InferenceSession(m.SerializeToString()).run(None, feeds)


def theirs(m: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def both(m: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    got, want = ours(m, feeds), theirs(m, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        assert np.asarray(g).dtype == np.asarray(w).dtype
    return got


X = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], np.float32)


def _ref(op_output: str, attr: str, ref: str) -> onnx.NodeProto:
    """A Constant whose ``attr`` refers to the function attribute ``ref``."""
    n = oh.make_node("Constant", [], [op_output])
    n.attribute.append(oh.make_attribute_ref(attr, onnx.AttributeProto.FLOAT, ref_attr_name=ref))
    return n


def _scale_fn() -> onnx.FunctionProto:
    """ScaleShift(x) = x * alpha + beta: alpha must be given, beta defaults to 0.5."""
    nodes = [
        _ref("a", "value_float", "alpha"),
        _ref("b", "value_float", "beta"),
        oh.make_node("Mul", ["x", "a"], ["xa"]),
        oh.make_node("Add", ["xa", "b"], ["y"]),
    ]
    return oh.make_function(
        DOM,
        "ScaleShift",
        ["x"],
        ["y"],
        nodes,
        [oh.make_opsetid("", 18)],
        attributes=["alpha"],
        attribute_protos=[oh.make_attribute("beta", 0.5)],
    )


def test_local_function_with_attribute_reference_and_default() -> None:
    m = fn_model(
        [
            oh.make_node("ScaleShift", ["x"], ["y1"], domain=DOM, alpha=2.0),
            oh.make_node("ScaleShift", ["y1"], ["y2"], domain=DOM, alpha=-1.0, beta=10.0),
        ],
        [_scale_fn()],
        [vi("x", F, [2, 3])],
        [vi("y1", F, [2, 3]), vi("y2", F, [2, 3])],
    )
    y1, y2 = both(m, {"x": X})
    np.testing.assert_allclose(y1, X * 2 + 0.5)
    np.testing.assert_allclose(y2, -(X * 2 + 0.5) + 10)


def test_two_calls_with_the_same_node_name_do_not_collide() -> None:
    m = fn_model(
        [
            oh.make_node("ScaleShift", ["x"], ["y1"], domain=DOM, alpha=2.0, name="n"),
            oh.make_node("ScaleShift", ["x"], ["y2"], domain=DOM, alpha=3.0, name="n"),
        ],
        [_scale_fn()],
        [vi("x", F, [2, 3])],
        [vi("y1", F, [2, 3]), vi("y2", F, [2, 3])],
    )
    y1, y2 = ours(m, {"x": X})
    np.testing.assert_allclose(y1, X * 2 + 0.5)
    np.testing.assert_allclose(y2, X * 3 + 0.5)


def test_nested_local_functions_and_another_opset() -> None:
    # Inner uses opset 13's ReduceMean (axes an attribute) while the model imports opset 18
    # (where axes is an input).
    inner = oh.make_function(
        DOM,
        "RowMean",
        ["x"],
        ["s"],
        [oh.make_node("ReduceMean", ["x"], ["s"], axes=[1], keepdims=1)],
        [oh.make_opsetid("", 13)],
    )
    outer = oh.make_function(
        DOM,
        "Center",
        ["x"],
        ["y"],
        [
            oh.make_node("RowMean", ["x"], ["mean"], domain=DOM),
            oh.make_node("Sub", ["x", "mean"], ["y"]),
        ],
        [oh.make_opsetid("", 18), oh.make_opsetid(DOM, 1)],
    )
    m = fn_model(
        [oh.make_node("Center", ["x"], ["y"], domain=DOM)], [outer, inner], [vi("x", F, [2, 3])], [vi("y", F, [2, 3])]
    )
    # onnxruntime 1.2x inlines the inner body at the model's opset and rejects it: numpy oracle.
    (y,) = ours(m, {"x": X})
    np.testing.assert_allclose(y, X - X.mean(axis=1, keepdims=True), rtol=1e-6)


def test_function_subgraph_reads_a_function_internal_value() -> None:
    then = oh.make_graph([oh.make_node("Mul", ["t", "t"], ["r"])], "then", [], [vi("r")])
    other = oh.make_graph([oh.make_node("Neg", ["t"], ["r2"])], "else", [], [vi("r2")])
    f = oh.make_function(
        DOM,
        "Branchy",
        ["x", "c"],
        ["y"],
        [oh.make_node("Abs", ["x"], ["t"]), oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [oh.make_opsetid("", 18)],
    )
    m = fn_model(
        [
            oh.make_node("Branchy", ["x", "c"], ["y1"], domain=DOM),
            oh.make_node("Branchy", ["y1", "c"], ["y2"], domain=DOM),
        ],
        [f],
        [vi("x", F, [2, 3]), vi("c", TP.BOOL, [])],
        [vi("y2", F, [2, 3])],
    )
    for c in (True, False):
        (y,) = both(m, {"x": X, "c": np.array(c)})
        want = np.abs(X) ** 2 if c else -np.abs(-np.abs(X))
        if c:
            want = want**2
        np.testing.assert_allclose(y, want)


def test_function_output_omitted_by_the_caller_is_still_computed_inside() -> None:
    f = oh.make_function(
        DOM,
        "Two",
        ["x"],
        ["a", "b"],
        [oh.make_node("Neg", ["x"], ["a"]), oh.make_node("Add", ["a", "a"], ["b"])],
        [oh.make_opsetid("", 18)],
    )
    m = fn_model([oh.make_node("Two", ["x"], ["", "b"], domain=DOM)], [f], [vi("x", F, [2, 3])], [vi("b", F, [2, 3])])
    (b,) = ours(m, {"x": X})
    np.testing.assert_allclose(b, -2 * X)


def test_function_overloads() -> None:
    plus = oh.make_function(
        DOM, "Op", ["x"], ["y"], [oh.make_node("Add", ["x", "x"], ["y"])], [oh.make_opsetid("", 18)]
    )
    plus.overload = "plus"
    times = oh.make_function(
        DOM, "Op", ["x"], ["y"], [oh.make_node("Mul", ["x", "x"], ["y"])], [oh.make_opsetid("", 18)]
    )
    times.overload = "times"
    n1 = oh.make_node("Op", ["x"], ["y1"], domain=DOM)
    n1.overload = "plus"
    n2 = oh.make_node("Op", ["x"], ["y2"], domain=DOM)
    n2.overload = "times"
    m = fn_model([n1, n2], [plus, times], [vi("x", F, [2, 3])], [vi("y1", F, [2, 3]), vi("y2", F, [2, 3])])
    y1, y2 = ours(m, {"x": X})
    np.testing.assert_allclose(y1, X + X)
    np.testing.assert_allclose(y2, X * X)


def test_recursive_function_is_rejected() -> None:
    f = oh.make_function(
        DOM, "Loopy", ["x"], ["y"], [oh.make_node("Loopy", ["x"], ["y"], domain=DOM)], [oh.make_opsetid(DOM, 1)]
    )
    m = fn_model([oh.make_node("Loopy", ["x"], ["y"], domain=DOM)], [f], [vi("x", F, [2])], [vi("y", F, [2])])
    with pytest.raises(Exception, match="nest deeper|recursive"):
        build_graph(m)


def test_expanded_names_are_unique_across_scopes() -> None:
    # The same function called in the main graph and inside a Loop body: every value name of
    # the expanded model is defined once, whatever the scope.
    body = oh.make_graph(
        [oh.make_node("Identity", ["c"], ["co"]), oh.make_node("ScaleShift", ["v"], ["vo"], domain=DOM, alpha=2.0)],
        "body",
        [vi("i", TP.INT64, []), vi("c", TP.BOOL, []), vi("v", F, [2, 3])],
        [vi("co", TP.BOOL, []), vi("vo", F, [2, 3])],
    )
    m = fn_model(
        [
            oh.make_node("ScaleShift", ["x"], ["x1"], domain=DOM, alpha=2.0),
            oh.make_node("Loop", ["M", "", "x1"], ["y"], body=body),
        ],
        [_scale_fn()],
        [vi("x", F, [2, 3]), vi("M", TP.INT64, [])],
        [vi("y", F, [2, 3])],
    )
    g = build_graph(m)
    names: list[str] = []

    def collect(graph: Graph) -> None:
        for n in graph.nodes:
            names.extend(o for o in n.outputs if o)
            for sub in n.subgraphs():
                collect(sub)

    collect(g)
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    (y,) = both(m, {"x": X, "M": np.array(3, np.int64)})
    want = X
    for _ in range(4):
        want = want * 2 + 0.5
    np.testing.assert_allclose(y, want, rtol=1e-6)


# -- operators defined by a schema function -------------------------------------------------------


def test_schema_function_uses_the_schema_default_of_an_omitted_attribute() -> None:
    # Swish's body reads @alpha; the node omits it, so the schema default (1.0) applies.
    m = oh.make_model(
        oh.make_graph([oh.make_node("Swish", ["x"], ["y"])], "g", [vi("x", F, [2, 3])], [vi("y", F, [2, 3])]),
        opset_imports=[oh.make_opsetid("", 24)],
    )
    (y,) = ours(m, {"x": X})
    np.testing.assert_allclose(y, X / (1 + np.exp(-X)), rtol=1e-6)
    m2 = oh.make_model(
        oh.make_graph(
            [oh.make_node("Swish", ["x"], ["y"], alpha=2.0)], "g", [vi("x", F, [2, 3])], [vi("y", F, [2, 3])]
        ),
        opset_imports=[oh.make_opsetid("", 24)],
    )
    (y2,) = ours(m2, {"x": X})
    np.testing.assert_allclose(y2, X / (1 + np.exp(-2 * X)), rtol=1e-6)


def test_schema_function_inside_a_local_function() -> None:
    # A local function calling SwiGLU (whose body calls Swish, whose body reads @alpha).
    f = oh.make_function(
        DOM,
        "Gate",
        ["a", "b"],
        ["y"],
        [oh.make_node("SwiGLU", ["a", "b"], ["y"])],
        [oh.make_opsetid("", 28)],
    )
    m = fn_model(
        [oh.make_node("Gate", ["a", "b"], ["y"], domain=DOM)],
        [f],
        [vi("a", F, [2, 3]), vi("b", F, [2, 3])],
        [vi("y", F, [2, 3])],
        opset=28,
    )
    b = np.flip(X, axis=1).copy()
    (y,) = ours(m, {"a": X, "b": b})
    np.testing.assert_allclose(y, X / (1 + np.exp(-X)) * b, rtol=1e-6)
