"""optimizer/passes/relu_after_pool.py: a convolution's fused ReLU moves past the strided
MaxPool reading it, with identical numbers, and stays where moving it would change them."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import make_model, vinfo

F = TensorProto.FLOAT


def _model(pool_attrs: dict[str, Any], *, indices: bool = False, second_reader: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    # Channel 0's bias keeps every window negative (its ReLU output is 0), the others mix signs.
    inits = {
        "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "b": np.array([-40.0, -2.0, 0.0, 1.0], np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p", "i"] if indices else ["p"], **pool_attrs),
    ]
    outputs = [vinfo("p", F, None)]
    if indices:
        outputs.append(vinfo("i", TensorProto.INT64, None))
    if second_reader:
        nodes.append(helper.make_node("Neg", ["r"], ["n"]))
        outputs.append(vinfo("n", F, None))
    return make_model(nodes, [vinfo("x", F, [2, 3, 9, 9])], outputs, initializers=inits)


def _ops(model: onnx.ModelProto) -> dict[str, int]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return dict(collections.Counter(n.op_type for n in graph.nodes))


def _check(model: onnx.ModelProto, with_ort: bool = True) -> None:
    x = np.random.default_rng(4).standard_normal((2, 3, 9, 9)).astype(np.float32)
    data = model.SerializeToString()
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = onnxpy.InferenceSession(data).run(None, {"x": x})
    plain = onnxpy.InferenceSession(data, plain_opts).run(None, {"x": x})
    for g, p in zip(got, plain):
        np.testing.assert_array_equal(g, p)  # max and ReLU commute exactly
    if with_ort:  # onnxruntime refuses pads as wide as the kernel
        want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert (got[0] == 0).any() and (got[0] > 0).any()  # the ReLU really clipped something


@pytest.mark.parametrize(
    "pool",
    [
        {"kernel_shape": [3, 3], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},  # last windows partly outside
        {"kernel_shape": [2, 2], "strides": [2, 1]},
        # Padding narrower than the kernel: every window still holds an input element.
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [2, 0, 1, 1]},
    ],
    ids=["3x3s2", "ceil", "2x2s2x1", "padded", "padded-asymmetric"],
)
def test_relu_moves_after_a_strided_pool_of_full_windows(pool: dict[str, Any]) -> None:
    model = _model(pool)
    ops = _ops(model)
    assert ops == {"FusedConv": 1, "FusedMaxPool": 1}, ops
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    (conv,) = [n for n in graph.nodes if n.op_type == "FusedConv"]
    (fused,) = [n for n in graph.nodes if n.op_type == "FusedMaxPool"]
    assert not conv.attrs.get("activation") and fused.attrs["activation"] == "Relu"
    assert fused.outputs == ["p"]  # the pool's output keeps its name and values
    _check(model)
    # The rectified convolution output, fetched by name, still means what the model says.
    x = np.random.default_rng(5).standard_normal((2, 3, 9, 9)).astype(np.float32)
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    (got,) = onnxpy.InferenceSession(model.SerializeToString()).run(["r"], {"x": x})
    (want,) = onnxpy.InferenceSession(model.SerializeToString(), plain_opts).run(["r"], {"x": x})
    assert got.min() == 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "pool,kwargs",
    [
        # A window wholly in the padding (pad >= kernel), or possibly so (ceil_mode, dilation).
        ({"kernel_shape": [2, 2], "strides": [2, 2], "pads": [2, 0, 0, 0]}, {}),
        ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, {}),
        ({"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [3, 3]}, {}),
        ({"kernel_shape": [3, 3], "strides": [1, 1]}, {}),  # nothing saved
        ({"kernel_shape": [3, 3], "strides": [2, 2]}, {"indices": True}),
        ({"kernel_shape": [3, 3], "strides": [2, 2]}, {"second_reader": True}),
    ],
    ids=["pad-as-wide-as-kernel", "padded-ceil", "padded-dilated", "stride-1", "indices", "second-reader"],
)
def test_relu_stays_fused_where_moving_it_is_wrong_or_useless(pool: dict[str, Any], kwargs: dict[str, Any]) -> None:
    model = _model(pool, **kwargs)
    ops = _ops(model)
    assert "Relu" not in ops and "FusedMaxPool" not in ops, ops
    _check(model, with_ort=max(pool.get("pads", [0])) < min(pool["kernel_shape"]))


def _fire_model(*, relu_on_both: bool = True) -> onnx.ModelProto:
    """SqueezeNet's fire module before a pool: a 1x1 and a 3x3 expand of one input, each ReLU'd,
    concatenated on channels, then a 3x3/2 MaxPool."""
    rng = np.random.default_rng(6)
    inits = {
        "w1": rng.standard_normal((4, 3, 1, 1)).astype(np.float32),
        "b1": np.array([-40.0, -1.0, 0.0, 1.0], np.float32),
        "w3": rng.standard_normal((5, 3, 3, 3)).astype(np.float32),
        "b3": np.array([-1.0, 0.0, 0.5, -40.0, 2.0], np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["e1"]),
        helper.make_node("Relu", ["e1"], ["r1"]),
        helper.make_node("Conv", ["x", "w3", "b3"], ["e3"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu" if relu_on_both else "Identity", ["e3"], ["r3"]),
        helper.make_node("Concat", ["r1", "r3"], ["cat"], axis=1),
        helper.make_node("MaxPool", ["cat"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
    ]
    return make_model(nodes, [vinfo("x", F, [2, 3, 9, 9])], [vinfo("p", F, None)], initializers=inits)


def test_relu_of_every_concat_conv_member_moves_after_the_pool() -> None:
    model = _fire_model()
    assert _ops(model) == {"ConcatConv": 1, "FusedMaxPool": 1}
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    (cat,) = [n for n in graph.nodes if n.op_type == "ConcatConv"]
    assert cat.attrs["activations"] == ["", ""]
    _check(model)


def test_concat_conv_with_a_member_without_relu_keeps_its_activations() -> None:
    model = _fire_model(relu_on_both=False)
    ops = _ops(model)
    assert "Relu" not in ops and ops.get("ConcatConv") == 1, ops
    _check(model)


@pytest.mark.parametrize(
    "shape,attrs",
    [
        ((1, 24, 111, 111), dict(kernel_shape=[3, 3], strides=[2, 2])),  # over 1 MB: in blocks
        ((2, 5, 12, 11), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),  # whole passes
        ((1, 3, 6, 6), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[3, 3, 3, 3])),  # padded path
    ],
    ids=["blocked", "passes", "padded"],
)
def test_fused_max_pool_is_relu_of_max_pool(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    from onnxpy.ops.fused import fused_max_pool
    from onnxpy.ops.pool import max_pool

    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    want = np.maximum(max_pool(np, x, **attrs), 0)
    got = fused_max_pool(np, x, **attrs)
    np.testing.assert_array_equal(got, want)
    assert (got == 0).any() and (got > 0).any()
    with pytest.raises(ValueError, match="activation 'Relu' only"):
        fused_max_pool(np, x, **attrs, activation="Tanh")
