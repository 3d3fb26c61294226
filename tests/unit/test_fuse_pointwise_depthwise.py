"""optimizer/passes/fuse_pointwise_depthwise.py and its kernel: a 1x1 convolution read only by a
depthwise convolution becomes one PointwiseDepthwiseConv whose GEMM writes the depthwise
layer's zero-bordered input, with the numbers of the unfused graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ops import _depthwise
from onnxpy.ops.fused import fused_conv, pointwise_depthwise_conv
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import check_optimized, make_model, optimized_op_counts, vinfo

F = TensorProto.FLOAT
C_IN, C_MID = 4, 12


def _model(
    *,
    shape: tuple[int, ...] = (2, C_IN, 11, 9),
    act: tuple[str, dict[str, Any]] | None = ("Clip", {}),
    dw_attrs: dict[str, Any] | None = None,
    dw_kernel: tuple[int, int] = (3, 3),
    pw_attrs: dict[str, Any] | None = None,
    pw_group: int = 1,
    dw_act: bool = True,
    biases: bool = True,
    fetch_mid: bool = False,
    lead_depthwise: bool = False,
    shuffle: bool = False,
) -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    inits: dict[str, np.ndarray] = {
        "w1": rng.standard_normal((C_MID, C_IN // pw_group, 1, 1)).astype(np.float32),
        "w2": rng.standard_normal((C_MID, 1, *dw_kernel)).astype(np.float32),
    }
    if biases:
        # Negative and positive biases: the border must stay 0 whatever the bias.
        inits["b1"] = rng.standard_normal(C_MID).astype(np.float32) * 2
        inits["b2"] = rng.standard_normal(C_MID).astype(np.float32)
    nodes = []
    x = "x"
    if lead_depthwise:
        # A depthwise layer first: the pointwise convolution then reads a channels-last result.
        inits["w0"] = rng.standard_normal((C_IN, 1, 3, 3)).astype(np.float32)
        nodes.append(helper.make_node("Conv", ["x", "w0"], ["x0"], group=C_IN, pads=[1, 1, 1, 1]))
        x = "x0"
    nodes.append(
        helper.make_node("Conv", [x, "w1", "b1"] if biases else [x, "w1"], ["e"], group=pw_group, **(pw_attrs or {}))
    )
    mid = "e"
    if act is not None:
        op, attrs = act
        if op == "Clip":
            inits["lo"] = np.array(attrs.get("lo", 0.0), np.float32)
            inits["hi"] = np.array(attrs.get("hi", 6.0), np.float32)
            nodes.append(helper.make_node("Clip", ["e", "lo", "hi"], ["a"]))
        else:
            nodes.append(helper.make_node(op, ["e"], ["a"], **attrs))
        mid = "a"
    if shuffle:
        # ShuffleNet's channel shuffle over the 1x1 convolution's groups (folded into it).
        n, _, h, w = shape
        inits["split"] = np.array([n, pw_group, C_MID // pw_group, h, w], np.int64)
        inits["merge"] = np.array([n, C_MID, h, w], np.int64)
        nodes += [
            helper.make_node("Reshape", [mid, "split"], ["s5"]),
            helper.make_node("Transpose", ["s5"], ["t5"], perm=[0, 2, 1, 3, 4]),
            helper.make_node("Reshape", ["t5", "merge"], ["shuffled"]),
        ]
        mid = "shuffled"
    dw_in = [mid, "w2", "b2"] if biases else [mid, "w2"]
    nodes.append(helper.make_node("Conv", dw_in, ["d"], group=C_MID, **(dw_attrs or {"pads": [1, 1, 1, 1]})))
    out = "d"
    if dw_act:
        nodes.append(helper.make_node("Relu", ["d"], ["r"]))
        out = "r"
    outputs = [vinfo(out, F, None)]
    if fetch_mid:
        outputs.append(vinfo(mid, F, None))
    return make_model(nodes, [vinfo("x", F, list(shape))], outputs, initializers=inits)


def _check(model: onnx.ModelProto, shape: tuple[int, ...] = (2, C_IN, 11, 9)) -> list[np.ndarray]:
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32) * 2
    return check_optimized(model, {"x": x})


@pytest.mark.parametrize(
    "act",
    [("Clip", {}), ("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Tanh", {}), ("HardSwish", {}), None],
    ids=["relu6", "relu", "leaky", "tanh", "hardswish", "none"],
)
def test_fuses_with_activations_that_keep_zero(act: tuple[str, dict[str, Any]] | None) -> None:
    model = _model(act=act)
    assert optimized_op_counts(model) == {"PointwiseDepthwiseConv": 1}
    _check(model)


@pytest.mark.parametrize(
    "dw_attrs,kernel,shape",
    [
        ({"pads": [1, 1, 1, 1], "strides": [2, 2]}, (3, 3), (2, C_IN, 11, 9)),
        ({"pads": [1, 1, 1, 1], "strides": [2, 2]}, (3, 3), (1, C_IN, 12, 10)),  # last row/col unread
        ({"pads": [0, 2, 1, 0]}, (3, 3), (2, C_IN, 11, 9)),  # asymmetric
        ({"pads": [2, 2, 2, 2]}, (5, 5), (2, C_IN, 11, 9)),
        ({"pads": [3, 3, 3, 3], "strides": [3, 2]}, (3, 3), (1, C_IN, 7, 8)),  # pads past the kernel
        ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (3, 3), (1, C_IN, 8, 8)),
        ({}, (1, 3), (2, C_IN, 6, 9)),  # unpadded, 1x3
        # Rows of 28 outputs and more at column stride 2: the input stored by column parity.
        ({"pads": [1, 1, 1, 1], "strides": [2, 2]}, (3, 3), (2, C_IN, 5, 57)),
        ({"pads": [0, 2, 1, 1], "strides": [1, 2]}, (3, 4), (1, C_IN, 4, 60)),
    ],
    ids=["s2", "s2-even", "asym", "5x5", "pads>kernel", "same-upper", "1x3", "s2-phased", "s2-phased-asym"],
)
@pytest.mark.parametrize("gemm_over", ["bordered", "inside"])
def test_depthwise_geometries(
    dw_attrs: dict[str, Any],
    kernel: tuple[int, int],
    shape: tuple[int, ...],
    gemm_over: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both ways of running the 1x1 GEMM: over the zero-bordered map (its ones channel zero in
    the border), or over the input positions only and copied inside a zeroed border (small
    maps, ``_pointwise_dense``); phased inputs always take the first."""
    calls: list[int] = []
    dense = _depthwise._pointwise_dense
    monkeypatch.setattr(_depthwise, "_DENSE_BORDER", float("inf") if gemm_over == "bordered" else 0.0)
    monkeypatch.setattr(_depthwise, "_pointwise_dense", lambda *a: calls.append(1) or dense(*a))
    model = _model(shape=shape, dw_attrs=dw_attrs, dw_kernel=kernel)
    assert optimized_op_counts(model) == {"PointwiseDepthwiseConv": 1}
    _check(model, shape)
    out_width = 28 if shape[3] > 50 else 1  # the two phased cases have rows of 28+ outputs, the rest fewer
    phased = _depthwise._phased(dw_attrs.get("strides", [1, 1]), kernel[1], out_width)
    assert bool(calls) == (gemm_over == "inside" and not phased)


@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize("shuffle", [False, True], ids=["plain", "shuffled"])
def test_grouped_pointwise_runs_as_one_block_diagonal_gemm(groups: int, shuffle: bool) -> None:
    model = _model(pw_group=groups, shuffle=shuffle)
    assert optimized_op_counts(model) == {"PointwiseDepthwiseConv": 1}
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    attrs = graph.nodes[0].attrs
    assert attrs["group1"] == groups and attrs.get("shuffle_groups1", 0) == (groups if shuffle else 0)
    _check(model)


def test_no_biases_and_no_trailing_activation() -> None:
    model = _model(biases=False, dw_act=False)
    assert optimized_op_counts(model) == {"PointwiseDepthwiseConv": 1}
    _check(model)


def test_channels_last_input() -> None:
    model = _model(lead_depthwise=True)
    assert optimized_op_counts(model) == {"Conv": 1, "PointwiseDepthwiseConv": 1}
    _check(model)


def test_the_fused_intermediate_can_still_be_fetched() -> None:
    model = _model()
    x = np.random.default_rng(5).standard_normal((2, C_IN, 11, 9)).astype(np.float32)
    data = model.SerializeToString()
    got = onnxpy.InferenceSession(data).run(["a", "r"], {"x": x})
    # onnxruntime fetches graph outputs only: the reference is the same model with "a" as one.
    want = ort.InferenceSession(_model(fetch_mid=True).SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["a", "r"], {"x": x}
    )
    assert (got[0] == 0).any() and (got[0] == 6).any()  # the ReLU6 clipped at both ends
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"act": ("Sigmoid", {})},  # sigmoid(0) = 0.5: the border would not stay 0
        {"act": ("HardSigmoid", {})},
        {"act": ("Clip", {"lo": 0.5, "hi": 6.0})},  # the range excludes 0
        {"pw_attrs": {"strides": [2, 2]}},
        {"pw_attrs": {"pads": [1, 1, 1, 1]}},
        {"fetch_mid": True},  # the intermediate is a graph output
        {"dw_attrs": {"pads": [2, 2, 2, 2], "dilations": [2, 2]}},
    ],
    ids=["sigmoid", "hardsigmoid", "clip-above-0", "strided-1x1", "padded-1x1", "mid-output", "dilated"],
)
def test_near_misses_stay_unfused(kwargs: dict[str, Any]) -> None:
    model = _model(**kwargs)
    ops = optimized_op_counts(model)
    assert "PointwiseDepthwiseConv" not in ops, ops
    _check(model)


def test_depthwise_reading_something_else_too() -> None:
    """The 1x1 result read by the depthwise convolution and by another node: not fused."""
    model = _model(dw_act=False)
    model.graph.node.append(helper.make_node("Neg", ["a"], ["n"]))
    model.graph.output.append(vinfo("n", F, None))
    ops = optimized_op_counts(model)
    assert "PointwiseDepthwiseConv" not in ops, ops
    _check(model)


@pytest.mark.parametrize("group1,shuffle", [(1, 0), (2, 2), (4, 2)])
def test_kernel_fallback_matches_the_fast_path(group1: int, shuffle: int) -> None:
    """Where the fast path does not apply (here a float16 input), the kernel runs the two
    convolutions one after the other; both give the composition's numbers."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w1 = rng.standard_normal((8, 4 // group1, 1, 1)).astype(np.float32)
    b1 = rng.standard_normal(8).astype(np.float32)
    w2 = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    b2 = rng.standard_normal(8).astype(np.float32)
    attrs: dict[str, Any] = {"group": 8, "pads": [1, 0, 1, 2], "strides": [2, 1]}
    pw: dict[str, Any] = {"group1": group1, "shuffle_groups1": shuffle}
    mid = fused_conv(
        np, x, w1, b1, group=group1, shuffle_groups=shuffle, activation="Clip", activation_params=[0.0, 6.0]
    )
    want = fused_conv(np, mid, w2, b2, **attrs, activation="Relu")
    fast = pointwise_depthwise_conv(
        np, x, w1, b1, w2, b2, activation1="Clip", activation1_params=[0.0, 6.0], activation="Relu", **attrs, **pw
    )
    slow = pointwise_depthwise_conv(
        np,
        x.astype(np.float16),
        w1,
        b1,
        w2,
        b2,
        activation1="Clip",
        activation1_params=[0.0, 6.0],
        activation="Relu",
        **attrs,
        **pw,
    )
    np.testing.assert_allclose(fast, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(slow, want, rtol=2e-2, atol=2e-2)
    assert fast.shape == want.shape == (2, 8, 4, 6)


class _NodeContext:
    """The part of the executor's kernel context this kernel reads: the node's memo."""

    def __init__(self) -> None:
        self.memo: dict[Any, Any] = {}


def test_a_nodes_plan_keeps_its_two_activations_apart() -> None:
    """The plan remembered per node and input shape carries both in-place activations: calls
    that reuse it (and a second input shape with a plan of its own) apply Clip to the 1x1 and
    Relu to the depthwise result, not the other way round (values above 6 tell them apart)."""
    rng = np.random.default_rng(5)
    w1 = 3 * rng.standard_normal((8, 4, 1, 1)).astype(np.float32)
    b1 = rng.standard_normal(8).astype(np.float32)
    w2 = 3 * rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    b2 = rng.standard_normal(8).astype(np.float32)
    attrs: dict[str, Any] = {"group": 8, "pads": [1, 1, 1, 1]}
    acts: dict[str, Any] = {"activation1": "Clip", "activation1_params": [0.0, 6.0], "activation": "Relu"}
    ctx = _NodeContext()
    for shape in [(1, 4, 6, 5), (1, 4, 6, 5), (2, 4, 9, 7), (1, 4, 6, 5)]:
        x = 4 * rng.standard_normal(shape).astype(np.float32)
        mid = fused_conv(np, x, w1, b1, activation="Clip", activation_params=[0.0, 6.0])
        want = fused_conv(np, mid, w2, b2, **attrs, activation="Relu")
        got = pointwise_depthwise_conv(np, x, w1, b1, w2, b2, **attrs, **acts, ctx=ctx)
        assert float(want.max()) > 6.0  # a Clip in the second place would show
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert len(ctx.memo) == 2


def test_an_activation_it_does_not_know_is_refused_by_name() -> None:
    """The optimizer fuses only activations that keep zero and apply in place; a hand-made
    node with another one gets an error naming it, on the fast path and on the fallback
    (float16 input) alike, on every call (errors are not remembered as plans)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    w1 = rng.standard_normal((8, 4, 1, 1)).astype(np.float32)
    w2 = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    attrs: dict[str, Any] = {"group": 8, "pads": [1, 1, 1, 1], "activation": "Softplus"}
    ctx = _NodeContext()
    for _ in range(2):
        with pytest.raises(ValueError, match="'Softplus' cannot be applied in place"):
            pointwise_depthwise_conv(np, x, w1, None, w2, None, **attrs, ctx=ctx)
    with pytest.raises(ValueError, match="unknown fused activation 'Softplus'"):
        pointwise_depthwise_conv(np, x.astype(np.float16), w1, None, w2, None, **attrs, ctx=ctx)
