"""optimizer/passes/pack_matmuls.py and PackedMatMul: products of one input with several constant
weights become one GEMM whose column slices are the results, with unchanged values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxpy.ops.fused import packed_matmul
from tests.helpers import check_optimized, make_model, optimized_op_counts, vinfo

F = TensorProto.FLOAT


def _model(
    *,
    runtime_weight: bool = False,
    activation: bool = False,
    dtype: int = F,
    extra_readers: bool = False,
    residual: bool = False,
) -> onnx.ModelProto:
    """x (2, 5, 8) times wq/wk/wv (+ biases) and a bias-free wo; optionally one weight fed as an
    input, a ReLU after the query product, float64, or in-place-able readers of the results."""
    rng = np.random.default_rng(1)
    np_dt = np.float32 if dtype == F else np.float64
    inits = {n: rng.standard_normal((8, c)).astype(np_dt) for n, c in (("wq", 6), ("wk", 6), ("wv", 4), ("wo", 3))}
    inits.update({f"b{n[1]}": rng.standard_normal(inits[n].shape[1]).astype(np_dt) for n in ("wq", "wk", "wv")})
    inputs = [vinfo("x", dtype, [2, 5, 8])]
    if runtime_weight:
        del inits["wv"]
        inputs.append(vinfo("wv", dtype, [8, 4]))
    nodes = []
    outs = []
    for n in ("q", "k", "v"):
        nodes += [
            helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"]),
            helper.make_node("Add", [f"{n}0", f"b{n}"], [n]),
        ]
        outs.append(n)
    nodes.append(helper.make_node("MatMul", ["x", "wo"], ["o"]))
    outs.append("o")
    if activation:
        nodes.append(helper.make_node("Relu", ["q"], ["qr"]))
        outs[0] = "qr"
    if residual:
        # A skip connection after the key product: it fuses into that FusedMatMul instead.
        nodes.append(helper.make_node("Add", ["k", "x6"], ["kr"]))
        inits["x6"] = rng.standard_normal((2, 5, 6)).astype(np_dt)
        outs[1] = "kr"
    if extra_readers:
        # Add may write in place; its input is a slice of the packed product, so it must not.
        nodes.append(helper.make_node("Add", ["q", "q"], ["qq"]))
        nodes.append(helper.make_node("Neg", ["k"], ["kn"]))
        outs += ["qq", "kn"]
    return make_model(nodes, inputs, [vinfo(o, dtype, None) for o in outs], initializers=inits)


def _check(model: onnx.ModelProto) -> None:
    rng = np.random.default_rng(2)
    dtype = np.float64 if model.graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE else np.float32
    feeds = {"x": rng.standard_normal((2, 5, 8)).astype(dtype)}
    if len(model.graph.input) > 1:
        feeds["wv"] = rng.standard_normal((8, 4)).astype(dtype)
    check_optimized(model, feeds)


def test_products_of_one_input_are_packed() -> None:
    model = _model()
    assert optimized_op_counts(model) == {"PackedMatMul": 1}
    _check(model)


def test_results_stay_intact_under_in_place_readers() -> None:
    model = _model(extra_readers=True)
    assert optimized_op_counts(model)["PackedMatMul"] == 1
    _check(model)


def test_a_fused_activation_leaves_that_product_out() -> None:
    model = _model(activation=True)
    assert optimized_op_counts(model) == {"PackedMatMul": 1, "FusedMatMul": 1}
    _check(model)


def test_a_residual_add_after_a_packed_product_stays_correct() -> None:
    # Packing wins the race (both passes run in the same round): the Add stays after the slice.
    model = _model(residual=True)
    assert optimized_op_counts(model) == {"PackedMatMul": 1, "Add": 1}
    _check(model)


def test_a_fused_matmul_with_a_residual_is_never_packed() -> None:
    from onnxpy.optimizer.passes import pack_matmuls
    from onnxpy.runtime.compile import build_graph

    rng = np.random.default_rng(3)
    inits = {n: rng.standard_normal((8, 6)).astype(np.float32) for n in ("wa", "wb", "wc")}
    inits.update({n: rng.standard_normal(6).astype(np.float32) for n in ("ba", "bb", "bc")})
    nodes = [
        helper.make_node("FusedMatMul", ["x", "wa", "ba"], ["a"], domain="onnxpy.fused"),
        helper.make_node("FusedMatMul", ["x", "wb", "bb", "z"], ["b"], domain="onnxpy.fused"),
        helper.make_node("FusedMatMul", ["x", "wc", "bc"], ["c"], domain="onnxpy.fused"),
    ]
    model = make_model(
        nodes,
        [vinfo("x", F, [5, 8]), vinfo("z", F, [5, 6])],
        [vinfo(o, F, None) for o in "abc"],
        initializers=inits,
        extra_opsets={"onnxpy.fused": 1},
    )
    graph = build_graph(model)
    assert pack_matmuls.run(graph)
    kept = [n for n in graph.nodes if n.op_type == "FusedMatMul"]
    assert [n.outputs for n in kept] == [["b"]] and kept[0].inputs[3] == "z"
    import onnxpy

    x, z = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32)
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": x, "z": z})
    for g, w, b, addend in zip(got, ("wa", "wb", "wc"), ("ba", "bb", "bc"), (0, z, 0)):
        np.testing.assert_allclose(g, x @ inits[w] + inits[b] + addend, rtol=1e-5, atol=1e-5)


def test_a_weight_fed_at_run_time_leaves_that_product_out() -> None:
    model = _model(runtime_weight=True)
    ops = optimized_op_counts(model)
    assert ops["PackedMatMul"] == 1 and ops["MatMul"] + ops.get("FusedMatMul", 0) == 1, ops
    _check(model)


def test_float64_is_left_alone() -> None:
    model = _model(dtype=TensorProto.DOUBLE)
    assert "PackedMatMul" not in optimized_op_counts(model)
    _check(model)


def test_kernel_checks_its_splits() -> None:
    a = np.ones((2, 3), np.float32)
    b = np.ones((3, 5), np.float32)
    q, k = packed_matmul(np, a, b, None, splits=[2, 3])
    assert q.shape == (2, 2) and k.shape == (2, 3) and np.all(k == 3)
    with pytest.raises(ValueError, match="add up to B's 5 columns"):
        packed_matmul(np, a, b, None, splits=[2, 2])
