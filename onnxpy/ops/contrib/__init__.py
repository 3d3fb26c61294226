"""onnxruntime's contrib operators (domain com.microsoft) that its own tools write into models:
the quantizer's QOperator kernels (``quant``) and the transformer optimizer's fused layers
(``transformer``). Their semantics are onnxruntime's ContribOperators documentation, checked
against onnxruntime's behaviour in the tests."""

DOMAIN = "com.microsoft"

from . import attention, fused, quant, transformer  # noqa: E402, F401 - importing registers the kernels
