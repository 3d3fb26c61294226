"""fuse_flat_gemm: Reshape(x, [-1, K]) -> Gemm -> Reshape(x's leading sizes + [N]), as
transformers' Conv1D exports it (GPT-2), becomes FusedMatMul(x, W, bias) when the targets are
provably that flattening and its inverse; other Reshape pairs stay."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.passes import fuse_flat_gemm
from onnxpy.runtime.compile import build_graph
from tests.helpers import make_model, vinfo

RNG = np.random.default_rng(5)
K, N = 6, 5


def _dim(x: str, i: int, tag: str) -> list:
    """Unsqueeze(Gather(Shape(x), i)): x.size(i) as a one-entry vector."""
    return [
        helper.make_node("Shape", [x], [f"{tag}_shape"]),
        helper.make_node("Gather", [f"{tag}_shape", f"idx{i}"], [f"{tag}_d"], axis=0),
        helper.make_node("Unsqueeze", [f"{tag}_d", "axis0"], [tag]),
    ]


def _conv1d_model(
    back: str = "gathers", trans_b: int = 0, alpha: float = 1.0, beta: float = 1.0, bias_shape: tuple = (N,)
) -> tuple:
    """x (b, s, K) -> Reshape [-1, K] -> Gemm -> Reshape back; ``back`` says how the second
    target is computed: "gathers" (Conv1D's x.size(0), x.size(1), N), "slice" (Shape[:-1] + N),
    "swapped" (x.size(1), x.size(0), N: not x's leading sizes)."""
    w = RNG.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    c = RNG.standard_normal(bias_shape).astype(np.float32)
    nodes = [
        *_dim("x", 2, "k"),
        helper.make_node("Concat", ["minus1", "k"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w", "c"], ["g"], transB=trans_b, alpha=alpha, beta=beta),
    ]
    if back == "slice":
        nodes += [
            helper.make_node("Shape", ["x"], ["xs"]),
            helper.make_node("Slice", ["xs", "zero", "minus1"], ["lead"]),
            helper.make_node("Concat", ["lead", "n"], ["back_shape"], axis=0),
        ]
    else:
        first, second = (0, 1) if back == "gathers" else (1, 0)
        nodes += [*_dim("x", first, "d0"), *_dim("x", second, "d1")]
        nodes.append(helper.make_node("Concat", ["d0", "d1", "n"], ["back_shape"], axis=0))
    nodes.append(helper.make_node("Reshape", ["g", "back_shape"], ["y"]))
    inits = {
        "w": w,
        "c": c,
        "minus1": np.array([-1], np.int64),
        "zero": np.array([0], np.int64),
        "n": np.array([N], np.int64),
        "axis0": np.array([0], np.int64),
        **{f"idx{i}": np.array(i, np.int64) for i in range(3)},
    }
    used = {i for n in nodes for i in n.input}
    model = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, ["b", "s", K])],
        [vinfo("y", TensorProto.FLOAT, None)],
        initializers={k: v for k, v in inits.items() if k in used},
    )
    return model, w, c


def _fused(model) -> list:
    graph = build_graph(model)
    fuse_flat_gemm.run(graph)
    return graph.nodes


def _check_against_onnxruntime(model, shape: tuple[int, ...]) -> np.ndarray:
    x = {"x": RNG.standard_normal(shape).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]
    got = onnxpy.InferenceSession(model).run(None, x)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return got


@pytest.mark.parametrize("back", ["gathers", "slice"])
def test_conv1d_projection_becomes_one_fused_matmul(back: str) -> None:
    model, w, c = _conv1d_model(back)
    (node,) = _fused(model)  # the shape arithmetic is pruned with the Reshapes
    assert node.op_type == "FusedMatMul" and node.inputs == ["x", "w", "c"] and node.outputs == ["y"]
    for shape in [(2, 3, K), (1, 1, K), (3, 7, K)]:
        _check_against_onnxruntime(model, shape)


@pytest.mark.parametrize(
    ("trans_b", "alpha", "beta", "bias_shape"),
    [(1, 1.0, 1.0, (N,)), (0, 0.5, 2.0, (1, N)), (1, -1.5, 0.25, ()), (0, 1.0, 0.0, (N,))],
)
def test_gemm_attributes_fold_into_the_weights_and_bias(trans_b: int, alpha: float, beta: float, bias_shape) -> None:
    model, w, c = _conv1d_model(trans_b=trans_b, alpha=alpha, beta=beta, bias_shape=bias_shape)
    (node,) = _fused(model)
    assert node.op_type == "FusedMatMul" and node.inputs[0] == "x"
    assert len(node.inputs) == (2 if beta == 0.0 else 3)
    x = RNG.standard_normal((2, 4, K)).astype(np.float32)
    y = onnxpy.InferenceSession(model).run(None, {"x": x})[0]
    want = alpha * (x @ (w.T if trans_b else w)) + beta * np.broadcast_to(c.reshape(-1), (N,))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    _check_against_onnxruntime(model, (2, 4, K))


def test_targets_that_are_not_the_flattening_stay() -> None:
    # x.size(1), x.size(0): a transposed view of the rows, not x's leading sizes
    model, _, _ = _conv1d_model("swapped")
    assert [n.op_type for n in _fused(model)].count("Reshape") == 2
    got = _check_against_onnxruntime(model, (2, 3, K))
    assert got.shape == (3, 2, N)
    # allowzero on a Reshape, and a flat value read by something else too
    for edit in ("allowzero", "second_reader"):
        model, _, _ = _conv1d_model()
        if edit == "allowzero":
            reshape = next(n for n in model.graph.node if n.op_type == "Reshape")
            reshape.attribute.append(helper.make_attribute("allowzero", 1))
            model.opset_import[0].version = 17
        else:
            model.graph.output.append(vinfo("flat", TensorProto.FLOAT, None))
        assert "Gemm" in [n.op_type for n in _fused(model)]
        x = {"x": RNG.standard_normal((2, 3, K)).astype(np.float32)}
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)
        for g, wv in zip(onnxpy.InferenceSession(model).run(None, x), want):
            np.testing.assert_allclose(g, wv, rtol=1e-5, atol=1e-5)


def test_constant_targets_of_a_static_input() -> None:
    w = RNG.standard_normal((K, N)).astype(np.float32)
    nodes = [
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w"], ["g"]),
        helper.make_node("Reshape", ["g", "back_shape"], ["y"]),
    ]

    def model(back: list[int]):
        return make_model(
            nodes,
            [vinfo("x", TensorProto.FLOAT, [2, 3, K])],
            [vinfo("y", TensorProto.FLOAT, None)],
            initializers={"w": w, "flat_shape": np.array([-1, K], np.int64), "back_shape": np.array(back, np.int64)},
        )

    assert [n.op_type for n in _fused(model([2, 3, N]))] == ["FusedMatMul"]
    _check_against_onnxruntime(model([2, 3, N]), (2, 3, K))
    # [3, 2, N] has the right size but not x's leading sizes: it stays, and reshapes as asked
    assert "Gemm" in [n.op_type for n in _fused(model([3, 2, N]))]
    assert _check_against_onnxruntime(model([3, 2, N]), (2, 3, K)).shape == (3, 2, N)
