"""onnxruntime's other name for its native module (onnxruntime.capi._pybind_state)."""

from .onnxruntime_pybind11_state import *  # noqa: F403
from .onnxruntime_pybind11_state import __all__  # noqa: F401
