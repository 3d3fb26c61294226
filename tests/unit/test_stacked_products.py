"""Kernels whose A is a stack (batch, tokens, features) and whose B is one shared matrix make a
single product of all the stack's rows: numpy's matmul would make one product per matrix of the
stack (BERT's packed Q/K/V projection at batch 8: 646 against 390 us)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ops import fused, fused_quant, nn, quant
from onnxpy.ops.contrib import quant as contrib_quant

_RNG = np.random.default_rng(11)


@pytest.fixture
def products(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """The operand shapes of every numpy matmul made while the test runs."""
    made: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    real = np.matmul

    def recording(a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        made.append((tuple(np.shape(a)), tuple(np.shape(b))))
        return real(a, b, *args, **kwargs)

    monkeypatch.setattr(np, "matmul", recording)
    yield made


def _stack_products(made: list[tuple[tuple[int, ...], tuple[int, ...]]], b_shape: tuple[int, ...]) -> list[Any]:
    """The products with a stacked A against the shared ``b_shape`` matrix."""
    return [(a, b) for a, b in made if b == b_shape and len(a) > 2]


def test_packed_matmul(products: list[Any]) -> None:
    a = _RNG.standard_normal((4, 16, 32)).astype(np.float32)
    b = _RNG.standard_normal((32, 24)).astype(np.float32)
    bias = _RNG.standard_normal(24).astype(np.float32)
    got = fused.packed_matmul(np, a, b, bias, splits=[8, 16])
    want = a @ b + bias
    np.testing.assert_allclose(np.concatenate(got, axis=-1), want, rtol=1e-5, atol=1e-5)
    assert [g.shape for g in got] == [(4, 16, 8), (4, 16, 16)]
    assert products and not _stack_products(products, b.shape)


def test_half_precision_matmul(products: list[Any]) -> None:
    a = _RNG.standard_normal((4, 16, 32)).astype(np.float16)
    b = _RNG.standard_normal((32, 24)).astype(np.float16)
    got = nn.matmul(np, a, b)
    assert got.dtype == np.float16 and got.shape == (4, 16, 24)
    np.testing.assert_allclose(got, (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16), rtol=2e-3)
    assert products and not _stack_products(products, b.shape)


def test_matmul_integer(products: list[Any]) -> None:
    a = _RNG.integers(0, 256, (4, 16, 32), dtype=np.uint8)
    b = _RNG.integers(-128, 128, (32, 24), dtype=np.int8)
    got = quant.matmul_integer(np, a, b, np.uint8(3), np.int8(-2))
    want = (a.astype(np.int64) - 3) @ (b.astype(np.int64) + 2)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    assert products and not _stack_products(products, b.shape)


def test_shifted_integer_matmul(products: list[Any]) -> None:
    v = _RNG.integers(-255, 256, (4, 16, 32)).astype(np.float32)
    b = _RNG.integers(0, 256, (32, 24), dtype=np.uint8)
    scale = np.float32(0.01)
    got = fused_quant.shifted_integer_matmul(np, v, b, np.uint8(128), scale)
    want = (v.astype(np.float64) @ (b.astype(np.float64) - 128)) * 0.01
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert products and not _stack_products(products, b.shape)


def test_matmul_nbits(products: list[Any]) -> None:
    k, n, block = 32, 24, 16
    q = _RNG.integers(0, 16, (n, k), dtype=np.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, k // block, block // 2)
    scales = _RNG.uniform(0.01, 0.1, n * (k // block)).astype(np.float32)
    a = _RNG.standard_normal((4, 16, k)).astype(np.float32)
    got = contrib_quant.matmul_nbits(np, a, packed, scales, K=k, N=n, block_size=block)
    weights = (q.astype(np.float32) - 8) * np.repeat(scales.reshape(n, k // block), block, axis=1)
    np.testing.assert_allclose(got, a @ weights.T, rtol=1e-4, atol=1e-4)
    assert products and not _stack_products(products, (k, n))


@pytest.mark.parametrize("op_type", ["LSTM", "GRU", "RNN"])
def test_recurrent_input_projection(products: list[Any], op_type: str) -> None:
    steps, batch, features, hidden = 7, 2, 12, 5
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op_type]
    w = _RNG.standard_normal((1, gates * hidden, features)).astype(np.float32)
    r = _RNG.standard_normal((1, gates * hidden, hidden)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node(op_type, ["x", "w", "r"], ["y"], hidden_size=hidden)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, batch, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(r, "r")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString()
    x = _RNG.standard_normal((steps, batch, features)).astype(np.float32)
    (got,) = onnxpy.InferenceSession(model).run(None, {"x": x})
    assert got.shape == (steps, 1, batch, hidden)
    # The projection of every step's input at once: one product of all steps' rows.
    projections = [(a, b) for a, b in products if b == (features, gates * hidden)]
    assert projections == [((steps * batch, features), (features, gates * hidden))]
