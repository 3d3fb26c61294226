"""optimizer/passes/fuse_concat_conv.py and ConcatConv: a channel Concat of convolutions of one
input becomes one node whose members write their channels of the result in place, through
every convolution path, with the numbers of the unfused graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ops.fused import concat_conv
from tests.helpers import check_optimized, make_model, optimized_op_counts, vinfo

F = TensorProto.FLOAT

# (output channels, kernel, attributes, activation): on 64 channels of 28x28 these take the
# 1x1 GEMM, the 1x1 GEMM with the bias inside, tap-sum, Winograd F(4x4), padded-width im2col
# and the channels-last depthwise path (which copies into its slice).
MEMBERS = [
    (16, 1, {}, "Relu"),
    (128, 1, {}, None),
    (8, 3, {"pads": [1, 1, 1, 1]}, "Relu"),
    (64, 3, {"pads": [1, 1, 1, 1]}, "Clip"),
    (24, 5, {"pads": [2, 2, 2, 2]}, "Relu"),
    (64, 3, {"pads": [1, 1, 1, 1], "group": 64}, "Relu"),
]


def _model(
    members: list[tuple[int, int, dict[str, Any], str | None]],
    shape: tuple[int, ...],
    *,
    other_input: bool = False,
    extra_reader: bool = False,
    axis: int = 1,
) -> onnx.ModelProto:
    rng = np.random.default_rng(9)
    c = shape[1]
    inits: dict[str, np.ndarray] = {"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    nodes = [helper.make_node("Relu", ["x"], ["x1"])]  # the members' shared input
    inputs = [vinfo("x", F, list(shape))]
    if other_input:
        inputs.append(vinfo("z", F, list(shape)))
    parts = []
    for i, (m, k, attrs, act) in enumerate(members):
        group = attrs.get("group", 1)
        inits[f"w{i}"] = (rng.standard_normal((m, c // group, k, k)) * 0.2).astype(np.float32)
        inits[f"b{i}"] = rng.standard_normal(m).astype(np.float32)
        src = "z" if other_input and i == 1 else "x1"
        nodes.append(helper.make_node("Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], **attrs))
        name = f"c{i}"
        if act == "Relu":
            nodes.append(helper.make_node("Relu", [name], [f"a{i}"]))
            name = f"a{i}"
        elif act == "Clip":
            nodes.append(helper.make_node("Clip", [name, "lo", "hi"], [f"a{i}"]))
            name = f"a{i}"
        parts.append(name)
    nodes.append(helper.make_node("Concat", parts, ["y"], axis=axis))
    outputs = [vinfo("y", F, None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", [parts[0]], ["n"]))
        outputs.append(vinfo("n", F, None))
    return make_model(nodes, inputs, outputs, initializers=inits)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }


def _check(model: onnx.ModelProto) -> None:
    check_optimized(model, _feeds(model), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [1, 2], ids=["in-place", "batch2-copied"])
def test_every_convolution_path_writes_its_slice(batch: int) -> None:
    model = _model(MEMBERS, (batch, 64, 28, 28))
    assert optimized_op_counts(model) == {"Relu": 1, "ConcatConv": 1}
    _check(model)


def test_fire_module_and_a_narrow_map() -> None:
    """SqueezeNet's shape (1x1 and 3x3 expands of one squeeze) on a 7x7 map (plain im2col)."""
    model = _model([(16, 1, {}, "Relu"), (16, 3, {"pads": [1, 1, 1, 1]}, "Relu")], (1, 8, 7, 7))
    assert optimized_op_counts(model) == {"Relu": 1, "ConcatConv": 1}
    _check(model)


@pytest.mark.parametrize(
    "kwargs",
    [{"other_input": True}, {"extra_reader": True}, {"axis": 2}],
    ids=["different-inputs", "member-read-elsewhere", "axis-2"],
)
def test_near_misses_stay_unfused(kwargs: dict[str, Any]) -> None:
    members = [(16, 1, {}, "Relu"), (16, 3, {"pads": [1, 1, 1, 1]}, "Relu")]
    model = _model(members, (1, 16, 9, 9), **kwargs)
    assert "ConcatConv" not in optimized_op_counts(model)
    _check(model)


def test_the_optimized_model_round_trips(tmp_path: Path) -> None:
    model = _model(MEMBERS[:3], (1, 64, 14, 14))
    path = tmp_path / "optimized.onnx"
    opts = onnxpy.SessionOptions()
    opts.optimized_model_filepath = str(path)
    feeds = _feeds(model)
    first = onnxpy.InferenceSession(model.SerializeToString(), opts).run(None, feeds)
    saved = onnx.load(str(path))
    assert [n.op_type for n in saved.graph.node].count("ConcatConv") == 1
    again = onnxpy.InferenceSession(str(path)).run(None, feeds)
    np.testing.assert_array_equal(first[0], again[0])


def test_kernel_rejects_members_of_different_sizes() -> None:
    x = np.ones((1, 2, 6, 6), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    attrs: dict[str, Any] = {
        "kernel_shapes": [3, 3, 3, 3],
        "pads": [1, 1, 1, 1, 0, 0, 0, 0],
        "strides": [1, 1, 1, 1],
        "dilations": [1, 1, 1, 1],
        "groups": [1, 1],
        "activations": ["", ""],
        "activation_params": [0.0] * 4,
    }
    with pytest.raises(ValueError, match="cannot be concatenated"):
        concat_conv(np, x, w, None, x, w, None, **attrs)
    with pytest.raises(ValueError, match="expected X, W, B for each"):
        concat_conv(np, x, w, None, x, w, **attrs)


def test_only_the_channels_last_member_is_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """For one image every path but the channels-last depthwise one writes its slice itself."""
    from onnxpy.ops import conv as conv_mod

    copied: list[tuple[int, ...]] = []
    original = conv_mod._delivered

    def spy(y: Any, into: Any) -> Any:
        if into is not None and y is not into:
            copied.append(tuple(into.shape))
        return original(y, into)

    monkeypatch.setattr(conv_mod, "_delivered", spy)
    model = _model(MEMBERS, (1, 64, 28, 28))
    onnxpy.InferenceSession(model.SerializeToString()).run(None, _feeds(model))
    assert copied == [(1, 64, 28, 28)]  # the depthwise member (group 64) alone
