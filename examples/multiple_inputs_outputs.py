"""Founding document, "Multiple inputs and outputs" — run on the CPU.

Adapted only for the device ("cuda" -> "cpu"). ``data1`` and ``data2`` are the document's
placeholders, defined here; multi_input_model.onnx computes output1 = input1 + input2 and
output2 = input1 @ input2.T.
"""

import numpy as np
from _setup import prepare

import onnxpy as ort

prepare()
rng = np.random.default_rng(7)
data1 = rng.standard_normal((3, 4), dtype=np.float32)
data2 = rng.standard_normal((3, 4), dtype=np.float32)

sess = ort.InferenceSession("multi_input_model.onnx", providers=["CPUExecutionProvider"])
io_binding = sess.io_binding()

# Bind multiple inputs
input1 = ort.OrtValue.ortvalue_from_numpy(data1, "cpu", 0)
input2 = ort.OrtValue.ortvalue_from_numpy(data2, "cpu", 0)
io_binding.bind_ortvalue_input("input1", input1)
io_binding.bind_ortvalue_input("input2", input2)

# Bind multiple outputs
io_binding.bind_output("output1", "cpu")
io_binding.bind_output("output2", "cpu")

sess.run_with_iobinding(io_binding)

outputs = io_binding.get_outputs()
output1, output2 = outputs[0], outputs[1]

expected = sess.run(None, {"input1": data1, "input2": data2})
np.testing.assert_allclose(output1.numpy(), expected[0], rtol=1e-6)
np.testing.assert_allclose(output2.numpy(), expected[1], rtol=1e-6)
print("output1", output1.shape(), "output2", output2.shape(), "match session.run")
