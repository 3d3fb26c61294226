"""The shape-of-views pass: a Shape read through a Transpose or Reshape is computed from the
view's input, so views kept alive only by Shape readers disappear. Checked against onnxruntime
and the unoptimized graph, for several input shapes."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import make_model, vinfo

I64 = TensorProto.INT64


def _ops(model: onnx.ModelProto) -> collections.Counter[str]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return collections.Counter(n.op_type for n in graph.nodes)


def _check(model: onnx.ModelProto, shapes: list[tuple[int, ...]]) -> None:
    data = model.SerializeToString()
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess, plain = onnxpy.InferenceSession(data), onnxpy.InferenceSession(data, plain_opts)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in shapes:  # shapes come back: memoized values must follow the shapes
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        for got, base, want in zip(sess.run(None, feeds), plain.run(None, feeds), ref.run(None, feeds)):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got, base)


def _views_model(reader: str = "", **shape_attrs: int) -> onnx.ModelProto:
    """y = Relu(x); outputs the shapes of Transpose(Reshape(y, [0, -1, 2]), perm) and of the
    Reshape itself (with Shape's start/end when given); ``reader`` also reads the Transpose."""
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("Reshape", ["y", "target"], ["r"], name="split"),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
        helper.make_node("Shape", ["t"], ["t_shape"], **shape_attrs),
        helper.make_node("Shape", ["r"], ["r_shape"], **shape_attrs),
    ]
    outputs = [vinfo("t_shape", I64, None), vinfo("r_shape", I64, None)]
    if reader:
        nodes.append(helper.make_node(reader, ["t"], ["t_out"]))
        outputs.append(vinfo("t_out", TensorProto.FLOAT, None))
    inits = {"target": np.array([0, -1, 2], np.int64)}
    return make_model(nodes, [vinfo("x", shape=["a", "b", "c"])], outputs, inits)


@pytest.mark.parametrize("window", [{}, {"start": 1}, {"start": -2, "end": -1}, {"end": 9}], ids=str)
def test_shapes_through_transpose_and_reshape_lose_the_views(window: dict[str, int]) -> None:
    model = _views_model(**window)
    ops = _ops(model)
    assert "Transpose" not in ops and "Reshape" not in ops
    assert ops["ShapeMemo"] >= 1  # the rewritten shape reads are memoized like any other
    _check(model, [(2, 3, 4), (1, 5, 2), (2, 3, 4), (3, 1, 6)])


def test_a_view_with_a_data_reader_stays() -> None:
    model = _views_model(reader="Neg")
    ops = _ops(model)
    assert ops["Transpose"] == 1 and ops["Reshape"] == 1
    _check(model, [(2, 3, 4), (1, 5, 2)])


def test_transpose_without_perm_reverses_the_axes() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("Transpose", ["y"], ["t"]),
        helper.make_node("Shape", ["t"], ["s"]),
    ]
    model = make_model(nodes, [vinfo("x", shape=["a", "b", "c"])], [vinfo("s", I64, None)])
    assert "Transpose" not in _ops(model)
    _check(model, [(2, 3, 4), (5, 1, 2)])


def test_a_bad_reshape_target_still_fails_the_run_naming_it() -> None:
    model = _views_model()
    sess = onnxpy.InferenceSession(model.SerializeToString())
    with pytest.raises(Exception, match=r"'split \(shape\)'.*cannot reshape \[2, 3, 5\] to \[0, -1, 2\]"):
        sess.run(None, {"x": np.zeros((2, 3, 5), np.float32)})  # 15 values per row: not in pairs
