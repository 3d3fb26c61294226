"""ai.onnx.preview.training optimizers: Adagrad, Adam, Momentum.

Each updates several tensors at once: the variadic inputs are groups (all X, then all G, ...),
and so are the outputs. The formulas are the operator docs' pseudo code; scalars are applied in
the tensors' own precision.
"""

from __future__ import annotations

import math
from typing import Any

from ._compat import host_scalar
from .registry import op

TRAINING = "ai.onnx.preview.training"


def _groups(tensors: tuple[Any, ...], k: int, op_name: str) -> list[tuple[Any, ...]]:
    if len(tensors) == 0 or len(tensors) % k:
        raise ValueError(f"{op_name} takes {k} tensors per optimized variable, got {len(tensors)} tensors")
    n = len(tensors) // k
    return [tuple(tensors[g * n + i] for g in range(k)) for i in range(n)]


@op("Adagrad", 1, domain=TRAINING, host_inputs=(0, 1))
def adagrad(
    xp: Any,
    R: Any,
    T: Any,
    *inputs: Any,
    decay_factor: float = 0.0,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
) -> Any:
    r = float(host_scalar(R)) / (1.0 + float(host_scalar(T)) * decay_factor)
    xs, hs = [], []
    for x, g, h in _groups(inputs, 3, "Adagrad"):
        g_reg = norm_coefficient * x + g
        h_new = h + g_reg * g_reg
        xs.append((x - r * g_reg / (xp.sqrt(h_new) + epsilon)).astype(x.dtype))
        hs.append(h_new.astype(h.dtype))
    return (*xs, *hs)


@op("Adam", 1, domain=TRAINING, host_inputs=(0, 1))
def adam(
    xp: Any,
    R: Any,
    T: Any,
    *inputs: Any,
    alpha: float = 0.9,
    beta: float = 0.999,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
    norm_coefficient_post: float = 0.0,
) -> Any:
    r = float(host_scalar(R))
    t = float(host_scalar(T))
    r_adj = r * math.sqrt(1.0 - beta**t) / (1.0 - alpha**t) if t > 0 else r
    xs, vs, hs = [], [], []
    for x, g, v, h in _groups(inputs, 4, "Adam"):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g_reg
        h_new = beta * h + (1 - beta) * g_reg * g_reg
        x_new = x - r_adj * v_new / (xp.sqrt(h_new) + epsilon)
        xs.append(((1 - norm_coefficient_post) * x_new).astype(x.dtype))
        vs.append(v_new.astype(v.dtype))
        hs.append(h_new.astype(h.dtype))
    return (*xs, *vs, *hs)


@op("Momentum", 1, domain=TRAINING, host_inputs=(0, 1))
def momentum(
    xp: Any, R: Any, T: Any, *inputs: Any, alpha: float, beta: float, mode: str, norm_coefficient: float
) -> Any:
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"mode '{mode}' is not 'standard' or 'nesterov'")
    r = float(host_scalar(R))
    beta_adj = beta if float(host_scalar(T)) > 0 else 1.0
    xs, vs = [], []
    for x, g, v in _groups(inputs, 3, "Momentum"):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + beta_adj * g_reg
        step = v_new if mode == "standard" else g_reg + alpha * v_new
        xs.append((x - r * step).astype(x.dtype))
        vs.append(v_new.astype(v.dtype))
    return (*xs, *vs)
