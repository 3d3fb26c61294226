"""optimizer/passes/fuse_fake_quant.py and the FakeQuant activation: a QuantizeLinear ->
DequantizeLinear pair becomes one in-place step that the convolutions and products before it
take as their activation, with exactly the numbers of the two nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from tests.helpers import make_model, optimized_op_counts, quantize_static_model, vinfo

F = TensorProto.FLOAT
RNG = np.random.default_rng(5)


def _sessions(model: onnx.ModelProto) -> tuple[Any, Any]:
    data = model.SerializeToString()
    plain = onnxpy.SessionOptions()
    plain.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxpy.InferenceSession(data), onnxpy.InferenceSession(data, plain)


def _pair(q_type: int, zero_point: Any, scale: float = 0.05, opset: int = 21, **q_attrs: Any) -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> y with constant scalar parameters."""
    inits = {"s": np.array(scale, np.float32)}
    names = ["x", "s"]
    if zero_point is not None:
        inits["z"] = np.array(zero_point, helper.tensor_dtype_to_np_dtype(q_type))
        names.append("z")
    nodes = [
        helper.make_node("QuantizeLinear", names, ["q"], **q_attrs),
        helper.make_node("DequantizeLinear", ["q", *names[1:]], ["y"]),
    ]
    return make_model(nodes, [vinfo("x", F, [None])], [vinfo("y", F, [None])], inits, opset=opset, ir_version=10)


# Values at and around the rounding and clipping edges of scale 0.05: halves of a step, the
# type's limits, infinities, signed zeros, subnormals, huge values.
EDGES = np.array(
    [0.0, -0.0, 0.025, -0.025, 0.075, 0.0749999, 0.0750001, -0.125, 1e-45, -1e-45, 6.35, 6.4, -6.4, -6.45,
     12.75, 12.8, -12.8, 1e3, -1e3, 1e30, -1e30, np.inf, -np.inf, 3276.75, -3276.8, 3277.0],
    np.float32,
)  # fmt: skip


@pytest.mark.parametrize(
    ("q_type", "zero_point"),
    [
        (TensorProto.UINT8, 128),
        (TensorProto.UINT8, 0),
        (TensorProto.UINT8, None),
        (TensorProto.INT8, 0),
        (TensorProto.INT8, -7),
        (TensorProto.UINT16, 30000),
        (TensorProto.INT16, 5),
    ],
)
def test_pair_is_one_step_with_the_same_bits(q_type: int, zero_point: Any) -> None:
    model = _pair(q_type, zero_point)
    assert optimized_op_counts(model) == {"FakeQuant": 1}
    fused, plain = _sessions(model)
    x = np.concatenate([EDGES, (RNG.standard_normal(4000) * 8).astype(np.float32)])
    got, want = fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()


def test_nan_stays_nan() -> None:
    """NaN's quantization is undefined: the fused step keeps it NaN rather than invent a number."""
    fused, _ = _sessions(_pair(TensorProto.UINT8, 128))
    assert np.isnan(fused.run(None, {"x": np.array([np.nan, 1.0], np.float32)})[0][0])


def _not_fused(model: onnx.ModelProto) -> None:
    counts = optimized_op_counts(model)
    assert "FakeQuant" not in counts and counts.get("QuantizeLinear") == 1, counts


def test_left_alone_when_the_pair_does_not_cancel() -> None:
    # A DequantizeLinear with another scale.
    model = _pair(TensorProto.UINT8, 128)
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.1, np.float32), "s2"))
    model.graph.node[1].input[1] = "s2"
    _not_fused(model)
    # A zero point of another value.
    model = _pair(TensorProto.UINT8, 128)
    model.graph.initializer.append(numpy_helper.from_array(np.array(127, np.uint8), "z2"))
    model.graph.node[1].input[2] = "z2"
    _not_fused(model)
    # Float8: the cast rounds, no integer clip reproduces it.
    _not_fused(_pair(TensorProto.FLOAT8E4M3FN, 0.0))
    # A scale that is not positive.
    _not_fused(_pair(TensorProto.UINT8, 128, scale=0.0))
    # Per-axis parameters.
    model = _pair(TensorProto.UINT8, None)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([0.05], np.float32), "s"))
    model.graph.initializer[0].dims[:] = [1]
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    counts = optimized_op_counts(model)
    assert counts.get("FakeQuant") == 1  # one value of shape [1] is per-tensor too
    # The integer value is an output of the graph: it must still be computed.
    model = _pair(TensorProto.UINT8, 128)
    model.graph.output.append(vinfo("q", TensorProto.UINT8, [None]))
    _not_fused(model)
    # A scale the caller may override.
    model = _pair(TensorProto.UINT8, 128)
    model.graph.input.append(vinfo("s", F, []))
    _not_fused(model)


def _cnn() -> onnx.ModelProto:
    """Convolutions of every fused kind: a 1x1 expansion into a depthwise layer (the
    pointwise-depthwise fusion), a residual add, a channel Concat of convolutions of one input
    (ConcatConv), max pooling and a Gemm."""
    rng = np.random.default_rng(0)

    inits: dict[str, np.ndarray] = {}

    def w(name: str, *shape: int, s: float = 0.3) -> None:
        inits[name] = (rng.standard_normal(shape) * s).astype(np.float32)

    [
        w("c1w", 8, 3, 3, 3), w("c1b", 8, s=0.1), w("pw", 32, 8, 1, 1), w("pb", 32, s=0.1),
        w("dw", 32, 1, 3, 3), w("db", 32, s=0.1), w("pj", 8, 32, 1, 1, s=0.2), w("pjb", 8, s=0.1),
        w("e1", 8, 8, 1, 1), w("e1b", 8, s=0.1), w("e3", 8, 8, 3, 3, s=0.15), w("e3b", 8, s=0.1),
        w("gw", 16, 10, s=0.3), w("gb", 10, s=0.1),
    ]  # fmt: skip
    inits.update(lo=np.array(0.0, np.float32), hi=np.array(6.0, np.float32))
    mk = helper.make_node
    nodes = [
        mk("Conv", ["x", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]),
        mk("Relu", ["c1"], ["r1"]),
        mk("Conv", ["r1", "pw", "pb"], ["p"]),
        mk("Clip", ["p", "lo", "hi"], ["pr"]),
        mk("Conv", ["pr", "dw", "db"], ["d"], pads=[1, 1, 1, 1], group=32),
        mk("Clip", ["d", "lo", "hi"], ["dr"]),
        mk("Conv", ["dr", "pj", "pjb"], ["j"]),
        mk("Add", ["j", "r1"], ["res"]),
        mk("MaxPool", ["res"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        mk("Conv", ["mp", "e1", "e1b"], ["x1"]),
        mk("Relu", ["x1"], ["x1r"]),
        mk("Conv", ["mp", "e3", "e3b"], ["x3"], pads=[1, 1, 1, 1]),
        mk("Relu", ["x3"], ["x3r"]),
        mk("Concat", ["x1r", "x3r"], ["cat"], axis=1),
        mk("GlobalAveragePool", ["cat"], ["gap"]),
        mk("Flatten", ["gap"], ["flat"]),
        mk("Gemm", ["flat", "gw", "gb"], ["y"]),
    ]
    return make_model(nodes, [vinfo("x", F, [None, 3, 16, 16])], [vinfo("y", F, [None, 10])], inits, opset=13)


def _quantize_static(tmp_path: Path, activations: str, weights: str, per_channel: bool) -> onnx.ModelProto:
    return quantize_static_model(tmp_path, _cnn(), "QDQ", activations, weights, per_channel=per_channel)


@pytest.mark.parametrize(
    ("activations", "weights", "per_channel"),
    [("QUInt8", "QInt8", False), ("QInt8", "QInt8", True), ("QUInt16", "QInt8", False)],
)
def test_quantized_cnn_runs_fused_with_the_unfused_numbers(
    tmp_path: Path, activations: str, weights: str, per_channel: bool
) -> None:
    """A QDQ model from onnxruntime's quantizer: no QuantizeLinear is left, the convolutions take
    FakeQuant as their activation (the depthwise one inside PointwiseDepthwiseConv, the expand
    layers inside ConcatConv), and the output is the unoptimized graph's, bit for bit."""
    import onnxruntime

    model = _quantize_static(tmp_path, activations, weights, per_channel)
    counts = optimized_op_counts(model)
    assert "QuantizeLinear" not in counts and "DequantizeLinear" not in counts, counts
    if not any(n.domain == "com.microsoft" for n in model.graph.node):
        # (Older quantizers write 16-bit pairs as contrib nodes, which onnx's shape inference
        # does not type: the fusions that need float32 types then stay away.)
        assert counts.get("PointwiseDepthwiseConv") == 1 and counts.get("ConcatConv") == 1, counts
    fused, plain = _sessions(model)
    x = RNG.standard_normal((3, 3, 16, 16)).astype(np.float32)
    got, want = fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
    assert got.tobytes() == want.tobytes()
    # onnxruntime unoptimized runs the same float graph; its results may differ in the last
    # bits of a float product, so by at most a step of the output's quantization.
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort_plain = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    scale = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "y_scale")))
    # (One step in float32: its size plus the rounding of values that large, which at 16 bits
    # is a fair part of a step.)
    assert np.abs(got - ort_plain.run(None, {"x": x})[0]).max() <= scale + 4 * np.spacing(np.abs(got).max())


def _requantized(middle: list[onnx.NodeProto], second_scale: float) -> onnx.ModelProto:
    """x -> Q/DQ (scale 0.05) -> ``middle`` (reading "d1", writing "m") -> Q/DQ -> Neg -> y."""
    inits = {"s": np.array(0.05, np.float32), "s2": np.array(second_scale, np.float32), "z": np.array(128, np.uint8)}
    inits["shape"] = np.array([4, 6], np.int64)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q1"]),
        helper.make_node("DequantizeLinear", ["q1", "s", "z"], ["d1"]),
        *middle,
        helper.make_node("QuantizeLinear", ["m", "s2", "z"], ["q2"]),
        helper.make_node("DequantizeLinear", ["q2", "s2", "z"], ["d2"]),
        helper.make_node("Neg", ["d2"], ["y"]),
    ]
    return make_model(nodes, [vinfo("x", F, [2, 12])], [vinfo("y", F, None)], inits, opset=13)


@pytest.mark.parametrize(
    "middle",
    [
        [helper.make_node("Reshape", ["d1", "shape"], ["m"])],
        [helper.make_node("Transpose", ["d1"], ["t"]), helper.make_node("Flatten", ["t"], ["m"])],
        [helper.make_node("Concat", ["d1", "d1"], ["m"], axis=0)],
        [helper.make_node("Relu", ["d1"], ["m"])],
    ],
    ids=["reshape", "transpose-flatten", "concat", "relu"],
)
def test_a_pair_on_values_already_on_its_grid_is_dropped(middle: list[onnx.NodeProto]) -> None:
    """The quantizer re-quantizes after Reshape, Transpose, Concat...: on the same grid that
    second FakeQuant changes no bit, and goes. Relu computes new values: it stays (fused)."""
    x = EDGES[:24].reshape(2, 12)
    same, other = _requantized(middle, 0.05), _requantized(middle, 0.07)
    kept = 1 if middle[0].op_type != "Relu" else 2
    assert optimized_op_counts(same).get("FakeQuant") == kept
    assert optimized_op_counts(other).get("FakeQuant") == 2
    for model in (same, other):
        fused, plain = _sessions(model)
        assert fused.run(None, {"x": x})[0].tobytes() == plain.run(None, {"x": x})[0].tobytes()


def test_a_product_takes_its_pair_as_activation() -> None:
    """MatMul -> Q/DQ (a QDQ transformer's products) becomes one FusedMatMul quantizing its fresh
    result in place, with the unfused bits."""
    rng = np.random.default_rng(6)
    inits = {"w": rng.standard_normal((16, 8)).astype(np.float32), "s": np.array(0.02, np.float32)}
    inits["z"] = np.array(3, np.int8)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("QuantizeLinear", ["m", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    model = make_model(nodes, [vinfo("x", F, [2, 5, 16])], [vinfo("y", F, [2, 5, 8])], inits, opset=13)
    assert optimized_op_counts(model) == {"FusedMatMul": 1}
    fused, plain = _sessions(model)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    assert fused.run(None, {"x": x})[0].tobytes() == plain.run(None, {"x": x})[0].tobytes()
