"""onnxruntime's newer InferenceSession and SessionOptions methods, each compared with
onnxruntime where both run it: run_with_ortvaluevector, create_ortvalue_from_shape_and_type,
get_input_epdevices, get_provider_graph_assignment_info, release_captured_graph,
set_ep_dynamic_options, add_external_initializers_from_files_in_memory, add_provider,
set_load_cancellation_flag, set_provider_selection_policy_delegate and the EPContext data read
callback (refused). Plus a guard: every public method of onnxruntime's session, options, value
and binding classes exists in onnxpy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from tests.helpers import skip_before_onnxruntime

LIBS = [pytest.param(onnxruntime, id="onnxruntime"), pytest.param(onnxpy, id="onnxpy")]
F = TensorProto.FLOAT
X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _needs(lib: Any, cls: str, method: str) -> None:
    """Skip where the installed onnxruntime (the oracle) predates ``cls.method``."""
    if not hasattr(getattr(lib, cls), method):
        skip_before_onnxruntime((1, 32), f"has no {cls}.{method}")


def _model(**meta: Any) -> bytes:
    """Z = X + Y, W = X * Y, all float [2, 3]."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "Y"], ["Z"]), helper.make_node("Mul", ["X", "Y"], ["W"])],
        "g",
        [helper.make_tensor_value_info(n, F, [2, 3]) for n in ("X", "Y")],
        [helper.make_tensor_value_info(n, F, [2, 3]) for n in ("Z", "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for key, value in meta.items():
        if key == "metadata":
            for k, v in value.items():
                model.metadata_props.add(key=k, value=v)
        else:
            setattr(model, key, value)
    return model.SerializeToString()


def _if_model() -> bytes:
    """Relu -> Identity -> Sigmoid, an If whose branches hold a node each, and an Add."""
    x = helper.make_tensor_value_info("X", F, [2, 3])
    then = helper.make_graph(
        [helper.make_node("Neg", ["X"], ["t"], name="neg_in_then")],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, [2, 3])],
    )
    other = helper.make_graph(
        [helper.make_node("Abs", ["X"], ["e"], name="abs_in_else")],
        "else",
        [],
        [helper.make_tensor_value_info("e", F, [2, 3])],
    )
    nodes = [
        helper.make_node("Relu", ["X"], ["r"], name="relu"),
        helper.make_node("Identity", ["r"], ["r2"], name="ident"),
        helper.make_node("Sigmoid", ["r2"], ["s"], name="sig"),
        helper.make_node("If", ["c"], ["i"], then_branch=then, else_branch=other, name="iff"),
        helper.make_node("Add", ["s", "i"], ["Y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [x, helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("Y", F, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


W = np.arange(12, dtype=np.float32).reshape(3, 4)
B = np.arange(4, dtype=np.float32)
WEIGHTS = W.tobytes() + B.tobytes()


def _external_model(location: str = "weights.bin") -> bytes:
    """Y = X @ W + B with W and B stored in the external file ``location`` (W at 0, B at 48)."""
    inits = []
    for name, arr, offset in (("W", W, 0), ("B", B, 48)):
        t = numpy_helper.from_array(np.zeros_like(arr), name)
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(arr.nbytes))):
            t.external_data.add(key=k, value=v)
        inits.append(t)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", F, [2, 3])],
        [helper.make_tensor_value_info("Y", F, [2, 4])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _session(lib: Any, model: bytes, options: Any = None) -> Any:
    return lib.InferenceSession(model, options, providers=["CPUExecutionProvider"])


# -- every method name ------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ["InferenceSession", "SessionOptions", "RunOptions", "OrtValue", "IOBinding"])
def test_every_public_method_of_onnxruntimes_class_exists_in_onnxpy(cls: str) -> None:
    theirs = [n for n in dir(getattr(onnxruntime, cls)) if not n.startswith("_")]
    assert theirs
    assert [n for n in theirs if not hasattr(getattr(onnxpy, cls), n)] == []


# -- run_with_ortvaluevector ------------------------------------------------------------------
def _ort_vector_run(fetch_names: list[str], prefilled: list[np.ndarray] | None = None) -> list[np.ndarray]:
    skip_before_onnxruntime((1, 32), "builds OrtDevice and OrtValueVector differently")
    C = onnxruntime.capi._pybind_state  # noqa: N806 - onnxruntime's usual name
    sess = _session(onnxruntime, _model())
    feeds = C.OrtValueVector()
    for a in (X, X + 1):
        feeds.push_back(onnxruntime.OrtValue.ortvalue_from_numpy(a)._ortvalue)
    fetches = C.OrtValueVector()
    for a in prefilled or []:
        fetches.push_back(onnxruntime.OrtValue.ortvalue_from_numpy(a)._ortvalue)
    cpu = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    sess.run_with_ortvaluevector(
        onnxruntime.RunOptions(), ["X", "Y"], feeds, fetch_names, fetches, [cpu] * len(fetch_names)
    )
    return [fetches[i].numpy() for i in range(len(fetch_names))]


def _feeds() -> list[onnxpy.OrtValue]:
    return [onnxpy.OrtValue.ortvalue_from_numpy(X), onnxpy.OrtValue.ortvalue_from_numpy(X + 1)]


def _cpu(n: int) -> list[onnxpy.OrtDevice]:
    return [onnxpy.OrtDevice.make("cpu", 0)] * n


def test_run_with_ortvaluevector_appends_results_to_empty_fetches() -> None:
    expected = _ort_vector_run(["W", "Z"])
    sess = _session(onnxpy, _model())
    fetches: list[onnxpy.OrtValue] = []
    assert sess.run_with_ortvaluevector(onnxpy.RunOptions(), ["X", "Y"], _feeds(), ["W", "Z"], fetches, _cpu(2)) is None
    assert [f.device_name() for f in fetches] == ["cpu", "cpu"]
    for got, want in zip(fetches, expected, strict=True):
        np.testing.assert_array_equal(got.numpy(), want)


def test_run_with_ortvaluevector_writes_into_preallocated_fetches() -> None:
    theirs = np.zeros((2, 3), np.float32)
    expected = _ort_vector_run(["Z"], [theirs])
    np.testing.assert_array_equal(theirs, expected[0])  # onnxruntime wrote into the buffer
    ours = np.zeros((2, 3), np.float32)
    target = onnxpy.OrtValue.ortvalue_from_numpy(ours)
    fetches = [target]
    _session(onnxpy, _model()).run_with_ortvaluevector(None, ["X", "Y"], _feeds(), ["Z"], fetches, _cpu(1))
    assert fetches[0] is target and target.data_ptr() == ours.ctypes.data
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(
    ("feed_names", "fetch_names", "fetch_count", "match"),
    [
        (["X"], ["Z"], 0, "feed names has 1 elements, but feed has 2 elements"),
        (["X", "Y"], [], 0, "At least one output should be requested"),
        (["X", "Y"], ["Z"], 2, "fetch names has 1 elements, but fetch has 2 elements"),
        (["X", "Q"], ["Z"], 0, "Invalid input name"),
        (["X", "Y"], ["Q"], 0, "Invalid output name"),
    ],
)
def test_run_with_ortvaluevector_refuses_what_onnxruntime_refuses(
    feed_names: list[str], fetch_names: list[str], fetch_count: int, match: str
) -> None:
    skip_before_onnxruntime((1, 32), "builds OrtDevice and OrtValueVector differently")
    C = onnxruntime.capi._pybind_state  # noqa: N806
    feeds = C.OrtValueVector()
    for a in (X, X + 1):
        feeds.push_back(onnxruntime.OrtValue.ortvalue_from_numpy(a)._ortvalue)
    fetches = C.OrtValueVector()
    for _ in range(fetch_count):
        fetches.push_back(onnxruntime.OrtValue.ortvalue_from_numpy(np.zeros((2, 3), np.float32))._ortvalue)
    cpu = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match=match):
        _session(onnxruntime, _model()).run_with_ortvaluevector(
            onnxruntime.RunOptions(), feed_names, feeds, fetch_names, fetches, [cpu] * max(1, len(fetch_names))
        )
    ours = [onnxpy.OrtValue.ortvalue_from_numpy(np.zeros((2, 3), np.float32)) for _ in range(fetch_count)]
    with pytest.raises(onnxpy.InvalidArgument, match=match):
        _session(onnxpy, _model()).run_with_ortvaluevector(
            onnxpy.RunOptions(), feed_names, _feeds(), fetch_names, ours, _cpu(max(1, len(fetch_names)))
        )


def test_run_with_ortvaluevector_checks_every_preallocated_fetch_before_writing() -> None:
    good, bad = np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)
    fetches = [onnxpy.OrtValue.ortvalue_from_numpy(good), onnxpy.OrtValue.ortvalue_from_numpy(bad)]
    with pytest.raises(onnxpy.InvalidArgument, match="invalid dimensions for output: W"):
        _session(onnxpy, _model()).run_with_ortvaluevector(None, ["X", "Y"], _feeds(), ["Z", "W"], fetches, _cpu(2))
    assert not good.any() and not bad.any()


def test_run_with_ortvaluevector_needs_a_device_per_fetch() -> None:
    # onnxruntime aborts the process here (an out-of-range read); onnxpy refuses
    with pytest.raises(onnxpy.InvalidArgument, match="one OrtDevice per fetch name"):
        _session(onnxpy, _model()).run_with_ortvaluevector(None, ["X", "Y"], _feeds(), ["Z"], [], [])


def test_run_with_ortvaluevector_honours_terminate() -> None:
    options = onnxpy.RunOptions()
    options.terminate = True
    with pytest.raises(onnxpy.Fail, match="terminate flag"):
        _session(onnxpy, _model()).run_with_ortvaluevector(options, ["X", "Y"], _feeds(), ["Z"], [], _cpu(1))


# -- create_ortvalue_from_shape_and_type --------------------------------------------------------
@pytest.mark.parametrize(
    "element_type", [np.float32, np.int64, np.float16, np.bool_, TensorProto.FLOAT, TensorProto.BFLOAT16]
)
def test_create_ortvalue_from_shape_and_type_matches_onnxruntime(element_type: Any) -> None:
    _needs(onnxruntime, "InferenceSession", "create_ortvalue_from_shape_and_type")
    values = [
        _session(lib, _model()).create_ortvalue_from_shape_and_type([2, 3], element_type, "cpu")
        for lib in (onnxruntime, onnxpy)
    ]
    assert [(v.shape(), v.data_type(), v.device_name()) for v in values] == [([2, 3], values[0].data_type(), "cpu")] * 2


@pytest.mark.parametrize("lib", LIBS)
def test_create_ortvalue_from_shape_and_type_runs_in_the_session(lib: Any) -> None:
    _needs(lib, "InferenceSession", "create_ortvalue_from_shape_and_type")
    sess = _session(lib, _model())
    value = sess.create_ortvalue_from_shape_and_type([2, 3], np.float32, "cpu")
    value.update_inplace(X)
    (z,) = sess.run_with_ort_values(["Z"], {"X": value, "Y": value})
    np.testing.assert_array_equal(z.numpy(), X + X)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize(
    ("element_type", "device", "match"),
    [(str, "cpu", "only supported for numeric tensor types"), (np.float32, "cuda", "No session allocator found")],
)
def test_create_ortvalue_from_shape_and_type_refusals(lib: Any, element_type: Any, device: str, match: str) -> None:
    _needs(lib, "InferenceSession", "create_ortvalue_from_shape_and_type")
    if device == "cuda" and lib is onnxpy and "CUDAExecutionProvider" in onnxpy.get_available_providers():
        pytest.skip("a CPU session on a machine with CUDA: refused as well, compared on CPU-only machines")
    with pytest.raises(RuntimeError, match=match):
        _session(lib, _model()).create_ortvalue_from_shape_and_type([2], element_type, device)


# -- get_input_epdevices ----------------------------------------------------------------------
def test_get_input_epdevices_gives_the_cpu_device_per_input() -> None:
    _needs(onnxruntime, "InferenceSession", "get_input_epdevices")
    c = numpy_helper.from_array(np.ones(3, np.float32), "C")
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "C"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", F, [2, 3]), helper.make_tensor_value_info("C", F, [3])],
        [helper.make_tensor_value_info("Y", F, [2, 3])],
        initializer=[c],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    described = []
    for lib in (onnxruntime, onnxpy):
        devices = _session(lib, model).get_input_epdevices()
        described.append([(d.ep_name, int(d.device.type)) for d in devices])
    assert described[0] == described[1] == [("CPUExecutionProvider", 0)]  # C is an overridable initializer
    assert isinstance(_session(onnxpy, model).get_input_epdevices()[0], onnxpy.OrtEpDevice)


# -- get_provider_graph_assignment_info ---------------------------------------------------------
def _assignment(lib: Any, level: Any) -> list[tuple[str, list[tuple[str, str, str]]]]:
    options = lib.SessionOptions()
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    options.graph_optimization_level = level
    info = _session(lib, _if_model(), options).get_provider_graph_assignment_info()
    return [(s.ep_name, [(n.name, n.domain, n.op_type) for n in s.get_nodes()]) for s in info]


@pytest.mark.parametrize("level", ["ORT_DISABLE_ALL", "ORT_ENABLE_ALL"])
def test_provider_graph_assignment_info_matches_onnxruntime(level: str) -> None:
    _needs(onnxruntime, "InferenceSession", "get_provider_graph_assignment_info")
    theirs = _assignment(onnxruntime, getattr(onnxruntime.GraphOptimizationLevel, level))
    ours = _assignment(onnxpy, getattr(onnxpy.GraphOptimizationLevel, level))
    assert ours == theirs
    assert ours[:2] == [
        ("CPUExecutionProvider", [("abs_in_else", "", "Abs")]),
        ("CPUExecutionProvider", [("neg_in_then", "", "Neg")]),
    ]


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("value", [None, "0", "true"])
def test_provider_graph_assignment_info_needs_the_config_entry(lib: Any, value: str | None) -> None:
    _needs(lib, "InferenceSession", "get_provider_graph_assignment_info")
    options = lib.SessionOptions()
    if value is not None:
        options.add_session_config_entry("session.record_ep_graph_assignment_info", value)
    with pytest.raises(lib.capi.onnxruntime_pybind11_state.Fail, match='must be set to "1"'):
        _session(lib, _model(), options).get_provider_graph_assignment_info()


# -- release_captured_graph and set_ep_dynamic_options ------------------------------------------
@pytest.mark.parametrize("lib", LIBS)
def test_release_captured_graph_without_a_captured_graph_does_nothing(lib: Any) -> None:
    _needs(lib, "InferenceSession", "release_captured_graph")
    sess = _session(lib, _model())
    assert sess.release_captured_graph() is None
    assert sess.release_captured_graph(5) is None
    with pytest.raises(TypeError):
        sess.release_captured_graph("0")
    np.testing.assert_array_equal(sess.run(["Z"], {"X": X, "Y": X})[0], X + X)


@pytest.mark.parametrize("lib", LIBS)
def test_set_ep_dynamic_options(lib: Any) -> None:
    _needs(lib, "InferenceSession", "set_ep_dynamic_options")
    sess = _session(lib, _model())
    assert sess.set_ep_dynamic_options({"ep.dynamic.workload_type": "Efficient", "unknown.key": "1"}) is None
    with pytest.raises(RuntimeError, match="No options were provided"):
        sess.set_ep_dynamic_options({})
    with pytest.raises(TypeError):
        sess.set_ep_dynamic_options([("a", "b")])  # type: ignore[arg-type]
    np.testing.assert_array_equal(sess.run(["W"], {"X": X, "Y": X})[0], X * X)


# -- add_external_initializers_from_files_in_memory ---------------------------------------------
@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize(
    "buffer",
    [WEIGHTS, bytearray(WEIGHTS), memoryview(WEIGHTS), np.frombuffer(WEIGHTS, np.float32)],
    ids=["bytes", "bytearray", "memoryview", "float32-array"],
)
def test_external_initializers_from_files_in_memory(lib: Any, buffer: Any) -> None:
    _needs(lib, "SessionOptions", "add_external_initializers_from_files_in_memory")
    options = lib.SessionOptions()
    options.add_external_initializers_from_files_in_memory(["./weights.bin"], [buffer], [len(WEIGHTS)])
    (y,) = _session(lib, _external_model(), options).run(None, {"X": X})
    np.testing.assert_allclose(y, X @ W + B)


@pytest.mark.parametrize("lib", LIBS)
def test_in_memory_file_takes_the_place_of_the_one_on_disk(lib: Any, tmp_path: Path) -> None:
    _needs(lib, "SessionOptions", "add_external_initializers_from_files_in_memory")
    (tmp_path / "m.onnx").write_bytes(_external_model("sub/w.bin"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes(bytes(len(WEIGHTS)))  # zeros on disk
    options = lib.SessionOptions()
    options.add_external_initializers_from_files_in_memory(["sub/w.bin"], [WEIGHTS], [len(WEIGHTS)])
    sess = lib.InferenceSession(str(tmp_path / "m.onnx"), options, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"X": X})[0], X @ W + B)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize(
    ("name", "length", "match"),
    [("other.bin", len(WEIGHTS), "weights.bin"), ("weights.bin", 32, "out of bounds|outside")],
    ids=["file-not-given", "too-short"],
)
def test_in_memory_files_missing_or_short_fail_creation(lib: Any, name: str, length: int, match: str) -> None:
    _needs(lib, "SessionOptions", "add_external_initializers_from_files_in_memory")
    options = lib.SessionOptions()
    options.add_external_initializers_from_files_in_memory([name], [WEIGHTS], [length])
    with pytest.raises(lib.capi.onnxruntime_pybind11_state.Fail, match=match):
        _session(lib, _external_model(), options)


@pytest.mark.parametrize("lib", LIBS)
def test_in_memory_files_need_lists_of_one_length(lib: Any) -> None:
    _needs(lib, "SessionOptions", "add_external_initializers_from_files_in_memory")
    with pytest.raises(RuntimeError):
        lib.SessionOptions().add_external_initializers_from_files_in_memory(["weights.bin"], [WEIGHTS], [])
    with pytest.raises(TypeError):
        lib.SessionOptions().add_external_initializers_from_files_in_memory(["weights.bin"], ["text"], [4])


def test_in_memory_file_is_read_at_creation_not_when_added() -> None:
    buffer = bytearray(WEIGHTS)
    options = onnxpy.SessionOptions()
    options.add_external_initializers_from_files_in_memory(["weights.bin"], [buffer], [len(buffer)])
    buffer[:] = bytes(len(buffer))  # as in onnxruntime: the buffer is referenced until creation
    np.testing.assert_array_equal(_session(onnxpy, _external_model(), options).run(None, {"X": X})[0], 0)


def test_in_memory_length_beyond_the_buffer_is_refused() -> None:
    with pytest.raises(onnxpy.InvalidArgument, match="outside its buffer"):
        onnxpy.SessionOptions().add_external_initializers_from_files_in_memory(["w.bin"], [b"1234"], [5])


# -- set_load_cancellation_flag -----------------------------------------------------------------
@pytest.mark.parametrize("lib", LIBS)
def test_load_cancellation_flag(lib: Any) -> None:
    _needs(lib, "SessionOptions", "set_load_cancellation_flag")
    options = lib.SessionOptions()
    options.set_load_cancellation_flag(True)
    with pytest.raises(lib.capi.onnxruntime_pybind11_state.ModelLoadCanceled):
        _session(lib, _model(), options)
    options.set_load_cancellation_flag(False)
    sess = _session(lib, _model(), options)
    options.set_load_cancellation_flag(True)  # a session being re-created (set_providers) sees it too
    np.testing.assert_array_equal(sess.run(["Z"], {"X": X, "Y": X})[0], X + X)
    with pytest.raises(lib.capi.onnxruntime_pybind11_state.ModelLoadCanceled):
        sess.set_providers(["CPUExecutionProvider"])
    with pytest.raises(TypeError):
        options.set_load_cancellation_flag("yes")


def test_load_cancellation_during_creation_stops_it() -> None:
    options = onnxpy.SessionOptions()

    def cancel_then_choose(devices: Any, *_: Any) -> list[Any]:
        options.set_load_cancellation_flag(True)  # as another thread would, while the session loads
        return [devices[-1]]

    options.set_provider_selection_policy_delegate(cancel_then_choose)
    with pytest.raises(onnxpy.ModelLoadCanceled):
        onnxpy.InferenceSession(_model(), options)


# -- add_provider -------------------------------------------------------------------------------
@pytest.mark.parametrize("lib", LIBS)
def test_add_provider(lib: Any) -> None:
    _needs(lib, "SessionOptions", "add_provider")
    options = lib.SessionOptions()
    options.add_provider("CPUExecutionProvider", {})
    assert options.has_providers()
    sess = lib.InferenceSession(_model(), options)
    assert sess.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(RuntimeError, match="Unknown Provider Type: FooExecutionProvider"):
        options.add_provider("FooExecutionProvider", {})
    with pytest.raises(TypeError):
        options.add_provider("CPUExecutionProvider", {"option": 1})
    options.add_provider("CPUExecutionProvider", {})
    with pytest.raises(lib.capi.onnxruntime_pybind11_state.Fail, match="has already been registered"):
        lib.InferenceSession(_model(), options)


@pytest.mark.parametrize("lib", LIBS)
def test_add_provider_refuses_providers_not_available_here(lib: Any) -> None:
    _needs(lib, "SessionOptions", "add_provider")
    with pytest.raises(lib.capi.onnxruntime_pybind11_state.InvalidArgument, match="Failed to add provider of type"):
        lib.SessionOptions().add_provider("TensorrtExecutionProvider", {})


# -- set_provider_selection_policy_delegate -----------------------------------------------------
def _delegate_call(lib: Any) -> tuple[Any, ...]:
    calls: list[tuple[Any, ...]] = []

    def delegate(devices: Any, model_metadata: Any, runtime_metadata: Any, max_selections: Any) -> list[Any]:
        calls.append((devices, model_metadata, runtime_metadata, max_selections))
        return [d for d in devices if d.ep_name == "CPUExecutionProvider"]

    options = lib.SessionOptions()
    options.set_provider_selection_policy_delegate(delegate)
    assert options.has_providers()
    model = _model(doc_string="doc", producer_name="prod", metadata={"k": "v"})
    assert lib.InferenceSession(model, options).get_providers() == ["CPUExecutionProvider"]
    assert len(calls) == 1
    return calls[0]


def test_selection_delegate_gets_what_onnxruntimes_gets() -> None:
    _needs(onnxruntime, "SessionOptions", "set_provider_selection_policy_delegate")
    theirs, ours = _delegate_call(onnxruntime), _delegate_call(onnxpy)
    assert ours[1:] == theirs[1:]
    assert [type(a) for a in ours] == [type(a) for a in theirs]
    assert [d.ep_name for d in ours[0]] == [d.ep_name for d in onnxpy.get_ep_devices()]


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize(
    ("delegate", "match"),
    [
        (lambda *a: [], "EP selection delegate did not select anything"),
        (lambda *a: 1 / 0, "EP selection delegate failed: ZeroDivisionError"),
        (lambda *a: None, "EP selection delegate failed"),
    ],
    ids=["nothing", "raises", "not-a-list"],
)
def test_selection_delegate_failures(lib: Any, delegate: Any, match: str) -> None:
    _needs(lib, "SessionOptions", "set_provider_selection_policy_delegate")
    options = lib.SessionOptions()
    options.set_provider_selection_policy_delegate(delegate)
    with pytest.raises(lib.capi.onnxruntime_pybind11_state.Fail, match=match):
        lib.InferenceSession(_model(), options)


@pytest.mark.parametrize("lib", LIBS)
def test_selection_policy_and_delegate_replace_each_other(lib: Any) -> None:
    _needs(lib, "SessionOptions", "set_provider_selection_policy_delegate")
    calls: list[int] = []

    def delegate(devices: Any, *_: Any) -> list[Any]:
        calls.append(1)
        return [devices[-1]]

    options = lib.SessionOptions()
    options.set_provider_selection_policy_delegate(delegate)
    options.set_provider_selection_policy(lib.OrtExecutionProviderDevicePolicy.PREFER_CPU)
    lib.InferenceSession(_model(), options)
    assert calls == []
    options.set_provider_selection_policy_delegate(delegate)
    lib.InferenceSession(_model(), options)
    assert calls == [1]
    with pytest.warns(Warning, match="already been configured with providers"):  # explicit providers win
        _session(lib, _model(), options)
    assert calls == [1]


# -- the EPContext data read callback -----------------------------------------------------------
def test_ep_context_data_read_func_is_refused_by_name() -> None:
    options = onnxpy.SessionOptions()
    with pytest.raises(onnxpy.NotImplemented, match="set_ep_context_data_read_func is not supported"):
        options.set_ep_context_data_read_func(lambda name, buffer: None, 1024)
    assert options.clear_ep_context_data_read_func() is None  # nothing was registered


def test_assignment_classes_are_onnxruntimes_names() -> None:
    assert onnxpy.capi.onnxruntime_pybind11_state.OrtEpAssignedSubgraph is onnxpy.OrtEpAssignedSubgraph
    assert onnxpy.capi.onnxruntime_pybind11_state.OrtEpAssignedNode is onnxpy.OrtEpAssignedNode
