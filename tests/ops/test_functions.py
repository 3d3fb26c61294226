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


def _row_mean_model(model_opset: int) -> onnx.ModelProto:
    """Center(x) = x - RowMean(x): RowMean imports opset 13 (ReduceMean's axes an attribute),
    Center imports opset 18 and only uses Sub, the same at every opset from 14 on."""
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
    return fn_model(
        [oh.make_node("Center", ["x"], ["y"], domain=DOM)],
        [outer, inner],
        [vi("x", F, [2, 3])],
        [vi("y", F, [2, 3])],
        opset=model_opset,
    )


def test_nested_local_functions_and_another_opset() -> None:
    # Center imports opset 18, the model 13: its Sub is valid at 13 too, so it runs (as in
    # onnxruntime, although onnx's checker refuses any import whose schema differs).
    (y,) = both(_row_mean_model(13), {"x": X})
    np.testing.assert_allclose(y, X - X.mean(axis=1, keepdims=True), rtol=1e-6)


def test_function_opset_incompatible_with_the_model_is_refused() -> None:
    # RowMean imports opset 13, the model 18, where ReduceMean has no 'axes' attribute: onnx's
    # checker and onnxruntime refuse the model.
    m = _row_mean_model(18)
    with pytest.raises(onnx.checker.ValidationError, match="not compatible with the version imported by model"):
        onnx.checker.check_model(m)
    with pytest.raises(Exception, match="axes"):
        theirs(m, {"x": X})
    with pytest.raises(onnxpy.InvalidGraph, match="RowMean imports opset 13 .* not compatible .* opset 18.*'axes'"):
        ours(m, {"x": X})


def test_function_opset_newer_than_the_model_with_a_changed_input_is_refused() -> None:
    # The audit case: ReduceSum-13 takes axes as an input, ReduceSum-11 (model opset 12) does not.
    axes = onnx.numpy_helper.from_array(np.array([1], np.int64))
    f = oh.make_function(
        DOM,
        "RS",
        ["a"],
        ["b"],
        [oh.make_node("Constant", [], ["ax"], value=axes), oh.make_node("ReduceSum", ["a", "ax"], ["b"], keepdims=0)],
        [oh.make_opsetid("", 13)],
    )
    m = fn_model([oh.make_node("RS", ["x"], ["y"], domain=DOM)], [f], [vi("x", F, [2, 3])], [vi("y", F, [2])], 12, 8)
    with pytest.raises(onnx.checker.ValidationError, match="not compatible"):
        onnx.checker.check_model(m)
    with pytest.raises(Exception, match="input size 2"):
        theirs(m, {"x": X})
    with pytest.raises(onnxpy.InvalidGraph, match="RS imports opset 13 .* opset 12: .* has 2 inputs"):
        ours(m, {"x": X})


def test_uncalled_function_with_another_opset_is_accepted() -> None:
    # onnxruntime only inlines (and checks) the functions a graph calls.
    f = oh.make_function(DOM, "Unused", ["a"], ["b"], [oh.make_node("Relu", ["a"], ["b"])], [oh.make_opsetid("", 14)])
    m = fn_model([oh.make_node("Relu", ["x"], ["y"])], [f], [vi("x", F, [2, 3])], [vi("y", F, [2, 3])], opset=13)
    both(m, {"x": X})


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
    with pytest.raises(Exception, match="recursive"):
        build_graph(m)


def _chain(n: int, back_to: int | None = None) -> list[onnx.FunctionProto]:
    """E0 = Relu, E<k> calls E<k-1>; with ``back_to``, E0 calls E<back_to> instead (a cycle)."""
    first = (
        oh.make_node("Relu", ["a"], ["b"]) if back_to is None else oh.make_node(f"E{back_to}", ["a"], ["b"], domain=DOM)
    )
    ops = [oh.make_opsetid("", 18), oh.make_opsetid(DOM, 1)]
    fs = [oh.make_function(DOM, "E0", ["a"], ["b"], [first], ops)]
    fs += [
        oh.make_function(DOM, f"E{k}", ["a"], ["b"], [oh.make_node(f"E{k - 1}", ["a"], ["b"], domain=DOM)], ops)
        for k in range(1, n)
    ]
    return fs


def test_long_chain_of_calls_is_not_recursion() -> None:
    m = fn_model(
        [oh.make_node("E79", ["x"], ["y"], domain=DOM)], _chain(80), [vi("x", F, [2, 3])], [vi("y", F, [2, 3])]
    )
    (y,) = both(m, {"x": X})
    np.testing.assert_array_equal(y, np.maximum(X, 0))


def test_indirect_recursion_is_a_cycle_with_a_short_message() -> None:
    m = fn_model(
        [oh.make_node("E79", ["x"], ["y"], domain=DOM, name="top")],
        _chain(80, back_to=40),
        [vi("x", F, [2, 3])],
        [vi("y", F, [2, 3])],
    )
    with pytest.raises(
        onnxpy.InvalidGraph, match=r"node 'top' \(custom.fn.E79\): function custom.fn.E40 calls itself"
    ) as e:
        ours(m, {"x": X})
    assert len(str(e.value)) < 200, str(e.value)


def test_recursion_inside_a_subgraph_of_the_body_is_detected() -> None:
    then = oh.make_graph([oh.make_node("Rec", ["a", "c"], ["r"], domain=DOM)], "then", [], [vi("r")])
    other = oh.make_graph([oh.make_node("Identity", ["a"], ["r2"])], "else", [], [vi("r2")])
    f = oh.make_function(
        DOM,
        "Rec",
        ["a", "c"],
        ["b"],
        [oh.make_node("If", ["c"], ["b"], then_branch=then, else_branch=other)],
        [oh.make_opsetid("", 18), oh.make_opsetid(DOM, 1)],
    )
    m = fn_model(
        [oh.make_node("Rec", ["x", "c"], ["y"], domain=DOM)], [f], [vi("x", F, [2, 3]), vi("c", TP.BOOL, [])], [vi("y")]
    )
    with pytest.raises(onnxpy.InvalidGraph, match="Rec calls itself recursively"):
        ours(m, {"x": X, "c": np.array(False)})


def test_call_with_more_inputs_than_the_function_declares_is_refused() -> None:
    f = oh.make_function(DOM, "Inner", ["a"], ["b"], [oh.make_node("Relu", ["a"], ["b"])], [oh.make_opsetid("", 18)])
    m = fn_model(
        [oh.make_node("Inner", ["x", "x"], ["y"], domain=DOM, name="call")], [f], [vi("x", F, [2, 3])], [vi("y")]
    )
    with pytest.raises(Exception, match="cannot exceed number of formal parameters"):
        theirs(m, {"x": X})
    with pytest.raises(onnxpy.InvalidGraph, match=r"node 'call' .* has 2 inputs; function custom.fn.Inner declares 1"):
        ours(m, {"x": X})


def _col_fn() -> onnx.FunctionProto:
    return oh.make_function(
        DOM,
        "Col",
        ["a"],
        ["b"],
        [oh.make_node("Neg", ["a"], ["t"]), oh.make_node("Relu", ["t"], ["b"])],
        [oh.make_opsetid("", 18)],
    )


def test_inlined_names_do_not_collide_with_model_values() -> None:
    # 'Col__Col_0__t' is what onnxpy once named Col's inner value 't': a model value of that name
    # was silently shadowed (read from an If branch) or refused as produced twice (same scope).
    taken = "Col__Col_0__t"
    then = oh.make_graph(
        [oh.make_node("Col", ["x"], ["r"], domain=DOM), oh.make_node("Add", ["r", taken], ["r2"])], "t", [], [vi("r2")]
    )
    other = oh.make_graph([oh.make_node("Identity", [taken], ["r3"])], "e", [], [vi("r3")])
    m = fn_model(
        [oh.make_node("Abs", ["x"], [taken]), oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [_col_fn()],
        [vi("x", F, [2, 3]), vi("c", TP.BOOL, [])],
        [vi("y")],
    )
    (y,) = both(m, {"x": X, "c": np.array(True)})
    np.testing.assert_array_equal(y, np.maximum(-X, 0) + np.abs(X))
    m2 = fn_model(
        [
            oh.make_node("Col", ["x"], ["y"], domain=DOM),
            oh.make_node("Abs", ["x"], [taken]),
            oh.make_node("Add", ["y", taken], ["z"]),
        ],
        [_col_fn()],
        [vi("x", F, [2, 3])],
        [vi("z")],
    )
    (z,) = both(m2, {"x": X})
    np.testing.assert_array_equal(z, np.maximum(-X, 0) + np.abs(X))


def test_inlined_names_avoid_every_name_of_the_model() -> None:
    # Every candidate name (and its first numbered variants) is already used somewhere: in the
    # graph, in a subgraph, in a function body.
    names = ["Col__Col_0__t", "Col__Col_0__t_1", "Col__Col_0__Neg"]
    then = oh.make_graph([oh.make_node("Neg", ["x"], [names[1]])], "t", [], [vi(names[1])])
    other = oh.make_graph([oh.make_node("Abs", ["x"], [names[0]])], "e", [], [vi(names[0])])
    m = fn_model(
        [
            oh.make_node("Col", ["x"], ["y"], domain=DOM),
            oh.make_node("If", ["c"], ["u"], then_branch=then, else_branch=other),
            oh.make_node("Add", ["y", "u"], ["z"]),
        ],
        [_col_fn()],
        [vi("x", F, [2, 3]), vi("c", TP.BOOL, [])],
        [vi("z")],
    )
    for c in (True, False):
        both(m, {"x": X, "c": np.array(c)})
    g = build_graph(m)
    (col,) = [n for n in g.nodes if n.op_type == "Neg"]
    assert col.outputs[0] not in names


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
