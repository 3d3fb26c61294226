"""Edges of OrtValue / IOBinding / feeds found by a differential audit against onnxruntime 1.32:
sub-byte types bound by pointer, np.matrix feeds, the caller changing an array's shape after
binding it, and string tensors holding other objects."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import onnxpy
from tests.helpers import make_model, vinfo

F = TensorProto.FLOAT


def _session(nodes: list, inputs: list, outputs: list, mod=onnxpy, opset: int = 21) -> object:
    m = make_model(nodes, inputs, outputs, opset=opset, ir_version=10)
    return mod.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def test_int4_tensors_are_not_bound_by_pointer() -> None:
    # onnxruntime packs two int4 values to a byte, onnxpy one: a caller's buffer of onnxruntime's
    # size was read and written past its end. Refused, naming the way that works.
    sess = _session(
        [helper.make_node("DequantizeLinear", ["X", "s"], ["Y"])],
        [vinfo("X", TensorProto.INT4, [4]), vinfo("s", F, [])],
        [vinfo("Y", F, [4])],
    )
    io = sess.io_binding()
    packed = np.zeros(2, np.uint8)
    for bind in (
        lambda: io.bind_input("X", "cpu", 0, TensorProto.INT4, [4], packed.ctypes.data),
        lambda: io.bind_output("X", "cpu", 0, TensorProto.INT4, [4], packed.ctypes.data),
    ):
        with pytest.raises(onnxpy.InvalidArgument, match="int4 tensors cannot be bound by pointer.*bind a numpy array"):
            bind()
    x = np.array([1, 2, 3, 4], ml_dtypes.int4)
    io.bind_cpu_input("X", x)  # an array holds one value per byte: fine
    io.bind_cpu_input("s", np.array(0.5, np.float32))
    io.bind_output("Y")
    sess.run_with_iobinding(io)
    assert io.get_outputs()[0].numpy().tolist() == [0.5, 1.0, 1.5, 2.0]


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_a_matrix_feed_is_read_as_a_plain_array() -> None:
    # np.matrix keeps two dimensions through every reduction: Reshape to [4] gave [1, 4], and
    # ReduceSum failed on matrix.sum's signature.
    nodes = [
        helper.make_node("Reshape", ["X", "shape"], ["R"]),
        helper.make_node("ReduceSum", ["X"], ["S"], keepdims=0),
    ]
    inputs, outputs = [vinfo("X", F, [2, 2]), vinfo("shape", TensorProto.INT64, [1])], [vinfo("R", F), vinfo("S", F)]
    x = np.matrix([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    feeds = {"X": x, "shape": np.array([4], np.int64)}
    want = _session(nodes, inputs, outputs, onnxruntime, opset=17).run(None, feeds)
    got = _session(nodes, inputs, outputs, opset=17).run(None, feeds)
    assert [type(g) for g in got] == [np.ndarray, np.ndarray]
    assert [g.shape for g in got] == [w.shape for w in want] == [(4,), ()]
    io = _session(nodes, inputs, outputs, opset=17).io_binding()
    io.bind_cpu_input("X", x)
    assert io._inputs["X"].shape() == [2, 2] and type(io._inputs["X"].numpy()) is np.ndarray


def test_changing_an_arrays_shape_after_binding_changes_nothing_bound() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    value = onnxpy.OrtValue.ortvalue_from_numpy(a)
    sess = _session([helper.make_node("Neg", ["X"], ["Y"])], [vinfo("X", F, None)], [vinfo("Y", F)], opset=17)
    io = sess.io_binding()
    io.bind_cpu_input("X", a)
    io.bind_output("Y")
    a.shape = (3, 2)  # the caller's object, reshaped in place
    assert value.shape() == [2, 3]
    sess.run_with_iobinding(io)
    result = io.get_outputs()[0]
    assert result.shape() == [2, 3]
    view = result.numpy()
    view.shape = (6,)
    assert result.shape() == [2, 3]  # numpy() hands out a new array object over the same memory
    a[0, 0] = 42.0  # the memory itself is still shared: the next run reads it
    sess.run_with_iobinding(io)
    assert io.get_outputs()[0].numpy()[0, 0] == -42.0


def test_string_feeds_holding_other_objects_become_their_str() -> None:
    m = make_model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [vinfo("x", TensorProto.STRING, [None])],
        [vinfo("y", TensorProto.STRING)],
    ).SerializeToString()
    x = np.array(["a", 1, None, 2.5], dtype=object)
    want = onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxpy.InferenceSession(m).run(None, {"x": x})[0]
    assert got.tolist() == want.tolist() == ["a", "1", "None", "2.5"]
    assert x.tolist() == ["a", 1, None, 2.5]  # the caller's array is left as it was
    for element_type in (np.str_, str, np.dtype("U5"), object):
        v = onnxpy.OrtValue.ortvalue_from_shape_and_type([2], element_type)
        assert v.data_type() == "tensor(string)" and v.numpy().dtype == object
        assert onnxpy.InferenceSession(m).run(None, {"x": v.numpy()})[0].tolist() == ["", ""]
