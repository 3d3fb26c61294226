"""float16 variants of the shared models, for ``bench.py --half``.

Each model's float32 weights, attribute tensors, float inputs and outputs become float16, and
its Casts to float32 cast to float16 instead: the model as a float16 export writes it. Outside
issue 5's figures: onnxpy computes such graphs in float32 between their boundaries
(``optimizer/passes/half_in_float.py``), onnxruntime's CPU provider partly in float16 kernels,
so their outputs differ by float16 steps.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (changed in place and returned) with its float32 tensors and values in float16."""
    g = model.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for node in g.node:
        for a in node.attribute:
            if a.HasField("t") and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
    for vi in (*g.input, *g.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    del g.value_info[:]  # float32 types of intermediates no longer hold; inference redoes them
    return model


def half_models(shared: list[str], workdir: str) -> list[tuple[str, str]]:
    """(name, path) of the float16 variant of each model in ``shared``."""
    out = []
    for path in shared:
        name = f"{Path(path).stem}_fp16"
        dst = os.path.join(workdir, f"{name}.onnx")
        onnx.save(to_float16(onnx.load(path)), dst)
        out.append((name, dst))
    return out
