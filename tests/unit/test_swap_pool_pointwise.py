"""optimizer/passes/swap_pool_pointwise.py: an AveragePool and the 1x1 convolution next to it
trade places where that pools fewer channels or convolves fewer positions, with the same
numbers (up to rounding), and stay where the swap would change them."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import check_optimized, make_model, vinfo

F = TensorProto.FLOAT


def _order(model: onnx.ModelProto) -> list[str]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return [n.op_type for n in graph.nodes]


def _check(model: onnx.ModelProto, shape: list[int]) -> None:
    # Outputs are sums of up to 256 products of unit normals (magnitudes about 10-20): float32
    # rounding in another order moves them by ~1e-6 of that, more than 1e-5 absolute near zero.
    check_optimized(model, {"x": np.random.default_rng(4).standard_normal(shape).astype(np.float32)}, atol=1e-4)


def _transition(
    pool: dict[str, Any],
    *,
    bias: bool = True,
    relu: bool = False,
    cin: int = 256,
    cout: int = 128,
    batch: int | str = 2,
) -> onnx.ModelProto:
    """DenseNet's transition: a 1x1 convolution (cin -> cout), then an average pool."""
    rng = np.random.default_rng(3)
    inits = {"w": rng.standard_normal((cout, cin, 1, 1)).astype(np.float32)}
    conv_in = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(cout).astype(np.float32) * 3
        conv_in.append("b")
    nodes = [helper.make_node("Conv", conv_in, ["y"])]
    pooled = "y"
    if relu:
        nodes.append(helper.make_node("Relu", ["y"], ["r"]))
        pooled = "r"
    nodes.append(helper.make_node("AveragePool", [pooled], ["p"], **pool))
    return make_model(nodes, [vinfo("x", F, [batch, cin, 12, 12])], [vinfo("p", F, None)], initializers=inits)


def _projection(
    pool: dict[str, Any], *, bias: bool = True, relu: bool = True, cin: int = 48, cout: int = 8
) -> onnx.ModelProto:
    """Inception's pool projection: a 3x3/1 average pool, then a 1x1 convolution, BN and ReLU."""
    rng = np.random.default_rng(5)
    inits = {
        "w": rng.standard_normal((cout, cin, 1, 1)).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, cout).astype(np.float32),
        "shift": rng.standard_normal(cout).astype(np.float32),
        "mean": rng.standard_normal(cout).astype(np.float32),
        "var": rng.uniform(0.5, 1.5, cout).astype(np.float32),
    }
    conv_in = ["p", "w"]
    if bias:
        inits["b"] = rng.standard_normal(cout).astype(np.float32) * 3
        conv_in.append("b")
    nodes = [
        helper.make_node("AveragePool", ["x"], ["p"], **pool),
        helper.make_node("Conv", conv_in, ["c"]),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"]),
    ]
    out = "n"
    if relu:
        nodes.append(helper.make_node("Relu", ["n"], ["r"]))
        out = "r"
    return make_model(nodes, [vinfo("x", F, [2, cin, 9, 9])], [vinfo(out, F, None)], initializers=inits)


@pytest.mark.parametrize(
    "pool",
    [
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},  # count_include_pad 0
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    ],
    ids=["2x2s2", "padded", "ceil"],
)
def test_a_transition_pools_first(pool: dict[str, Any]) -> None:
    model = _transition(pool)
    order = _order(model)
    assert order[0] == "AveragePool" and order[1:] in (["Conv"], ["FusedConv"]), order
    _check(model, [2, 256, 12, 12])


def test_a_free_batch_dimension_does_not_stop_the_swap() -> None:
    model = _transition({"kernel_shape": [2, 2], "strides": [2, 2]}, batch="N")
    assert _order(model)[0] == "AveragePool"
    _check(model, [3, 256, 12, 12])


def test_a_projection_convolves_first_and_its_relu_follows_the_pool() -> None:
    model = _projection({"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]})
    assert _order(model) == ["FusedConv", "AveragePool", "Relu"]
    _check(model, [2, 48, 9, 9])


def test_a_projection_without_activation_needs_no_relu() -> None:
    model = _projection({"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}, relu=False)
    order = _order(model)
    assert order[0] in ("Conv", "FusedConv") and order[1:] == ["AveragePool"], order
    _check(model, [2, 48, 9, 9])


@pytest.mark.parametrize(
    "model,shape",
    [
        # A padded position counted in the average scales the bias: Pool(Wx + b) != W Pool(x) + b.
        (
            _transition({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
            [2, 256, 12, 12],
        ),
        # A ReLU between the convolution and the pool does not commute with the average.
        (_transition({"kernel_shape": [2, 2], "strides": [2, 2]}, relu=True), [2, 256, 12, 12]),
        # Pooling first costs more: more input than output channels at the same positions.
        (_projection({"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}, cin=8, cout=48), [2, 8, 9, 9]),
    ],
    ids=["counted-padding-with-bias", "relu-between", "widening"],
)
def test_the_order_stays_where_a_swap_is_wrong_or_costs_more(model: onnx.ModelProto, shape: list[int]) -> None:
    order = _order(model)
    pool_first = model.graph.node[0].op_type == "AveragePool"
    assert (order[0] == "AveragePool") == pool_first, order
    _check(model, shape)


def test_counted_padding_without_bias_still_swaps() -> None:
    # With no bias, padded zeros map to zeros: the swap stays exact.
    model = _transition(
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}, bias=False
    )
    assert _order(model)[0] == "AveragePool"
    _check(model, [2, 256, 12, 12])


@pytest.mark.parametrize("relu", [True, False])
def test_a_projection_counting_padding_leaves_its_bias_after_the_pool(relu: bool) -> None:
    # torchvision's Inception v3: avg_pool2d(3, 1, padding=1) counts the padded zeros, which
    # would scale a bias pooled with the convolution's output at the borders; the bias is added
    # after the pool instead, where every position gets it whole.
    pool = {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 1}
    model = _projection(pool, relu=relu)
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    order = [n.op_type for n in graph.nodes]
    assert order == ["FusedConv" if relu else order[0], "AveragePool", "Add", *(["Relu"] if relu else [])], order
    assert order[0] in ("Conv", "FusedConv") and len(graph.nodes[0].inputs) == 2  # its bias left it
    add = graph.nodes[2]
    assert graph.initializers[add.inputs[1]].shape == (8, 1, 1)
    _check(model, [2, 48, 9, 9])


def test_a_projection_counting_padding_with_a_bias_input_stays() -> None:
    # A bias that is not a constant cannot be reshaped for the Add at optimization time.
    pool = {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 1}
    model = _projection(pool, bias=False)
    model.graph.node[1].input.append("b")
    model.graph.input.append(vinfo("b", F, [8]))
    assert _order(model)[0] == "AveragePool"
    check_optimized(
        model,
        {
            "x": np.random.default_rng(4).standard_normal((2, 48, 9, 9)).astype(np.float32),
            "b": np.random.default_rng(5).standard_normal(8).astype(np.float32),
        },
    )


def test_intermediate_values_fetched_by_name_keep_their_meaning() -> None:
    model = _transition({"kernel_shape": [2, 2], "strides": [2, 2]})
    x = np.random.default_rng(6).standard_normal((2, 256, 12, 12)).astype(np.float32)
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model.SerializeToString()
    (got,) = onnxpy.InferenceSession(data).run(["y"], {"x": x})
    (want,) = onnxpy.InferenceSession(data, plain_opts).run(["y"], {"x": x})
    assert got.shape == (2, 128, 12, 12)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_two_rewrites_never_undo_each_other() -> None:
    # After a transition pools first, its (pool -> conv) pair must not look cheaper swapped back.
    graph = build_graph(_transition({"kernel_shape": [2, 2], "strides": [2, 2]}))
    optimize(graph, 99, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    from onnxpy.optimizer.passes import swap_pool_pointwise

    assert swap_pool_pointwise.run(graph) is False
    assert collections.Counter(n.op_type for n in graph.nodes) == ops
