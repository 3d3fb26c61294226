"""fold_layer_scale.py: gamma * (x @ W + b) -> x @ (W * gamma) + b * gamma, after which the
residual Add fuses into the product; and the cases where gamma must stay a Mul."""

from __future__ import annotations

import collections
import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.optimizer.rewrite import FUSED_DOMAIN
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches, make_model, vinfo

RNG = np.random.default_rng(11)
F32 = TensorProto.FLOAT
D = 16
TORCH_REASON = "torch is not installed (this test exports a torch module)"


def _optimized(model: onnx.ModelProto) -> list:
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    return graph.nodes


def _ops(model: onnx.ModelProto) -> dict[str, int]:
    return dict(collections.Counter(n.op_type for n in _optimized(model)))


def _matches(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    assert_optimized_matches(model, feeds, rtol=1e-5, atol=1e-6)


def _weights(k: int = D, n: int = D) -> tuple[np.ndarray, np.ndarray]:
    return (RNG.standard_normal((k, n)) * 0.3).astype(np.float32), RNG.standard_normal(n).astype(np.float32)


def _block(gamma: np.ndarray, bias: bool = True, gamma_first: bool = False) -> onnx.ModelProto:
    """x + gamma * (x @ W [+ b]) on x of shape [2, 5, D]."""
    w, b = _weights()
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"])]
    if bias:
        nodes.append(helper.make_node("Add", ["p", "b"], ["pb"]))
    src = "pb" if bias else "p"
    nodes.append(helper.make_node("Mul", ["gamma", src] if gamma_first else [src, "gamma"], ["s"]))
    nodes.append(helper.make_node("Add", ["x", "s"], ["y"]))
    inits = {"w": w, "gamma": gamma, **({"b": b} if bias else {})}
    return make_model(nodes, [vinfo("x", F32, [2, 5, D])], [vinfo("y", F32, [2, 5, D])], initializers=inits)


X = {"x": RNG.standard_normal((2, 5, D)).astype(np.float32)}
GAMMA = RNG.uniform(0.1, 1.0, D).astype(np.float32)


@pytest.mark.parametrize(
    ("gamma", "bias", "gamma_first"),
    [
        (GAMMA, True, False),
        (GAMMA.reshape(1, D), True, True),
        (GAMMA.reshape(1, 1, D), True, False),
        (np.array([0.125], np.float32), True, False),  # one factor for every column
        (GAMMA, False, False),  # no bias: the product stays without one
    ],
)
def test_layer_scale_folds_and_the_residual_fuses(gamma: np.ndarray, bias: bool, gamma_first: bool) -> None:
    model = _block(gamma, bias, gamma_first)
    nodes = _optimized(model)
    assert [(n.op_type, n.domain) for n in nodes] == [("FusedMatMul", FUSED_DOMAIN)]
    fused = nodes[0]
    assert fused.inputs[0] == "x" and fused.inputs[3] == "x" and bool(fused.inputs[2]) == bias
    _matches(model, X)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_scale_folds_into_weight_and_bias(trans_b: int) -> None:
    w, b = _weights(D, 8)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "c"], ["p"], transB=trans_b, alpha=0.5, beta=2.0),
        helper.make_node("Mul", ["p", "gamma"], ["y"]),
    ]
    inits = {"w": w.T.copy() if trans_b else w, "c": b.reshape(1, 8), "gamma": GAMMA[:8].reshape(1, 8)}
    model = make_model(nodes, [vinfo("x", F32, [3, D])], [vinfo("y", F32, [3, 8])], initializers=inits)
    assert "Mul" not in _ops(model)
    _matches(model, {"x": RNG.standard_normal((3, D)).astype(np.float32)})


def test_timm_layer_scale_export_folds() -> None:
    torch = pytest.importorskip("torch", reason=TORCH_REASON)

    class LayerScaleBlock(torch.nn.Module):  # timm's LayerScale after a Linear, then the residual
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(D, D)
            self.gamma = torch.nn.Parameter(torch.rand(D))

        def forward(self, x):
            return x + self.fc(x).mul(self.gamma)

    torch.manual_seed(0)
    module = LayerScaleBlock().eval()
    x = torch.randn(2, 7, D)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module, (x,), f, input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "b", 1: "s"}},
            opset_version=17, dynamo=False,
        )  # fmt: skip
    model = onnx.load_from_string(f.getvalue())
    assert _ops(model) == {"FusedMatMul": 1}
    with torch.no_grad():
        want = module(x).numpy()
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    _matches(model, {"x": RNG.standard_normal((1, 3, D)).astype(np.float32)})


def test_gamma_along_another_axis_stays() -> None:
    """A [D, 1] gamma against a [D, D] product scales rows: not a weight's columns."""
    w, b = _weights()
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["pb"]),
        helper.make_node("Mul", ["pb", "gamma"], ["y"]),
    ]
    inits = {"w": w, "b": b, "gamma": GAMMA.reshape(D, 1)}
    model = make_model(nodes, [vinfo("x", F32, [D, D])], [vinfo("y", F32, [D, D])], initializers=inits)
    assert _ops(model).get("Mul") == 1
    _matches(model, {"x": RNG.standard_normal((D, D)).astype(np.float32)})


def test_product_with_a_second_reader_stays() -> None:
    w, b = _weights()
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["pb"]),
        helper.make_node("Mul", ["pb", "gamma"], ["s"]),
        helper.make_node("Add", ["x", "s"], ["y"]),
        helper.make_node("Relu", ["pb"], ["r"]),
    ]
    model = make_model(
        nodes,
        [vinfo("x", F32, [2, 5, D])],
        [vinfo("y", F32, [2, 5, D]), vinfo("r", F32, [2, 5, D])],
        initializers={"w": w, "b": b, "gamma": GAMMA},
    )
    assert _ops(model).get("Mul") == 1
    _matches(model, X)


def test_activation_between_product_and_scale_stays() -> None:
    w, b = _weights()
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["pb"]),
        helper.make_node("Gelu", ["pb"], ["g"]),
        helper.make_node("Mul", ["g", "gamma"], ["s"]),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    model = make_model(
        nodes,
        [vinfo("x", F32, [2, 5, D])],
        [vinfo("y", F32, [2, 5, D])],
        initializers={"w": w, "b": b, "gamma": GAMMA},
        opset=20,
    )
    ops = _ops(model)
    assert ops.get("Mul") == 1 and ops.get("FusedMatMul") == 1  # the GELU fused into the product
    _matches(model, X)


def test_weight_a_caller_may_override_stays() -> None:
    """W is an initializer listed as a graph input: a feed may replace it, so it is no constant
    (without bias, so that the Mul reads the MatMul itself)."""
    model = _block(GAMMA, bias=False)
    model.graph.input.append(vinfo("w", F32, [D, D]))
    assert _ops(model).get("Mul") == 1
    _matches(model, X)
    _matches(model, {**X, "w": RNG.standard_normal((D, D)).astype(np.float32)})


def test_weight_shared_by_two_products_is_not_modified() -> None:
    """Both products read W; one is scaled. The other must still see W as it was."""
    w, b = _weights()
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["pb"]),
        helper.make_node("Mul", ["pb", "gamma"], ["s"]),
        helper.make_node("Add", ["x", "s"], ["y"]),
        helper.make_node("MatMul", ["z", "w"], ["q"]),
        helper.make_node("Add", ["q", "b"], ["v"]),
    ]
    model = make_model(
        nodes,
        [vinfo("x", F32, [2, 5, D]), vinfo("z", F32, [3, D])],
        [vinfo("y", F32, [2, 5, D]), vinfo("v", F32, [3, D])],
        initializers={"w": w, "b": b, "gamma": GAMMA},
    )
    nodes = _optimized(model)
    assert "Mul" not in collections.Counter(n.op_type for n in nodes)
    readers = sorted(n.inputs[1] for n in nodes if n.op_type == "FusedMatMul")
    assert len(readers) == 2 and "w" in readers and readers[0] != readers[1]
    _matches(model, {**X, "z": RNG.standard_normal((3, D)).astype(np.float32)})


def test_gamma_that_adds_an_axis_stays() -> None:
    """A [1, 1, D] gamma against a [5, D] product makes a [1, 5, D] result: the Mul stays."""
    w, b = _weights()
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["pb"]),
        helper.make_node("Mul", ["pb", "gamma"], ["y"]),
    ]
    inits = {"w": w, "b": b, "gamma": GAMMA.reshape(1, 1, D)}
    model = make_model(nodes, [vinfo("x", F32, [5, D])], [vinfo("y", F32, [1, 5, D])], initializers=inits)
    assert _ops(model).get("Mul") == 1
    _matches(model, {"x": RNG.standard_normal((5, D)).astype(np.float32)})


def test_scale_after_the_residual_stays() -> None:
    """gamma * (x @ W + b + x): the product carries the residual, which gamma scales too."""
    w, b = _weights()
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["pb"]),
        helper.make_node("Add", ["pb", "x"], ["r"]),
        helper.make_node("Mul", ["r", "gamma"], ["y"]),
    ]
    model = make_model(
        nodes,
        [vinfo("x", F32, [2, 5, D])],
        [vinfo("y", F32, [2, 5, D])],
        initializers={"w": w, "b": b, "gamma": GAMMA},
    )
    ops = _ops(model)
    assert ops.get("Mul") == 1 and ops.get("FusedMatMul") == 1
    _matches(model, X)
