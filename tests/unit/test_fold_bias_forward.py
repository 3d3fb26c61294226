"""optimizer/passes/fold_bias_forward.py: a convolution's bias moves into the 1x1 convolution
that alone reads its output (per group for grouped readers), with the unoptimized graph's and
onnxruntime's numbers; where an activation, another reader, padding or a graph output is in the
way, nothing moves."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxpy.ir.graph import Graph
from onnxpy.optimizer.passes import fold_bias_forward
from onnxpy.optimizer.rewrite import constant
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches, make_model, vinfo

F = TensorProto.FLOAT
C, M, HW = 8, 12, 5


def _model(
    *,
    group: int = 2,
    reader_bias: bool = True,
    relu_between: bool = False,
    second_reader: bool = False,
    reader_kernel: int = 1,
    reader_pads: int = 0,
    fetch_middle: bool = False,
    residual: bool = False,
    shuffle: bool = False,
) -> onnx.ModelProto:
    """A depthwise 3x3 convolution with a bias, read by a (grouped) convolution, then ReLU."""
    rng = np.random.default_rng(group * 10 + reader_kernel)
    inits = {
        "wd": rng.standard_normal((C, 1, 3, 3)).astype(np.float32),
        "bd": rng.standard_normal(C).astype(np.float32),
        "wp": rng.standard_normal((M, C // group, reader_kernel, reader_kernel)).astype(np.float32),
        "bp": rng.standard_normal(M).astype(np.float32),
    }
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=C, pads=[1, 1, 1, 1])]
    mid = "d"
    if relu_between:
        nodes.append(helper.make_node("Relu", ["d"], ["dr"]))
        mid = "dr"
    reader_in = [mid, "wp", "bp"] if reader_bias else [mid, "wp"]
    nodes.append(helper.make_node("Conv", reader_in, ["p"], group=group, pads=[reader_pads] * 4))
    last = "p"
    if residual:
        nodes.append(helper.make_node("Add", ["p", "z"], ["pz"]))
        last = "pz"
    if shuffle:  # ShuffleNet's channel shuffle after the reader, which folds into it later
        inits["split"] = np.array([1, group, M // group, HW, HW], np.int64)
        inits["merge"] = np.array([1, M, HW, HW], np.int64)
        nodes += [
            helper.make_node("Reshape", [last, "split"], ["s5"]),
            helper.make_node("Transpose", ["s5"], ["t5"], perm=[0, 2, 1, 3, 4]),
            helper.make_node("Reshape", ["t5", "merge"], ["sh"]),
        ]
        last = "sh"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    outputs = [vinfo("y", F, None)]
    if second_reader:
        nodes.append(helper.make_node("Sigmoid", [mid], ["s"]))
        outputs.append(vinfo("s", F, None))
    if fetch_middle:
        outputs.append(vinfo(mid, F, None))
    inputs = [vinfo("x", F, [1, C, HW, HW])] + ([vinfo("z", F, [1, M, HW, HW])] if residual else [])
    return make_model(nodes, inputs, outputs, initializers=inits)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((1, C, HW, HW)).astype(np.float32)}
    if any(i.name == "z" for i in model.graph.input):
        feeds["z"] = rng.standard_normal((1, M, HW, HW)).astype(np.float32)
    return feeds


def _folded(model: onnx.ModelProto) -> tuple[bool, Graph]:
    graph = build_graph(model)
    return fold_bias_forward.run(graph), graph


def _conv(graph: Graph, weight: str) -> onnx.NodeProto:
    return next(n for n in graph.nodes if n.op_type == "Conv" and n.inputs[1].startswith(weight))


@pytest.mark.parametrize("group", [1, 2, 4])
def test_bias_moves_into_the_pointwise_reader(group: int) -> None:
    model = _model(group=group)
    changed, graph = _folded(model)
    assert changed
    assert _conv(graph, "wd").inputs == ["x", "wd"]  # the depthwise layer adds nothing now
    reader = _conv(graph, "wp")
    wd = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    w = wd["wp"].astype(np.float64).reshape(group, M // group, C // group)
    want = wd["bp"] + np.einsum("gmc,gc->gm", w, wd["bd"].reshape(group, C // group)).reshape(M)
    np.testing.assert_allclose(constant(graph, reader.inputs[2]), want, rtol=1e-6)
    assert_optimized_matches(model, _feeds(model), rtol=1e-5, atol=1e-5)


def test_a_reader_without_bias_gets_one() -> None:
    model = _model(reader_bias=False)
    changed, graph = _folded(model)
    assert changed and len(_conv(graph, "wp").inputs) == 3
    assert_optimized_matches(model, _feeds(model), rtol=1e-5, atol=1e-5)


def test_a_shuffled_reader_keeps_the_bias_in_its_own_order() -> None:
    # The reader's bias is in its output order before the shuffle; the fused kernel permutes it.
    model = _model(group=4, shuffle=True)
    assert _folded(model)[0]
    assert_optimized_matches(model, _feeds(model), rtol=1e-5, atol=1e-5)


def test_a_residual_reader_folds_before_its_addend() -> None:
    # After fusion the reader is FusedConv(X, W, B, Z) with its ReLU: act(conv + B + Z).
    model = _model(residual=True)
    assert _folded(model)[0]
    assert_optimized_matches(model, _feeds(model), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"relu_between": True},  # the bias would have to cross the activation
        {"second_reader": True},  # another reader needs the biased values
        {"fetch_middle": True},  # so does the caller
        {"reader_kernel": 3, "reader_pads": 1},  # the reader mixes positions (and zero padding)
        {"reader_pads": 1},  # a padded 1x1 reader sees zeros, not the bias, in its border
    ],
)
def test_nothing_moves_where_the_bias_is_needed(kwargs: dict[str, object]) -> None:
    model = _model(**kwargs)
    changed, graph = _folded(model)
    assert not changed
    assert _conv(graph, "wd").inputs == ["x", "wd", "bd"]
    assert_optimized_matches(model, _feeds(model), rtol=1e-5, atol=1e-5)
