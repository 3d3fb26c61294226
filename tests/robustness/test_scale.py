"""Scale: deeply nested subgraphs and graphs of 100,000 nodes load and run without
RecursionError, in time linear in their size; nesting beyond the cap is a clear error."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper

import onnxpy
from onnxpy.model.load import MAX_NESTING_DEPTH
from tests.helpers import make_model, vinfo

F = TensorProto.FLOAT


def nested_if(depth: int) -> onnx.ModelProto:
    """If inside If ``depth`` levels deep; the innermost then-branch returns outer 'x', every
    else-branch its negation. Built in place: protobuf cannot parse messages nested this deep,
    so the model exists only as a ModelProto."""
    m = make_model([], [vinfo("c", TensorProto.BOOL, []), vinfo("x", F, [2])], [vinfo("o0", F, [2])])
    g = m.graph
    for d in range(depth):
        n = g.node.add(op_type="If", name=f"if{d}")
        n.input.append("c")
        n.output.append(f"o{d}")
        other = n.attribute.add(name="else_branch", type=AttributeProto.GRAPH)
        other.g.name = f"else{d}"
        other.g.node.append(helper.make_node("Neg", ["x"], [f"n{d}"]))
        other.g.output.append(vinfo(f"n{d}", F, [2]))
        then = n.attribute.add(name="then_branch", type=AttributeProto.GRAPH)
        then.g.name = f"then{d}"
        then.g.output.append(vinfo(f"o{d + 1}", F, [2]))
        g = then.g
    g.node.append(helper.make_node("Identity", ["x"], [f"o{depth}"]))
    return m


def nested_loop(depth: int) -> onnx.ModelProto:
    """Loop bodies nested ``depth`` deep. The outermost Loop runs twice, every inner one once,
    each carrying a value down; the innermost body adds outer 'step', read across every level."""
    m = make_model(
        [],
        [vinfo("x", F, [2]), vinfo("step", F, [2])],
        [vinfo("o0", F, [2])],
        initializers={"two": np.array(2, np.int64), "one": np.array(1, np.int64), "yes": np.array(True)},
    )
    g = m.graph
    for d in range(depth):
        n = g.node.add(op_type="Loop", name=f"loop{d}")
        n.input.extend(["two" if d == 0 else "one", "yes", "x" if d == 0 else f"v{d}"])
        n.output.append(f"o{d}")
        body = n.attribute.add(name="body", type=AttributeProto.GRAPH).g
        body.name = f"body{d}"
        body.input.extend([vinfo(f"i{d}", TensorProto.INT64, []), vinfo(f"c{d}", TensorProto.BOOL, [])])
        body.input.append(vinfo(f"v{d + 1}", F, [2]))
        body.output.extend([vinfo(f"co{d}", TensorProto.BOOL, []), vinfo(f"o{d + 1}", F, [2])])
        body.node.append(helper.make_node("Identity", [f"c{d}"], [f"co{d}"]))
        g = body
    g.node.append(helper.make_node("Add", [f"v{depth}", "step"], [f"o{depth}"]))
    return m


@pytest.mark.parametrize("depth", [200])
def test_if_nested_200_levels_loads_and_runs(depth: int, tmp_path: Path) -> None:
    m = nested_if(depth)
    so = onnxpy.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")  # export walks every level too
    sess = onnxpy.InferenceSession(m, so)
    x = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(True), "x": x})[0], x)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(False), "x": x})[0], -x)
    assert (tmp_path / "opt.onnx").stat().st_size > 0


def test_loop_bodies_nested_200_levels_load_and_run() -> None:
    sess = onnxpy.InferenceSession(nested_loop(200))
    x = np.array([1.0, 2.0], np.float32)
    step = np.array([0.0, 0.5], np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x, "step": step})[0], x + 2 * step)


def test_nesting_beyond_the_cap_is_a_clear_error() -> None:
    with pytest.raises(onnxpy.InvalidGraph, match=f"more than {MAX_NESTING_DEPTH} levels"):
        onnxpy.InferenceSession(nested_if(MAX_NESTING_DEPTH + 1))


def test_serialized_model_nested_past_protobufs_limit_is_a_clear_error() -> None:
    data = nested_if(60).SerializeToString()
    with pytest.raises(onnxpy.InvalidProtobuf, match="Protobuf parsing failed"):
        onnxpy.InferenceSession(data)


def test_type_nested_absurdly_deep_is_a_clear_error() -> None:
    m = make_model([helper.make_node("Identity", ["x"], ["y"])], [vinfo("x", F, [2])], [vinfo("y", F, [2])])
    tp = m.graph.input[0].type
    tp.Clear()
    for _ in range(1000):
        tp = tp.sequence_type.elem_type
    tp.tensor_type.elem_type = F
    with pytest.raises(onnxpy.InvalidGraph, match="nested more than"):
        onnxpy.InferenceSession(m)


def chain(n: int) -> onnx.ModelProto:
    ops = ("Relu", "Neg", "Abs", "Sigmoid")
    nodes = [helper.make_node(ops[i % 4], [f"v{i}" if i else "x"], [f"v{i + 1}"]) for i in range(n)]
    nodes.append(helper.make_node("Identity", [f"v{n}"], ["y"]))
    return make_model(nodes, [vinfo("x", F, [4])], [vinfo("y", F, [4])])


def _create_and_run(n: int) -> float:
    m = chain(n)
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    started = time.perf_counter()
    out = onnxpy.InferenceSession(m).run(None, {"x": x})[0]
    elapsed = time.perf_counter() - started
    # The chain's result, computed independently: Relu, Neg, Abs, Sigmoid repeated.
    want = x.astype(np.float64)
    for i in range(n):
        op = i % 4
        want = (
            np.maximum(want, 0)
            if op == 0
            else -want
            if op == 1
            else np.abs(want)
            if op == 2
            else 1 / (1 + np.exp(-want))
        )
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    return elapsed


def test_100k_nodes_load_and_run_in_time_linear_in_size() -> None:
    """Creation + one run of a 100,000-node chain against a 10,000-node one. Linear work gives a
    ratio near 10 (cache effects push it up a little); anything quadratic gives ~100. The bound
    is generous so a loaded machine does not fail it; the best of two small runs is the base."""
    small = min(_create_and_run(10_000) for _ in range(2))
    large = _create_and_run(100_000)
    ratio = large / small
    assert ratio < 40, f"10k nodes: {small:.2f}s, 100k nodes: {large:.2f}s, ratio {ratio:.1f} (linear ~10)"
