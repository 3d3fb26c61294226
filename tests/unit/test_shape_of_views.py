"""The shape-of-views pass: a Shape read through a Transpose, Reshape, Expand, Unsqueeze or
Squeeze is computed from the node's input, so nodes kept alive only by Shape readers disappear.
Checked against onnxruntime and the unoptimized graph, for several input shapes."""

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


def _expand_model(opset: int = 17, data_reader: bool = False, **shape_attrs: int) -> onnx.ModelProto:
    """y = Relu(x) of shape (a, b, c); outputs the shapes of u = Unsqueeze(y, [1, -1]) (a, 1, b,
    c, 1), of e = Expand(u, [2, 1, 3, 1, 2, 1]) (2, a, 3, b, 2, 1: a new axis, both sides
    broadcast; c must be 1 or 2) with Shape's start/end when given, and of Squeeze(e, [-1]) and
    Squeeze(e) (every axis of size 1). Before opset 13 the axes are attributes.
    ``data_reader``: a Neg reads e too."""
    axes = {"u": [1, -1], "s": [-1]}
    inits = {"widths": np.array([2, 1, 3, 1, 2, 1], np.int64)}
    if opset >= 13:
        inits |= {f"{k}_axes": np.array(v, np.int64) for k, v in axes.items()}
        unsqueeze = helper.make_node("Unsqueeze", ["y", "u_axes"], ["u"])
        squeeze = helper.make_node("Squeeze", ["e", "s_axes"], ["s"])
    else:
        unsqueeze = helper.make_node("Unsqueeze", ["y"], ["u"], axes=axes["u"])
        squeeze = helper.make_node("Squeeze", ["e"], ["s"], axes=axes["s"])
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        unsqueeze,
        helper.make_node("Expand", ["u", "widths"], ["e"], name="widen"),
        squeeze,
        helper.make_node("Squeeze", ["e"], ["s_all"]),
        helper.make_node("Shape", ["u"], ["u_shape"]),
        helper.make_node("Shape", ["e"], ["e_shape"], **shape_attrs),
        helper.make_node("Shape", ["s"], ["s_shape"]),
        helper.make_node("Shape", ["s_all"], ["s_all_shape"]),
    ]
    outputs = [vinfo(f"{n}_shape", I64, None) for n in ("u", "e", "s", "s_all")]
    if data_reader:
        nodes.append(helper.make_node("Neg", ["e"], ["e_neg"]))
        outputs.append(vinfo("e_neg", TensorProto.FLOAT, None))
    return make_model(nodes, [vinfo("x", shape=["a", "b", "c"])], outputs, inits, opset=opset)


@pytest.mark.parametrize("window", [{}, {"start": 1}, {"start": -3, "end": -1}], ids=str)
def test_shapes_through_unsqueeze_expand_and_squeeze_lose_them(window: dict[str, int]) -> None:
    model = _expand_model(**window)
    # the shapes are worked out in one memo node (the shape ops among its members)
    assert _ops(model) == {"Relu": 1, "ShapeMemo": 1}
    _check(model, [(2, 3, 2), (1, 1, 1), (2, 3, 2), (4, 1, 2)])


def test_axes_given_as_attributes_before_opset_13() -> None:
    model = _expand_model(opset=11)
    assert _ops(model) == {"Relu": 1, "ShapeMemo": 1}
    _check(model, [(2, 3, 2), (1, 1, 1), (3, 2, 1)])


def test_an_expand_with_a_data_reader_stays() -> None:
    model = _expand_model(data_reader=True)
    ops = _ops(model)
    assert ops["Expand"] == 1 and ops["Unsqueeze"] == 1 and "Squeeze" not in ops
    _check(model, [(2, 3, 2), (1, 1, 1)])


def test_an_expand_that_cannot_broadcast_still_fails_the_run_naming_it() -> None:
    model = _expand_model()
    assert "Expand" not in _ops(model)
    sess = onnxpy.InferenceSession(model.SerializeToString())
    with pytest.raises(
        onnxpy.OnnxpyError, match=r"'widen \(shape\)'.*cannot expand shape \[2, 1, 3, 5, 1\] to \[2, 1, 3, 1, 2, 1\]"
    ):
        sess.run(None, {"x": np.zeros((2, 3, 5), np.float32)})  # 5 columns: neither 1 nor 2


def test_squeezing_an_axis_that_is_not_1_still_fails_the_run() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("Squeeze", ["y", "axes"], ["s"], name="flatten"),
        helper.make_node("Shape", ["s"], ["s_shape"]),
    ]
    inits = {"axes": np.array([1], np.int64)}
    model = make_model(nodes, [vinfo("x", shape=["a", "b", "c"])], [vinfo("s_shape", I64, None)], inits)
    assert "Squeeze" not in _ops(model)
    _check(model, [(2, 1, 3)])
    sess = onnxpy.InferenceSession(model.SerializeToString())
    with pytest.raises(onnxpy.OnnxpyError, match=r"'flatten \(shape\)'.*cannot squeeze axis 1 of shape \[2, 4, 3\]"):
        sess.run(None, {"x": np.zeros((2, 4, 3), np.float32)})
