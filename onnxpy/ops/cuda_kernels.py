"""Kernels for CUDAExecutionProvider where CuPy allows a faster path than the generic code.

They are registered with ``provider="CUDAExecutionProvider"`` at the same ``since`` as the generic
kernel, so the CUDA provider picks them and every other provider keeps the generic one.

- Activations and erf: one ``ElementwiseKernel`` pass each (the generic code chains several
  CuPy calls, i.e. several kernel launches and temporaries; erf has no CuPy routine at all and
  the generic one is a 30-step polynomial). Bodies are CUDA C++ over the element type ``T``;
  arithmetic runs in ``W`` (float for float16/float32, double for float64). Inputs of other
  element types use the generic kernel.
- Conv (2-D / 3-D, float16/32/64): cuDNN through ``cupyx.cudnn.convolution_forward`` when CuPy
  has cuDNN (CuPy 13 with the cuDNN library installed); otherwise the generic im2col over a
  strided view followed by one batched cuBLAS GEMM per group, which runs unchanged on CuPy.
  Pooling runs the generic strided-window code, which is already one CuPy reduction per call.

Nothing here imports CuPy: the namespace arrives as ``xp``; cuDNN is looked up lazily only when
``xp`` is CuPy.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from . import conv as generic_conv
from . import elementwise as generic
from ._spatial import geometry
from .registry import op

PROVIDER = "CUDAExecutionProvider"

#: element types the elementwise bodies are written for
FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

PREAMBLE = r"""
template <typename T> struct onnxpy_work { typedef float type; };
template <> struct onnxpy_work<double> { typedef double type; };
"""

#: name -> (scalar parameters, CUDA C++ body computing ``y`` from ``x``)
BODIES: dict[str, tuple[tuple[str, ...], str]] = {
    "sigmoid": ((), "W v = x; W e = exp(-fabs(v)); y = (T)(v >= W(0) ? W(1) / (W(1) + e) : e / (W(1) + e));"),
    "erf": ((), "W v = x; y = (T)erf(v);"),
    "gelu": ((), "W v = x; y = (T)(W(0.5) * v * (W(1) + erf(v * W(0.70710678118654752440))));"),
    "gelu_tanh": (
        (),
        # 0.5 * (1 + tanh(u)) as 1 / (1 + exp(-2u)): no cancellation for negative x (elementwise.gelu)
        "W v = x; W u2 = W(1.59576912160573071176) * (v + W(0.044715) * v * v * v); y = (T)(v / (W(1) + exp(-u2)));",
    ),
    "softplus": ((), "W v = x; y = (T)(fmax(v, W(0)) + log1p(exp(-fabs(v))));"),
    "softsign": ((), "W v = x; y = (T)(v / (W(1) + fabs(v)));"),
    "mish": ((), "W v = x; W sp = fmax(v, W(0)) + log1p(exp(-fabs(v))); y = (T)(v * tanh(sp));"),
    "elu": (("alpha",), "W v = x; y = (T)(v > W(0) ? v : W(alpha) * expm1(v));"),
    "selu": (("alpha", "gamma"), "W v = x; y = (T)(W(gamma) * (v > W(0) ? v : W(alpha) * expm1(v)));"),
    "celu": (("alpha",), "W v = x; W a = W(alpha); y = (T)(fmax(v, W(0)) + fmin(W(0), a * expm1(v / a)));"),
    "leaky_relu": (("alpha",), "W v = x; y = (T)(v >= W(0) ? v : v * W(alpha));"),
    "hard_sigmoid": (("alpha", "beta"), "W v = x; y = (T)fmin(W(1), fmax(W(0), W(alpha) * v + W(beta)));"),
    "hard_swish": ((), "W v = x; y = (T)(v * fmin(W(1), fmax(W(0), v * W(1.0 / 6.0) + W(0.5))));"),
    "thresholded_relu": (("alpha",), "W v = x; y = (T)(v > W(alpha) ? v : W(0));"),
}

_compiled: dict[tuple[int, str], Any] = {}


def kernel_source(name: str) -> tuple[str, str, str]:
    """(in_params, out_params, operation) of a body as ElementwiseKernel takes them."""
    params, body = BODIES[name]
    in_params = "T x" + "".join(f", float64 {p}" for p in params)
    return in_params, "T y", "typedef typename onnxpy_work<T>::type W; " + body


def elementwise(xp: Any, name: str, x: Any, **scalars: float) -> Any:
    """Run a body over ``x`` in one pass; None when ``xp`` or the dtype has no such path."""
    make = getattr(xp, "ElementwiseKernel", None)
    if make is None or x.dtype not in FLOATS:
        return None
    key = (id(xp), name)
    kernel = _compiled.get(key)
    if kernel is None:
        in_params, out_params, operation = kernel_source(name)
        kernel = make(in_params, out_params, operation, f"onnxpy_{name}", preamble=PREAMBLE)
        _compiled[key] = kernel
    params = BODIES[name][0]
    return kernel(x, *(float(scalars[p]) for p in params))


def _or(result: Any, fallback: Any) -> Any:
    return fallback() if result is None else result


@op("Sigmoid", 6, provider=PROVIDER)
def sigmoid(xp: Any, x: Any) -> Any:
    return _or(elementwise(xp, "sigmoid", x), lambda: generic.sigmoid(xp, x))


@op("Erf", 9, provider=PROVIDER)
def erf(xp: Any, x: Any) -> Any:
    return _or(elementwise(xp, "erf", x), lambda: generic.erf(xp, x))


@op("Gelu", 20, provider=PROVIDER)
def gelu(xp: Any, x: Any, *, approximate: str = "none") -> Any:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got '{approximate}'")
    name = "gelu_tanh" if approximate == "tanh" else "gelu"
    return _or(elementwise(xp, name, x), lambda: generic.gelu(xp, x, approximate=approximate))


@op("Softplus", 1, provider=PROVIDER)
def softplus(xp: Any, x: Any) -> Any:
    return _or(elementwise(xp, "softplus", x), lambda: generic.softplus(xp, x))


@op("Softsign", 1, provider=PROVIDER)
def softsign(xp: Any, x: Any) -> Any:
    return _or(elementwise(xp, "softsign", x), lambda: generic.softsign(xp, x))


@op("Mish", 18, provider=PROVIDER)
def mish(xp: Any, x: Any) -> Any:
    return _or(elementwise(xp, "mish", x), lambda: generic.mish(xp, x))


@op("Elu", 6, provider=PROVIDER)
def elu(xp: Any, x: Any, *, alpha: float = 1.0) -> Any:
    return _or(elementwise(xp, "elu", x, alpha=alpha), lambda: generic.elu(xp, x, alpha=alpha))


@op("Selu", 6, provider=PROVIDER)
def selu(xp: Any, x: Any, *, alpha: float = 1.67326319217681884765625, gamma: float = 1.05070102214813232421875) -> Any:
    return _or(
        elementwise(xp, "selu", x, alpha=alpha, gamma=gamma), lambda: generic.selu(xp, x, alpha=alpha, gamma=gamma)
    )


@op("Celu", 12, provider=PROVIDER)
def celu(xp: Any, x: Any, *, alpha: float = 1.0) -> Any:
    return _or(elementwise(xp, "celu", x, alpha=alpha), lambda: generic.celu(xp, x, alpha=alpha))


@op("LeakyRelu", 6, provider=PROVIDER)
def leaky_relu(xp: Any, x: Any, *, alpha: float = 0.01) -> Any:
    return _or(elementwise(xp, "leaky_relu", x, alpha=alpha), lambda: generic.leaky_relu(xp, x, alpha=alpha))


@op("HardSigmoid", 6, provider=PROVIDER)
def hard_sigmoid(xp: Any, x: Any, *, alpha: float = 0.2, beta: float = 0.5) -> Any:
    return _or(
        elementwise(xp, "hard_sigmoid", x, alpha=alpha, beta=beta),
        lambda: generic.hard_sigmoid(xp, x, alpha=alpha, beta=beta),
    )


@op("HardSwish", 14, provider=PROVIDER)
def hard_swish(xp: Any, x: Any) -> Any:
    return _or(elementwise(xp, "hard_swish", x), lambda: generic.hard_swish(xp, x))


@op("ThresholdedRelu", 10, provider=PROVIDER)
def thresholded_relu(xp: Any, x: Any, *, alpha: float = 1.0) -> Any:
    return _or(
        elementwise(xp, "thresholded_relu", x, alpha=alpha), lambda: generic.thresholded_relu(xp, x, alpha=alpha)
    )


# -- convolution ----------------------------------------------------------------------------------

_cudnn_cache: dict[int, Any] = {}


def cudnn_for(xp: Any) -> Any:
    """``cupyx.cudnn`` when ``xp`` is CuPy built with a loadable cuDNN, else None (CuPy 14 has none)."""
    key = id(xp)
    if key not in _cudnn_cache:
        found = None
        if getattr(xp, "__name__", "") == "cupy":
            try:
                lib = importlib.import_module("cupy.cuda.cudnn")
                if getattr(lib, "available", True):
                    found = importlib.import_module("cupyx.cudnn")
            except Exception:  # noqa: BLE001 - missing library or extension: use cuBLAS
                found = None
        _cudnn_cache[key] = found
    return _cudnn_cache[key]


def conv_cudnn(
    xp: Any,
    x: Any,
    w: Any,
    b: Any,
    *,
    auto_pad: str,
    dilations: list[int] | None,
    group: int,
    kernel_shape: list[int] | None,
    pads: list[int] | None,
    strides: list[int] | None,
) -> Any:
    """The convolution through cuDNN, or None where it does not apply."""
    cudnn = cudnn_for(xp)
    if cudnn is None or x.ndim not in (4, 5) or x.dtype not in FLOATS or w.dtype != x.dtype:
        return None
    if b is not None and b.dtype != x.dtype:
        return None
    nd = x.ndim - 2
    k = list(w.shape[2:])
    if kernel_shape is not None and list(kernel_shape) != k:
        return None  # the generic kernel raises the error
    c, m = x.shape[1], w.shape[0]
    if group <= 0 or c % group or m % group or w.shape[1] != c // group:
        return None
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    begin, end, out = geometry(x.shape[2:], k, strides, dilations, pads, auto_pad)
    if begin != end:  # cuDNN pads symmetrically: pad the input explicitly instead
        x = xp.pad(x, [(0, 0), (0, 0), *zip(begin, end)])
        begin = [0] * nd
    y = xp.empty((x.shape[0], m, *out), dtype=x.dtype)
    if y.size == 0:
        return y + (0 if b is None else b.reshape((1, m) + (1,) * nd))
    try:
        cudnn.convolution_forward(
            xp.ascontiguousarray(x),
            xp.ascontiguousarray(w),
            None if b is None else xp.ascontiguousarray(b),
            y,
            tuple(begin),
            tuple(strides),
            tuple(dilations),
            group,
            auto_tune=False,
            tensor_core="auto",
        )
    except Exception:  # noqa: BLE001 - a configuration cuDNN refuses: the cuBLAS path handles it
        return None
    return y


@op("Conv", 1, provider=PROVIDER)
def conv(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    y = conv_cudnn(xp, X, W, B, **attrs)
    if y is not None:
        return y
    return generic_conv.conv(xp, X, W, B, **attrs)
