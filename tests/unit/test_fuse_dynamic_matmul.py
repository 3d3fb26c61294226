"""optimizer/passes/fuse_dynamic_matmul.py: products quantized by onnxruntime's quantize_dynamic
run as DynamicQuantizeShifted + ShiftedIntegerMatMul with exactly the unfused numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from tests.helpers import make_model, optimized_op_counts, vinfo

F = TensorProto.FLOAT


def _layer() -> onnx.ModelProto:
    """Three products of one input (attention's Q, K, V) with biases, one without, and a
    product of their sum: DynamicQuantizeLinear's output shared by several MatMulIntegers."""
    rng = np.random.default_rng(3)
    inits = {f"w{i}": (rng.standard_normal((32, 32)) * 0.2).astype(np.float32) for i in range(5)}
    inits.update({f"b{i}": (rng.standard_normal(32) * 0.1).astype(np.float32) for i in range(3)})
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", f"w{i}"], [f"m{i}"]) for i in range(4)]
    nodes += [mk("Add", [f"m{i}", f"b{i}"], [f"a{i}"]) for i in range(3)]
    nodes += [
        mk("Add", ["a0", "a1"], ["s01"]),
        mk("Add", ["s01", "a2"], ["s"]),
        mk("Add", ["s", "m3"], ["t"]),
        mk("Relu", ["t"], ["r"]),
        mk("MatMul", ["r", "w4"], ["y"]),
    ]
    return make_model(nodes, [vinfo("x", F, ["batch", 7, 32])], [vinfo("y", F, ["batch", 7, 32])], inits, opset=13)


def _quantize_dynamic(tmp_path: Path, weight_type: str, per_channel: bool) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp, qp = tmp_path / "float.onnx", tmp_path / "quant.onnx"
    onnx.save(_layer(), fp)
    quantize_dynamic(str(fp), str(qp), weight_type=getattr(QuantType, weight_type), per_channel=per_channel)
    return onnx.load(str(qp))


@pytest.mark.parametrize(("weight_type", "per_channel"), [("QUInt8", False), ("QInt8", False), ("QInt8", True)])
def test_quantized_products_fuse_with_the_unfused_numbers(tmp_path: Path, weight_type: str, per_channel: bool) -> None:
    import onnxruntime

    model = _quantize_dynamic(tmp_path, weight_type, per_channel)
    assert {n.op_type for n in model.graph.node} >= {"DynamicQuantizeLinear", "MatMulInteger"}
    counts = optimized_op_counts(model)
    assert counts.get("ShiftedIntegerMatMul") == 5 and counts.get("DynamicQuantizeShifted") == 2, counts
    assert "MatMulInteger" not in counts and "DynamicQuantizeLinear" not in counts, counts
    data = model.SerializeToString()
    plain_options = onnxpy.SessionOptions()
    plain_options.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    fused, plain = onnxpy.InferenceSession(data), onnxpy.InferenceSession(data, plain_options)
    rng = np.random.default_rng(4)
    for x in [rng.standard_normal((2, 7, 32)).astype(np.float32), np.zeros((1, 7, 32), np.float32)]:
        got = fused.run(None, {"x": x})[0]
        assert got.tobytes() == plain.run(None, {"x": x})[0].tobytes()
        want = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_left_alone_when_the_quantized_input_has_another_reader(tmp_path: Path) -> None:
    model = _quantize_dynamic(tmp_path, "QUInt8", False)
    dql = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLinear")
    model.graph.output.append(vinfo(dql.output[0], TensorProto.UINT8, None))
    counts = optimized_op_counts(model)
    assert counts.get("DynamicQuantizeLinear") == 1 and counts.get("DynamicQuantizeShifted") == 1, counts
    assert counts.get("MatMulInteger") == 4 and counts.get("ShiftedIntegerMatMul") == 1, counts


def test_infinite_inputs_give_the_unfused_numbers() -> None:
    """An infinity makes the quantization scale infinite: x / inf is NaN, which the unfused
    DynamicQuantizeLinear casts to some uint8; the fused step takes those very integers instead
    of carrying NaN into the product, which a constant scale then shows (found by fuzzing)."""
    mk = helper.make_node
    nodes = [
        mk("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        mk("MatMulInteger", ["xq", "w", "xz"], ["acc"]),
        mk("Cast", ["acc"], ["accf"], to=F),
        mk("Mul", ["accf", "s"], ["y"]),
    ]
    inits = {"w": np.arange(12, dtype=np.uint8).reshape(4, 3), "s": np.array(0.5, np.float32)}
    model = make_model(nodes, [vinfo("x", F, [2, 4])], [vinfo("y", F, [2, 3])], inits, opset=13)
    assert optimized_op_counts(model).get("ShiftedIntegerMatMul") == 1
    data = model.SerializeToString()
    plain_options = onnxpy.SessionOptions()
    plain_options.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    fused, plain = onnxpy.InferenceSession(data), onnxpy.InferenceSession(data, plain_options)
    x = np.array([[1, 2, 3, 4], [np.inf, 1, 2, 3]], np.float32)
    got, want = fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
    assert np.isfinite(want).all() and got.tobytes() == want.tobytes()
