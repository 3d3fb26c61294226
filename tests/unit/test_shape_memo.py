"""The shape-memo pass: shape computations run once per input shape, then come from a cache."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.rewrite import FUSED_DOMAIN
from tests.helpers import make_model, run_in_threads, vinfo

I64 = TensorProto.INT64


def _flatten_by_shape_model() -> onnx.ModelProto:
    """y = reshape(x, [batch, -1]) * 2 and z = reshape(y, shape(x)): the targets are computed
    from shape(x) at run time (Shape -> Gather -> Unsqueeze -> Concat), as exporters write them;
    the second chain reads the shape of a value computed after the first memo's output."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Mul", ["flat", "two"], ["y"]),
        helper.make_node("Shape", ["y"], ["ys"]),
        helper.make_node("Gather", ["ys", "one"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "b1"], ["swap"], axis=0),
        helper.make_node("Reshape", ["y", "swap"], ["z"]),
    ]
    inits = {
        "zero": np.array(0, np.int64),
        "one": np.array(1, np.int64),
        "axes0": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
        "two": np.array(2, np.float32),
    }
    return make_model(nodes, [vinfo("x", shape=["B", "H", "W"])], [vinfo("y"), vinfo("z")], inits)


def test_shape_chains_become_memo_nodes_with_correct_results_for_each_shape() -> None:
    model = _flatten_by_shape_model()
    sess = onnxpy.InferenceSession(model)
    assert "memoize_shapes" in sess._applied_passes
    memos = [n for n in sess._compiled.graph.nodes if n.op_type == "ShapeMemo"]
    # One memo per chain: x's shape, and the swap target, keyed by x's and y's shapes (y exists
    # only after the first memo's Reshape); y's own Shape/Gather/Unsqueeze feed only the swap's
    # Concat, so they run inside that memo rather than as a third one.
    assert len(memos) == 2 and all(n.domain == FUSED_DOMAIN for n in memos)
    assert sorted(tuple(n.inputs[: n.attrs["keyed"]]) for n in memos) == [("x",), ("x", "y")]
    ops = {n.op_type for n in sess._compiled.graph.nodes}
    assert not ops & {"Gather", "Unsqueeze", "Shape", "Concat"}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    shapes = [(2, 3, 4), (5, 1, 2), (2, 3, 4), (1, 7, 3), (5, 1, 2)]
    for shape in shapes:  # shapes come back: cached entries must not leak between shapes
        x = rng.standard_normal(shape).astype(np.float32)
        got = sess.run(None, {"x": x})
        want = ref.run(None, {"x": x})
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_array_equal(g, w)


def test_each_memo_runs_its_body_once_per_distinct_shape() -> None:
    sess = onnxpy.InferenceSession(_flatten_by_shape_model())
    for shape in [(2, 3, 4), (2, 3, 4), (4, 3, 2), (2, 3, 4)]:
        sess.run(None, {"x": np.ones(shape, np.float32)})
    steps = [s for s in sess._compiled.plan.steps if s.op_type == "ShapeMemo"]
    assert steps
    for step in steps:
        body = step.fn.keywords["body"]
        assert len(body.shape_memo) == 2  # two distinct shapes seen
        for outs in body.shape_memo.values():
            assert all(not o.flags.writeable for o in outs)


def test_memoized_values_returned_as_outputs_are_the_callers_own() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
        helper.make_node("Concat", ["b1", "b1"], ["shape_out"], axis=0),
    ]
    inits = {"zero": np.array(0, np.int64), "axes0": np.array([0], np.int64)}
    model = make_model(nodes, [vinfo("x", shape=["B", 2])], [vinfo("shape_out", I64)], inits)
    sess = onnxpy.InferenceSession(model)
    first = sess.run(None, {"x": np.ones((3, 2), np.float32)})[0]
    assert first.flags.writeable
    first[:] = 99  # the caller may write into what it got...
    again = sess.run(None, {"x": np.ones((3, 2), np.float32)})[0]
    np.testing.assert_array_equal(again, [3, 3])  # ...without changing later results


def test_random_ops_and_small_chains_are_left_alone() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["zeros"]),
        helper.make_node("RandomUniformLike", ["zeros"], ["r"], dtype=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "r"], ["y"]),
    ]
    model = make_model(nodes, [vinfo("x", shape=["B", 3])], [vinfo("y")])
    sess = onnxpy.InferenceSession(model)
    assert not any(n.op_type == "ShapeMemo" for n in sess._compiled.graph.nodes)
    a = sess.run(None, {"x": np.zeros((4, 3), np.float32)})[0]
    b = sess.run(None, {"x": np.zeros((4, 3), np.float32)})[0]
    assert not np.array_equal(a, b)  # the random op still draws anew each run


def test_disabled_below_extended_level_and_written_to_optimized_models(tmp_path) -> None:
    model = _flatten_by_shape_model()
    basic = onnxpy.SessionOptions()
    basic.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert "memoize_shapes" not in onnxpy.InferenceSession(model, basic)._applied_passes
    so = onnxpy.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    want = onnxpy.InferenceSession(model, so).run(None, {"x": x})
    saved = onnx.load(str(tmp_path / "opt.onnx"))
    assert any(n.op_type == "ShapeMemo" for n in saved.graph.node)
    got = onnxpy.InferenceSession(saved).run(None, {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_concurrent_runs_with_many_shapes_fill_and_evict_the_memo_safely(monkeypatch) -> None:

    from onnxpy.ops import fused

    monkeypatch.setattr(fused, "SHAPE_MEMO_ENTRIES", 3)  # force eviction while threads race
    model = _flatten_by_shape_model()
    sess = onnxpy.InferenceSession(model)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    shapes = [(b, h, 2) for b in (1, 2, 3) for h in (1, 2, 3)]
    failures: list[str] = []

    def worker(tid: int) -> None:
        rng = np.random.default_rng(tid)
        for i in range(60):
            shape = shapes[(tid + i) % len(shapes)]
            x = rng.standard_normal(shape).astype(np.float32)
            got = sess.run(None, {"x": x})
            want = ref.run(None, {"x": x})
            if any(g.shape != w.shape or not np.array_equal(g, w) for g, w in zip(got, want)):
                failures.append(f"thread {tid} shape {shape}")

    run_in_threads(worker, 6)
    assert not failures


def test_memos_whose_outputs_are_scalars_are_cached_too() -> None:
    # x / x.shape[0]: the group's output is a 0-d value, which numpy hands back as a scalar
    # (np.float32), not an array. Swin-T's memos (its windows' attention masks among them)
    # were recomputed on every run because of such outputs: 12 ms of a 122 ms run.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["one", "nf"], ["inv"]),
        helper.make_node("Mul", ["x", "inv"], ["y"]),
    ]
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.float32)}
    model = make_model(nodes, [vinfo("x", shape=["B", 3])], [vinfo("y")], inits)
    sess = onnxpy.InferenceSession(model)
    steps = [s for s in sess._compiled.plan.steps if s.op_type == "ShapeMemo"]
    assert len(steps) == 1
    for rows in (4, 4, 5):
        x = np.full((rows, 3), 2.0, np.float32)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, x / rows)
    body = steps[0].fn.keywords["body"]
    assert len(body.shape_memo) == 2  # both shapes cached
    for outs in body.shape_memo.values():
        assert all(isinstance(o, np.ndarray) and not o.flags.writeable for o in outs)
