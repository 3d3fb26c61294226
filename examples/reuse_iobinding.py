"""Founding document, "Reusing IOBinding for multiple runs" — run on the CPU.

Adapted only for the device ("cuda" -> "cpu"). ``generate_input`` and ``process_output`` are the
document's placeholders, defined here: deterministic inputs, outputs collected in ``results``.
"""

import numpy as np
from _setup import prepare

import onnxpy as ort

prepare()
results = []


def generate_input(i):
    return np.random.default_rng(i).standard_normal((1, 3, 224, 224), dtype=np.float32)


def process_output(value):
    results.append(value.numpy().copy())


sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
io_binding = sess.io_binding()

# Bind output once
io_binding.bind_output("output", "cpu")

# Run multiple times with different inputs
for i in range(100):
    # Create new input
    input_data = generate_input(i)
    ortvalue_input = ort.OrtValue.ortvalue_from_numpy(input_data, "cpu", 0)

    # Update input binding
    io_binding.clear_binding_inputs()
    io_binding.bind_ortvalue_input("input", ortvalue_input)

    # Run inference
    sess.run_with_iobinding(io_binding)

    # Process outputs
    outputs = io_binding.get_outputs()
    process_output(outputs[0])

for i in (0, 50, 99):
    np.testing.assert_allclose(results[i], sess.run(None, {"input": generate_input(i)})[0], rtol=1e-6)
print(f"{len(results)} runs; spot checks match session.run")
