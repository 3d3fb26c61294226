"""Feeds of sequence and optional inputs against onnxruntime: an OrtValue of the wrong kind (a
tensor for a sequence, a sequence for a tensor) or of the wrong element type is refused at the
feed, an optional input may be left out, and NodeArg and OrtValue report what onnxruntime does."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import onnxpy

A = np.arange(6, dtype=np.float32).reshape(2, 3)


def _model(nodes: list, inputs: list, outputs: list) -> bytes:
    g = oh.make_graph(nodes, "g", inputs, outputs)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 18)], ir_version=8).SerializeToString()


def _identities() -> bytes:
    return _model(
        [oh.make_node("Identity", ["s"], ["s2"]), oh.make_node("Identity", ["x"], ["y"])],
        [oh.make_tensor_sequence_value_info("s", TP.FLOAT, None), oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
        [oh.make_tensor_sequence_value_info("s2", TP.FLOAT, None), oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])],
    )


def _sequence_value(mod, dtype: type) -> object:
    """A sequence OrtValue of two rows, made by each runtime's own SplitToSequence."""
    et = TP.FLOAT if dtype is np.float32 else TP.INT64
    m = _model(
        [oh.make_node("SplitToSequence", ["x"], ["q"], axis=0)],
        [oh.make_tensor_value_info("x", et, None)],
        [oh.make_tensor_sequence_value_info("q", et, None)],
    )
    sess = mod.InferenceSession(m, providers=["CPUExecutionProvider"])
    return sess.run_with_ort_values(None, {"x": mod.OrtValue.ortvalue_from_numpy(A.astype(dtype))})[0]


@pytest.mark.parametrize("mod", [onnxruntime, onnxpy], ids=["onnxruntime", "onnxpy"])
def test_an_ortvalue_of_the_wrong_kind_is_refused_at_the_feed(mod) -> None:
    sess = mod.InferenceSession(_identities(), providers=["CPUExecutionProvider"])
    tensor = mod.OrtValue.ortvalue_from_numpy(A)
    for feeds in (
        {"s": tensor, "x": tensor},  # a tensor for the sequence input
        {"s": _sequence_value(mod, np.float32), "x": _sequence_value(mod, np.float32)},  # a sequence for x
        {"s": _sequence_value(mod, np.int64), "x": tensor},  # seq(int64) for seq(float)
    ):
        with pytest.raises(Exception) as err:
            sess.run_with_ort_values(None, feeds)
        if mod is onnxpy:
            assert isinstance(err.value, onnxpy.InvalidArgument)
            assert "input 's'" in str(err.value) or "input 'x'" in str(err.value)
    if mod is onnxpy:
        with pytest.raises(
            onnxpy.InvalidArgument, match=r"input 's' is seq\(tensor\(float\)\): got an OrtValue holding a tensor"
        ):
            sess.run(None, {"s": tensor, "x": A})


def test_a_sequence_ortvalue_of_the_right_type_runs() -> None:
    sess = onnxpy.InferenceSession(_identities())
    seq = _sequence_value(onnxpy, np.float32)
    s2, y = sess.run_with_ort_values(None, {"s": seq, "x": onnxpy.OrtValue.ortvalue_from_numpy(A)})
    assert s2.is_tensor_sequence() and [v.tolist() for v in s2.numpy()] == [[A[0].tolist()], [A[1].tolist()]]
    np.testing.assert_array_equal(y.numpy(), A)


def test_sequence_ortvalue_reports_its_element_type() -> None:
    for mod in (onnxruntime, onnxpy):
        assert _sequence_value(mod, np.int64).element_type() == TP.INT64
        assert _sequence_value(mod, np.float32).element_type() == TP.FLOAT


def _optional_model() -> bytes:
    def opt(name: str, shape: list) -> object:
        return oh.make_value_info(name, oh.make_optional_type_proto(oh.make_tensor_type_proto(TP.FLOAT, shape)))

    return _model(
        [oh.make_node("OptionalHasElement", ["o"], ["h"]), oh.make_node("Identity", ["o"], ["p"])],
        [opt("o", [2, 3])],
        [oh.make_tensor_value_info("h", TP.BOOL, []), opt("p", [2, "N"])],
    )


def test_an_optional_input_left_out_runs_as_empty() -> None:
    m = _optional_model()
    want = onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {})
    sess = onnxpy.InferenceSession(m)
    for _ in range(2):  # the first run and the cached plan's
        got = sess.run(None, {})
        assert [bool(got[0]), got[1]] == [bool(want[0]), want[1]] == [False, None]
    h, p = sess.run(None, {"o": A})
    assert bool(h) and np.array_equal(p, A)


def test_optional_nodeargs_report_the_shape_they_hold() -> None:
    m = _optional_model()
    theirs = onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"])
    ours = onnxpy.InferenceSession(m)
    for get in ("get_inputs", "get_outputs"):
        want = [(a.name, a.type, a.shape) for a in getattr(theirs, get)()]
        assert [(a.name, a.type, a.shape) for a in getattr(ours, get)()] == want
    assert ours.get_inputs()[0].shape == [2, 3]
