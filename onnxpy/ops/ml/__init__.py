"""ai.onnx.ml kernels; importing this package registers them."""

from . import linear, preprocess  # noqa: F401 - importing registers the kernels
