"""Build onnxpy/data/demo.onnx: a small image classifier (conv, batch norm, residual,
depthwise conv, pooling, dense, softmax) with fixed random weights.

Run from the repository root: python scripts/make_demo_model.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(2026)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def w(name: str, *shape: int, scale: float = 0.2) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def bn(prefix: str, x: str, c: int) -> str:
        inits.append(numpy_helper.from_array((1 + 0.1 * rng.standard_normal(c)).astype(np.float32), f"{prefix}.gamma"))
        inits.append(numpy_helper.from_array((0.1 * rng.standard_normal(c)).astype(np.float32), f"{prefix}.beta"))
        inits.append(numpy_helper.from_array((0.1 * rng.standard_normal(c)).astype(np.float32), f"{prefix}.mean"))
        inits.append(numpy_helper.from_array((1 + 0.1 * rng.random(c)).astype(np.float32), f"{prefix}.var"))
        nodes.append(
            helper.make_node(
                "BatchNormalization",
                [x, f"{prefix}.gamma", f"{prefix}.beta", f"{prefix}.mean", f"{prefix}.var"],
                [f"{prefix}.out"],
                name=prefix,
            )
        )
        return f"{prefix}.out"

    def conv(prefix: str, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
        pad = k // 2
        nodes.append(
            helper.make_node(
                "Conv",
                [x, w(f"{prefix}.weight", cout, cin // group, k, k), w(f"{prefix}.bias", cout, scale=0.05)],
                [f"{prefix}.out"],
                name=prefix,
                kernel_shape=[k, k],
                pads=[pad] * 4,
                strides=[stride, stride],
                group=group,
            )
        )
        return f"{prefix}.out"

    def relu(prefix: str, x: str) -> str:
        nodes.append(helper.make_node("Relu", [x], [f"{prefix}.relu"], name=f"{prefix}.relu"))
        return f"{prefix}.relu"

    x = relu("stem", bn("stem.bn", conv("stem.conv", "input", 3, 16, 3), 16))
    nodes.append(helper.make_node("MaxPool", [x], ["pool1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]))
    # A residual block: conv-bn-relu-conv-bn + identity.
    y = relu("block.a", bn("block.bn1", conv("block.conv1", "pool1", 16, 16, 3), 16))
    y = bn("block.bn2", conv("block.conv2", y, 16, 16, 3), 16)
    nodes.append(helper.make_node("Add", ["pool1", y], ["block.sum"], name="block.add"))
    x = relu("block", "block.sum")
    # Depthwise-separable downsampling.
    x = relu("dw", conv("dw.conv", x, 16, 16, 3, stride=2, group=16))
    x = relu("pw", conv("pw.conv", x, 16, 32, 1))
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["features"], name="flatten", axis=1))
    nodes.append(
        helper.make_node(
            "Gemm", ["features", w("fc.weight", 10, 32), w("fc.bias", 10, scale=0.05)], ["logits"], name="fc", transB=1
        )
    )
    nodes.append(helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1))

    graph = helper.make_graph(
        nodes,
        "onnxpy_demo_tinynet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits,
        doc_string="A small residual CNN classifying 32x32 RGB images into 10 classes (random weights).",
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxpy-demo")
    model.ir_version = 8
    model.doc_string = "onnxpy's embedded demo model"
    onnx.checker.check_model(model, full_check=True)
    return model


if __name__ == "__main__":
    out = Path(__file__).resolve().parent.parent / "onnxpy" / "data" / "demo.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(), out)
    print(f"wrote {out} ({out.stat().st_size} bytes)")
