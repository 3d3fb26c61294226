"""torch CPU tensors bound by data_ptr for input and output: no copy in, no copy out.

Runs onnxpy's demo model (a small CNN: input "input" [batch, 3, 32, 32] -> "probabilities"
[batch, 10]). The runtime reads the input tensor's memory in place and writes the result into
the output tensor; the caller keeps both tensors alive while they are bound.
"""

from pathlib import Path

import numpy as np
import torch

import onnxpy as ort

model_path = Path(ort.__file__).parent / "data" / "demo.onnx"
sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])

torch.manual_seed(0)
x = torch.randn(4, 3, 32, 32, dtype=torch.float32)  # contiguous CPU tensor
y = torch.empty(4, 10, dtype=torch.float32)

io_binding = sess.io_binding()
io_binding.bind_input("input", "cpu", 0, np.float32, tuple(x.shape), x.data_ptr())
io_binding.bind_output("probabilities", "cpu", 0, np.float32, tuple(y.shape), y.data_ptr())

sess.run_with_iobinding(io_binding)
first = y.clone()
assert io_binding.get_outputs()[0].data_ptr() == y.data_ptr()  # the result lives in y
np.testing.assert_allclose(first.numpy(), sess.run(None, {"input": x.numpy()})[0], rtol=1e-5, atol=1e-6)

# Change the input tensor in place: the next run reads the new values from the same memory.
x.mul_(-0.5)
sess.run_with_iobinding(io_binding)
np.testing.assert_allclose(y.numpy(), sess.run(None, {"input": x.numpy()})[0], rtol=1e-5, atol=1e-6)

# The bound output is also reachable from torch through DLPack, still without a copy.
view = torch.from_dlpack(io_binding.get_outputs()[0])
assert view.data_ptr() == y.data_ptr()
print("probabilities written into the torch tensor in place:", tuple(y.shape))
