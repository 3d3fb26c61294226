"""Graphs on which the optimizer once went wrong (found by a random-graph fuzzer), each run at the
default level against onnxruntime, or, for values onnxruntime cannot fetch, against onnxpy with
the optimizer off."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy

F = TensorProto.FLOAT


def _model(nodes: list, inputs: dict[str, list[int]], outputs: list[str], inits: dict[str, Any]) -> bytes:
    graph = helper.make_graph(
        nodes,
        "regression",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, F, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _against_onnxruntime(data: bytes, feeds: dict[str, np.ndarray]) -> None:
    want = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxpy.InferenceSession(data).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _unoptimized() -> onnxpy.SessionOptions:
    opts = onnxpy.SessionOptions()
    opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    return opts


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_a_per_channel_constant_after_a_channel_shuffle(op: str) -> None:
    # fold_shuffle gives the convolution a shuffled output order; a constant folded into its
    # weights afterwards must not land on the unshuffled channel.
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("Reshape", ["c", "split"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "merged"], ["s"]),
        helper.make_node(op, ["s", "k"], ["y"]),
    ]
    inits = {
        "w": rng.standard_normal((6, 4, 1, 1)).astype(np.float32),
        "k": rng.standard_normal((6, 1, 1)).astype(np.float32),
        "split": np.array([1, 2, 3, 3, 3], np.int64),
        "merged": np.array([1, 6, 3, 3], np.int64),
    }
    data = _model(nodes, {"x": [1, 4, 3, 3]}, ["y"], inits)
    _against_onnxruntime(data, {"x": rng.standard_normal((1, 4, 3, 3)).astype(np.float32)})


@pytest.mark.parametrize("activation", ["Sigmoid", "Tanh", "Relu"])
def test_pointwise_then_depthwise_then_an_activation(activation: str) -> None:
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[1, 1]),
        helper.make_node("Conv", ["a", "w2"], ["d"], kernel_shape=[3, 3], group=8, pads=[1, 1, 1, 1]),
        helper.make_node(activation, ["d"], ["y"]),
    ]
    inits = {
        "w1": rng.standard_normal((8, 2, 1, 1)).astype(np.float32),
        "w2": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
    }
    data = _model(nodes, {"x": [1, 2, 8, 4]}, ["y"], inits)
    _against_onnxruntime(data, {"x": rng.standard_normal((1, 2, 8, 4)).astype(np.float32)})


@pytest.mark.parametrize("use", ["graph_output", "other_reader"])
def test_a_decomposed_layer_norm_whose_deviation_is_used_elsewhere(use: str) -> None:
    # The fusion must leave the pattern alone when its standard deviation is needed elsewhere.
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["y"]),
    ]
    outputs = ["y", "sd"]
    if use == "other_reader":
        nodes.append(helper.make_node("Neg", ["sd"], ["z"]))
        outputs = ["y", "z"]
    data = _model(nodes, {"x": [2, 3, 8]}, outputs, {"two": np.float32(2), "eps": np.float32(1e-5)})
    x = np.random.default_rng(3).standard_normal((2, 3, 8)).astype(np.float32)
    _against_onnxruntime(data, {"x": x})


def _fetch_cases() -> dict[str, tuple[list, dict[str, list[int]], dict[str, Any], str]]:
    rng = np.random.default_rng(4)

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    return {
        # fold_bias_forward moves c1's bias into the next convolution
        "bias_moved_forward": (
            [
                helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                helper.make_node("Conv", ["c1", "w2", "b2"], ["y"], kernel_shape=[1, 1]),
            ],
            {"x": [1, 3, 5, 5]},
            {"w1": w(4, 3, 3, 3), "b1": w(4), "w2": w(6, 4, 1, 1), "b2": w(6)},
            "c1",
        ),
        # fold_relu_floor turns the ReLU after a BatchNormalization into a per-channel floor
        "relu_made_a_floor": (
            [
                helper.make_node("BatchNormalization", ["x", "s", "t", "mu", "var"], ["bn"]),
                helper.make_node("Relu", ["bn"], ["r"]),
                helper.make_node("Conv", ["r", "w"], ["y"], kernel_shape=[1, 1]),
            ],
            {"x": [1, 4, 5, 5]},
            {"s": w(4), "t": w(4), "mu": w(4), "var": np.abs(w(4)) + 0.5, "w": w(3, 4, 1, 1)},
            "r",
        ),
        # swap_pool_pointwise moves the pool past a 1x1 convolution
        "pool_swapped": (
            [
                helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
                helper.make_node("AveragePool", ["c1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                helper.make_node("Conv", ["p", "w2", "b2"], ["c2"], kernel_shape=[1, 1]),
                helper.make_node("Conv", ["c2", "w3"], ["y"], kernel_shape=[1, 1]),
            ],
            {"x": [1, 3, 6, 6]},
            {"w1": w(4, 3, 1, 1), "b1": w(4), "w2": w(5, 4, 1, 1), "b2": w(5), "w3": w(2, 5, 1, 1)},
            "p",
        ),
    }


@pytest.mark.parametrize("case", sorted(_fetch_cases()))
def test_fetched_intermediates_hold_the_models_values(case: str) -> None:
    """A value fetched by name is the model's value even where a pass kept its name but changed
    what it holds; the graph's outputs stay those of the optimized graph."""
    nodes, inputs, inits, name = _fetch_cases()[case]
    data = _model(nodes, inputs, ["y"], inits)
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs.items()}
    plain = onnxpy.InferenceSession(data, _unoptimized())
    sess = onnxpy.InferenceSession(data)
    np.testing.assert_allclose(sess.run([name], feeds)[0], plain.run([name], feeds)[0], rtol=1e-5, atol=1e-5)
    both = sess.run([name, "y"], feeds)
    np.testing.assert_allclose(both[0], plain.run([name], feeds)[0], rtol=1e-5, atol=1e-5)
    _against_onnxruntime(data, feeds)


# -- found by a fusion-targeted fuzzer (25,000 graphs; session 18) ------------------------------


def _optimized_and_not(data: bytes, feeds: dict[str, np.ndarray]) -> tuple[list[Any], list[Any]]:
    return onnxpy.InferenceSession(data).run(None, feeds), onnxpy.InferenceSession(data, _unoptimized()).run(
        None, feeds
    )


def _layernorm(eps: Any, gamma: Any, beta: Any) -> tuple[list, dict[str, Any]]:
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
        helper.make_node("Mul", ["n", "g"], ["ng"]),
        helper.make_node("Add", ["ng", "b"], ["y"]),
    ]
    return nodes, {"two": np.float32(2), "eps": eps, "g": gamma, "b": beta}


@pytest.mark.parametrize(
    "case",
    ["beta along another axis", "epsilon of higher rank", "gamma of higher rank"],
)
def test_layernorm_fusion_keeps_what_its_constants_broadcast_to(case: str) -> None:
    # A [W, 1] beta was applied along the last axis; a one-value epsilon or a [1, 1, W] gamma of
    # higher rank than x lost the leading dimension they add.
    rng = np.random.default_rng(5)
    w = 4
    eps, gamma, beta = (
        np.float32(1e-5),
        rng.standard_normal(w).astype(np.float32),
        rng.standard_normal(w).astype(np.float32),
    )
    if case == "beta along another axis":
        beta = rng.standard_normal((w, 1)).astype(np.float32)
    elif case == "epsilon of higher rank":
        eps = np.full((1, 1, 1), 1e-5, np.float32)
    else:
        gamma = gamma.reshape(1, 1, w)
    nodes, inits = _layernorm(eps, gamma, beta)
    data = _model(nodes, {"x": [w, w]}, ["y"], inits)
    x = rng.standard_normal((w, w)).astype(np.float32)
    (got,), (want,) = _optimized_and_not(data, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # onnxruntime's own LayerNorm fusion drops the epsilon's extra dimension too: compare with it
    # unoptimized.
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    (theirs,) = onnxruntime.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert theirs.shape == got.shape
    np.testing.assert_allclose(got, theirs, rtol=1e-5, atol=1e-5)


def test_a_one_value_constant_of_higher_rank_is_not_folded_per_channel() -> None:
    # Mul by a [1, 1, 1, 1, 1] constant after a 2-D convolution adds a dimension; folding it into
    # the weights dropped it.
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["c", "k"], ["y"])]
    inits = {"w": rng.standard_normal((2, 3, 1, 1)).astype(np.float32), "k": np.full((1, 1, 1, 1, 1), 2.0, np.float32)}
    data = _model(nodes, {"x": [1, 3, 2, 2]}, ["y"], inits)
    x = rng.standard_normal((1, 3, 2, 2)).astype(np.float32)
    (got,), (want,) = _optimized_and_not(data, {"x": x})
    assert got.shape == want.shape == (1, 1, 2, 2, 2)
    _against_onnxruntime(data, {"x": x})


def test_a_gelu_with_a_wrong_constant_is_not_fused() -> None:
    # 0.4999 for 0.5 is another function; the matcher's 1e-4 tolerance fused it into an exact Gelu.
    nodes = [
        helper.make_node("Div", ["x", "r2"], ["a"]),
        helper.make_node("Erf", ["a"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["b"]),
        helper.make_node("Mul", ["x", "b"], ["c"]),
        helper.make_node("Mul", ["c", "half"], ["y"]),
    ]
    inits = {"r2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.4999)}
    data = _model(nodes, {"x": [1, 4]}, ["y"], inits)
    x = np.array([[4, 6, 8, -0.3]], np.float32)
    (got,), (want,) = _optimized_and_not(data, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[0, 2] == pytest.approx(8 * 0.4999 * 2, rel=1e-5)


def test_conv_and_average_pool_are_not_swapped_around_an_empty_map() -> None:
    rng = np.random.default_rng(7)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[3, 1], ceil_mode=1),
    ]
    data = _model(nodes, {"x": [1, 16, 2, 2]}, ["y"], {"w": rng.standard_normal((7, 16, 1, 1)).astype(np.float32)})
    x = rng.standard_normal((1, 16, 2, 2)).astype(np.float32)
    (got,), (want,) = _optimized_and_not(data, {"x": x})
    assert got.shape == want.shape == (1, 7, 0, 2)
