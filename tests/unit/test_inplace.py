"""In-place execution: an elementwise step writes its output into an input buffer that nothing
else can see, and never into one that something can (feeds, constants, fetched values, buffers
viewed by other values)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.runtime import executor
from tests.helpers import make_model, vinfo


def _unoptimized(model: onnx.ModelProto) -> onnxpy.InferenceSession:
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxpy.InferenceSession(model, so)


@pytest.fixture
def inplace_log(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    log: list[tuple[str, bool]] = []
    real = executor._inplace_target

    def spy(step: Any, args: list[Any]) -> Any:
        target = real(step, args)
        log.append((step.node_name, target is not None))
        return target

    monkeypatch.setattr(executor, "_inplace_target", spy)
    return log


def _chain() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Add", ["a", "b"], ["c"], name="add"),
        helper.make_node("Mul", ["c", "two"], ["y"], name="mul"),
    ]
    return make_model(
        nodes, [vinfo("x", shape=[2, 3]), vinfo("b", shape=[3])], [vinfo("y")], {"two": np.array(2, np.float32)}
    )


def test_intermediate_buffers_are_reused_and_feeds_left_alone(inplace_log: list) -> None:
    sess = _unoptimized(_chain())
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    x_before = x.copy()
    b = np.ones(3, np.float32)
    y = sess.run(None, {"x": x, "b": b})[0]
    np.testing.assert_allclose(y, (np.maximum(x_before, 0) + 1) * 2)
    np.testing.assert_array_equal(x, x_before)  # Relu reads a feed: never written in place
    assert inplace_log == [("add", True), ("mul", True)]


def test_fetched_intermediates_are_not_overwritten(inplace_log: list) -> None:
    sess = _unoptimized(_chain())
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    a, y = sess.run(["a", "y"], {"x": x, "b": np.ones(3, np.float32)})
    np.testing.assert_array_equal(a, np.maximum(x, 0))
    np.testing.assert_allclose(y, (np.maximum(x, 0) + 1) * 2)
    assert ("add", True) not in inplace_log  # 'a' is fetched: protected


def test_a_buffer_viewed_by_a_live_value_is_not_overwritten(inplace_log: list) -> None:
    # v = reshape(a) is a view of a's buffer; Add is a's last reader but v is still needed.
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Reshape", ["a", "shape"], ["v"], name="view"),
        helper.make_node("Add", ["a", "b"], ["c"], name="add"),
        helper.make_node("Reshape", ["c", "shape"], ["c2"], name="view2"),
        helper.make_node("Sub", ["v", "c2"], ["y"], name="sub"),
    ]
    model = make_model(
        nodes,
        [vinfo("x", shape=[2, 3]), vinfo("b", shape=[2, 3])],
        [vinfo("y")],
        {"shape": np.array([3, 2], np.int64)},
    )
    sess = _unoptimized(model)
    feeds = {
        "x": np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32),
        "b": np.full((2, 3), 5, np.float32),
    }
    got = sess.run(None, feeds)[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(got, np.full((3, 2), -5, np.float32))
    assert ("add", False) in inplace_log


def test_broadcasting_to_a_larger_shape_allocates(inplace_log: list) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Add", ["a", "big"], ["y"], name="add"),
    ]
    model = make_model(nodes, [vinfo("x", shape=[3]), vinfo("big", shape=[4, 3])], [vinfo("y")])
    x = np.array([-1, 0, 2], np.float32)
    big = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = _unoptimized(model).run(None, {"x": x, "big": big})[0]
    np.testing.assert_array_equal(y, np.maximum(x, 0) + big)
    assert inplace_log == [("add", False)]


def test_results_equal_onnxruntime_on_a_model_with_many_elementwise_steps() -> None:
    rng = np.random.default_rng(3)
    nodes, prev = [], "x"
    for i in range(12):
        op = ["Add", "Mul", "Sub", "Relu"][i % 4]
        ins = [prev] if op == "Relu" else [prev, f"k{i}"]
        nodes.append(helper.make_node(op, ins, [f"t{i}"]))
        prev = f"t{i}"
    inits = {f"k{i}": rng.standard_normal((4, 5)).astype(np.float32) for i in range(12)}
    model = make_model(nodes, [vinfo("x", TensorProto.FLOAT, [4, 5])], [vinfo(prev)], inits)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(3):  # repeated runs: no buffer carries state from one run to the next
        np.testing.assert_allclose(_unoptimized(model).run(None, {"x": x})[0], want, rtol=1e-6)


def test_broadcast_check_is_numpys_rule() -> None:
    """The in-place test's shape rule (plain Python, ~5 us cheaper a step than
    np.broadcast_shapes) agrees with numpy on every pair of small shapes."""
    import itertools

    from onnxpy.ops._compat import broadcasts_into

    dims = (0, 1, 2, 3)
    shapes = [s for r in range(4) for s in itertools.product(dims, repeat=r)]
    for small, big in itertools.product(shapes, shapes):
        try:
            want = np.broadcast_shapes(small, big) == big
        except ValueError:
            want = False
        assert broadcasts_into(small, big) == want, (small, big)
