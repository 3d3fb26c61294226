"""ai.onnx.ml kernels; importing this package registers them."""
