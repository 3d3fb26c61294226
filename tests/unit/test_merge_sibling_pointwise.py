"""optimizer/passes/merge_sibling_pointwise.py: 1x1 convolutions reading one input become one
SiblingConv over their stacked weights, with the same numbers; convolutions that
cannot stack stay apart."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import check_optimized, make_model, vinfo

F = TensorProto.FLOAT


def _ops(model: onnx.ModelProto) -> dict[str, int]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return dict(collections.Counter(n.op_type for n in graph.nodes))


def _check(model: onnx.ModelProto, shape: list[int], fetch: list[str] | None = None) -> None:
    feeds = {"x": np.random.default_rng(4).standard_normal(shape).astype(np.float32)}
    # Stacked GEMMs may sum in another order: tolerances to the outputs' scale (values reach ~60).
    if fetch is None:
        check_optimized(model, feeds, atol=1e-4)
        return
    # Intermediate values, which onnxruntime cannot fetch: optimized against unoptimized.
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = onnxpy.InferenceSession(model.SerializeToString()).run(fetch, feeds)
    plain = onnxpy.InferenceSession(model.SerializeToString(), plain_opts).run(fetch, feeds)
    for g, p in zip(got, plain, strict=True):
        np.testing.assert_allclose(g, p, rtol=1e-5, atol=1e-4)


def _siblings(
    specs: list[tuple[int, bool, dict]], *, batch: int = 1, opset: int = 17, cin: int = 12
) -> onnx.ModelProto:
    """Convolutions of one input x, one per spec (output channels, Relu after it, Conv
    attributes), each followed by a 3x3 convolution whose output is a graph output."""
    rng = np.random.default_rng(7)
    inits: dict[str, np.ndarray] = {}
    nodes = []
    ends = []
    for i, (m, relu, attrs) in enumerate(specs):
        k = attrs.pop("kernel", 1)
        group = attrs.get("group", 1)
        inits[f"w{i}"] = rng.standard_normal((m, cin // group, k, k)).astype(np.float32)
        inits[f"b{i}"] = rng.standard_normal(m).astype(np.float32)
        nodes.append(helper.make_node("Conv", ["x", f"w{i}", f"b{i}"], [f"c{i}"], **attrs))
        out = f"c{i}"
        if relu:
            nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
            out = f"r{i}"
        inits[f"v{i}"] = rng.standard_normal((4, m, 3, 3)).astype(np.float32)
        nodes.append(helper.make_node("Conv", [out, f"v{i}"], [f"e{i}"], pads=[1, 1, 1, 1]))
        ends.append(f"e{i}")
    outputs = [vinfo(e, F, None) for e in ends]
    return make_model(nodes, [vinfo("x", F, [batch, cin, 7, 6])], outputs, initializers=inits, opset=opset)


@pytest.mark.parametrize("batch", [1, 3])
def test_inception_style_siblings_stack_into_one_convolution(batch: int) -> None:
    model = _siblings([(8, True, {}), (5, True, {}), (3, True, {})], batch=batch)
    ops = _ops(model)
    assert ops.get("SiblingConv") == 1 and ops.get("Relu") is None, ops
    assert ops.get("FusedConv", 0) + ops.get("Conv", 0) == 3, ops  # the three 3x3 readers
    _check(model, [batch, 12, 7, 6])


def test_mixed_activations_take_one_relu_over_the_leading_slice() -> None:
    # ResNet's first block: a main 1x1 with Relu and a shortcut 1x1 without, listed plain first.
    model = _siblings([(6, False, {}), (9, True, {}), (4, False, {}), (2, True, {})])
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    (sib,) = [n for n in graph.nodes if n.op_type == "SiblingConv"]
    assert sib.attrs["splits"] == [9, 2, 6, 4] and sib.attrs["relu_channels"] == 11
    assert not any(n.op_type == "Relu" for n in graph.nodes)
    _check(model, [1, 12, 7, 6])


def test_strided_siblings_stack() -> None:
    model = _siblings([(8, True, {"strides": [2, 2]}), (5, True, {"strides": [2, 2]})], opset=11)
    assert _ops(model).get("SiblingConv") == 1
    _check(model, [1, 12, 7, 6])


@pytest.mark.parametrize(
    "specs",
    [
        [(8, True, {}), (5, True, {"strides": [2, 2]})],  # different strides
        [(8, True, {}), (5, True, {"kernel": 3, "pads": [1, 1, 1, 1]})],  # not 1x1
        [(8, True, {}), (6, True, {"group": 2})],  # grouped
        [(8, True, {})],  # alone
    ],
    ids=["strides", "3x3", "grouped", "alone"],
)
def test_convolutions_that_cannot_stack_stay_apart(specs: list[tuple[int, bool, dict]]) -> None:
    model = _siblings(specs)
    assert "SiblingConv" not in _ops(model)
    _check(model, [1, 12, 7, 6])


def test_weights_fed_at_run_time_are_not_stacked() -> None:
    rng = np.random.default_rng(8)
    w1 = rng.standard_normal((4, 3, 1, 1)).astype(np.float32)
    model = make_model(
        [
            helper.make_node("Conv", ["x", "w0"], ["a"]),
            helper.make_node("Conv", ["x", "w1"], ["b"]),
        ],
        [vinfo("x", F, [1, 3, 5, 5]), vinfo("w0", F, [4, 3, 1, 1])],
        [vinfo("a", F, None), vinfo("b", F, None)],
        initializers={"w1": w1},
    )
    assert "SiblingConv" not in _ops(model)


def test_a_member_output_fetched_by_name() -> None:
    model = _siblings([(8, True, {}), (5, False, {})])
    _check(model, [1, 12, 7, 6], fetch=["r0", "c1", "e1"])


def test_sibling_conv_checks_its_splits() -> None:
    from onnxpy.ops.fused import sibling_conv

    x = np.ones((1, 4, 3, 3), np.float32)
    w = np.ones((6, 4, 1, 1), np.float32)
    with pytest.raises(ValueError, match="splits \\[2, 3\\] must be positive and add up to W's 6"):
        sibling_conv(np, x, w, splits=[2, 3])
    with pytest.raises(ValueError, match="relu_channels 7 must be within"):
        sibling_conv(np, x, w, splits=[2, 4], relu_channels=7)
    a, b = sibling_conv(np, x - 2, w, splits=[2, 4], relu_channels=2)
    assert (a == 0).all() and (b == -4).all()  # Relu on the first two channels only
