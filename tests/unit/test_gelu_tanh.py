"""GELU's tanh approximation: the kernel (ops/elementwise.gelu_tanh) against the formula in
float64, and its decomposed export (GPT-2's NewGELU, torch's gelu(approximate="tanh")) fused by
fuse_patterns into GeluTanh, then into a product's activation by fuse_activation."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from onnxpy.ops.elementwise import gelu_tanh
from onnxpy.optimizer.manager import optimize
from onnxpy.optimizer.passes import fuse_patterns
from onnxpy.runtime.compile import build_graph
from tests.helpers import make_model, vinfo

RNG = np.random.default_rng(11)
BETA, KAPPA = math.sqrt(2 / math.pi), 0.044715


def _formula(x: np.ndarray, beta: float = BETA, kappa: float = KAPPA) -> np.ndarray:
    """The definition, term by term, in float64."""
    v = x.astype(np.float64)
    return 0.5 * v * (1 + np.tanh(beta * (v + kappa * v**3)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("size", [7, 300_000])  # small, and blocked through the L2-sized temporary
def test_kernel_matches_the_formula(dtype: type, size: int) -> None:
    x = (RNG.standard_normal(size) * 4).astype(dtype)
    got = gelu_tanh(np, x)
    assert got.dtype == dtype and got.shape == x.shape
    tol = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}[dtype]
    want = _formula(x)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * 1e-2)


@pytest.mark.filterwarnings("error")
def test_kernel_saturates_and_keeps_nan() -> None:
    x = np.array([-np.inf, -1e30, -60.0, -0.0, 0.0, 60.0, 1e30, np.inf, np.nan], dtype=np.float32)
    got = gelu_tanh(np, x)
    assert np.isnan(got[0])  # -inf * 0, as the formula gives
    np.testing.assert_array_equal(got[1:8], np.array([0, 0, 0, 0, 60, 1e30, np.inf], dtype=np.float32))
    assert np.signbit(got[1]) and np.signbit(got[3])  # the limit from below is -0
    assert np.isnan(got[8])


def test_kernel_writes_in_place_and_in_memory_order() -> None:
    # a channels-last array, large enough for the blocks: computed in its own memory order
    x = (RNG.standard_normal((2, 48, 40, 48)) * 3).astype(np.float32).transpose(0, 3, 1, 2)
    want = _formula(x)
    y = x.copy(order="K")
    assert gelu_tanh(np, y, out=y) is y
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-8)
    # other constants than GELU's, and a 0-d array
    np.testing.assert_allclose(gelu_tanh(np, np.array(1.5, np.float32), 0.5, 0.25), _formula(np.array(1.5), 0.5, 0.25))


def _tanh_gelu_nodes(form: str) -> list:
    """0.5 x (1 + tanh(beta (x + kappa x^3))) as exporters write it."""
    if form == "newgelu":  # transformers' NewGELUActivation (GPT-2): Pow, 0.5 on x first
        return [
            helper.make_node("Mul", ["half", "x"], ["hx"]),
            helper.make_node("Pow", ["x", "three"], ["cube"]),
            helper.make_node("Mul", ["kappa", "cube"], ["kc"]),
            helper.make_node("Add", ["x", "kc"], ["inner"]),
            helper.make_node("Mul", ["beta", "inner"], ["u"]),
            helper.make_node("Tanh", ["u"], ["t"]),
            helper.make_node("Add", ["one", "t"], ["p"]),
            helper.make_node("Mul", ["hx", "p"], ["y"]),
        ]
    # torch's gelu(approximate="tanh") before opset 20: x * (x * x), 0.5 applied last
    return [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("Mul", ["x", "sq"], ["cube"]),
        helper.make_node("Mul", ["cube", "kappa"], ["kc"]),
        helper.make_node("Add", ["kc", "x"], ["inner"]),
        helper.make_node("Mul", ["inner", "beta"], ["u"]),
        helper.make_node("Tanh", ["u"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["p"]),
        helper.make_node("Mul", ["x", "p"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["y"]),
    ]


def _tanh_gelu_model(form: str, beta: float = BETA, kappa: float = KAPPA, elem: int = TensorProto.FLOAT):
    dt = np.float16 if elem == TensorProto.FLOAT16 else np.float32
    consts = {
        "half": np.array(0.5, dt),
        "one": np.array(1, dt),
        "three": np.array(3, dt),
        "kappa": np.array(kappa, dt),
        "beta": np.array(beta, dt),
    }
    nodes = _tanh_gelu_nodes(form)
    used = {i for n in nodes for i in n.input}
    return make_model(
        nodes,
        [vinfo("x", elem, [4, 16])],
        [vinfo("y", elem, [4, 16])],
        initializers={k: v for k, v in consts.items() if k in used},
    )


@pytest.mark.parametrize("form", ["newgelu", "torch_tanh"])
def test_decomposed_tanh_gelu_fuses_and_matches_onnxruntime(form: str) -> None:
    m = _tanh_gelu_model(form)
    graph = build_graph(m)
    assert fuse_patterns.run(graph)
    (node,) = graph.nodes
    assert node.op_type == "GeluTanh"
    assert node.attrs["beta"] == pytest.approx(BETA, rel=1e-7) and node.attrs["kappa"] == pytest.approx(KAPPA, rel=1e-7)
    x = {"x": (RNG.standard_normal((4, 16)) * 4).astype(np.float32)}
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]
    got = onnxpy.InferenceSession(m).run(None, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, _formula(x["x"]), rtol=2e-6, atol=1e-7)


def test_half_precision_constants_are_kept_as_the_model_has_them() -> None:
    m = _tanh_gelu_model("newgelu", elem=TensorProto.FLOAT16)
    x = {"x": (RNG.standard_normal((4, 16)) * 3).astype(np.float16)}
    got = onnxpy.InferenceSession(m).run(None, x)[0]
    beta, kappa = float(np.float16(BETA)), float(np.float16(KAPPA))
    assert (beta, kappa) != (BETA, KAPPA)
    np.testing.assert_allclose(got.astype(np.float64), _formula(x["x"], beta, kappa), rtol=1e-3, atol=1e-3)


def test_other_shapes_of_the_expression_stay_apart() -> None:
    # x^2 instead of x^3, and a cube whose square is read elsewhere: not GELU's pattern
    m = _tanh_gelu_model("newgelu")
    m.graph.initializer[[t.name for t in m.graph.initializer].index("three")].CopyFrom(
        helper.make_tensor("three", TensorProto.FLOAT, [], [2.0])
    )
    graph = build_graph(m)
    fuse_patterns.run(graph)
    assert "GeluTanh" not in {n.op_type for n in graph.nodes} and "Tanh" in {n.op_type for n in graph.nodes}

    m2 = _tanh_gelu_model("torch_tanh")
    m2.graph.output.append(vinfo("sq", TensorProto.FLOAT, [4, 16]))
    graph = build_graph(m2)
    fuse_patterns.run(graph)
    assert "GeluTanh" not in {n.op_type for n in graph.nodes}
    x = {"x": (RNG.standard_normal((4, 16)) * 4).astype(np.float32)}
    y, sq = onnxpy.InferenceSession(m2).run(None, x)
    np.testing.assert_allclose(y, _formula(x["x"]), rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(sq, x["x"] ** 2, rtol=1e-6)


def test_fused_into_the_product_before_it() -> None:
    # MatMul + bias, then the decomposed tanh GELU: one FusedMatMul with the GELU as its activation
    w = RNG.standard_normal((16, 16)).astype(np.float32)
    b = RNG.standard_normal(16).astype(np.float32)
    gelu = _tanh_gelu_model("newgelu")
    model = make_model(
        [helper.make_node("MatMul", ["a", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["x"]), *gelu.graph.node],
        [vinfo("a", TensorProto.FLOAT, [4, 16])],
        [vinfo("y", TensorProto.FLOAT, [4, 16])],
        initializers={**{t.name: numpy_helper.to_array(t) for t in gelu.graph.initializer}, "w": w, "b": b},
    )
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    assert [(n.op_type, n.attrs.get("activation")) for n in graph.nodes] == [("FusedMatMul", "GeluTanh")]
    a = {"a": RNG.standard_normal((4, 16)).astype(np.float32)}
    np.testing.assert_allclose(
        onnxpy.InferenceSession(model).run(None, a)[0], _formula(a["a"] @ w + b), rtol=1e-5, atol=1e-5
    )
