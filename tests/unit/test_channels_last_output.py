"""optimizer/passes/channels_last_output.py: a convolution read only by depthwise convolutions
writes channels-last memory, with the same values; other convolutions keep NCHW."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxpy.ops import conv as conv_module
from onnxpy.ops._layout import is_channels_last
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import check_optimized, make_model, vinfo

F = TensorProto.FLOAT


def _model(reader: str, *, stem_kernel: int = 3, stem_is_output: bool = False) -> onnx.ModelProto:
    """x -> Conv(3 -> 8, stride 2) + Relu -> ``reader`` -> y."""
    rng = np.random.default_rng(5)
    k = stem_kernel
    inits = {
        "w0": rng.standard_normal((8, 3, k, k)).astype(np.float32),
        "b0": rng.standard_normal(8).astype(np.float32),
        "wd": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
        "wg": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
        "w1": rng.standard_normal((6, 8, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["s"], pads=[k // 2] * 4, strides=[2, 2]),
        helper.make_node("Relu", ["s"], ["r"]),
    ]
    if reader == "depthwise":
        nodes.append(helper.make_node("Conv", ["r", "wd"], ["y"], pads=[1, 1, 1, 1], group=8))
    elif reader == "two depthwise":
        nodes.append(helper.make_node("Conv", ["r", "wd"], ["y1"], pads=[1, 1, 1, 1], group=8))
        nodes.append(helper.make_node("Conv", ["r", "wd"], ["y2"], pads=[0, 0, 0, 0], group=8))
        nodes.append(helper.make_node("Add", ["y1", "y1"], ["y"]))
        nodes.append(helper.make_node("ReduceSum", ["y2"], ["z"], keepdims=0))
    elif reader == "grouped":  # 2 channels per group: not depthwise
        nodes.append(helper.make_node("Conv", ["r", "wg"], ["y"], pads=[1, 1, 1, 1], group=2))
    elif reader == "depthwise and pointwise":
        nodes.append(helper.make_node("Conv", ["r", "wd"], ["y"], pads=[1, 1, 1, 1], group=8))
        nodes.append(helper.make_node("Conv", ["r", "w1"], ["z"]))
    outputs = [vinfo("y", F, None)]
    if reader in ("two depthwise", "depthwise and pointwise"):
        outputs.append(vinfo("z", F, None))
    if stem_is_output:
        outputs.append(vinfo("r", F, None))
    return make_model(nodes, [vinfo("x", F, [1, 3, 16, 14])], outputs, initializers=inits)


def _marked(model: onnx.ModelProto) -> list[str]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return [n.op_type for n in graph.nodes if n.attrs.get("channels_last")]


def _check(model: onnx.ModelProto) -> None:
    x = np.random.default_rng(6).standard_normal((1, 3, 16, 14)).astype(np.float32)
    check_optimized(model, {"x": x}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("reader", ["depthwise", "two depthwise"])
def test_a_convolution_read_by_depthwise_layers_writes_channels_last(
    monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    model = _model(reader)
    assert _marked(model) == ["FusedConv"]
    layouts: list[bool] = []
    real = conv_module._im2col_gemm

    def spy(*args: object, **kwargs: object) -> object:
        y = real(*args, **kwargs)
        layouts.append(is_channels_last(y))
        return y

    monkeypatch.setattr(conv_module, "_im2col_gemm", spy)
    _check(model)
    assert True in layouts  # the stem's result really was channels-last


@pytest.mark.parametrize(
    "reader,kwargs",
    [
        ("grouped", {}),
        ("depthwise and pointwise", {}),
        ("depthwise", {"stem_is_output": True}),
        ("depthwise", {"stem_kernel": 1}),
    ],
    ids=["grouped reader", "a pointwise reader too", "graph output", "1x1 stem"],
)
def test_other_convolutions_keep_nchw(reader: str, kwargs: dict[str, object]) -> None:
    model = _model(reader, **kwargs)  # type: ignore[arg-type]
    assert _marked(model) == []
    _check(model)


def test_the_kernel_returns_the_same_values_channels_last() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 3, 20, 18)).astype(np.float32)
    w = rng.standard_normal((16, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    plain = conv_module.conv_nd(np, x, w, b, pads=[1, 1, 1, 1], strides=[2, 2])
    last = conv_module.conv_nd(np, x, w, b, pads=[1, 1, 1, 1], strides=[2, 2], channels_last=True)
    assert is_channels_last(last) and not is_channels_last(plain)
    np.testing.assert_allclose(last, plain, rtol=1e-5, atol=1e-5)
    # Two images: the mark is ignored (NCHW), values the same.
    x2 = np.concatenate([x, x[:, :, ::-1]])
    both = conv_module.conv_nd(np, x2, w, b, pads=[1, 1, 1, 1], strides=[2, 2], channels_last=True)
    np.testing.assert_allclose(both[:1], plain, rtol=1e-5, atol=1e-5)
