"""Each optimizer pass on a small graph: what it rewrites, and that the numbers do not change."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ir.graph import Node
from onnxpy.optimizer.manager import optimize
from onnxpy.optimizer.passes import constant_folding, eliminate, fold_batchnorm, fuse_activation
from onnxpy.optimizer.rewrite import FUSED_DOMAIN
from onnxpy.runtime.compile import build_graph
from tests.helpers import make_model, vinfo

RNG = np.random.default_rng(7)


def _ops(graph) -> dict[str, int]:
    return dict(collections.Counter(n.op_type for n in graph.nodes))


def _same_numbers(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-5) -> onnxpy.InferenceSession:
    """Run at level 0 and at level 99; assert equal outputs; return the optimized session."""
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = onnxpy.InferenceSession(model, plain_opts).run(None, feeds)
    sess = onnxpy.InferenceSession(model)
    got = sess.run(None, feeds)
    for g, w in zip(got, plain):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-5 * max(1.0, float(np.max(np.abs(w)))))
    return sess


def _conv_model(extra_nodes, extra_inits, out_name, out_shape=(1, 4, 6, 6)):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]), *extra_nodes]
    return make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [vinfo(out_name, TensorProto.FLOAT, list(out_shape))],
        initializers={"w": w, "b": b, **extra_inits},
    )


X = {"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)}


def test_constant_folding_turns_weight_subgraphs_into_initializers() -> None:
    nodes = [
        helper.make_node(
            "ConstantOfShape", ["shape"], ["w"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])
        ),
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("Gather", ["sx", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    inits = {
        "shape": np.array([12, 2], np.int64),
        "zero": np.array(0, np.int64),
        "axes": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
    }
    m = make_model(
        nodes, [vinfo("x", TensorProto.FLOAT, [2, 3, 4])], [vinfo("y", TensorProto.FLOAT, [2, 2])], initializers=inits
    )
    graph = build_graph(m)
    assert constant_folding.run(graph)
    assert _ops(graph) == {"Reshape": 1, "MatMul": 1}
    assert graph.initializers["w"].shape == (12, 2) and np.all(graph.initializers["w"] == 0.5)
    assert graph.initializers["newshape"].tolist() == [2, -1]
    assert not constant_folding.run(graph)  # a fixpoint
    _same_numbers(m, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)})


def test_a_folded_transpose_is_stored_in_c_order() -> None:
    # GPT-2's tied lm_head: MatMul(h, Transpose(wte)). The folded weight is its own C-ordered
    # array (BLAS streams it better for one token than the transposed view's order), read-only.
    wte = RNG.standard_normal((10, 4)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["wte"], ["wt"]), helper.make_node("MatMul", ["h", "wt"], ["y"])]
    m = make_model(
        nodes, [vinfo("h", TensorProto.FLOAT, [3, 4])], [vinfo("y", TensorProto.FLOAT, [3, 10])], {"wte": wte}
    )
    graph = build_graph(m)
    assert constant_folding.run(graph)
    wt = graph.initializers["wt"]
    assert wt.flags.c_contiguous and wt.flags.owndata and not wt.flags.writeable
    np.testing.assert_array_equal(wt, wte.T)
    _same_numbers(m, {"h": RNG.standard_normal((3, 4)).astype(np.float32)})


def test_constant_folding_keeps_random_ops_and_dynamic_shapes() -> None:
    nodes = [
        helper.make_node("RandomNormal", [], ["r"], shape=[2]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Add", ["x", "r"], ["y"]),
    ]
    m = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, ["n", 2])],
        [vinfo("y", TensorProto.FLOAT, ["n", 2]), vinfo("s", TensorProto.INT64, [2])],
    )
    graph = build_graph(m)
    constant_folding.run(graph)
    assert "RandomNormal" in _ops(graph) and "Shape" in _ops(graph)


@pytest.mark.parametrize(
    ("picker", "folds"),
    [
        ("slice-last", True),  # x.shape[-1:] of a (n, s, 3) value: [3]
        ("gather-last", True),
        ("slice-all", False),  # takes the unknown dimensions too
        ("gather-first", False),
    ],
)
def test_a_shape_s_known_dimensions_fold_when_only_they_are_picked(picker: str, folds: bool) -> None:
    # torch's scaled_dot_product_attention export: scale = 1 / sqrt(q.shape[-1]) from Shape
    i64 = TensorProto.INT64
    inits: dict[str, np.ndarray] = {"big": np.array([2**62], np.int64), "one": np.array(1.0, np.float32)}
    if picker.startswith("slice"):
        inits["start"] = np.array([-1 if picker == "slice-last" else 0], np.int64)
        pick = helper.make_node("Slice", ["shape", "start", "big"], ["dims"])
    else:
        inits["index"] = np.array([-1 if picker == "gather-last" else 0], np.int64)
        pick = helper.make_node("Gather", ["shape", "index"], ["dims"], axis=0)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        pick,
        helper.make_node("Cast", ["dims"], ["d"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["d"], ["root"]),
        helper.make_node("Div", ["one", "root"], ["scale"]),
        helper.make_node("Mul", ["x", "scale"], ["y"]),
    ]
    m = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, ["n", "s", 3])],
        [vinfo("y", TensorProto.FLOAT, None), vinfo("dims", i64, None)],
        initializers=inits,
    )
    graph = build_graph(m)
    optimize(graph, 1)  # basic: constant folding to a fixpoint
    ops = _ops(graph)
    assert ("Shape" not in ops and set(ops) == {"Mul"}) == folds, ops
    x = RNG.standard_normal((2, 3, 3)).astype(np.float32)
    _same_numbers(m, {"x": x})


def test_overridable_initializers_are_not_folded() -> None:
    m = make_model(
        [helper.make_node("Neg", ["w"], ["y"])],
        [vinfo("w", TensorProto.FLOAT, [2])],
        [vinfo("y", TensorProto.FLOAT, [2])],
        initializers={"w": np.ones(2, np.float32)},
    )
    graph = build_graph(m)
    assert not constant_folding.run(graph)
    sess = onnxpy.InferenceSession(m)
    assert sess.run(None, {"w": np.array([3, 4], np.float32)})[0].tolist() == [-3, -4]


def test_eliminate_identity_dropout_and_noop_cast_but_keep_graph_outputs() -> None:
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Dropout", ["a"], ["b", "mask"], ratio=0.3),
        helper.make_node("Cast", ["b"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("Relu", ["c"], ["d"]),
        helper.make_node("Identity", ["d"], ["y"]),
    ]
    m = make_model(nodes, [vinfo("x", TensorProto.FLOAT, [4])], [vinfo("y", TensorProto.FLOAT, [4])], opset=11)
    graph = build_graph(m)
    assert eliminate.run(graph)
    assert _ops(graph) == {"Relu": 1, "Identity": 1}  # the Identity naming the output stays
    assert graph.nodes[0].inputs == ["x"]
    _same_numbers(m, {"x": np.array([-1, 0, 1, 2], np.float32)})


def test_dropout_with_a_used_mask_stays() -> None:
    nodes = [helper.make_node("Dropout", ["x"], ["y", "mask"])]
    m = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [4])],
        [vinfo("y", TensorProto.FLOAT, [4]), vinfo("mask", TensorProto.BOOL, [4])],
        opset=11,
    )
    graph = build_graph(m)
    assert not eliminate.run(graph)


def _bn_nodes(src: str, out: str, prefix: str, c: int = 4) -> tuple[list, dict]:
    inits = {
        f"{prefix}_s": RNG.uniform(0.5, 1.5, c).astype(np.float32),
        f"{prefix}_b": RNG.standard_normal(c).astype(np.float32),
        f"{prefix}_m": RNG.standard_normal(c).astype(np.float32),
        f"{prefix}_v": RNG.uniform(0.5, 1.5, c).astype(np.float32),
    }
    node = helper.make_node("BatchNormalization", [src, *inits], [out], epsilon=1e-3)
    return [node], inits


def test_conv_batchnorm_folds_into_the_conv() -> None:
    bn, inits = _bn_nodes("c", "y", "bn")
    m = _conv_model(bn, inits, "y")
    graph = build_graph(m)
    assert fold_batchnorm.run(graph)
    assert _ops(graph) == {"Conv": 1}
    assert graph.nodes[0].outputs == ["y"]
    _same_numbers(m, X)


def test_batchnorm_after_a_shared_conv_becomes_channel_affine() -> None:
    bn, inits = _bn_nodes("c", "n", "bn")
    extra = [*bn, helper.make_node("Add", ["n", "c"], ["y"])]  # c has two readers: no folding into conv
    m = _conv_model(extra, inits, "y")
    graph = build_graph(m)
    assert fold_batchnorm.run(graph)
    assert "ChannelAffine" in _ops(graph) and "BatchNormalization" not in _ops(graph)
    _same_numbers(m, X)


def test_per_channel_mul_add_fold_into_conv_and_affine() -> None:
    extra = [helper.make_node("Mul", ["c", "m"], ["d"]), helper.make_node("Add", ["d", "a"], ["y"])]
    inits = {
        "m": RNG.standard_normal((4, 1, 1)).astype(np.float32),
        "a": RNG.standard_normal((1, 4, 1, 1)).astype(np.float32),
    }
    m = _conv_model(extra, inits, "y")
    graph = build_graph(m)
    assert fold_batchnorm.run(graph)
    while fold_batchnorm.run(graph):  # a sweep folds one node into a producer; the manager repeats
        pass
    assert _ops(graph) == {"Conv": 1}
    _same_numbers(m, X)
    # A non-per-channel constant (varies along width) must not fold.
    extra = [helper.make_node("Mul", ["c", "m"], ["y"])]
    m2 = _conv_model(extra, {"m": RNG.standard_normal((1, 1, 1, 6)).astype(np.float32)}, "y")
    graph = build_graph(m2)
    assert not fold_batchnorm.run(graph)
    _same_numbers(m2, X)


@pytest.mark.parametrize(
    ("act", "attrs", "extra_inputs", "extra_inits"),
    [
        ("Relu", {}, [], {}),
        ("LeakyRelu", {"alpha": 0.2}, [], {}),
        ("Clip", {}, ["lo", "hi"], {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}),
        ("Sigmoid", {}, [], {}),
        ("Tanh", {}, [], {}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, [], {}),
        ("HardSwish", {}, [], {}),
    ],
)
def test_conv_activation_fusion(act: str, attrs: dict, extra_inputs: list, extra_inits: dict) -> None:
    m = _conv_model([helper.make_node(act, ["c", *extra_inputs], ["y"], **attrs)], extra_inits, "y")
    graph = build_graph(m)
    assert fuse_activation.run(graph)
    assert _ops(graph) == {"FusedConv": 1}
    assert graph.nodes[0].domain == FUSED_DOMAIN and graph.nodes[0].attrs["activation"] == act
    _same_numbers(m, X)


def _residual_relu_model(z_nodes: list[onnx.NodeProto], z_input: onnx.ValueInfoProto) -> onnx.ModelProto:
    """Conv(x) + z -> Relu, where ``z_nodes`` make z from the graph input ``z_input``."""
    return make_model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            *z_nodes,
            helper.make_node("Add", ["c", "z"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"]),
        ],
        [vinfo("x", TensorProto.FLOAT, [1, 3, 6, 6]), z_input],
        [vinfo("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        initializers={
            "w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
            "b": RNG.standard_normal(4).astype(np.float32),
        },
    )


def _fused_conv_after_fusion(m: onnx.ModelProto) -> Node:
    graph = build_graph(m)
    while fuse_activation.run(graph):
        pass
    (fused,) = [n for n in graph.nodes if n.op_type == "FusedConv"]
    assert len(graph.nodes) == 1 + sum(n.op_type == "Neg" for n in graph.nodes)
    return fused


def test_residual_add_and_relu_fuse_into_the_conv() -> None:
    m = _residual_relu_model([helper.make_node("Neg", ["x2"], ["z"])], vinfo("x2", TensorProto.FLOAT, [1, 4, 6, 6]))
    fused = _fused_conv_after_fusion(m)
    assert fused.inputs[3] == "z" and fused.attrs["activation"] == "Relu"
    _same_numbers(m, {**X, "x2": RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)})


def test_per_channel_constant_add_before_relu_becomes_bias_not_residual() -> None:
    """Conv -> Mul(per-channel) -> Add(per-channel) -> Relu (light Inception v2's scale layers):
    the Add folds into the bias, so the ReLU stays an in-place epilogue; a residual input would
    cost a broadcast pass and a separate activation pass."""
    extra = [
        helper.make_node("Mul", ["c", "m"], ["d"]),
        helper.make_node("Add", ["d", "a"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    inits = {
        "m": RNG.standard_normal((4, 1, 1)).astype(np.float32),
        "a": RNG.standard_normal((4, 1, 1)).astype(np.float32),
    }
    m = _conv_model(extra, inits, "y")
    graph = build_graph(m)
    from onnxpy.optimizer.manager import optimize

    optimize(graph, 99, host_only=True)
    assert _ops(graph) == {"FusedConv": 1}
    (fused,) = graph.nodes
    assert len(fused.inputs) < 4 or not fused.inputs[3]
    assert fused.attrs["activation"] == "Relu"
    _same_numbers(m, X)


def test_residual_that_broadcasts_per_channel_is_added_in_place() -> None:
    """A per-channel addend that is not a constant (a graph input) stays a residual input; the
    kernel broadcasts it into the convolution's output and applies the activation after."""
    m = _residual_relu_model([], vinfo("z", TensorProto.FLOAT, [4, 1, 1]))
    fused = _fused_conv_after_fusion(m)
    assert fused.inputs[3] == "z" and fused.attrs["activation"] == "Relu"
    got = _same_numbers(m, {**X, "z": RNG.standard_normal((4, 1, 1)).astype(np.float32)}).run(
        None, {**X, "z": np.full((4, 1, 1), -1e3, np.float32)}
    )[0]
    np.testing.assert_array_equal(got, 0)  # the ReLU ran after the addend


def test_gemm_relu_and_matmul_bias_fusions() -> None:
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["g"], transB=1),
        helper.make_node("Relu", ["g"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["mm"]),
        helper.make_node("Add", ["mm", "b2"], ["y"]),
    ]
    inits = {
        "w1": RNG.standard_normal((8, 5)).astype(np.float32),
        "b1": RNG.standard_normal(8).astype(np.float32),
        "w2": RNG.standard_normal((8, 3)).astype(np.float32),
        "b2": RNG.standard_normal(3).astype(np.float32),
    }
    m = make_model(
        nodes, [vinfo("x", TensorProto.FLOAT, [2, 5])], [vinfo("y", TensorProto.FLOAT, [2, 3])], initializers=inits
    )
    graph = build_graph(m)
    assert fuse_activation.run(graph)
    assert _ops(graph) == {"FusedGemm": 1, "FusedMatMul": 1}
    _same_numbers(m, {"x": RNG.standard_normal((2, 5)).astype(np.float32)})


@pytest.mark.parametrize(
    "z_shape,then_relu",
    [((2, 4, 3), False), ((4, 3), True), ((1, 3), False), ((3, 2, 4, 3), False)],
    ids=["same-shape", "broadcast-then-relu", "row", "larger"],
)
def test_matmul_bias_residual_add_becomes_one_fused_matmul(z_shape: tuple[int, ...], then_relu: bool) -> None:
    """MatMul + bias + Add of a tensor (a transformer's skip connection): the addend becomes
    FusedMatMul's 4th input, added in place when it broadcasts into the product, into a new
    array when it broadcasts the product larger; an activation after it still fuses."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["lin"]),
        helper.make_node("Add", ["z", "lin"], ["res"]),  # the residual first: either order fuses
    ]
    if then_relu:
        nodes.append(helper.make_node("Relu", ["res"], ["y"]))
    out = "y" if then_relu else "res"
    inits = {"w": RNG.standard_normal((5, 3)).astype(np.float32), "b": RNG.standard_normal(3).astype(np.float32)}
    m = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [2, 4, 5]), vinfo("z", TensorProto.FLOAT, list(z_shape))],
        [vinfo(out, TensorProto.FLOAT, None)],
        initializers=inits,
    )
    graph = build_graph(m)
    optimize(graph, 99, host_only=True)
    (fused,) = graph.nodes
    assert fused.op_type == "FusedMatMul" and fused.inputs[3] == "z"
    assert fused.attrs.get("activation", "") == ("Relu" if then_relu else "")
    feeds = {
        "x": RNG.standard_normal((2, 4, 5)).astype(np.float32),
        "z": RNG.standard_normal(z_shape).astype(np.float32),
    }
    sess = _same_numbers(m, feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tail", ["residual", "silu", "relu"])
def test_bias_free_products_take_their_residual_or_activation(tail: str) -> None:
    """Llama's projections have no bias: MatMul(x, W) then its residual Add (o_proj, down_proj)
    or its activation (gate_proj's SiLU) becomes one FusedMatMul, FusedMatMul(x, W, -, z) for
    a residual."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"])]
    if tail == "residual":
        nodes.append(helper.make_node("Add", ["z", "mm"], ["y"]))
    elif tail == "silu":
        nodes += [helper.make_node("Sigmoid", ["mm"], ["s"]), helper.make_node("Mul", ["mm", "s"], ["y"])]
    else:
        nodes.append(helper.make_node("Relu", ["mm"], ["y"]))
    m = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [2, 4, 5]), vinfo("z", TensorProto.FLOAT, [2, 4, 3])],
        [vinfo("y", TensorProto.FLOAT, None)],
        initializers={"w": RNG.standard_normal((5, 3)).astype(np.float32)},
    )
    graph = build_graph(m)
    optimize(graph, 99, host_only=True)
    (fused,) = graph.nodes
    assert fused.op_type == "FusedMatMul" and fused.inputs[:2] == ["x", "w"]
    if tail == "residual":
        assert fused.inputs[2:] == ["", "z"] and not fused.attrs.get("activation")
    else:
        assert fused.attrs["activation"] == {"silu": "Swish", "relu": "Relu"}[tail]
    feeds = {
        "x": RNG.standard_normal((2, 4, 5)).astype(np.float32),
        "z": RNG.standard_normal((2, 4, 3)).astype(np.float32),
    }
    sess = _same_numbers(m, feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)


def test_a_bias_free_product_with_siblings_is_left_to_pack_matmuls() -> None:
    # two products of x (a gate and an up projection): packed into one GEMM, the residual
    # Add after one of them stays a node of its own
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"]),
        helper.make_node("MatMul", ["x", "w2"], ["b"]),
        helper.make_node("Add", ["a", "z"], ["y1"]),
        helper.make_node("Mul", ["b", "b"], ["y2"]),
    ]
    m = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [2, 5]), vinfo("z", TensorProto.FLOAT, [2, 3])],
        [vinfo("y1", TensorProto.FLOAT, None), vinfo("y2", TensorProto.FLOAT, None)],
        initializers={
            "w1": RNG.standard_normal((5, 3)).astype(np.float32),
            "w2": RNG.standard_normal((5, 3)).astype(np.float32),
        },
    )
    graph = build_graph(m)
    optimize(graph, 99, host_only=True)
    assert sorted(n.op_type for n in graph.nodes) == ["Add", "Mul", "PackedMatMul"]
    _same_numbers(
        m, {"x": RNG.standard_normal((2, 5)).astype(np.float32), "z": RNG.standard_normal((2, 3)).astype(np.float32)}
    )


def test_levels_select_passes() -> None:
    from onnxpy.optimizer.manager import passes_for_level

    assert passes_for_level(0) == []
    assert constant_folding.run in passes_for_level(1) and fold_batchnorm.run not in passes_for_level(1)
    assert fold_batchnorm.run in passes_for_level(2) and fuse_activation.run in passes_for_level(99)


def test_optimized_model_filepath_writes_a_loadable_model(tmp_path) -> None:
    bn, inits = _bn_nodes("c", "r", "bn")
    m = _conv_model([*bn, helper.make_node("Relu", ["r"], ["y"])], inits, "y")
    so = onnxpy.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    want = onnxpy.InferenceSession(m, so).run(None, X)[0]
    saved = onnx.load(str(tmp_path / "opt.onnx"))
    assert [n.op_type for n in saved.graph.node] == ["FusedConv"]
    assert any(o.domain == FUSED_DOMAIN for o in saved.opset_import)
    np.testing.assert_allclose(onnxpy.InferenceSession(saved).run(None, X)[0], want, rtol=1e-6)
    src = tmp_path / "model.onnx"
    onnx.save(m, src)
    so2 = onnxpy.SessionOptions()
    so2.optimized_model_filepath = str(src)
    with pytest.raises(onnxpy.InvalidArgument, match="refusing to overwrite"):
        onnxpy.InferenceSession(str(src), so2)


def _gelu_nodes(order: str) -> list:
    if order == "div_last_half":
        return [
            helper.make_node("Div", ["x", "sqrt2"], ["a"]),
            helper.make_node("Erf", ["a"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["p"]),
            helper.make_node("Mul", ["x", "p"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["y"]),
        ]
    if order == "mul_half_first":
        return [
            helper.make_node("Mul", ["x", "rsqrt2"], ["a"]),
            helper.make_node("Erf", ["a"], ["e"]),
            helper.make_node("Add", ["one", "e"], ["p"]),
            helper.make_node("Mul", ["x", "half"], ["hx"]),
            helper.make_node("Mul", ["hx", "p"], ["y"]),
        ]
    return [  # (1 + erf) * 0.5, then * x
        helper.make_node("Div", ["x", "sqrt2"], ["a"]),
        helper.make_node("Erf", ["a"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["p"]),
        helper.make_node("Mul", ["p", "half"], ["m"]),
        helper.make_node("Mul", ["m", "x"], ["y"]),
    ]


def _gelu_model(order: str, divisor: float, multiplier: float | None = None) -> onnx.ModelProto:
    """A decomposed GELU in ``order`` dividing by ``divisor`` (or multiplying by ``multiplier``,
    1 / divisor by default)."""
    consts = {
        "sqrt2": np.array(divisor, np.float32),
        "rsqrt2": np.array(1 / divisor if multiplier is None else multiplier, np.float32),
        "one": np.array(1, np.float32),
        "half": np.array(0.5, np.float32),
    }
    return make_model(
        _gelu_nodes(order),
        [vinfo("x", TensorProto.FLOAT, [3, 8])],
        [vinfo("y", TensorProto.FLOAT, [3, 8])],
        initializers=consts,
    )


def _bn_relu_pool_conv_model(pool: dict, pool_readers: int = 1) -> onnx.ModelProto:
    """x -> BatchNorm -> Relu -> AveragePool -> 1x1 Conv, as DenseNet's transitions run once
    their convolution has moved after the pool."""
    c, m = 4, 6
    bn, inits = _bn_nodes("x", "n", "bn", c)
    inits["cw"] = RNG.standard_normal((m, c, 1, 1)).astype(np.float32)
    inits["cb"] = RNG.standard_normal(m).astype(np.float32)
    nodes = [
        *bn,
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("AveragePool", ["r"], ["p"], **pool),
        helper.make_node("Conv", ["p", "cw", "cb"], ["y"]),
    ]
    outs = ["y"]
    if pool_readers > 1:
        nodes.append(helper.make_node("Neg", ["p"], ["other"]))
        outs.append("other")
    return make_model(
        nodes, [vinfo("x", TensorProto.FLOAT, [1, c, 5, 5])], [vinfo(o) for o in outs], initializers=inits
    )


@pytest.mark.parametrize(
    "pool",
    [
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]},  # count_include_pad 0
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},  # 5 -> 3: the last window partial
    ],
    ids=["2x2-stride-2", "3x3-padded-not-counted", "ceil-mode"],
)
def test_relu_after_affine_folds_through_an_average_pool(pool: dict) -> None:
    sess = _same_numbers(_bn_relu_pool_conv_model(pool), _bn_relu_feeds(), rtol=1e-5)
    ops = _ops(sess._compiled.graph)
    assert ops.get("ChannelMax") == 1 and "ChannelAffine" not in ops, ops


@pytest.mark.parametrize(
    "pool,readers",
    [
        ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, 1),  # padding counted
        ({"kernel_shape": [2, 2], "strides": [2, 2]}, 2),  # the pooled value read elsewhere too
    ],
    ids=["padding-counted", "two-readers"],
)
def test_relu_floor_fold_through_a_pool_declines_where_it_would_change_values(pool: dict, readers: int) -> None:
    sess = _same_numbers(_bn_relu_pool_conv_model(pool, readers), _bn_relu_feeds(extreme=False), rtol=1e-5)
    assert "ChannelMax" not in _ops(sess._compiled.graph)


@pytest.mark.parametrize("order", ["div_last_half", "mul_half_first", "half_then_x"])
def test_gelu_patterns_fuse(order: str) -> None:
    from onnxpy.optimizer.passes import fuse_patterns

    m = _gelu_model(order, np.sqrt(2))
    graph = build_graph(m)
    assert fuse_patterns.run(graph)
    assert _ops(graph) == {"Gelu": 1}
    _same_numbers(m, {"x": RNG.standard_normal((3, 8)).astype(np.float32) * 3})


@pytest.mark.parametrize("affine", [True, False])
def test_decomposed_layernorm_fuses(affine: bool) -> None:
    from onnxpy.optimizer.passes import fuse_patterns

    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n" if affine else "y"]),
    ]
    consts = {"two": np.array(2, np.float32), "eps": np.array(1e-5, np.float32)}
    if affine:
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["g"]), helper.make_node("Add", ["g", "beta"], ["y"])]
        consts |= {
            "gamma": RNG.standard_normal(16).astype(np.float32),
            "beta": RNG.standard_normal(16).astype(np.float32),
        }
    m = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [2, 5, 16])],
        [vinfo("y", TensorProto.FLOAT, [2, 5, 16])],
        initializers=consts,
        opset=13,
    )
    graph = build_graph(m)
    assert fuse_patterns.run(graph)
    assert _ops(graph) == {"LayerNormalization": 1}
    _same_numbers(m, {"x": RNG.standard_normal((2, 5, 16)).astype(np.float32)})


def test_transpose_pairs_merge_or_vanish() -> None:
    from onnxpy.optimizer.passes import fuse_patterns

    nodes = [
        helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1, 3]),  # cancels
        helper.make_node("Transpose", ["t2"], ["t3"], perm=[3, 0, 1, 2]),
        helper.make_node("Transpose", ["t3"], ["y"], perm=[1, 2, 3, 0]),  # cancels again
        helper.make_node("Transpose", ["x"], ["u1"], perm=[1, 0, 2, 3]),
        helper.make_node("Transpose", ["u1"], ["z"], perm=[0, 1, 3, 2]),  # merges into one
    ]
    m = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [2, 3, 4, 5])],
        [vinfo("y", TensorProto.FLOAT, [2, 3, 4, 5]), vinfo("z", TensorProto.FLOAT, [3, 2, 5, 4])],
    )
    graph = build_graph(m)
    assert fuse_patterns.run(graph)
    assert _ops(graph) == {"Identity": 2, "Transpose": 1}
    assert eliminate.run(graph)  # the inner Identity goes; the one naming output y stays
    assert _ops(graph) == {"Identity": 1, "Transpose": 1}
    _same_numbers(m, {"x": RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)})


def _bn_relu_conv_model(scale_sign: float, kernel: int, pads: int, readers: int = 1, residual: bool = False):
    """x -> BatchNorm -> Relu -> Conv (kernel x kernel) [-> + x2 -> Relu], as DenseNet writes it."""
    c, m = 4, 6
    bn, inits = _bn_nodes("x", "n", "bn", c)
    inits["bn_s"] = inits["bn_s"] * np.float32(scale_sign)
    inits["cw"] = RNG.standard_normal((m, c, kernel, kernel)).astype(np.float32)
    inits["cb"] = RNG.standard_normal(m).astype(np.float32)
    nodes = [*bn, helper.make_node("Relu", ["n"], ["r"])]
    nodes.append(helper.make_node("Conv", ["r", "cw", "cb"], ["y0"], pads=[pads] * 4))
    outs = ["y0"]
    if residual:
        nodes += [helper.make_node("Add", ["y0", "x2"], ["s"]), helper.make_node("Relu", ["s"], ["y1"])]
        outs = ["y1"]
    if readers > 1:
        nodes.append(helper.make_node("Neg", ["r"], ["other"]))
        outs.append("other")
    inputs = [vinfo("x", TensorProto.FLOAT, [1, c, 5, 5])]
    if residual:
        inputs.append(vinfo("x2", TensorProto.FLOAT, [1, m, 5, 5]))
    return make_model(nodes, inputs, [vinfo(o) for o in outs], initializers=inits)


def _bn_relu_feeds(residual: bool = False, extreme: bool = True) -> dict[str, np.ndarray]:
    x = (RNG.standard_normal((1, 4, 5, 5)) * 3).astype(np.float32)
    if extreme:
        x[0, 0, 0, :2] = [-1e30, -np.inf]  # ReLU gives 0 there; max(x, f) gives the floor: same product
    feeds = {"x": x}
    if residual:
        feeds["x2"] = RNG.standard_normal((1, 6, 5, 5)).astype(np.float32)
    return feeds


def test_relu_after_affine_folds_into_a_pointwise_conv_leaving_one_max() -> None:
    for residual in (False, True):
        m = _bn_relu_conv_model(1.0, kernel=1, pads=0, residual=residual)
        sess = _same_numbers(m, _bn_relu_feeds(residual), rtol=1e-5)
        ops = _ops(sess._compiled.graph)
        assert ops.get("ChannelMax") == 1 and "ChannelAffine" not in ops, ops


@pytest.mark.parametrize(
    "sign,kernel,pads,readers",
    [(-1.0, 1, 0, 1), (1.0, 3, 1, 1), (1.0, 1, 0, 2)],
    ids=["negative-scale", "3x3-padded", "two-readers"],
)
def test_relu_floor_fold_declines_where_the_identity_does_not_hold(
    sign: float, kernel: int, pads: int, readers: int
) -> None:
    m = _bn_relu_conv_model(sign, kernel=kernel, pads=pads, readers=readers)
    sess = _same_numbers(m, _bn_relu_feeds(extreme=False), rtol=1e-5)
    assert "ChannelMax" not in _ops(sess._compiled.graph)


@pytest.mark.parametrize("order", ["div_last_half", "mul_half_first", "half_then_x"])
def test_gelu_pattern_with_half_precision_constants_fuses_with_its_scale(order: str) -> None:
    # a float16 export rounds sqrt(2) to 1.4140625: x * Phi(x * sqrt(2) / 1.4140625) is what the
    # graph computes, fused as gelu(x * s) / s with that scale
    from onnxpy.optimizer.passes import fuse_patterns

    m = _gelu_model(order, float(np.float16(np.sqrt(2))), float(np.float16(1 / np.sqrt(2))))
    graph = build_graph(m)
    assert fuse_patterns.run(graph)
    (gelu,) = graph.nodes
    assert gelu.op_type == "Gelu" and gelu.attrs["scale"] != 1.0 and abs(gelu.attrs["scale"] - 1) < 1e-3
    x = {"x": RNG.standard_normal((3, 8)).astype(np.float32) * 3}
    _same_numbers(m, x)
    # and the same as onnxruntime, which runs the unfused nodes
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]
    np.testing.assert_allclose(onnxpy.InferenceSession(m).run(None, x)[0], want, rtol=1e-5, atol=1e-6)


def test_gelu_like_pattern_far_from_sqrt2_stays_apart() -> None:
    from onnxpy.optimizer.passes import fuse_patterns

    graph = build_graph(_gelu_model("div_last_half", 3.0))
    fuse_patterns.run(graph)
    assert "Gelu" not in _ops(graph) and _ops(graph)["Erf"] == 1
