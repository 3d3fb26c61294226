"""com.microsoft operators onnxruntime's own graph optimizer writes into the models it saves
(SessionOptions.optimized_model_filepath).

ORT_ENABLE_EXTENDED fuses Conv + activation into FusedConv (whose optional Z is a residual
addend) and Gemm + activation into FusedGemm; ORT_ENABLE_ALL also rewrites quantized (QDQ)
convolutions and max pools to channels-last QLinearConv / NhwcMaxPool; the dynamic quantizer
writes DynamicQuantizeLSTM. Semantics are the
ContribOperators documentation's, with what it leaves open (which activations each operator
accepts, their parameters, the residual's shape) taken from onnxruntime's behaviour and checked
in tests/ops/test_contrib_fused.py.

The com.microsoft.nchwc operators of ORT_ENABLE_ALL (ReorderInput, blocked Conv, MaxPool...) are
not implemented: their tensors are in a blocked layout whose block size depends on the CPU the
model was optimized on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import pool, rnn
from ..fused import apply_activation
from ..fused import fused_conv as _fused_conv
from ..nn import gemm
from ..quant import dynamic_quantize_linear
from ..quant import qlinear_conv as _qlinear_conv
from ..registry import op
from . import DOMAIN
from .quant import _int_matmul_to_float, _per_column, dynamic_quantize_matmul

_BYTE_TYPES = (np.dtype(np.uint8), np.dtype(np.int8))

# FusedConv's activations and how many activation_params each needs (onnxruntime refuses fewer;
# extra values are ignored).
_CONV_ACTIVATIONS = {"Relu": 0, "Tanh": 0, "Sigmoid": 0, "HardSwish": 0, "LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2}


def _checked_conv_activation(op_name: str, activation: str, params: list[float] | None) -> list[float]:
    if activation == "":
        return []
    if activation not in _CONV_ACTIVATIONS:
        raise ValueError(
            f"{op_name}: unsupported activation '{activation}' (expected one of {sorted(_CONV_ACTIVATIONS)})"
        )
    values = [float(v) for v in params or []]
    need = _CONV_ACTIVATIONS[activation]
    if len(values) < need:
        raise ValueError(
            f"{op_name}: activation '{activation}' needs {need} activation_params, got {len(values)} ({values})"
        )
    return values[:need]


def _conv_activated(
    xp: Any,
    op_name: str,
    X: Any,  # noqa: N803 - spec names
    W: Any,  # noqa: N803
    B: Any,  # noqa: N803
    Z: Any,  # noqa: N803
    conv_attrs: dict[str, Any],
    activation: str,
    activation_params: list[float] | None,
    ctx: Any,
    out: Any,
) -> Any:
    params = _checked_conv_activation(op_name, activation, activation_params)
    if Z is not None and not X.dtype == W.dtype == Z.dtype:
        raise ValueError(f"{op_name}: X, W and Z must share one element type, got {X.dtype}, {W.dtype}, {Z.dtype}")
    y = _fused_conv(xp, X, W, B, Z, **conv_attrs, activation=activation, activation_params=params, ctx=ctx, out=out)
    if Z is not None and tuple(y.shape) != tuple(Z.shape):
        # onnxruntime adds Z element by element: it must have the output's shape (no broadcasting).
        raise ValueError(f"{op_name}: Z has shape {list(Z.shape)}, expected the output's shape {list(y.shape)}")
    return y.astype(X.dtype, copy=False)  # conv_nd computes float16 in float32


@op("FusedConv", 1, domain=DOMAIN, may_inplace={3: 0}, out_checked=True)
def fused_conv(
    xp: Any,
    X: Any,  # noqa: N803 - spec names
    W: Any,  # noqa: N803
    B: Any = None,  # noqa: N803
    Z: Any = None,  # noqa: N803
    *,
    activation: str = "",
    activation_params: list[float] | None = None,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
    out: Any = None,
) -> Any:
    """activation(Conv(X, W, B) + Z): Conv, then the residual Z (of the output's shape), then the
    activation. ``out`` is Z's buffer when the executor hands it over (Z dies here)."""
    conv_attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    return _conv_activated(xp, "FusedConv", X, W, B, Z, conv_attrs, activation, activation_params, ctx, out)


@op("NhwcFusedConv", 1, domain=DOMAIN)
def nhwc_fused_conv(
    xp: Any,
    X: Any,  # noqa: N803 - spec names
    W: Any,  # noqa: N803
    B: Any = None,  # noqa: N803
    Z: Any = None,  # noqa: N803
    *,
    activation: str = "",
    activation_params: list[float] | None = None,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    """FusedConv on channels-last X, Z and Y ([N, spatial..., C]); W keeps Conv's [M, C/group, k...]."""
    if X.ndim < 3:
        raise ValueError(f"NhwcFusedConv: X must be channels-last of rank >= 3, got shape {list(X.shape)}")
    conv_attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    z = None if Z is None else xp.moveaxis(Z, -1, 1)
    y = _conv_activated(
        xp, "NhwcFusedConv", xp.moveaxis(X, -1, 1), W, B, z, conv_attrs, activation, activation_params, ctx, None
    )
    return xp.moveaxis(y, 1, -1)


# FusedGemm's activations: the attributes each reads, all required (onnxruntime has no defaults).
_GEMM_ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "Relu": (),
    "Tanh": (),
    "Sigmoid": (),
    "Softsign": (),
    "Softplus": (),
    "LeakyRelu": ("activation_alpha",),
    "Elu": ("activation_alpha",),
    "ThresholdedRelu": ("activation_alpha",),
    "HardSigmoid": ("activation_alpha", "activation_beta"),
    "ScaledTanh": ("activation_alpha", "activation_beta"),
    "ParametricSoftplus": ("activation_alpha", "activation_beta"),
    "Selu": ("activation_alpha", "activation_gamma"),
}


def _gemm_activation(xp: Any, y: Any, name: str, alpha: float, beta: float, gamma: float) -> Any:
    t = y.dtype.type
    if name in ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid"):
        return apply_activation(xp, y, name, [alpha, beta])
    if name == "Softsign":
        return y / (1 + xp.abs(y))
    if name == "Softplus":
        return xp.logaddexp(y, t(0))
    if name == "Elu":
        return xp.where(y > 0, y, t(alpha) * xp.expm1(xp.minimum(y, t(0))))
    if name == "ThresholdedRelu":
        return xp.where(y > t(alpha), y, t(0))
    if name == "ScaledTanh":
        return t(alpha) * xp.tanh(t(beta) * y)
    if name == "ParametricSoftplus":
        return t(alpha) * xp.logaddexp(t(beta) * y, t(0))
    # Selu
    return t(gamma) * xp.where(y > 0, y, t(alpha) * xp.expm1(xp.minimum(y, t(0))))


@op("FusedGemm", 1, domain=DOMAIN)
def fused_gemm(
    xp: Any,
    A: Any,  # noqa: N803 - spec names
    B: Any,  # noqa: N803
    C: Any = None,  # noqa: N803
    *,
    activation: str,
    activation_alpha: float | None = None,
    activation_beta: float | None = None,
    activation_gamma: float | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,  # noqa: N803
    transB: int = 0,  # noqa: N803
) -> Any:
    """activation(alpha * A' @ B' + beta * C): Gemm, then one of onnxruntime's fused activations
    with its parameters in activation_alpha / _beta / _gamma."""
    if activation not in _GEMM_ACTIVATIONS:
        raise ValueError(
            f"FusedGemm: unsupported activation '{activation}' (expected one of {sorted(_GEMM_ACTIVATIONS)})"
        )
    given = {
        "activation_alpha": activation_alpha,
        "activation_beta": activation_beta,
        "activation_gamma": activation_gamma,
    }
    missing = [name for name in _GEMM_ACTIVATIONS[activation] if given[name] is None]
    if missing:
        raise ValueError(f"FusedGemm: activation '{activation}' needs attribute(s) {missing}")
    y = gemm(xp, A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB)
    if y.dtype.kind != "f":
        raise ValueError(f"FusedGemm: activation '{activation}' needs floating-point inputs, got {A.dtype}")
    params = [0.0 if v is None else float(v) for v in given.values()]
    return _gemm_activation(xp, y, activation, *params).astype(A.dtype, copy=False)


# -- channels-last quantized operators (NhwcTransformer, ORT_ENABLE_ALL) --------------------------


@op("NhwcMaxPool", 1, domain=DOMAIN)
def nhwc_max_pool(
    xp: Any,
    x: Any,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    """MaxPool of a channels-last 8-bit tensor [N, spatial..., C]. The maximum of integers needs
    no dequantization: the output keeps the input's scale and zero point."""
    if x.dtype not in _BYTE_TYPES:
        raise TypeError(f"NhwcMaxPool: x must be uint8 or int8, got {x.dtype}")
    if x.ndim < 3:
        raise ValueError(f"NhwcMaxPool: x must be channels-last of rank >= 3, got shape {list(x.shape)}")
    if len(kernel_shape) != x.ndim - 2:
        raise ValueError(
            f"NhwcMaxPool: kernel_shape {list(kernel_shape)} must have one entry per spatial axis of x "
            f"{list(x.shape)} ({x.ndim - 2})"
        )
    y = pool._max_pool(
        xp, xp.moveaxis(x, -1, 1), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, 0, False, ctx=ctx
    )
    return xp.moveaxis(y, 1, -1)


@op("QLinearConv", 1, domain=DOMAIN)
def qlinear_conv(
    xp: Any,
    x: Any,
    x_scale: Any,
    x_zero_point: Any,
    w: Any,
    w_scale: Any,
    w_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
    B: Any = None,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    channels_last: int = 0,
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    """ONNX QLinearConv; with channels_last x and y are [N, spatial..., C] (w keeps Conv's layout)."""
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    if not channels_last:
        return _qlinear_conv(xp, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B, **attrs)
    if x.ndim < 3:
        raise ValueError(f"QLinearConv (channels_last): x must be of rank >= 3, got shape {list(x.shape)}")
    y = _qlinear_conv(
        xp, xp.moveaxis(x, -1, 1), x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B, **attrs
    )
    return xp.moveaxis(y, 1, -1)


# -- DynamicQuantizeLSTM ---------------------------------------------------------------------------


def _checked_weight(q: Any, scale: Any, zero_point: Any, what: str, rows: int | None) -> None:
    """W [num_directions, input_size, 4*hidden] / R [num_directions, hidden, 4*hidden] and their
    per-direction ([num_directions]) or per-column ([num_directions, 4*hidden]) parameters."""
    if q.ndim != 3 or q.dtype not in _BYTE_TYPES or q.shape[2] % 4 or (rows is not None and q.shape[1] != rows):
        expect = f"[num_directions, {'K' if rows is None else rows}, 4*hidden_size]"
        raise ValueError(
            f"DynamicQuantizeLSTM: {what} must be a uint8 / int8 tensor {expect}, got {q.dtype} {list(q.shape)}"
        )
    dirs, _, cols = q.shape
    for name, p in ((f"{what}_scale", scale), (f"{what}_zero_point", zero_point)):
        if p is None:
            raise ValueError(f"DynamicQuantizeLSTM: input {name} is required")
        if tuple(p.shape) not in ((dirs,), (dirs, 1), (dirs, cols)):
            raise ValueError(
                f"DynamicQuantizeLSTM: {name} has shape {list(p.shape)}, expected [{dirs}] (per direction) "
                f"or [{dirs}, {cols}] (per column)"
            )
    if zero_point.dtype != q.dtype:
        raise ValueError(f"DynamicQuantizeLSTM: {what}_zero_point is {zero_point.dtype} but {what} is {q.dtype}")


@op("DynamicQuantizeLSTM", 1, domain=DOMAIN)
def dynamic_quantize_lstm(
    xp: Any,
    X: Any,  # noqa: N803 - spec names
    W: Any,  # noqa: N803
    R: Any,  # noqa: N803
    B: Any = None,  # noqa: N803
    sequence_lens: Any = None,
    initial_h: Any = None,
    initial_c: Any = None,
    P: Any = None,  # noqa: N803
    W_scale: Any = None,  # noqa: N803
    W_zero_point: Any = None,  # noqa: N803
    R_scale: Any = None,  # noqa: N803
    R_zero_point: Any = None,  # noqa: N803
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: list[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    input_forget: int = 0,
) -> tuple[Any, ...]:
    """ONNX LSTM whose W [num_directions, input_size, 4*hidden] and R [num_directions, hidden,
    4*hidden] (transposed against LSTM's) are 8-bit. As onnxruntime does, X (the whole sequence,
    once) and each step's hidden state are quantized dynamically to uint8 (DynamicQuantizeLinear)
    and multiplied with the integer weights (DynamicQuantizeMatMul); the rest is LSTM's float
    gate arithmetic."""
    _checked_weight(W, W_scale, W_zero_point, "W", X.shape[-1] if X.ndim == 3 else None)
    _checked_weight(R, R_scale, R_zero_point, "R", W.shape[2] // 4)
    if R.shape[:1] != W.shape[:1] or R.shape[2] != W.shape[2]:
        raise ValueError(
            f"DynamicQuantizeLSTM: R {list(R.shape)} must be [{W.shape[0]}, {W.shape[2] // 4}, {W.shape[2]}] to match W"
        )
    # _Setup checks X, B, sequence_lens and the states against W / R in LSTM's layout.
    s = rnn._Setup(
        xp, X, xp.swapaxes(W, 1, 2), xp.swapaxes(R, 1, 2), B, sequence_lens, hidden_size, direction, 0, 4,
        "DynamicQuantizeLSTM",
    )  # fmt: skip
    if s.cdt != np.float32:
        raise ValueError(f"DynamicQuantizeLSTM: X must be float32, got {X.dtype}")
    acts = rnn._activations(xp, activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], s.num_dirs)
    hsz = s.h
    xq, x_scale, x_zp = dynamic_quantize_linear(xp, s.x.reshape(-1, s.x.shape[-1]))
    projections, recurrences = [], []
    for d in range(s.num_dirs):
        w_scale = _per_column(W_scale[d], 4 * hsz, "W_scale") * x_scale
        proj = _int_matmul_to_float(xp, xq, x_zp, W[d], W_zero_point[d], w_scale, None, "DynamicQuantizeLSTM")
        proj = proj.reshape(s.t, s.batch, 4 * hsz)
        if s.wb is not None:
            proj += s.wb[d] + s.rb[d]
        projections.append(proj)
        # Each step's hidden state is quantized afresh (DynamicQuantizeMatMul).
        recurrences.append(lambda h, d=d: dynamic_quantize_matmul(xp, h, R[d], R_scale[d], R_zero_point[d]))
    return rnn.lstm_steps(
        xp, s, projections, recurrences, acts, P, initial_h, initial_c, clip, input_forget, "DynamicQuantizeLSTM",
        plain=rnn.default_activations(activations, ["Sigmoid", "Tanh", "Tanh"]),
    )  # fmt: skip
