"""Every error names what is wrong and what was expected, uses onnxruntime's exception class
names, and leaves the session usable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from tests.helpers import make_model, vinfo


@pytest.fixture
def sess() -> onnxpy.InferenceSession:
    nodes = [
        helper.make_node("Add", ["x", "b"], ["y"], name="adder"),
        helper.make_node("Reshape", ["y", "shape"], ["out"], name="reshaper"),
    ]
    m = make_model(
        nodes,
        [
            vinfo("x", TensorProto.FLOAT, ["n", 4]),
            vinfo("b", TensorProto.FLOAT, [4]),
            vinfo("shape", TensorProto.INT64, [2]),
        ],
        [vinfo("out", TensorProto.FLOAT, None)],
    )
    return onnxpy.InferenceSession(m)


def _good() -> dict[str, np.ndarray]:
    return {"x": np.ones((2, 4), np.float32), "b": np.ones(4, np.float32), "shape": np.array([4, 2], np.int64)}


def _still_works(sess: onnxpy.InferenceSession) -> None:
    out = sess.run(None, _good())[0]
    assert out.shape == (4, 2) and np.all(out == 2)


def test_all_exception_classes_share_one_base() -> None:
    for name in (
        "Fail",
        "InvalidArgument",
        "NoSuchFile",
        "NoModel",
        "EngineError",
        "RuntimeException",
        "InvalidProtobuf",
        "ModelLoaded",
        "NotImplemented",
        "InvalidGraph",
        "EPFail",
    ):
        cls = getattr(onnxpy, name)
        assert issubclass(cls, onnxpy.OnnxpyError), name
    assert issubclass(onnxpy.InvalidArgument, ValueError)


def test_unknown_input_name_lists_valid_names(sess: onnxpy.InferenceSession) -> None:
    feeds = _good()
    feeds["z"] = feeds.pop("x")
    with pytest.raises(onnxpy.InvalidArgument) as e:
        sess.run(None, feeds)
    assert "'z'" in str(e.value) and "['x', 'b', 'shape']" in str(e.value)
    _still_works(sess)


def test_missing_input_is_named(sess: onnxpy.InferenceSession) -> None:
    feeds = _good()
    del feeds["b"]
    with pytest.raises(onnxpy.InvalidArgument, match=r"Required inputs \(\['b'\]\) are missing"):
        sess.run(None, feeds)
    _still_works(sess)


def test_wrong_dtype_names_input_got_and_expected(sess: onnxpy.InferenceSession) -> None:
    feeds = _good()
    feeds["x"] = feeds["x"].astype(np.float64)
    with pytest.raises(onnxpy.InvalidArgument) as e:
        sess.run(None, feeds)
    msg = str(e.value)
    assert "'x'" in msg and "tensor(double)" in msg and "expected: (tensor(float))" in msg
    _still_works(sess)


def test_wrong_rank_names_input_got_and_expected(sess: onnxpy.InferenceSession) -> None:
    feeds = _good()
    feeds["x"] = np.ones((2, 4, 1), np.float32)
    with pytest.raises(onnxpy.InvalidArgument, match="Invalid rank for input: x Got: 3 Expected: 2"):
        sess.run(None, feeds)
    _still_works(sess)


def test_wrong_fixed_dimension_names_index_got_and_expected(sess: onnxpy.InferenceSession) -> None:
    feeds = _good()
    feeds["x"] = np.ones((2, 5), np.float32)
    with pytest.raises(onnxpy.InvalidArgument, match="input: x .*index: 1 Got: 5 Expected: 4"):
        sess.run(None, feeds)
    _still_works(sess)


def test_unknown_output_name_lists_valid_outputs(sess: onnxpy.InferenceSession) -> None:
    with pytest.raises(onnxpy.InvalidArgument) as e:
        sess.run(["nope"], _good())
    assert "nope" in str(e.value) and "['out']" in str(e.value)
    _still_works(sess)


def test_kernel_failure_names_node_name_and_op_type(sess: onnxpy.InferenceSession) -> None:
    feeds = _good()
    feeds["shape"] = np.array([3, 3], np.int64)
    with pytest.raises(onnxpy.RuntimeException) as e:
        sess.run(None, feeds)
    msg = str(e.value)
    assert "reshaper" in msg and "Reshape" in msg and "[2, 4]" in msg
    _still_works(sess)


def test_unsupported_operator_names_domain_op_and_opset() -> None:
    m = make_model(
        [helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")],
        [vinfo("x", TensorProto.FLOAT, [2])],
        [vinfo("y", TensorProto.FLOAT, [2])],
        extra_opsets={"com.example": 3},
    )
    with pytest.raises(onnxpy.NotImplemented) as e:
        onnxpy.InferenceSession(m)
    msg = str(e.value)
    assert "FancyOp" in msg and "com.example" in msg and "3" in msg


def test_missing_file_and_garbage_bytes(tmp_path: Path) -> None:
    with pytest.raises(onnxpy.NoSuchFile, match="does not exist"):
        onnxpy.InferenceSession(str(tmp_path / "missing.onnx"))
    with pytest.raises(onnxpy.InvalidProtobuf):
        onnxpy.InferenceSession(b"\x08\x07garbage\xff\xff\xff")
    with pytest.raises(onnxpy.InvalidProtobuf, match="empty"):
        onnxpy.InferenceSession(b"")
    with pytest.raises(onnxpy.InvalidArgument, match="expected a path"):
        onnxpy.InferenceSession(12345)


def test_too_new_ir_or_opset_is_refused() -> None:
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, [2])],
        [vinfo("y", TensorProto.FLOAT, [2])],
    )
    m.ir_version = onnx.IR_VERSION + 1
    with pytest.raises(onnxpy.InvalidGraph, match="IR version"):
        onnxpy.InferenceSession(m)
    m.ir_version = 8
    m.opset_import[0].version = onnx.defs.onnx_opset_version() + 1
    with pytest.raises(onnxpy.InvalidGraph, match="newer than the newest supported"):
        onnxpy.InferenceSession(m)


def test_graph_errors_at_creation_name_the_node() -> None:
    undefined = make_model(
        [helper.make_node("Relu", ["ghost"], ["y"], name="r")],
        [vinfo("x", TensorProto.FLOAT, [2])],
        [vinfo("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(onnxpy.InvalidGraph, match="node 'r' .*reads 'ghost'"):
        onnxpy.InferenceSession(undefined)
    cycle = make_model(
        [helper.make_node("Relu", ["b"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["b"], name="second")],
        [vinfo("x", TensorProto.FLOAT, [2])],
        [vinfo("a", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(onnxpy.InvalidGraph, match="cycle"):
        onnxpy.InferenceSession(cycle)
    twice = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="one"), helper.make_node("Neg", ["x"], ["y"], name="two")],
        [vinfo("x", TensorProto.FLOAT, [2])],
        [vinfo("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(onnxpy.InvalidGraph, match="produced by two nodes"):
        onnxpy.InferenceSession(twice)


def test_bad_attribute_type_is_named() -> None:
    node = helper.make_node("Softmax", ["x"], ["y"], name="sm")
    node.attribute.append(helper.make_attribute("axis", 1.5))
    m = make_model([node], [vinfo("x", TensorProto.FLOAT, [2, 2])], [vinfo("y", TensorProto.FLOAT, [2, 2])])
    with pytest.raises(onnxpy.InvalidGraph, match="attribute 'axis' has type FLOAT.*declares INT"):
        onnxpy.InferenceSession(m)


def test_missing_required_attribute_is_named() -> None:
    m = make_model(
        [helper.make_node("Cast", ["x"], ["y"], name="caster")],
        [vinfo("x", TensorProto.FLOAT, [2])],
        [vinfo("y", TensorProto.INT64, [2])],
    )
    with pytest.raises(onnxpy.InvalidGraph, match="caster.*missing required attribute.*'to'"):
        onnxpy.InferenceSession(m)


def test_initializer_whose_data_disagree_with_its_shape() -> None:
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, [4])],
        [vinfo("y", TensorProto.FLOAT, [4])],
        initializers={"w": np.ones(4, np.float32)},
    )
    m.graph.initializer[0].dims[:] = [5]
    with pytest.raises(onnxpy.Fail, match="'w'"):
        onnxpy.InferenceSession(m)


# -- arguments of the wrong kind: named, never coerced silently ----------------------------------


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("graph_optimization_level", 5, "ORT_ENABLE_ALL \\(99\\)"),
        ("graph_optimization_level", "2", "ORT_DISABLE_ALL \\(0\\)"),
        ("execution_mode", 7, "ORT_PARALLEL \\(1\\)"),
        ("execution_order", -1, "PRIORITY_BASED \\(1\\)"),
        ("log_severity_level", 9, "from 0 \\(verbose\\) to 4 \\(fatal\\)"),
        ("intra_op_num_threads", "4", "an int >= 0"),
        ("intra_op_num_threads", 2.5, "an int >= 0"),
        ("inter_op_num_threads", -1, "an int >= 0"),
        ("enable_profiling", "yes", "True or False"),
        ("enable_cpu_mem_arena", "no", "True or False"),  # "no" would have been true
        ("profile_file_prefix", 3, "a string"),
    ],
)
def test_session_options_refuse_bad_values_naming_the_option(option: str, value: object, expected: str) -> None:
    so = onnxpy.SessionOptions()
    before = getattr(so, option)
    with pytest.raises(onnxpy.InvalidArgument, match=rf"SessionOptions\.{option} must be .*{expected}.*got {value!r}"):
        setattr(so, option, value)
    assert getattr(so, option) == before


def test_session_options_take_enum_values_as_ints() -> None:
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = 1
    so.execution_mode = 1
    assert so.graph_optimization_level is onnxpy.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.execution_mode is onnxpy.ExecutionMode.ORT_PARALLEL
    assert "ORT_ENABLE_BASIC" in repr(so)
    ro = onnxpy.RunOptions()
    with pytest.raises(onnxpy.InvalidArgument, match=r"RunOptions\.log_severity_level"):
        ro.log_severity_level = 5
    with pytest.raises(onnxpy.InvalidArgument, match=r"RunOptions\.terminate must be True or False, got 'false'"):
        ro.terminate = "false"  # type: ignore[assignment]
    assert ro.terminate is False
    with pytest.raises(
        onnxpy.InvalidArgument, match="string key and a string value, got 'session.check_nan_inf' and 1"
    ):
        so.add_session_config_entry("session.check_nan_inf", 1)  # type: ignore[arg-type]
    with pytest.raises(onnxpy.InvalidArgument, match="the value for 'batch' must be an int >= 0, got 2.7"):
        so.add_free_dimension_override_by_name("batch", 2.7)  # type: ignore[arg-type]
    so.enable_profiling = 1  # 0 and 1 are fine
    assert so.enable_profiling is True


def test_arguments_of_the_wrong_kind_are_named(sess: onnxpy.InferenceSession) -> None:
    with pytest.raises(onnxpy.InvalidArgument, match="run_options must be a RunOptions .*got dict"):
        sess.run(None, _good(), {})  # type: ignore[arg-type]
    with pytest.raises(onnxpy.InvalidArgument, match="run_options must be a RunOptions"):
        sess.run_with_iobinding(sess.io_binding(), 5)  # type: ignore[arg-type]
    with pytest.raises(
        onnxpy.InvalidArgument, match=r"output_names must be a list .*the string 'out'; write \['out'\]"
    ):
        sess.run("out", _good())  # type: ignore[arg-type]
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vinfo("x")], [vinfo("y")])
    with pytest.raises(onnxpy.InvalidArgument, match=r"'providers' must be a list .*write \['CPUExecutionProvider'\]"):
        onnxpy.InferenceSession(m, providers="CPUExecutionProvider")  # type: ignore[arg-type]
    with pytest.raises(onnxpy.InvalidArgument, match="'provider_options' must be a list of dicts"):
        onnxpy.InferenceSession(m, providers=["CPUExecutionProvider"], provider_options=["x"])  # type: ignore[list-item]
    _still_works(sess)


def test_devices_and_shapes_of_the_wrong_kind_are_named(sess: onnxpy.InferenceSession) -> None:
    io = sess.io_binding()
    with pytest.raises(onnxpy.InvalidArgument, match="device id must be an int >= 0, got 'abc'"):
        io.bind_output("out", "cpu", "abc")  # type: ignore[arg-type]
    with pytest.raises(onnxpy.InvalidArgument, match="unsupported device type 'tpu'"):
        io.bind_output("out", "tpu")
    for shape in ([2.5, 3], "23", 5):
        with pytest.raises(onnxpy.InvalidArgument, match="shape must be a sequence of ints"):
            onnxpy.OrtValue.ortvalue_from_shape_and_type(shape, np.float32)  # type: ignore[arg-type]
    with pytest.raises(onnxpy.InvalidArgument, match="ortvalue_from_numpy: got None"):
        onnxpy.OrtValue.ortvalue_from_numpy(None)
    with pytest.raises(onnxpy.Fail, match=r"cannot allocate \d+ bytes for shape \[1048576, 1048576, 1048576\]"):
        onnxpy.OrtValue.ortvalue_from_shape_and_type([1 << 20] * 3, np.float32)
    _still_works(sess)


def test_from_dlpack_refuses_non_contiguous_tensors() -> None:
    # data_ptr() and the shape are the whole description of an OrtValue (onnxruntime refuses
    # these too: "ORT only supports contiguous tensor")
    for a in (np.arange(6, dtype=np.float32)[::-1], np.arange(6, dtype=np.float32).reshape(2, 3).T):
        with pytest.raises(onnxpy.InvalidArgument, match="from_dlpack: the tensor must be C-contiguous"):
            onnxpy.OrtValue.from_dlpack(a)


def test_a_profile_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    so = onnxpy.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "missing" / "trace")
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vinfo("x", TensorProto.FLOAT, [2])], [vinfo("y")])
    s = onnxpy.InferenceSession(m, so)
    s.run(None, {"x": np.ones(2, np.float32)})
    with pytest.raises(onnxpy.NoSuchFile, match="end_profiling could not write the trace.*missing"):
        s.end_profiling()
