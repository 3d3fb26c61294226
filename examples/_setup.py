"""Models for the examples, written where the founding document's code expects them.

The founding document's examples open "model.onnx" (input "input" [batch, 3, 224, 224] ->
output "output" [batch, 1000]) and "multi_input_model.onnx" (inputs "input1", "input2" ->
outputs "output1", "output2"). ``prepare()`` writes both into a fresh temporary folder and makes
it the working directory, so the document's lines run unchanged.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper, save

F = TensorProto.FLOAT


def classifier_model() -> ModelProto:
    """A tiny image classifier: GlobalAveragePool -> Flatten -> Gemm (3 -> 1000) -> Softmax."""
    rng = np.random.default_rng(1234)
    weight = rng.standard_normal((3, 1000)).astype(np.float32)
    bias = rng.standard_normal(1000).astype(np.float32)
    nodes = [
        helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["features"]),
        helper.make_node("Gemm", ["features", "weight", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["output"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("input", F, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("output", F, ["batch", 1000])],
        initializer=[numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(bias, "bias")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxpy-examples")


def multi_io_model() -> ModelProto:
    """output1 = input1 + input2, output2 = input1 @ input2^T (float32, [n, 4] inputs)."""
    nodes = [
        helper.make_node("Add", ["input1", "input2"], ["output1"]),
        helper.make_node("Transpose", ["input2"], ["input2_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["input1", "input2_t"], ["output2"]),
    ]
    graph = helper.make_graph(
        nodes,
        "multi_io",
        [helper.make_tensor_value_info("input1", F, ["n", 4]), helper.make_tensor_value_info("input2", F, ["n", 4])],
        [
            helper.make_tensor_value_info("output1", F, ["n", 4]),
            helper.make_tensor_value_info("output2", F, ["n", "n"]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxpy-examples")


def prepare() -> str:
    """Write model.onnx and multi_input_model.onnx into a new temporary folder and cd there."""
    folder = tempfile.mkdtemp(prefix="onnxpy-examples-")
    atexit.register(shutil.rmtree, folder, True)
    save(classifier_model(), os.path.join(folder, "model.onnx"))
    save(multi_io_model(), os.path.join(folder, "multi_input_model.onnx"))
    os.chdir(folder)
    return folder
