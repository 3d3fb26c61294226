"""Founding document, "CPU binding" — as written (it already targets the CPU)."""

import numpy as np
from _setup import prepare

import onnxpy as ort

prepare()

sess = ort.InferenceSession("model.onnx")
io_binding = sess.io_binding()

# Bind CPU input directly
input_array = np.random.randn(1, 3, 224, 224).astype(np.float32)
io_binding.bind_cpu_input("input", input_array)

# Bind output to CPU
io_binding.bind_output("output", "cpu")

sess.run_with_iobinding(io_binding)
outputs = io_binding.copy_outputs_to_cpu()

np.testing.assert_allclose(outputs[0], sess.run(None, {"input": input_array})[0], rtol=1e-6)
print("matches session.run:", outputs[0].shape)
