"""ai.onnx.ml kernels; importing this package registers them."""

from . import linear, preprocess, tree  # noqa: F401 - importing registers the kernels
