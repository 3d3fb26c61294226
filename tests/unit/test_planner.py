"""The execution plan is data: ids, order and release points can be asserted directly."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from onnxpy.ir.graph import topological_sort
from onnxpy.planner.plan import ABSENT, DISCARD
from onnxpy.providers import CPU
from onnxpy.runtime.compile import build_graph
from onnxpy.runtime.compiled import CompiledGraph
from tests.helpers import make_model, vinfo


def _compiled():
    # x -> a=Relu(x) -> b=Neg(a) -> c=Add(a, b) ; d=Sqrt(x) unused by the output
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["a"], ["b"], name="neg"),
        helper.make_node("Add", ["a", "b"], ["c"], name="add"),
        helper.make_node("Sqrt", ["x"], ["d"], name="sqrt"),
        helper.make_node("Mul", ["c", "w"], ["y"], name="mul"),
    ]
    m = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [3])],
        [vinfo("y", TensorProto.FLOAT, [3])],
        initializers={"w": np.full(3, 2, np.float32)},
    )
    graph = build_graph(m)
    return CompiledGraph(graph, CPU)


def test_plan_ids_order_and_release_points() -> None:
    plan = _compiled().plan
    assert plan.value_names[ABSENT] == "<absent>" and plan.value_names[DISCARD] == "<discarded>"
    assert [s.node_name for s in plan.steps] == ["relu", "neg", "add", "sqrt", "mul"]
    released = {s.node_name: {plan.value_names[i] for i in s.release} for s in plan.steps}
    assert released["relu"] == set()
    assert released["neg"] == set()
    assert released["add"] == {"a", "b"}  # both die at their last reader
    assert released["sqrt"] == {"x", "d"}  # x's last reader; d is never read
    assert released["mul"] == {"c"}  # y is fetched, w is a constant: neither is released
    assert plan.fetch_ids == [plan.id_of("y")]
    assert set(plan.feed_ids) == {"x"}
    assert plan.template[plan.id_of("w")] is not None


def test_plan_for_an_intermediate_keeps_it_alive() -> None:
    compiled = _compiled()
    plan = compiled.plan_for(["a", "y"])
    a = plan.id_of("a")
    assert all(a not in s.release for s in plan.steps)
    out = compiled.run({"x": np.array([-1, 0, 2], np.float32)}, plan=plan)
    np.testing.assert_array_equal(out[0], [0, 0, 2])
    np.testing.assert_array_equal(out[1], [0, 0, 0])


def test_omitted_optional_inputs_read_the_absent_slot() -> None:
    m = make_model(
        [helper.make_node("Clip", ["x", "", "hi"], ["y"], name="clip")],
        [vinfo("x", TensorProto.FLOAT, [3])],
        [vinfo("y", TensorProto.FLOAT, [3])],
        initializers={"hi": np.array(1, np.float32)},
    )
    compiled = CompiledGraph(build_graph(m), CPU)
    step = compiled.plan.steps[0]
    assert step.inputs[1] == ABSENT
    out = compiled.run({"x": np.array([-5, 0.5, 5], np.float32)})
    np.testing.assert_array_equal(out[0], [-5, 0.5, 1])


def test_topological_sort_fixes_an_unsorted_model() -> None:
    nodes = [
        helper.make_node("Neg", ["a"], ["b"], name="second"),
        helper.make_node("Relu", ["x"], ["a"], name="first"),
    ]
    m = make_model(nodes, [vinfo("x", TensorProto.FLOAT, [2])], [vinfo("b", TensorProto.FLOAT, [2])])
    graph = build_graph(m)
    assert [n.name for n in graph.nodes] == ["first", "second"]
    topological_sort(graph)  # idempotent
    assert [n.name for n in graph.nodes] == ["first", "second"]


def test_clone_is_independent() -> None:
    graph = _compiled().graph
    copy = graph.clone()
    copy.nodes[0].inputs[0] = "changed"
    copy.nodes.pop()
    assert graph.nodes[0].inputs[0] == "x" and len(graph.nodes) == 5
    assert copy.initializers["w"] is graph.initializers["w"]
