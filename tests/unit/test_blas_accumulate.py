"""GEMM adding into its output (numpy's bundled BLAS, beta = 1), and the residual convolutions
that use it: the convolution adds into the dying residual's buffer."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxpy
from onnxpy.ops import _blas
from onnxpy.ops import conv as conv_module
from onnxpy.runtime import executor
from tests.helpers import make_model, vinfo

needs_blas = pytest.mark.skipif(
    _blas.openblas_library() is None, reason="numpy here bundles no OpenBLAS that _blas can find (another numpy build)"
)


@needs_blas
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["rows", "a transposed", "b transposed", "c strided"])
def test_gemm_accumulate_adds_the_product(dtype: type, layout: str) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((7, 5)).astype(dtype)
    b = rng.standard_normal((5, 9)).astype(dtype)
    if layout == "a transposed":
        a = np.ascontiguousarray(a.T).T
    if layout == "b transposed":
        b = np.ascontiguousarray(b.T).T
    wide = rng.standard_normal((7, 12)).astype(dtype)
    c = wide[:, :9] if layout == "c strided" else rng.standard_normal((7, 9)).astype(dtype)
    want = c + a @ b
    before = wide.copy()
    assert _blas.gemm_accumulate(a, b, c)
    np.testing.assert_allclose(c, want, rtol=1e-5 if dtype == np.float32 else 1e-12)
    if layout == "c strided":
        np.testing.assert_array_equal(wide[:, 9:], before[:, 9:])  # outside c: untouched


@pytest.mark.parametrize(
    "case",
    ["int dtype", "mixed dtypes", "shape mismatch", "c overlaps a", "c columns strided", "read-only c"],
)
def test_gemm_accumulate_declines_what_it_cannot_do_and_leaves_c_alone(case: str) -> None:
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3, 4), (4, 4)))
    if case == "int dtype":
        a, b, c = a.astype(np.int32), b.astype(np.int32), c.astype(np.int32)
    elif case == "mixed dtypes":
        b = b.astype(np.float64)
    elif case == "shape mismatch":
        c = rng.standard_normal((4, 5)).astype(np.float32)
    elif case == "c overlaps a":
        a = c[:, :3]
    elif case == "c columns strided":
        c = rng.standard_normal((4, 8)).astype(np.float32)[:, ::2]
    elif case == "read-only c":
        c.flags.writeable = False
    before = c.copy()
    assert not _blas.gemm_accumulate(a, b, c)
    np.testing.assert_array_equal(c, before)


def test_a_private_reshaped_result_counts_as_owned_and_a_shared_one_does_not() -> None:
    v = np.matmul(np.ones((4, 3), np.float32), np.ones((3, 4), np.float32)).reshape(2, 8)
    assert not v.flags.owndata and executor._owns_memory(v)
    other = v.reshape(16)  # a second view of the same buffer: writing v would change it
    assert not executor._owns_memory(v)
    del other
    assert executor._owns_memory(v)
    assert not executor._owns_memory(v[:, ::2])  # a strided piece of it


def _residual_model(kernel: int, stride: int, bias: bool, residual_read_later: bool) -> onnx.ModelProto:
    """r = Relu(Conv_a(x)); y = Relu(Conv_b(r) + s) where s = Conv_s(x) is the shortcut (the
    residual), optionally also read afterwards (then it is not the convolution's to overwrite)."""
    c, m = 6, 8
    rng = np.random.default_rng(3)
    pad = kernel // 2
    inits = {
        "wa": rng.standard_normal((c, 3, 1, 1)).astype(np.float32),
        "wb": rng.standard_normal((m, c, kernel, kernel)).astype(np.float32) * 0.3,
        "ws": rng.standard_normal((m, 3, 1, 1)).astype(np.float32),
        "bb": rng.standard_normal(m).astype(np.float32),
    }
    conv_b_inputs = ["r", "wb", "bb"] if bias else ["r", "wb"]
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["x", "ws"], ["s"], strides=[stride, stride]),
        helper.make_node("Conv", conv_b_inputs, ["p"], pads=[pad] * 4, strides=[stride, stride]),
        helper.make_node("Add", ["p", "s"], ["q"]),
        helper.make_node("Relu", ["q"], ["y"]),
    ]
    outputs = [vinfo("y")]
    if residual_read_later:
        nodes.append(helper.make_node("Neg", ["s"], ["s_neg"]))
        outputs.append(vinfo("s_neg"))
    return make_model(nodes, [vinfo("x", shape=[1, 3, 10, 10])], outputs, inits)


@needs_blas
@pytest.mark.parametrize("kernel, stride, bias", [(1, 1, True), (1, 1, False), (3, 1, True), (3, 2, False)], ids=str)
@pytest.mark.parametrize("residual_read_later", [False, True], ids=["residual dies", "residual read later"])
def test_residual_convolutions_add_into_the_dying_residual(
    monkeypatch: pytest.MonkeyPatch, kernel: int, stride: int, bias: bool, residual_read_later: bool
) -> None:
    calls: list[Any] = []
    real = conv_module.gemm_accumulate

    def spy(a: Any, b: Any, c: Any) -> bool:
        done = real(a, b, c)
        calls.append(done)
        return done

    monkeypatch.setattr(conv_module, "gemm_accumulate", spy)
    model = _residual_model(kernel, stride, bias, residual_read_later)
    data = model.SerializeToString()
    x = np.random.default_rng(4).standard_normal((1, 3, 10, 10)).astype(np.float32)
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = onnxpy.InferenceSession(data, plain_opts).run(None, {"x": x})
    calls.clear()
    got = onnxpy.InferenceSession(data).run(None, {"x": x})
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, p, w in zip(got, plain, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(g, p, rtol=1e-5, atol=1e-5)
    # At these sizes every layer takes a 1x1 or im2col GEMM (no Winograd, no tap sum): it adds
    # into the residual's buffer, unless the residual is still needed afterwards.
    if residual_read_later:
        assert calls == []
    else:
        assert calls == [True]
