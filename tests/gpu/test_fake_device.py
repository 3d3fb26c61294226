"""Device logic on the fake GPU (tests/gpu/fake_device.py): runs on any machine.

Placement (CPU fallback, copy insertion, shape subgraphs on the host, constants on each side),
the IOBinding / OrtValue device paths, stream discipline and the CUDA-graph bookkeeping are the
same code on CUDA; the fake provider stands in for CuPy and refuses host/device mixing.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy as ort
from onnxpy.api.errors import InvalidArgument
from onnxpy.providers import provider_for_device, provider_for_session
from onnxpy.runtime.placement import FUSED_DOMAIN
from tests.helpers import make_model, vinfo

from . import fake_device
from .fake_device import FAKE_XP, FakeArray, FakeDeviceError

F = TensorProto.FLOAT
I64 = TensorProto.INT64
FAKE = fake_device.NAME


def _session(model: onnx.ModelProto, optimize: bool = False, **options: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=[(FAKE, dict(options))])


def _cpu(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def _layout(sess: ort.InferenceSession) -> list[tuple[str, str]]:
    """(op type, provider device) per node, in execution order."""
    c = sess._compiled
    return [(n.op_type, p.device_type) for n, p in zip(c.graph.nodes, c.placement.providers)]


# -- the fake itself ------------------------------------------------------------------------------


def test_fake_arrays_refuse_host_mixing_like_cupy() -> None:
    a = FAKE_XP.asarray(np.arange(6, dtype=np.float32))
    assert isinstance(a, FakeArray)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    with pytest.raises(FakeDeviceError):
        _ = a + np.ones(6, np.float32)
    with pytest.raises(FakeDeviceError):
        FAKE_XP.maximum(a, np.zeros(6, np.float32))
    with pytest.raises(AttributeError, match="CuPy does not"):
        _ = FAKE_XP.errstate  # numpy has it, CuPy does not
    total = a.sum()
    assert isinstance(total, FakeArray) and total.shape == ()  # 0-d array, not a numpy scalar
    with pytest.raises(TypeError):
        operator.index(total)  # CuPy arrays have no __index__
    assert float(total) == 15.0
    np.testing.assert_array_equal((a * 2 + 1).get(), np.arange(6) * 2 + 1)
    with pytest.raises(FakeDeviceError):
        FakeArray(np.array(["a"], dtype=object))


def test_registered_provider_is_listed_then_removed(fake_gpu: type) -> None:
    assert FAKE in ort.get_available_providers()
    assert ort.get_available_providers()[-1] == "CPUExecutionProvider"
    fake_device.uninstall()
    assert FAKE not in ort.get_available_providers()
    with pytest.raises(RuntimeError, match="unsupported device type"):
        provider_for_device("fakegpu")
    fake_device.install()


# -- placement ------------------------------------------------------------------------------------


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"], axis=-1),
    ]
    return make_model(nodes, [vinfo("x", F, ["n", 4])], [vinfo("y", F, ["n", 5])], {"w": w, "b": b})


def test_device_session_runs_every_node_on_the_device(fake_gpu: type) -> None:
    model = _mlp()
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    sess = _session(model, optimize=True)
    assert sess.get_providers() == [FAKE, "CPUExecutionProvider"]
    c = sess._compiled
    assert not c.placement.mixed and not c.placement.copies
    assert all(isinstance(v, FakeArray) for v in c.constants.values())
    stray = fake_gpu.outside_scope
    (y,) = sess.run(None, {"x": x})
    assert fake_gpu.outside_scope == stray, "device work ran outside the provider's stream scope"
    np.testing.assert_allclose(y, _cpu(model, {"x": x})[0], rtol=1e-6)


def test_unsupported_node_falls_back_with_copies_and_is_logged(
    fake_gpu: type, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Unique", ["r"], ["u"], sorted=1),  # host-only on device providers
        helper.make_node("Mul", ["u", "two"], ["y"]),
    ]
    model = make_model(nodes, [vinfo("x", F, [6])], [vinfo("y", F, None)], {"two": np.array(2.0, np.float32)})
    with caplog.at_level(logging.WARNING, logger="onnxpy"):
        sess = _session(model)
    assert _layout(sess) == [
        ("Relu", "fakegpu"),
        ("MemcpyToHost", "fakegpu"),
        ("Unique", "cpu"),
        ("MemcpyFromHost", "fakegpu"),
        ("Mul", "fakegpu"),
    ]
    copies = [n for n in sess._compiled.graph.nodes if n.domain == FUSED_DOMAIN]
    assert len(copies) == 2 == len(sess._compiled.placement.copies)
    assert any("Unique" in r.getMessage() and "CPUExecutionProvider" in r.getMessage() for r in caplog.records)
    x = np.array([3, -1, 3, 2, 0, 2], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], _cpu(model, {"x": x})[0])


def test_output_made_on_the_host_is_copied_back_to_the_device(fake_gpu: type) -> None:
    nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Unique", ["n"], ["y"], sorted=1)]
    model = make_model(nodes, [vinfo("x", F, [5])], [vinfo("y", F, None)])
    sess = _session(model)
    layout = _layout(sess)
    assert layout[-1] == ("MemcpyFromHost", "fakegpu") and ("Unique", "cpu") in layout
    assert sess._compiled.graph.nodes[-1].outputs == ["y"]  # the output keeps its name
    io = sess.io_binding()
    x = np.array([1, 5, 1, 2, 5], np.float32)
    io.bind_cpu_input("x", x)
    io.bind_output("y", "fakegpu")
    sess.run_with_iobinding(io)
    (out,) = io.get_outputs()
    assert out.device_name() == "fakegpu" and isinstance(out._value, FakeArray)
    np.testing.assert_array_equal(out.numpy(), [-5, -2, -1])


def test_shape_subgraph_runs_on_the_host_without_copies(fake_gpu: type) -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "axes"], ["d0v"]),
        helper.make_node("Concat", ["d0v", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = {
        "zero": np.array(0, np.int64),
        "axes": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
    }
    model = make_model(nodes, [vinfo("x", F, ["n", 3, 4])], [vinfo("y", F, None)], inits)
    sess = _session(model)
    assert _layout(sess) == [
        ("Shape", "cpu"),
        ("Gather", "cpu"),
        ("Unsqueeze", "cpu"),
        ("Concat", "cpu"),
        ("Reshape", "fakegpu"),
    ]
    c = sess._compiled
    assert not c.placement.copies and not c.placement.fallback
    assert all(isinstance(c.constants[k], np.ndarray) for k in inits)  # never uploaded
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.reshape(2, 12))


def test_initializer_read_on_both_sides_lives_on_both(fake_gpu: type) -> None:
    w = np.arange(6, dtype=np.float32).reshape(2, 3) % 4
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Unique", ["w"], ["u"], sorted=1),
    ]
    model = make_model(nodes, [vinfo("x", F, [1, 2])], [vinfo("y", F, None), vinfo("u", F, None)], {"w": w})
    sess = _session(model)
    c = sess._compiled
    (alias,) = c.placement.host_constants
    assert alias != "w" and isinstance(c.constants[alias], np.ndarray) and isinstance(c.constants["w"], FakeArray)
    unique = next(n for n in c.graph.nodes if n.op_type == "Unique")
    assert unique.inputs == [alias]
    x = np.array([[1, 2]], np.float32)
    got = sess.run(None, {"x": x})
    for g, want in zip(got, _cpu(model, {"x": x})):
        np.testing.assert_array_equal(g, want)


def test_element_types_the_device_cannot_hold_stay_on_the_host(fake_gpu: type) -> None:
    nodes = [
        helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["b"], ["f"], to=F),
        helper.make_node("Add", ["f", "x"], ["y"]),
    ]
    model = make_model(nodes, [vinfo("x", F, [4])], [vinfo("b", TensorProto.BFLOAT16, [4]), vinfo("y", F, [4])])
    sess = _session(model)
    layout = _layout(sess)
    assert ("Cast", "cpu") in layout and ("Add", "fakegpu") in layout
    assert layout.count(("Cast", "cpu")) == 2
    assert all("bfloat16" in why for why in sess._compiled.placement.fallback)
    x = np.array([1.5, -2.25, 3.0, 1e-3], np.float32)
    got = sess.run(None, {"x": x})
    want = _cpu(model, {"x": x})
    assert got[0].dtype == want[0].dtype
    np.testing.assert_array_equal(got[0].astype(np.float32), want[0].astype(np.float32))
    np.testing.assert_array_equal(got[1], want[1])


def test_subgraph_reads_a_host_value_through_a_copy(fake_gpu: type) -> None:
    then_g = helper.make_graph([helper.make_node("Add", ["u", "one"], ["t"])], "then", [], [vinfo("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Sub", ["u", "one"], ["e"])], "else", [], [vinfo("e", F, None)])
    nodes = [
        helper.make_node("Unique", ["x"], ["u"], sorted=1),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    model = make_model(
        nodes,
        [vinfo("x", F, [4]), vinfo("c", TensorProto.BOOL, [])],
        [vinfo("y", F, None)],
        {"one": np.array(1.0, np.float32)},
    )
    sess = _session(model)
    layout = _layout(sess)
    assert layout == [("MemcpyToHost", "fakegpu"), ("Unique", "cpu"), ("MemcpyFromHost", "fakegpu"), ("If", "fakegpu")]
    copied = sess._compiled.graph.nodes[2].outputs[0]
    then_branch = sess._compiled.graph.nodes[3].attrs["then_branch"]
    assert then_branch.nodes[0].inputs[0] == copied  # the subgraph reads the device copy
    x = np.array([2, 2, 7, 1], np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], _cpu(model, feeds)[0])


def test_node_suite_on_the_fake_device_matches_the_cpu(fake_gpu: type) -> None:
    """Every onnx node test case that passes on the CPU passes on the device provider too:
    kernels run over a CuPy-like namespace, placement keeps the rest on the host."""
    import warnings

    from tests.conformance.suite import _array, assert_close, known_failures, node_cases

    known = known_failures()
    failures = []
    for name, case in sorted(node_cases().items()):
        if name in known:
            continue

        def run(providers: list[str], case: object = case) -> None:
            sess = ort.InferenceSession(case.model.SerializeToString(), providers=providers)
            ins = [i.name for i in case.model.graph.input]
            outs = [o.name for o in case.model.graph.output]
            for inputs, outputs in case.data_sets:
                got = sess.run(outs, {n: _array(v) for n, v in zip(ins, inputs)})
                for n, g, w in zip(outs, got, outputs):
                    assert_close(n, g, _array(w), max(case.rtol, 1e-3), max(case.atol, 1e-5))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)
            try:
                try:
                    run(["CPUExecutionProvider"])
                except Exception:  # noqa: BLE001 - failing on the CPU too: not a device question
                    continue
                try:
                    run([FAKE])
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
            finally:
                logging.disable(logging.NOTSET)
    assert not failures, "\n".join(failures)


# -- OrtValue and IOBinding device paths ----------------------------------------------------------


def _add_relu() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "bias"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    return make_model(
        nodes, [vinfo("x", F, [2, 3])], [vinfo("y", F, [2, 3])], {"bias": np.full((2, 3), -1.0, np.float32)}
    )


def test_ortvalue_on_the_device(fake_gpu: type) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = ort.OrtValue.ortvalue_from_numpy(x, "fakegpu", 0)
    assert v.device_name() == "fakegpu" and isinstance(v._value, FakeArray)
    assert v.device().device_type() == ort.OrtDevice.GPU
    x[0, 0] = 100  # the OrtValue holds a device copy
    np.testing.assert_array_equal(v.numpy(), np.arange(6).reshape(2, 3))
    assert v.data_ptr() == v._provider.data_ptr(v._value) != x.ctypes.data
    v.update_inplace(np.full((2, 3), 7, np.float32))
    assert v.data_ptr() == v._provider.data_ptr(v._value)
    np.testing.assert_array_equal(v.numpy(), np.full((2, 3), 7))
    e = ort.OrtValue.ortvalue_from_shape_and_type([4, 2], np.float32, "fakegpu", 0)
    assert isinstance(e._value, FakeArray) and e.shape() == [4, 2]
    with pytest.raises(InvalidArgument, match="bfloat16"):
        ort.OrtValue.ortvalue_from_shape_and_type([2], TensorProto.BFLOAT16, "fakegpu", 0)
    with pytest.raises(InvalidArgument, match="cannot live"):
        ort.OrtValue.ortvalue_from_numpy(np.array(["a"]), "fakegpu", 0)


def test_copy_tensors_between_host_and_device(fake_gpu: type) -> None:
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    on_device = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32, "fakegpu", 0)
    ptr = on_device.data_ptr()
    ort.copy_tensors([ort.OrtValue.ortvalue_from_numpy(host)], [on_device])
    assert on_device.data_ptr() == ptr and isinstance(on_device._value, FakeArray)
    np.testing.assert_array_equal(on_device.numpy(), host)
    back = np.zeros((2, 3), np.float32)
    ort.copy_tensors([on_device], [ort.OrtValue.ortvalue_from_numpy(back)])
    np.testing.assert_array_equal(back, host)
    mixed = [ort.OrtValue.ortvalue_from_numpy(host), on_device]
    with pytest.raises(InvalidArgument, match="source tensors live on several devices"):
        ort.copy_tensors(mixed, [ort.OrtValue.ortvalue_from_numpy(np.zeros((2, 3), np.float32)) for _ in mixed])


def test_iobinding_device_inputs_and_outputs_stay_on_the_device(fake_gpu: type) -> None:
    model = _add_relu()
    sess = _session(model)
    provider = sess._provider
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    want = _cpu(model, {"x": x})[0]
    stray = fake_gpu.outside_scope
    downloads = provider.downloads

    io = sess.io_binding()
    io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "fakegpu", 0))
    io.bind_output("y", "fakegpu")
    sess.run_with_iobinding(io)
    (y,) = io.get_outputs()
    assert y.device_name() == "fakegpu" and isinstance(y._value, FakeArray)
    assert provider.downloads == downloads, "a device-bound run copied something to the host"
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], want)
    assert fake_gpu.outside_scope == stray


def test_bind_input_by_device_pointer_reads_in_place(fake_gpu: type) -> None:
    sess = _session(_add_relu())
    provider = sess._provider
    dev = provider.from_host(np.ones((2, 3), np.float32) * 3)
    io = sess.io_binding()
    io.bind_input("x", "fakegpu", 0, np.float32, [2, 3], provider.data_ptr(dev))
    io.bind_output("y", "fakegpu")
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], np.full((2, 3), 2))
    dev[...] = 10  # written on the device between runs: the next run reads it
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], np.full((2, 3), 9))


def test_bind_output_to_a_device_buffer_writes_in_place(fake_gpu: type) -> None:
    sess = _session(_add_relu())
    provider = sess._provider
    out = provider.empty((2, 3), np.dtype(np.float32))
    ptr = provider.data_ptr(out)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y", "fakegpu", 0, np.float32, [2, 3], ptr)
    sess.run_with_iobinding(io)
    assert io.get_outputs()[0].data_ptr() == ptr
    np.testing.assert_array_equal(out.get(), np.maximum(x - 1, 0))
    target = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32, "fakegpu", 0)
    io.bind_ortvalue_output("y", target)
    sess.run_with_iobinding(io)
    assert io.get_outputs()[0] is target
    np.testing.assert_array_equal(target.numpy(), np.maximum(x - 1, 0))


def test_device_session_output_bound_to_the_cpu(fake_gpu: type) -> None:
    sess = _session(_add_relu())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    host = np.zeros((2, 3), np.float32)
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y", "cpu", 0, np.float32, [2, 3], host.ctypes.data)
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(host, np.maximum(x - 1, 0))
    io.bind_output("y", "cpu")
    sess.run_with_iobinding(io)
    assert isinstance(io.get_outputs()[0]._value, np.ndarray)


def test_runs_wait_for_their_stream_unless_told_not_to(fake_gpu: type) -> None:
    sess = _session(_add_relu())
    p = sess._provider
    io = sess.io_binding()
    io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(np.ones((2, 3), np.float32), "fakegpu", 0))
    io.bind_output("y", "fakegpu")
    before = p.stream_syncs
    sess.run_with_iobinding(io)
    assert p.stream_syncs == before + 1
    ro = ort.RunOptions()
    ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
    sess.run_with_iobinding(io, ro)
    assert p.stream_syncs == before + 1
    io.synchronize_outputs()
    assert p.stream_syncs > before + 1
    syncs = p.device_syncs
    io.synchronize_inputs()
    assert p.device_syncs == syncs + 1


# -- CUDA graphs (the bookkeeping; the fake replays by running again) ------------------------------


def test_cuda_graph_captured_once_then_replayed_with_new_inputs(fake_gpu: type) -> None:
    sess = _session(_add_relu(), enable_cuda_graph="1")
    p = sess._provider
    x = ort.OrtValue.ortvalue_from_numpy(np.full((2, 3), 5, np.float32), "fakegpu", 0)
    io = sess.io_binding()
    io.bind_ortvalue_input("x", x)
    io.bind_output("y", "fakegpu")
    sess.run_with_iobinding(io)
    assert (p.captures, p.replays) == (1, 0)
    first = io.get_outputs()[0]
    np.testing.assert_array_equal(first.numpy(), np.full((2, 3), 4))
    x.update_inplace(np.full((2, 3), 8, np.float32))  # new values, same address
    sess.run_with_iobinding(io)
    assert (p.captures, p.replays) == (1, 1)
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), np.full((2, 3), 7))
    replay_out = io.get_outputs()[0]
    sess.run_with_iobinding(io)
    assert io.get_outputs()[0] is replay_out  # a graph writes the same memory every replay
    # A new input address is a new layout: captured again.
    io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(np.full((2, 3), 2, np.float32), "fakegpu", 0))
    sess.run_with_iobinding(io)
    assert p.captures == 2
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), np.full((2, 3), 1))


def test_cuda_graph_refused_for_host_inputs_and_cpu_nodes(fake_gpu: type) -> None:
    sess = _session(_add_relu(), enable_cuda_graph="1")
    io = sess.io_binding()
    io.bind_cpu_input("x", np.ones((2, 3), np.float32))
    io.bind_output("y", "fakegpu")
    with pytest.warns(RuntimeWarning, match="not in fakegpu memory"):
        sess.run_with_iobinding(io)
    sess.run_with_iobinding(io)  # warned once; runs normally
    assert sess._provider.captures == 0
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], np.zeros((2, 3)))

    nodes = [helper.make_node("Unique", ["x"], ["y"], sorted=1)]
    mixed = _session(make_model(nodes, [vinfo("x", F, [3])], [vinfo("y", F, None)]), enable_cuda_graph="1")
    io = mixed.io_binding()
    io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(np.array([2, 1, 2], np.float32), "fakegpu", 0))
    io.bind_output("y", "fakegpu")
    with pytest.warns(RuntimeWarning, match="run on the CPU"):
        mixed.run_with_iobinding(io)
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], [1, 2])


def test_cuda_graph_capture_failure_falls_back(fake_gpu: type) -> None:
    # Reshape reads its shape input on the host: a device-to-host sync, refused during capture.
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = make_model(nodes, [vinfo("x", F, [2, 3]), vinfo("shape", I64, [2])], [vinfo("y", F, None)])
    sess = _session(model, enable_cuda_graph="1")
    io = sess.io_binding()
    io.bind_ortvalue_input(
        "x", ort.OrtValue.ortvalue_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), "fakegpu")
    )
    io.bind_ortvalue_input("shape", ort.OrtValue.ortvalue_from_numpy(np.array([3, 2], np.int64), "fakegpu"))
    io.bind_output("y", "fakegpu")
    with pytest.warns(RuntimeWarning, match="could not be captured"):
        sess.run_with_iobinding(io)
    sess.run_with_iobinding(io)
    assert sess._provider.replays == 0
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], np.arange(6).reshape(3, 2))


# -- provider options ----------------------------------------------------------------------------


def test_provider_options_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown CUDAExecutionProvider option"):
        provider_for_session("CUDAExecutionProvider", {"no_such_option": "1"})
    with pytest.raises(ValueError, match="enable_cuda_graph"):
        provider_for_session("CUDAExecutionProvider", {"enable_cuda_graph": "maybe"})
    with pytest.raises(ValueError, match="device_id"):
        provider_for_session("CUDAExecutionProvider", {"device_id": "first"})


def test_cuda_requested_without_a_gpu_falls_back_to_the_cpu() -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA: the fallback path does not apply")
    model = _add_relu()
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.zeros((2, 3)))
    with pytest.raises(RuntimeError, match="'cuda:0' is not available"):
        ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)


def test_quantized_models_fused_on_the_device_match_the_cpu(fake_gpu: type, tmp_path: Any) -> None:
    """FakeQuant (a QDQ model's pairs, fused into the convolutions) and the dynamic products
    (DynamicQuantizeShifted + ShiftedIntegerMatMul) run on the device with the CPU's bits."""
    from tests.unit.test_fuse_dynamic_matmul import _quantize_dynamic
    from tests.unit.test_fuse_fake_quant import _quantize_static

    rng = np.random.default_rng(8)
    (tmp_path / "s").mkdir()
    (tmp_path / "d").mkdir()
    cases = [
        (_quantize_static(tmp_path / "s", "QUInt8", "QInt8", True), rng.standard_normal((2, 3, 16, 16))),
        (_quantize_dynamic(tmp_path / "d", "QInt8", True), rng.standard_normal((2, 7, 32))),
    ]
    for model, x in cases:
        feeds = {model.graph.input[0].name: x.astype(np.float32)}
        sess = _session(model, optimize=True)
        on_device = {op for op, device in _layout(sess) if device == fake_device.DEVICE}
        assert on_device & {"FakeQuant", "FusedConv", "ShiftedIntegerMatMul"}, _layout(sess)
        got = sess.run(None, feeds)[0]
        assert got.tobytes() == _cpu(model, feeds)[0].tobytes()


def test_concatenated_tap_sum_convolutions_run_on_the_device(fake_gpu: type) -> None:
    """A concatenation of a 1x1 and a narrow 3x3 convolution (M <= C/4: the tap sum) on the
    device: the members write their channels of the result, the device arrays never meet numpy."""
    rng = np.random.default_rng(11)
    inits = {
        "w1": rng.standard_normal((4, 16, 1, 1)).astype(np.float32),
        "b1": rng.standard_normal(4).astype(np.float32),
        "w3": rng.standard_normal((4, 16, 3, 3)).astype(np.float32),
        "b3": rng.standard_normal(4).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"]),
        helper.make_node("Conv", ["x", "w3", "b3"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["a", "c"], ["y"], axis=1),
    ]
    model = make_model(nodes, [vinfo("x", F, [1, 16, 6, 7])], [vinfo("y", F, [1, 8, 6, 7])], inits)
    x = rng.standard_normal((1, 16, 6, 7)).astype(np.float32)
    sess = _session(model, optimize=True)
    assert ("ConcatConv", fake_device.DEVICE) in _layout(sess)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, _cpu(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
