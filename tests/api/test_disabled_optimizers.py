"""InferenceSession(..., disabled_optimizers=[...]) with onnxpy's pass names turns those passes
off, as onnxruntime's argument does for its optimizers; names onnxpy has no pass for warn."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.manager import pass_names
from tests.helpers import make_model, vinfo

F = TensorProto.FLOAT


@pytest.fixture
def model() -> onnx.ModelProto:
    """A convolution with its ReLU, then a strided max pool: fuse_activation makes the first two
    one FusedConv, relu_after_pool moves the ReLU past the pool (a FusedMaxPool)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
    ]
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    return make_model(nodes, [vinfo("x", F, [1, 3, 9, 9])], [vinfo("p", F, None)], initializers=inits)


def _ops(model: onnx.ModelProto, tmp_path: Path, **kwargs: object) -> tuple[dict[str, int], np.ndarray]:
    so = onnxpy.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    sess = onnxpy.InferenceSession(model.SerializeToString(), so, **kwargs)
    x = np.random.default_rng(1).standard_normal((1, 3, 9, 9)).astype(np.float32)
    saved = onnx.load(so.optimized_model_filepath)
    return dict(collections.Counter(n.op_type for n in saved.graph.node)), sess.run(None, {"x": x})[0]


def test_a_disabled_pass_does_not_run(model: onnx.ModelProto, tmp_path: Path) -> None:
    all_ops, all_y = _ops(model, tmp_path)
    assert all_ops == {"FusedConv": 1, "FusedMaxPool": 1}
    ops, y = _ops(model, tmp_path, disabled_optimizers=["relu_after_pool"])
    assert ops == {"FusedConv": 1, "MaxPool": 1}  # the ReLU stayed in the convolution
    np.testing.assert_array_equal(y, all_y)
    ops, y = _ops(model, tmp_path, disabled_optimizers="fuse_activation")  # a name alone, too
    assert ops == {"Conv": 1, "Relu": 1, "MaxPool": 1}
    np.testing.assert_allclose(y, all_y, rtol=1e-6, atol=1e-6)


def test_every_pass_disabled_leaves_the_graph_as_loaded(model: onnx.ModelProto, tmp_path: Path) -> None:
    ops, _ = _ops(model, tmp_path, disabled_optimizers=pass_names())
    assert ops == {"Conv": 1, "Relu": 1, "MaxPool": 1}


def test_names_onnxpy_lacks_warn_and_the_rest_apply(model: onnx.ModelProto, tmp_path: Path) -> None:
    with pytest.warns(RuntimeWarning, match="ConvActivationFusion is not among onnxpy's optimizer passes") as seen:
        ops, _ = _ops(model, tmp_path, disabled_optimizers=["ConvActivationFusion", "relu_after_pool"])
    assert "relu_after_pool" in str(seen[0].message)  # the warning lists the names that work
    assert "relu_after_pool is" not in str(seen[0].message)
    assert ops == {"FusedConv": 1, "MaxPool": 1}


@pytest.mark.parametrize("bad", [3, ["relu_after_pool", 3]])
def test_names_must_be_strings(model: onnx.ModelProto, bad: object) -> None:
    with pytest.raises(onnxpy.InvalidArgumentType, match="disabled_optimizers"):
        onnxpy.InferenceSession(model.SerializeToString(), disabled_optimizers=bad)


def test_pass_names_are_unique_and_named_after_their_modules() -> None:
    names = pass_names()
    assert len(names) == len(set(names)) and "relu_after_pool" in names and "constant_folding" in names
