"""Swish: x * sigmoid(alpha * x). ONNX's Swish-24 runs as one kernel, and the exporters' Sigmoid
and Mul (SiLU, CLIP's QuickGelu) fuse into it (optimizer/passes/fuse_patterns.py) and from there
into the convolution or product before it (fuse_activation.py)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ops import elementwise
from onnxpy.ops.elementwise import swish
from onnxpy.optimizer.passes import fuse_patterns
from onnxpy.optimizer.rewrite import FUSED_DOMAIN
from onnxpy.runtime.compile import build_graph
from tests.helpers import make_model, vinfo

RNG = np.random.default_rng(24)


def _exact(x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """In float64, from alpha * x rounded to x's type (as the graph's Mul rounds it: at
    alpha x = -70 that rounding alone moves exp(-alpha x) by 4e-6 relative)."""
    v = x.astype(np.float64)
    with np.errstate(over="ignore"):
        return v / (1 + np.exp(-(x * x.dtype.type(alpha)).astype(np.float64)))


@pytest.mark.parametrize("alpha", [1.0, 1.702, -0.5])
def test_kernel_matches_the_definition(alpha: float) -> None:
    x = np.linspace(-120, 120, 200_001, dtype=np.float32)  # over two blocks: the blocked form
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exp's overflow far out is expected and silent
        got = swish(np, x, alpha)
    assert got.dtype == np.float32
    # Below about 4e-37 in magnitude the result is 0 (exp overflows), as float32 Sigmoid then
    # Mul give: no subnormals.
    np.testing.assert_allclose(got, _exact(x, alpha), rtol=3e-7, atol=4e-37)


def test_specials_and_in_place() -> None:
    x = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 3e38, -3e38, -100.0], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x * (1 / (1 + np.exp(-x)))  # what float32 Sigmoid then Mul give
    got = swish(np, x.copy())
    np.testing.assert_array_equal(got, want)
    y = x.copy()
    assert swish(np, y, out=y) is y
    np.testing.assert_array_equal(y, got)


def test_blocks_layouts_and_half_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    x = (RNG.standard_normal((3, 40_001)) * 8).astype(np.float32)
    blocked = swish(np, x)
    strided = swish(np, x[:, ::2])  # not one run: the whole-array form
    # A channels-last result seen as NCHW (a convolution's, before a depthwise layer): blocked
    # in its own memory order, and the result keeps that order.
    nhwc = (RNG.standard_normal((1, 56, 56, 32)) * 8).astype(np.float32).transpose(0, 3, 1, 2)
    channels_last = swish(np, nhwc)
    assert channels_last.transpose(0, 2, 3, 1).flags.c_contiguous
    monkeypatch.setattr(elementwise, "_SWISH_BLOCK", 1 << 30)
    np.testing.assert_array_equal(blocked, swish(np, x))  # same passes, same bits
    np.testing.assert_array_equal(strided, swish(np, np.ascontiguousarray(x[:, ::2])))
    np.testing.assert_array_equal(channels_last, swish(np, np.ascontiguousarray(nhwc)))
    h = x[0, :1000].astype(np.float16)
    got = swish(np, h)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), _exact(h.astype(np.float32)), rtol=1e-3, atol=1e-3)


def _swish_model(nodes: list, shape: list[int], inits: dict | None = None, opset: int = 17) -> onnx.ModelProto:
    return make_model(
        nodes, [vinfo("x", TensorProto.FLOAT, shape)], [vinfo("y", TensorProto.FLOAT, shape)], inits, opset=opset
    )


def _sessions(model: onnx.ModelProto) -> tuple[onnxpy.InferenceSession, onnxpy.InferenceSession]:
    plain = onnxpy.SessionOptions()
    plain.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxpy.InferenceSession(model), onnxpy.InferenceSession(model, plain)


def _fused_ops(model: onnx.ModelProto) -> list[tuple[str, str, dict]]:
    graph = build_graph(model)
    fuse_patterns.run(graph)
    return [(n.domain, n.op_type, dict(n.attrs)) for n in graph.nodes]


@pytest.mark.parametrize("order", ["x_first", "sigmoid_first"])
def test_silu_pattern_fuses(order: str) -> None:
    mul = ["x", "s"] if order == "x_first" else ["s", "x"]
    m = _swish_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", mul, ["y"])], [2, 3, 50])
    assert _fused_ops(m) == [(FUSED_DOMAIN, "Swish", {})]
    x = (RNG.standard_normal((2, 3, 50)) * 6).astype(np.float32)
    fused, plain = _sessions(m)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(fused.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_scaled_sigmoid_pattern_fuses_with_its_alpha() -> None:
    nodes = [
        helper.make_node("Mul", ["k", "x"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["y"]),
    ]
    m = _swish_model(nodes, [4, 30], {"k": np.array(1.702, np.float32)})
    ops = _fused_ops(m)
    assert [(d, o) for d, o, _ in ops] == [(FUSED_DOMAIN, "Swish")]
    assert ops[0][2]["alpha"] == pytest.approx(1.702, rel=1e-6)
    x = (RNG.standard_normal((4, 30)) * 6).astype(np.float32)
    fused, plain = _sessions(m)
    np.testing.assert_allclose(fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["sigmoid_read_twice", "square_of_sigmoid", "scale_not_constant", "other_operand"])
def test_lookalikes_stay(case: str) -> None:
    shape = [3, 7]
    inits: dict = {}
    extra_inputs = []
    if case == "sigmoid_read_twice":
        nodes = [
            helper.make_node("Sigmoid", ["x"], ["s"]),
            helper.make_node("Mul", ["x", "s"], ["m"]),
            helper.make_node("Add", ["m", "s"], ["y"]),
        ]
    elif case == "square_of_sigmoid":
        nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "s"], ["y"])]
    elif case == "scale_not_constant":
        nodes = [
            helper.make_node("Mul", ["k", "x"], ["a"]),
            helper.make_node("Sigmoid", ["a"], ["s"]),
            helper.make_node("Mul", ["x", "s"], ["y"]),
        ]
        extra_inputs = [vinfo("k", TensorProto.FLOAT, [])]
    else:  # x * sigmoid(z) for another z
        nodes = [helper.make_node("Sigmoid", ["z"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
        extra_inputs = [vinfo("z", TensorProto.FLOAT, shape)]
    m = make_model(
        nodes, [vinfo("x", TensorProto.FLOAT, shape), *extra_inputs], [vinfo("y", TensorProto.FLOAT, shape)], inits
    )
    assert all(op != "Swish" for _, op, _ in _fused_ops(m))
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    if case == "scale_not_constant":
        feeds["k"] = np.array(0.7, np.float32)
    if case == "other_operand":
        feeds["z"] = RNG.standard_normal(shape).astype(np.float32)
    fused, plain = _sessions(m)
    np.testing.assert_allclose(fused.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=1e-6)


def _mbconv(silu_after_expand: bool = True) -> onnx.ModelProto:
    """An EfficientNet block's start: a 1x1 expansion and a depthwise 3x3, each followed by SiLU."""
    w1 = (RNG.standard_normal((24, 8, 1, 1)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((24, 1, 3, 3)) * 0.3).astype(np.float32)
    b1, b2 = RNG.standard_normal(24).astype(np.float32), RNG.standard_normal(24).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["e"])]
    src = "e"
    if silu_after_expand:
        nodes += [helper.make_node("Sigmoid", ["e"], ["es"]), helper.make_node("Mul", ["e", "es"], ["ea"])]
        src = "ea"
    nodes += [
        helper.make_node("Conv", [src, "w2", "b2"], ["d"], group=24, pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Sigmoid", ["d"], ["ds"]),
        helper.make_node("Mul", ["ds", "d"], ["y"]),
    ]
    return make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [1, 8, 30, 30])],
        [vinfo("y", TensorProto.FLOAT, [1, 24, 15, 15])],
        {"w1": w1, "b1": b1, "w2": w2, "b2": b2},
    )


def test_silu_moves_into_the_convolutions_and_matches_onnxruntime(tmp_path) -> None:
    m = _mbconv()
    path = tmp_path / "optimized.onnx"
    opts = onnxpy.SessionOptions()
    opts.optimized_model_filepath = str(path)
    sess = onnxpy.InferenceSession(m, opts)
    optimized = onnx.load(str(path))
    kinds = [(n.domain, n.op_type) for n in optimized.graph.node]
    assert kinds == [(FUSED_DOMAIN, "PointwiseDepthwiseConv")], kinds
    attrs = {a.name: helper.get_attribute_value(a) for a in optimized.graph.node[0].attribute}
    assert attrs["activation1"] == b"Swish" and attrs["activation"] == b"Swish"
    x = RNG.standard_normal((1, 8, 30, 30)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    _, plain = _sessions(m)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], plain.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_swish_24_runs_as_one_kernel() -> None:
    m = _swish_model([helper.make_node("Swish", ["x"], ["y"], alpha=0.75)], [5, 9], opset=24)
    m.ir_version = 11
    x = (RNG.standard_normal((5, 9)) * 4).astype(np.float32)
    fused, plain = _sessions(m)
    for sess in (fused, plain):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], _exact(x, 0.75), rtol=1e-6, atol=1e-7)


def test_in_place_activations_take_0d_arrays() -> None:
    # A 1-D @ 1-D product is 0-d; numpy's ufuncs return scalars there unless given out=.
    from onnxpy.ops.fused import IN_PLACE_ACTIVATIONS, apply_activation

    params = {"LeakyRelu": [0.1], "Clip": [-1.0, 1.0], "HardSigmoid": [0.2, 0.5], "FakeQuant": [0.1, -128.0, 127.0]}
    params["GeluTanh"] = [0.7978845608028654, 0.044715]
    for name in sorted(IN_PLACE_ACTIVATIONS):
        got = apply_activation(np, np.array(-0.55, np.float32), name, params.get(name, []))
        want = apply_activation(np, np.array([-0.55], np.float32), name, params.get(name, []))
        assert isinstance(got, np.ndarray) and got.shape == () and got.dtype == np.float32, name
        assert got == want[0], name
