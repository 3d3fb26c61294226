"""GELU (erf form) as a fused activation: carried into the convolution, product or
PointwiseDepthwiseConv before it and applied in place on its result (MaxViT's MBConv blocks,
transformers' MLPs)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ops.elementwise import gelu
from onnxpy.ops.fused import apply_activation
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import make_model, vinfo

RNG = np.random.default_rng(20)


@pytest.mark.parametrize("shape", [(7, 9), (3, 200, 300)], ids=["whole", "blocked"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_in_place_activation_gives_the_kernels_values(shape: tuple[int, ...], dtype: type) -> None:
    x = (RNG.standard_normal(shape) * 4).astype(dtype)
    want = gelu(np, x)
    y = x.copy()
    assert apply_activation(np, y, "Gelu", []) is y
    np.testing.assert_array_equal(y, want)
    view = np.swapaxes(x, -1, -2)
    z = view.copy(order="K")  # not C-ordered, as a channels-last convolution's result
    assert not z.flags.c_contiguous
    want_view = gelu(np, view)
    assert apply_activation(np, z, "Gelu", []) is z
    np.testing.assert_array_equal(z, want_view)


def _ops(model: onnx.ModelProto) -> list[tuple[str, dict]]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return [(n.op_type, dict(n.attrs)) for n in graph.nodes]


def _same_as_plain_and_onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> None:
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = onnxpy.InferenceSession(model).run(None, {"x": x})[0]
    plain = onnxpy.InferenceSession(model, plain_opts).run(None, {"x": x})[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _decomposed_gelu(src: str, out: str) -> list[onnx.NodeProto]:
    return [
        helper.make_node("Div", [src, "sqrt2"], [f"{out}_a"]),
        helper.make_node("Erf", [f"{out}_a"], [f"{out}_e"]),
        helper.make_node("Add", [f"{out}_e", "one"], [f"{out}_p"]),
        helper.make_node("Mul", [src, f"{out}_p"], [f"{out}_m"]),
        helper.make_node("Mul", [f"{out}_m", "half"], [out]),
    ]


GELU_CONSTS = {
    "sqrt2": np.array(np.sqrt(2), np.float32),
    "one": np.array(1, np.float32),
    "half": np.array(0.5, np.float32),
}


def test_products_carry_the_gelu() -> None:
    w = (RNG.standard_normal((16, 24)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(24).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["pb"])]
    nodes += _decomposed_gelu("pb", "y")
    model = make_model(
        nodes, [vinfo("x", TensorProto.FLOAT, [2, 5, 16])], [vinfo("y")], {"w": w, "b": b, **GELU_CONSTS}
    )
    ops = _ops(model)
    assert [op for op, _ in ops] == ["FusedMatMul"] and ops[0][1]["activation"] == "Gelu"
    _same_as_plain_and_onnxruntime(model, (RNG.standard_normal((2, 5, 16)) * 2).astype(np.float32))


def test_expansion_gelu_depthwise_becomes_one_kernel() -> None:
    """MaxViT's MBConv: 1x1 expansion, GELU, depthwise 3x3 (GELU(0) = 0 keeps the border 0)."""
    w1 = (RNG.standard_normal((24, 8, 1, 1)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((24, 1, 3, 3)) * 0.3).astype(np.float32)
    b1, b2 = RNG.standard_normal(24).astype(np.float32), RNG.standard_normal(24).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["e"]), helper.make_node("Gelu", ["e"], ["g"])]
    nodes += [helper.make_node("Conv", ["g", "w2", "b2"], ["d"], group=24, pads=[1, 1, 1, 1], strides=[2, 2])]
    nodes += _decomposed_gelu("d", "y")
    model = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [1, 8, 30, 30])],
        [vinfo("y")],
        {"w1": w1, "b1": b1, "w2": w2, "b2": b2, **GELU_CONSTS},
        opset=20,
    )
    ops = _ops(model)
    assert [op for op, _ in ops] == ["PointwiseDepthwiseConv"]
    assert ops[0][1]["activation1"] == "Gelu" and ops[0][1]["activation"] == "Gelu"
    _same_as_plain_and_onnxruntime(model, RNG.standard_normal((1, 8, 30, 30)).astype(np.float32))


@pytest.mark.parametrize("variant", ["tanh", "scaled"])
def test_other_gelus_keep_their_own_function(variant: str) -> None:
    # the tanh form fuses as its own activation (GeluTanh), never as the erf one; a scaled GELU
    # (gelu(x * s) / s) is no in-place activation and stays a node of its own
    w = (RNG.standard_normal((6, 3, 3, 3)) * 0.3).astype(np.float32)
    consts: dict = {"w": w}
    if variant == "tanh":
        nodes = [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Gelu", ["c"], ["y"], approximate="tanh"),
        ]
    else:  # a float16 model's rounded divisor: gelu(x * s) / s, not an in-place activation
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), *_decomposed_gelu("c", "y")]
        consts.update(GELU_CONSTS, sqrt2=np.array(1.4140625, np.float32))
    model = make_model(nodes, [vinfo("x", TensorProto.FLOAT, [1, 3, 8, 8])], [vinfo("y")], consts, opset=20)
    ops = _ops(model)
    assert all(attrs.get("activation") != "Gelu" for _, attrs in ops), ops
    if variant == "tanh":
        assert [(op, attrs.get("activation")) for op, attrs in ops] == [("FusedConv", "GeluTanh")]
    _same_as_plain_and_onnxruntime(model, RNG.standard_normal((1, 3, 8, 8)).astype(np.float32))
