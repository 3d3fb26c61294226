"""Founding document, "Basic CUDA inference" — run on the CPU.

Adapted only for the device: "cuda" -> "cpu", CUDAExecutionProvider -> CPUExecutionProvider,
and onnxpy imported as ort. ``prepare()`` writes model.onnx and makes its folder the cwd.
"""

import numpy as np
from _setup import prepare

import onnxpy as ort

prepare()

sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])

# Create IOBinding
io_binding = sess.io_binding()

# Create input on the device
input_data = np.random.randn(1, 3, 224, 224).astype(np.float32)
ortvalue_input = ort.OrtValue.ortvalue_from_numpy(input_data, "cpu", 0)

# Bind input and output
io_binding.bind_ortvalue_input("input", ortvalue_input)
io_binding.bind_output("output", "cpu")

# Run inference on the device
sess.run_with_iobinding(io_binding)

# Get outputs (still on the device)
outputs = io_binding.get_outputs()
print(f"Output device: {outputs[0].device_name()}")

# Copy to CPU if needed
output_cpu = io_binding.copy_outputs_to_cpu()

np.testing.assert_allclose(output_cpu[0], sess.run(None, {"input": input_data})[0], rtol=1e-6)
print("matches session.run:", output_cpu[0].shape)
