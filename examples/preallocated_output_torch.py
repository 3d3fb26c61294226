"""Founding document, "Pre-allocated output buffers" — a torch CPU tensor as the output buffer.

Adapted only for the device: "cuda" -> "cpu", device="cuda:0" -> device="cpu". The document uses
``input_data`` without defining it; it is defined here as in the basic example.
"""

import numpy as np
import torch
from _setup import prepare

import onnxpy as ort

prepare()
input_data = np.random.randn(1, 3, 224, 224).astype(np.float32)

sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
io_binding = sess.io_binding()

# Pre-allocate output buffer with PyTorch
output_shape = (1, 1000)
output_buffer = torch.zeros(output_shape, dtype=torch.float32, device="cpu")

# Bind to pre-allocated buffer
io_binding.bind_output(
    "output",
    device_type="cpu",
    device_id=0,
    element_type=np.float32,
    shape=output_shape,
    buffer_ptr=output_buffer.data_ptr(),
)

# Input binding
input_ortvalue = ort.OrtValue.ortvalue_from_numpy(input_data, "cpu", 0)
io_binding.bind_ortvalue_input("input", input_ortvalue)

# Run inference - output written directly to PyTorch tensor
sess.run_with_iobinding(io_binding)
print(f"Output in PyTorch tensor: {output_buffer}")

assert io_binding.get_outputs()[0].data_ptr() == output_buffer.data_ptr()
np.testing.assert_allclose(output_buffer.numpy(), sess.run(None, {"input": input_data})[0], rtol=1e-6)
print("written in place; matches session.run")
