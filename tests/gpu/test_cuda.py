"""CUDAExecutionProvider on a real GPU (CuPy). Skipped, with the reason, where there is none.

    pytest -m cuda tests/gpu -v

One test or more per point of issue 6: the founding document's examples with "cuda", pointer
identity of device outputs, torch tensors bound by data_ptr, CUDA-graph replay with new inputs,
streams and DLPack, placement with CPU fallback, the CUDA kernels, and light models matching the
CPU provider within 1e-3.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy as ort
from onnxpy.api.errors import InvalidArgument
from onnxpy.providers import cuda as cuda_provider
from tests.helpers import light_models, make_model, random_feeds, randomize_weights, shared_models, vinfo

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not cuda_provider.is_available(),
        reason=f"needs an NVIDIA GPU with CuPy (pip install 'onnxpy[cuda]'): {cuda_provider.unavailable_reason()}",
    ),
]

F = TensorProto.FLOAT
CUDA = ["CUDAExecutionProvider"]


@pytest.fixture
def cp():  # noqa: ANN201 - the cupy module
    import cupy

    return cupy


@pytest.fixture
def torch_cuda():  # noqa: ANN201 - the torch module, with CUDA
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch is installed without CUDA support")
    return torch


@pytest.fixture
def example_models(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """model.onnx and multi_input_model.onnx of the founding document, in the cwd."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    from _setup import classifier_model, multi_io_model

    onnx.save(classifier_model(), str(tmp_path / "model.onnx"))
    onnx.save(multi_io_model(), str(tmp_path / "multi_input_model.onnx"))
    monkeypatch.chdir(tmp_path)


def _cpu_run(path: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(path).run(None, feeds)


# -- availability ----------------------------------------------------------------------------------


def test_cuda_is_listed_first() -> None:
    assert ort.get_available_providers()[0] == "CUDAExecutionProvider"
    assert ort.get_device() == "GPU"


# -- the founding document, with "cuda" -----------------------------------------------------------


def test_basic_cuda_inference(example_models: None) -> None:
    sess = ort.InferenceSession("model.onnx", providers=["CUDAExecutionProvider"])
    io_binding = sess.io_binding()
    input_data = np.random.randn(1, 3, 224, 224).astype(np.float32)
    ortvalue_input = ort.OrtValue.ortvalue_from_numpy(input_data, "cuda", 0)
    io_binding.bind_ortvalue_input("input", ortvalue_input)
    io_binding.bind_output("output", "cuda")
    sess.run_with_iobinding(io_binding)
    outputs = io_binding.get_outputs()
    assert outputs[0].device_name() == "cuda"
    output_cpu = io_binding.copy_outputs_to_cpu()
    np.testing.assert_allclose(output_cpu[0], _cpu_run("model.onnx", {"input": input_data})[0], rtol=1e-3, atol=1e-6)


def test_reusing_iobinding_for_multiple_runs(example_models: None) -> None:
    sess = ort.InferenceSession("model.onnx", providers=["CUDAExecutionProvider"])
    cpu = ort.InferenceSession("model.onnx")
    io_binding = sess.io_binding()
    io_binding.bind_output("output", "cuda")
    rng = np.random.default_rng(0)
    kept = []
    for _ in range(5):
        input_data = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
        ortvalue_input = ort.OrtValue.ortvalue_from_numpy(input_data, "cuda", 0)
        io_binding.clear_binding_inputs()
        io_binding.bind_ortvalue_input("input", ortvalue_input)
        sess.run_with_iobinding(io_binding)
        outputs = io_binding.get_outputs()
        kept.append((outputs[0], cpu.run(None, {"input": input_data})[0]))
    for value, want in kept:  # earlier results keep their values
        np.testing.assert_allclose(value.numpy(), want, rtol=1e-3, atol=1e-6)


def test_preallocated_torch_output_buffer(example_models: None, torch_cuda) -> None:  # noqa: ANN001
    torch = torch_cuda
    sess = ort.InferenceSession("model.onnx", providers=["CUDAExecutionProvider"])
    io_binding = sess.io_binding()
    output_shape = (1, 1000)
    output_buffer = torch.zeros(output_shape, dtype=torch.float32, device="cuda:0")
    io_binding.bind_output(
        "output",
        device_type="cuda",
        device_id=0,
        element_type=np.float32,
        shape=output_shape,
        buffer_ptr=output_buffer.data_ptr(),
    )
    input_data = np.random.randn(1, 3, 224, 224).astype(np.float32)
    input_ortvalue = ort.OrtValue.ortvalue_from_numpy(input_data, "cuda", 0)
    io_binding.bind_ortvalue_input("input", input_ortvalue)
    sess.run_with_iobinding(io_binding)
    assert io_binding.get_outputs()[0].data_ptr() == output_buffer.data_ptr()
    want = _cpu_run("model.onnx", {"input": input_data})[0]
    np.testing.assert_allclose(output_buffer.cpu().numpy(), want, rtol=1e-3, atol=1e-6)


def test_multiple_inputs_and_outputs(example_models: None) -> None:
    sess = ort.InferenceSession("multi_input_model.onnx", providers=["CUDAExecutionProvider"])
    io_binding = sess.io_binding()
    data1 = np.random.randn(3, 4).astype(np.float32)
    data2 = np.random.randn(3, 4).astype(np.float32)
    io_binding.bind_ortvalue_input("input1", ort.OrtValue.ortvalue_from_numpy(data1, "cuda", 0))
    io_binding.bind_ortvalue_input("input2", ort.OrtValue.ortvalue_from_numpy(data2, "cuda", 0))
    io_binding.bind_output("output1", "cuda")
    io_binding.bind_output("output2", "cuda")
    sess.run_with_iobinding(io_binding)
    output1, output2 = io_binding.get_outputs()
    assert output1.device_name() == output2.device_name() == "cuda"
    np.testing.assert_allclose(output1.numpy(), data1 + data2, rtol=1e-6)
    np.testing.assert_allclose(output2.numpy(), data1 @ data2.T, rtol=1e-4, atol=1e-5)


def test_best_practices_keep_data_on_the_gpu(example_models: None, cp) -> None:  # noqa: ANN001
    sess = ort.InferenceSession("model.onnx", providers=["CUDAExecutionProvider"])
    batches = [
        ort.OrtValue.ortvalue_from_numpy(np.random.randn(1, 3, 224, 224).astype(np.float32), "cuda", 0)
        for _ in range(3)
    ]
    io_binding = sess.io_binding()
    io_binding.bind_ortvalue_input("input", batches[0])
    io_binding.bind_output("output", "cuda")
    sess.run_with_iobinding(io_binding)
    gpu_output = io_binding.get_outputs()[0]
    assert isinstance(gpu_output._value, cp.ndarray)
    for batch in batches:
        io_binding.clear_binding_inputs()
        io_binding.bind_ortvalue_input("input", batch)
        sess.run_with_iobinding(io_binding)
        outputs = io_binding.get_outputs()
        io_binding.synchronize_outputs()
        want = _cpu_run("model.onnx", {"input": batch.numpy()})[0]
        np.testing.assert_allclose(outputs[0].numpy(), want, rtol=1e-3, atol=1e-6)


# -- OrtValue and IOBinding on the device ---------------------------------------------------------


def _add_relu() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["z"])]
    return make_model(nodes, [vinfo("x", F, [4, 8]), vinfo("y", F, [4, 8])], [vinfo("z", F, [4, 8])])


def test_ortvalue_lives_on_the_device(cp) -> None:  # noqa: ANN001
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    assert isinstance(v._value, cp.ndarray) and v.device_name() == "cuda"
    assert v.data_ptr() == v._value.data.ptr
    np.testing.assert_array_equal(v.numpy(), x)
    e = ort.OrtValue.ortvalue_from_shape_and_type([2, 5], np.float16, "cuda", 0)
    assert isinstance(e._value, cp.ndarray) and e._value.dtype == np.float16
    a = cp.arange(6, dtype=cp.float32)
    d = ort.OrtValue.from_dlpack(a)
    assert d.device_name() == "cuda" and d.data_ptr() == a.data.ptr  # zero copy
    v.update_inplace(np.ones((3, 4), np.float32))
    assert v.data_ptr() == v._value.data.ptr
    np.testing.assert_array_equal(v.numpy(), np.ones((3, 4)))


def test_device_output_pointer_identity(cp) -> None:  # noqa: ANN001
    sess = ort.InferenceSession(_add_relu().SerializeToString(), providers=CUDA)
    x = cp.asarray(np.random.randn(4, 8).astype(np.float32))
    y = cp.asarray(np.random.randn(4, 8).astype(np.float32))
    out = cp.empty((4, 8), cp.float32)
    io = sess.io_binding()
    io.bind_input("x", "cuda", 0, np.float32, [4, 8], x.data.ptr)
    io.bind_input("y", "cuda", 0, np.float32, [4, 8], y.data.ptr)
    io.bind_output("z", "cuda", 0, np.float32, [4, 8], out.data.ptr)
    sess.run_with_iobinding(io)
    assert io.get_outputs()[0].data_ptr() == out.data.ptr
    np.testing.assert_allclose(cp.asnumpy(out), np.maximum(cp.asnumpy(x + y), 0), rtol=1e-6)
    x[...] = 5  # the bound input is read in place at the next run
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(cp.asnumpy(out), np.maximum(5 + cp.asnumpy(y), 0), rtol=1e-6)
    target = ort.OrtValue.ortvalue_from_shape_and_type([4, 8], np.float32, "cuda", 0)
    io.bind_ortvalue_output("z", target)
    sess.run_with_iobinding(io)
    assert io.get_outputs()[0] is target


def test_torch_tensors_bound_by_data_ptr(torch_cuda) -> None:  # noqa: ANN001
    torch = torch_cuda
    sess = ort.InferenceSession(_add_relu().SerializeToString(), providers=CUDA)
    x = torch.randn(4, 8, device="cuda:0")
    y = torch.randn(4, 8, device="cuda:0")
    z = torch.empty(4, 8, device="cuda:0")
    io = sess.io_binding()
    io.bind_input("x", "cuda", 0, np.float32, tuple(x.shape), x.data_ptr())
    io.bind_input("y", "cuda", 0, np.float32, tuple(y.shape), y.data_ptr())
    io.bind_output("z", "cuda", 0, np.float32, tuple(z.shape), z.data_ptr())
    io.synchronize_inputs()
    sess.run_with_iobinding(io)
    io.synchronize_outputs()
    assert io.get_outputs()[0].data_ptr() == z.data_ptr()
    torch.testing.assert_close(z, torch.relu(x + y))
    # And out through DLPack, without a copy.
    t = torch.from_dlpack(io.get_outputs()[0])
    assert t.data_ptr() == z.data_ptr()


def test_host_pointer_bound_as_cuda_is_refused() -> None:
    sess = ort.InferenceSession(_add_relu().SerializeToString(), providers=CUDA)
    host = np.zeros((4, 8), np.float32)
    with pytest.raises(InvalidArgument, match="host memory"):
        sess.io_binding().bind_input("x", "cuda", 0, np.float32, [4, 8], host.ctypes.data)


def test_outputs_bound_to_cuda_from_a_cpu_binding_and_back(cp) -> None:  # noqa: ANN001
    sess = ort.InferenceSession(_add_relu().SerializeToString(), providers=CUDA)
    x = np.random.randn(4, 8).astype(np.float32)
    y = np.random.randn(4, 8).astype(np.float32)
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_cpu_input("y", y)
    io.bind_output("z", "cpu")
    sess.run_with_iobinding(io)
    assert isinstance(io.get_outputs()[0]._value, np.ndarray)
    np.testing.assert_allclose(io.copy_outputs_to_cpu()[0], np.maximum(x + y, 0), rtol=1e-6)
    np.testing.assert_allclose(sess.run(None, {"x": x, "y": y})[0], np.maximum(x + y, 0), rtol=1e-6)


# -- streams --------------------------------------------------------------------------------------


def test_user_compute_stream_and_dlpack_stream(cp) -> None:  # noqa: ANN001
    stream = cp.cuda.Stream(non_blocking=True)
    sess = ort.InferenceSession(
        _add_relu().SerializeToString(),
        providers=[("CUDAExecutionProvider", {"user_compute_stream": str(stream.ptr)})],
    )
    assert sess._provider.stream.ptr == stream.ptr
    x = ort.OrtValue.ortvalue_from_numpy(np.full((4, 8), 2, np.float32), "cuda", 0)
    y = ort.OrtValue.ortvalue_from_numpy(np.full((4, 8), -1, np.float32), "cuda", 0)
    io = sess.io_binding()
    io.bind_ortvalue_input("x", x)
    io.bind_ortvalue_input("y", y)
    io.bind_output("z", "cuda")
    ro = ort.RunOptions()
    ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
    io.synchronize_inputs()
    sess.run_with_iobinding(io, ro)
    io.synchronize_outputs()
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], np.ones((4, 8)))
    consumer = cp.cuda.Stream(non_blocking=True)
    with consumer:
        got = cp.from_dlpack(io.get_outputs()[0])  # passes the consumer's stream to __dlpack__
        doubled = got * 2
    consumer.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(doubled), np.full((4, 8), 2))


# -- CUDA graphs ----------------------------------------------------------------------------------


def test_cuda_graph_replays_with_new_inputs(example_models: None) -> None:
    sess = ort.InferenceSession("model.onnx", providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
    cpu = ort.InferenceSession("model.onnx")
    rng = np.random.default_rng(3)
    first = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    x = ort.OrtValue.ortvalue_from_numpy(first, "cuda", 0)
    out = ort.OrtValue.ortvalue_from_shape_and_type([1, 1000], np.float32, "cuda", 0)
    io = sess.io_binding()
    io.bind_ortvalue_input("input", x)
    io.bind_ortvalue_output("output", out)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # capture must succeed
        sess.run_with_iobinding(io)
    assert io._graph is not None and io._graph.captured is not None
    np.testing.assert_allclose(out.numpy(), cpu.run(None, {"input": first})[0], rtol=1e-3, atol=1e-6)
    for _ in range(3):
        new = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
        x.update_inplace(new)
        sess.run_with_iobinding(io)  # replay
        np.testing.assert_allclose(out.numpy(), cpu.run(None, {"input": new})[0], rtol=1e-3, atol=1e-6)


# -- placement and CUDA kernels -------------------------------------------------------------------


def test_cpu_fallback_with_copies(cp) -> None:  # noqa: ANN001
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Unique", ["r"], ["u"], sorted=1),
        helper.make_node("Mul", ["u", "two"], ["y"]),
    ]
    model = make_model(nodes, [vinfo("x", F, [6])], [vinfo("y", F, None)], {"two": np.array(2.0, np.float32)})
    sess = ort.InferenceSession(model.SerializeToString(), providers=CUDA)
    assert sess._compiled.placement.mixed and len(sess._compiled.placement.copies) == 2
    x = np.array([3, -1, 3, 2, 0, 2], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [0, 4, 6])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize(
    "op_type,attrs",
    [
        ("Sigmoid", {}),
        ("Erf", {}),
        ("Gelu", {}),
        ("Gelu", {"approximate": "tanh"}),
        ("Softplus", {}),
        ("Mish", {}),
        ("Elu", {"alpha": 0.5}),
        ("Selu", {}),
        ("Celu", {"alpha": 2.0}),
        ("LeakyRelu", {"alpha": 0.1}),
        ("HardSigmoid", {}),
        ("HardSwish", {}),
        ("ThresholdedRelu", {"alpha": 0.5}),
        ("Softsign", {}),
    ],
)
def test_elementwise_kernels_match_the_cpu(op_type: str, attrs: dict, dtype: type) -> None:
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make_model(
        [helper.make_node(op_type, ["x"], ["y"], **attrs)],
        [vinfo("x", elem, [1000])],
        [vinfo("y", elem, [1000])],
        opset=22,
    )
    x = np.linspace(-6, 6, 1000).astype(dtype)
    got = ort.InferenceSession(model.SerializeToString(), providers=CUDA).run(None, {"x": x})[0]
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize(
    "attrs",
    [{}, {"pads": [1, 1, 1, 1]}, {"pads": [0, 1, 2, 1], "strides": [2, 2]}, {"group": 2}, {"dilations": [2, 2]}],
)
def test_conv_matches_the_cpu(attrs: dict, dtype: type) -> None:
    rng = np.random.default_rng(0)
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w = (rng.standard_normal((8, 4 // attrs.get("group", 1), 3, 3)) * 0.2).astype(dtype)
    b = rng.standard_normal(8).astype(dtype)
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)],
        [vinfo("x", elem, [2, 4, 17, 13])],
        [vinfo("y", elem, None)],
        {"w": w, "b": b},
    )
    x = rng.standard_normal((2, 4, 17, 13)).astype(dtype)
    got = ort.InferenceSession(model.SerializeToString(), providers=CUDA).run(None, {"x": x})[0]
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    tol = 1e-2 if dtype == np.float16 else 1e-4
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


# -- models ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", light_models() + shared_models(), ids=lambda p: p.stem)
def test_model_matches_the_cpu_provider(path) -> None:  # noqa: ANN001
    model = onnx.load(str(path))
    if "light" in str(path):
        model = randomize_weights(model)
    data = model.SerializeToString()
    cpu = ort.InferenceSession(data)
    gpu = ort.InferenceSession(data, providers=CUDA)
    feeds = random_feeds(cpu.get_inputs(), np.random.default_rng(0))
    want = cpu.run(None, feeds)
    got = gpu.run(None, feeds)
    for g, w in zip(got, want):
        scale = max(float(np.abs(w).max()), 1.0)
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * scale)
