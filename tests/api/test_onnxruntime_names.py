"""onnxruntime's names beyond the session: the capi namespace and its exception classes, what a
star import brings, how the enums print, the device API, the placeholders of features onnxpy
cannot provide, keyword names, TypeError for wrong argument types and get_provider_options.
onnxruntime is the oracle wherever it runs the same call on the CPU."""

from __future__ import annotations

import inspect
import types
from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import onnxpy
import onnxpy.api.session as session_module
from tests.helpers import make_model, skip_before_onnxruntime, vinfo

LIBS = [pytest.param(onnxruntime, id="onnxruntime"), pytest.param(onnxpy, id="onnxpy")]


def _model() -> bytes:
    m = make_model([helper.make_node("Relu", ["X"], ["Y"])], [vinfo("X", TensorProto.FLOAT, ["b", 4])], [vinfo("Y")])
    return m.SerializeToString()


def _feed() -> dict[str, np.ndarray]:
    return {"X": np.ones((1, 4), np.float32)}


def _exception_names(module: Any) -> set[str]:
    return {n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, BaseException)}


# -- 1. capi -----------------------------------------------------------------------------------
def test_capi_has_every_exception_class_of_onnxruntime_as_onnxpys_own() -> None:
    import onnxpy.capi.onnxruntime_pybind11_state as C  # noqa: N812 - the usual spelling

    theirs = _exception_names(onnxruntime.capi.onnxruntime_pybind11_state)
    assert theirs and theirs <= _exception_names(C)
    for name in theirs:
        assert getattr(C, name) is getattr(onnxpy, name), name
        assert getattr(onnxpy.capi._pybind_state, name) is getattr(C, name)
        assert issubclass(getattr(C, name), onnxpy.OnnxpyError)


@pytest.mark.parametrize("ort", LIBS)
def test_except_clause_through_capi_catches_the_error(ort: Any) -> None:
    sess = ort.InferenceSession(_model(), providers=["CPUExecutionProvider"])
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument):
        sess.run(None, {"X": np.ones((2, 5, 1), np.float32)})


def test_capi_names_common_to_both_levels_are_the_same_objects() -> None:
    C = onnxpy.capi.onnxruntime_pybind11_state  # noqa: N806
    for name in ("SessionOptions", "RunOptions", "GraphOptimizationLevel", "NodeArg", "OrtEpDevice", "get_ep_devices"):
        assert getattr(C, name) is getattr(onnxpy, name)
    collection = onnxpy.capi.onnxruntime_inference_collection
    assert collection.OrtValue is onnxpy.OrtValue and collection.InferenceSession is onnxpy.InferenceSession


def test_every_public_name_of_onnxruntime_exists() -> None:
    # left out: SessionIOBinding (its native binding; onnxpy has IOBinding) and
    # import_capi_exception (an internal helper)
    skip = {"SessionIOBinding", "import_capi_exception"}
    names = [n for n, v in vars(onnxruntime).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)]
    assert [n for n in names if n not in skip and not hasattr(onnxpy, n)] == []


# -- 2. star import ----------------------------------------------------------------------------
def test_star_import_keeps_the_builtin_not_implemented() -> None:
    namespace: dict[str, Any] = {}
    exec("from onnxpy import *", namespace)  # noqa: S102 - what a user script does
    assert "NotImplemented" not in namespace and "InvalidArgument" not in namespace
    assert "InferenceSession" in namespace
    assert onnxpy.NotImplemented is onnxpy.capi.onnxruntime_pybind11_state.NotImplemented


# -- 3. enums ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "GraphOptimizationLevel",
        "ExecutionMode",
        "ExecutionOrder",
        "OrtHardwareDeviceType",
        "OrtExecutionProviderDevicePolicy",
        "OrtDeviceVendorId",
    ],
)
def test_enums_print_as_onnxruntimes(name: str) -> None:
    if not hasattr(onnxruntime, name):
        skip_before_onnxruntime((1, 32), f"has no {name}")
    ours, theirs = getattr(onnxpy, name), getattr(onnxruntime, name)
    assert set(ours.__members__) == set(theirs.__members__)
    for member in ours.__members__:
        a, b = getattr(ours, member), getattr(theirs, member)
        assert (str(a), f"{a}", int(a)) == (str(b), f"{b}", int(b))
    first = next(iter(ours))
    assert f"{first:d}" == str(int(first))  # numeric formats still format the number


# -- 4. device API and placeholders --------------------------------------------------------------
def test_preload_dlls_and_print_debug_info(capsys: pytest.CaptureFixture[str]) -> None:
    assert onnxpy.preload_dlls() is None
    assert onnxpy.preload_dlls(cuda=False, cudnn=False, msvc=False, directory="") is None
    onnxpy.print_debug_info()
    assert "onnxpy" in capsys.readouterr().out
    assert onnxpy.has_collective_ops() is False


def test_get_ep_devices_cpu_as_onnxruntime() -> None:
    if not hasattr(onnxruntime, "get_ep_devices"):
        skip_before_onnxruntime((1, 32), "has no get_ep_devices")
    (theirs,) = [d for d in onnxruntime.get_ep_devices() if d.ep_name == "CPUExecutionProvider"]
    (ours,) = [d for d in onnxpy.get_ep_devices() if d.ep_name == "CPUExecutionProvider"]
    assert ours.ep_options == theirs.ep_options
    assert str(ours.device.type) == str(theirs.device.type)
    assert (ours.device.vendor, ours.device.vendor_id, ours.device.device_id) == (
        theirs.device.vendor,
        theirs.device.vendor_id,
        theirs.device.device_id,
    )
    assert set(ours.ep_metadata) == {"version"} and ours.device.metadata == {}
    with pytest.raises(onnxpy.NotImplemented, match="memory_info"):
        ours.memory_info(0)


@pytest.mark.parametrize("ort", LIBS)
def test_sessions_follow_devices_and_policy_of_their_options(ort: Any) -> None:
    if not hasattr(ort, "get_ep_devices"):
        skip_before_onnxruntime((1, 32), "has no get_ep_devices")
    cpu = [d for d in ort.get_ep_devices() if d.ep_name == "CPUExecutionProvider"]
    so = ort.SessionOptions()
    assert not so.has_providers()
    so.add_provider_for_devices(cpu, {})
    assert so.has_providers()
    sess = ort.InferenceSession(_model(), so)
    assert sess.get_providers() == ["CPUExecutionProvider"]
    np.testing.assert_array_equal(sess.run(None, _feed())[0], _feed()["X"])

    policy = ort.SessionOptions()
    policy.set_provider_selection_policy(ort.OrtExecutionProviderDevicePolicy.PREFER_CPU)
    assert policy.has_providers()
    assert ort.InferenceSession(_model(), policy).get_providers() == ["CPUExecutionProvider"]
    with pytest.warns(Warning, match="already been configured with providers"):
        ort.InferenceSession(_model(), policy, providers=["CPUExecutionProvider"])

    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="one or more OrtEpDevice"):
        ort.SessionOptions().add_provider_for_devices([], {})
    with pytest.raises(TypeError):
        ort.SessionOptions().add_provider_for_devices([1], {})


def test_gpu_policy_picks_cuda_only_where_it_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxpy.api import devices

    so = onnxpy.SessionOptions()
    so.set_provider_selection_policy(onnxpy.OrtExecutionProviderDevicePolicy.PREFER_GPU)
    monkeypatch.setattr(devices, "_cuda_count", lambda: 0)
    assert so._selected_providers() == ["CPUExecutionProvider"]
    monkeypatch.setattr(devices, "_cuda_count", lambda: 2)
    assert so._selected_providers() == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    gpus = [d for d in onnxpy.get_ep_devices() if d.ep_name == "CUDAExecutionProvider"]
    assert [d.ep_options for d in gpus] == [{"device_id": "0"}, {"device_id": "1"}]
    assert all(d.device.vendor == "NVIDIA" for d in gpus)
    chosen = onnxpy.SessionOptions()
    chosen.add_provider_for_devices(gpus[1:], {"enable_cuda_graph": "1"})
    assert chosen._selected_providers() == [("CUDAExecutionProvider", {"device_id": "1", "enable_cuda_graph": "1"})]


PLACEHOLDER_USES = {
    "register_execution_provider_library": lambda: onnxpy.register_execution_provider_library("x", "/x.so"),
    "unregister_execution_provider_library": lambda: onnxpy.unregister_execution_provider_library("x"),
    "LoraAdapter": lambda: onnxpy.LoraAdapter(),
    "AdapterFormat": lambda: onnxpy.AdapterFormat.from_file,
    "add_active_adapter": lambda: onnxpy.RunOptions().add_active_adapter(None),
    "ModelCompiler": lambda: onnxpy.ModelCompiler(onnxpy.SessionOptions(), "m.onnx"),
    "OrtCompileApiFlags": lambda: onnxpy.OrtCompileApiFlags.NONE,
    "SparseTensor": lambda: onnxpy.SparseTensor.sparse_coo_from_numpy,
    "as_sparse_tensor": lambda: onnxpy.OrtValue.ortvalue_from_numpy(np.ones(2)).as_sparse_tensor(),
    "OrtSparseFormat": lambda: onnxpy.OrtSparseFormat.ORT_SPARSE_COO,
    "OrtArenaCfg": lambda: onnxpy.OrtArenaCfg(0, -1, -1, -1),
    "OrtMemoryInfo": lambda: onnxpy.OrtMemoryInfo("Cpu", 0, 0, 0),
    "OrtMemType": lambda: onnxpy.OrtMemType.DEFAULT,
    "OrtAllocatorType": lambda: onnxpy.OrtAllocatorType.ORT_ARENA_ALLOCATOR,
    "create_and_register_allocator": lambda: onnxpy.create_and_register_allocator(None, None),
    "create_and_register_allocator_v2": lambda: onnxpy.create_and_register_allocator_v2("cpu", None, {}, None),
    "memory_info": lambda: onnxpy.OrtValue.ortvalue_from_shape_and_type([2], np.float32, memory_info=object()),
}


@pytest.mark.parametrize("feature", list(PLACEHOLDER_USES))
def test_unsupported_features_raise_not_implemented_naming_them(feature: str) -> None:
    with pytest.raises(onnxpy.NotImplemented, match=f"{feature}.*not supported: onnxpy"):
        PLACEHOLDER_USES[feature]()


def test_placeholders_stay_introspectable() -> None:
    assert not hasattr(onnxpy.SparseTensor, "__wrapped__")  # AttributeError, not NotImplemented
    assert not isinstance(1, onnxpy.OrtMemoryInfo)
    assert onnxpy.capi.onnxruntime_pybind11_state.LoraAdapter is onnxpy.LoraAdapter


def test_session_tuning_results_and_memory_infos() -> None:
    sess = onnxpy.InferenceSession(_model())
    assert sess.get_tuning_results() == onnxruntime.InferenceSession(_model()).get_tuning_results() == []
    sess.set_tuning_results([])
    with pytest.raises(onnxpy.NotImplemented, match="get_input_memory_infos"):
        sess.get_input_memory_infos()


# -- 5. keyword names ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["update_inplace", "ortvalue_from_shape_and_type"])
def test_ortvalue_parameter_names_are_onnxruntimes(method: str) -> None:
    # onnxruntime renamed them (update_inplace's np_arr became data; memory_info came later).
    skip_before_onnxruntime((1, 32), "names these parameters differently")
    ours = list(inspect.signature(getattr(onnxpy.OrtValue, method)).parameters)
    theirs = list(inspect.signature(getattr(onnxruntime.OrtValue, method)).parameters)
    assert ours == theirs


def test_update_inplace_by_keyword() -> None:
    v = onnxpy.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32, memory_info=None)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    v.update_inplace(data=x)
    np.testing.assert_array_equal(v.numpy(), x)


# -- 6. defaults --------------------------------------------------------------------------------
def test_profile_file_prefix_default_is_onnxruntimes() -> None:
    assert onnxpy.SessionOptions().profile_file_prefix == onnxruntime.SessionOptions().profile_file_prefix


# -- 7. TypeError for wrong types ----------------------------------------------------------------
def _set(ort: Any, key: str, value: Any) -> None:
    setattr(ort.SessionOptions(), key, value)


WRONG_TYPES = {
    "intra_op_num_threads=2.5": lambda ort: _set(ort, "intra_op_num_threads", 2.5),
    "enable_profiling='yes'": lambda ort: _set(ort, "enable_profiling", "yes"),
    "graph_optimization_level=2.0": lambda ort: _set(ort, "graph_optimization_level", 2.0),
    "logid=1": lambda ort: _set(ort, "logid", 1),
    "config entry value 1": lambda ort: ort.SessionOptions().add_session_config_entry("k", 1),
    "run config entry value 1": lambda ort: ort.RunOptions().add_run_config_entry("k", 1),
    "dimension name 1": lambda ort: ort.SessionOptions().add_free_dimension_override_by_name(1, 2),
    "sess_options=1": lambda ort: ort.InferenceSession(_model(), sess_options=1),
    "InferenceSession(123)": lambda ort: ort.InferenceSession(123),
    "run('Y', ...)": lambda ort: ort.InferenceSession(_model()).run("Y", _feed()),
    "run([1], ...)": lambda ort: ort.InferenceSession(_model()).run([1], _feed()),
    "run_options=1": lambda ort: ort.InferenceSession(_model()).run(None, _feed(), run_options=1),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
@pytest.mark.parametrize("ort", LIBS)
def test_wrong_argument_types_raise_type_error(ort: Any, case: str) -> None:
    with pytest.raises(TypeError) as info:
        WRONG_TYPES[case](ort)
    if ort is onnxpy:
        assert isinstance(info.value, onnxpy.InvalidArgument)  # existing except clauses still catch it


@pytest.mark.parametrize(
    "fn",
    [
        lambda: _set(onnxpy, "intra_op_num_threads", -1),
        lambda: _set(onnxpy, "enable_profiling", 2),
        lambda: _set(onnxpy, "graph_optimization_level", 7),
        lambda: onnxpy.SessionOptions().add_free_dimension_override_by_name("b", -2),
    ],
)
def test_wrong_values_are_not_type_errors(fn: Any) -> None:
    with pytest.raises(onnxpy.InvalidArgument) as info:
        fn()
    assert not isinstance(info.value, TypeError)


# -- 8. get_provider_options ----------------------------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"arena_extend_strategy": "kSameAsRequested"}, {"use_arena": "0"}])
def test_cpu_provider_options_as_onnxruntime(options: dict[str, str]) -> None:
    providers = [("CPUExecutionProvider", options)]
    ours = onnxpy.InferenceSession(_model(), providers=providers).get_provider_options()
    assert ours == onnxruntime.InferenceSession(_model(), providers=providers).get_provider_options()


def test_cuda_provider_options_report_what_onnxpy_honours(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU needed: the session believes CUDA is available and runs on the CPU provider.
    monkeypatch.setattr(
        session_module, "available_provider_names", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    monkeypatch.setattr(session_module, "provider_for_session", lambda name, opts: session_module.CPU)
    defaults = onnxpy.InferenceSession(_model(), providers=["CUDAExecutionProvider"]).get_provider_options()
    assert defaults == {
        "CUDAExecutionProvider": {
            "device_id": "0",
            "has_user_compute_stream": "0",
            "user_compute_stream": "0",
            "enable_cuda_graph": "0",
        },
        "CPUExecutionProvider": {},
    }
    given = {"device_id": 1, "enable_cuda_graph": True, "user_compute_stream": "0x10", "gpu_mem_limit": "1024"}
    opts = onnxpy.InferenceSession(_model(), providers=[("CUDAExecutionProvider", given)]).get_provider_options()
    assert opts["CUDAExecutionProvider"] == {
        "device_id": "1",
        "has_user_compute_stream": "1",
        "user_compute_stream": "16",
        "enable_cuda_graph": "1",
    }
