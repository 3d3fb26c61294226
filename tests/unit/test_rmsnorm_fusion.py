"""fuse_patterns' RMS normalization: x * 1 / Sqrt(ReduceMean(x^2) + eps) [* weight] over the
last axis (transformers' LlamaRMSNorm, T5LayerNorm) in the forms exporters write it becomes
onnxpy.fused.RMSNormalization, with the decomposed graph's (and onnxruntime's) values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxpy.optimizer.passes import fuse_patterns
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches, make_model, vinfo

RNG = np.random.default_rng(23)
W = 16


def _rms_model(
    form: str, weight: bool = True, axes: list[int] = (-1,), eps: np.ndarray | None = None
) -> onnx.ModelProto:
    if form == "llama":  # Pow 2, Div(1, Sqrt), Mul(x, r), Mul(weight, .)
        nodes = [
            helper.make_node("Pow", ["x", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["ms"], axes=list(axes), keepdims=1),
            helper.make_node("Add", ["ms", "eps"], ["v"]),
            helper.make_node("Sqrt", ["v"], ["s"]),
            helper.make_node("Div", ["one", "s"], ["r"]),
            helper.make_node("Mul", ["x", "r"], ["n"]),
        ]
    elif form == "reciprocal":  # x * x, Reciprocal, Mul(r, x)
        nodes = [
            helper.make_node("Mul", ["x", "x"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["ms"], axes=list(axes), keepdims=1),
            helper.make_node("Add", ["eps", "ms"], ["v"]),
            helper.make_node("Sqrt", ["v"], ["s"]),
            helper.make_node("Reciprocal", ["s"], ["r"]),
            helper.make_node("Mul", ["r", "x"], ["n"]),
        ]
    else:  # one Div of x
        nodes = [
            helper.make_node("Pow", ["x", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["ms"], axes=list(axes), keepdims=1),
            helper.make_node("Add", ["ms", "eps"], ["v"]),
            helper.make_node("Sqrt", ["v"], ["s"]),
            helper.make_node("Div", ["x", "s"], ["n"]),
        ]
    out = "n"
    if weight:
        nodes.append(helper.make_node("Mul", ["weight", "n"], ["y"]))
        out = "y"
    inits = {
        "two": np.array(2.0, np.float32),
        "one": np.array(1.0, np.float32),
        "eps": np.array(1e-6, np.float32) if eps is None else eps,
        "weight": (RNG.random(W) + 0.5).astype(np.float32),
    }
    used = {i for n in nodes for i in n.input}
    return make_model(
        nodes, [vinfo("x", TensorProto.FLOAT, ["b", "s", W])], [vinfo(out, TensorProto.FLOAT, ["b", "s", W])],
        initializers={k: v for k, v in inits.items() if k in used}, opset=17,
    )  # fmt: skip


def _want(x: np.ndarray, weight: np.ndarray | None, eps: float = 1e-6) -> np.ndarray:
    v = x.astype(np.float64)
    y = v / np.sqrt((v * v).mean(-1, keepdims=True) + eps)
    return y if weight is None else y * weight


@pytest.mark.parametrize("form", ["llama", "reciprocal", "div"])
@pytest.mark.parametrize("weight", [True, False])
def test_rms_norm_forms_fuse_into_one_node(form: str, weight: bool) -> None:
    model = _rms_model(form, weight)
    graph = build_graph(model)
    assert fuse_patterns.run(graph)
    (node,) = graph.nodes
    assert node.op_type == "RMSNormalization" and node.attrs["epsilon"] == pytest.approx(1e-6)
    x = (RNG.standard_normal((2, 5, W)) * 3).astype(np.float32)
    assert_optimized_matches(model, {"x": x}, rtol=1e-5, atol=1e-6)
    w = next((onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "weight"), None)
    from onnxpy import InferenceSession

    got = InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, _want(x, w if weight else None), rtol=2e-6, atol=1e-7)


def test_other_reductions_stay_apart() -> None:
    # over the middle axis, and an epsilon per feature: not an RMS norm over the last axis
    for model in (_rms_model("llama", axes=[1]), _rms_model("llama", eps=np.full(W, 1e-6, np.float32))):
        graph = build_graph(model)
        fuse_patterns.run(graph)
        assert "RMSNormalization" not in {n.op_type for n in graph.nodes}
        assert_optimized_matches(model, {"x": RNG.standard_normal((2, 5, W)).astype(np.float32)}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 1, 24), (24,), (1, 5, 24), (3, 24)])
def test_fused_kernel_one_row_and_many_match_the_formula(shape: tuple[int, ...]) -> None:
    # one row (a decoder step's token) takes a scalar path; several rows one pass per statistic
    from onnxpy.ops.fused import fused_rms_norm

    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, 24).astype(np.float32)
    got = fused_rms_norm(np, x, scale, epsilon=1e-6)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + 1e-6) * scale
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
