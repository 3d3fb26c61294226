"""Multi-head scaled dot-product attention as one step (onnxpy.fused.Attention).

``optimizer/passes/fuse_attention.py`` replaces the nodes exporters write for one attention
(per-head Reshape/Transpose of Q, K and V, the scales, Q K^T, the mask, Softmax, the NaN guard
and the product with V) by this kernel. It runs the same computation with the same kernels
(Reshape semantics, Softmax), with the heads as strided views and the scales folded into one
multiply of Q: one step instead of up to 14, and fewer passes over the scores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._blas import batches, stacked_matmul
from ._compat import broadcasts_into, host_ints
from .nn import _softmax_checked
from .registry import op
from .tensor import _reshape_target

DOMAIN = "onnxpy.fused"


def _heads(x: Any, shape: Any, what: str) -> Any:
    """``x`` reshaped to the 4-D (batch, seq, heads, head_size) the exporter's Reshape asked for."""
    target = _reshape_target(x.shape, host_ints(shape), 0)
    y = x.reshape(target)
    if y.ndim != 4:
        raise ValueError(
            f"Attention: {what} reshaped to {list(y.shape)}, expected 4 dimensions (batch, seq, heads, size)"
        )
    return y


def _broadcast_pair(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """np.broadcast_shapes of two equal-length leading shapes (batch, heads) whose sizes match
    or are 1 (MatMul's rule, which the product itself checks), without its ~5 us a call."""
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def _split(x: Any, what: str) -> Any:
    """``x`` given per head: (batch, heads, seq, size)."""
    if x.ndim != 4:
        raise ValueError(f"Attention: {what} has shape {list(x.shape)}, expected (batch, heads, seq, size)")
    return x


@op("Attention", 1, domain=DOMAIN, host_inputs=(3, 4, 5))
def attention(
    xp: Any,
    query: Any,
    key: Any,
    value: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    bias: Any = None,
    *,
    scale: float = 1.0,
    nan_to_zero: int = 0,
    nan_value: float = 0.0,
    query_heads: int = 0,
    key_heads: int = 0,
    value_heads: int = 0,
) -> Any:
    """softmax(Q K^T * scale + bias) V per head, Q/K/V given as (batch, seq, hidden) and split
    into heads by the shapes their Reshapes had; returns (batch, heads, seq, size).
    ``query_heads`` / ``key_heads`` / ``value_heads``: Q / K / V are given already split,
    (batch, heads, seq, size), their shape inputs absent (a decoder's keys and values with the
    past ones concatenated in front, which the graph also returns as its present state; timm's
    ViT splitting one packed projection by Reshape, Transpose and Split).

    ``nan_to_zero`` replaces NaN probabilities (rows where the mask hides every key) by
    ``nan_value``, as the graph's IsNaN/Where guard did."""
    q = _split(query, "query") if query_heads else _heads(query, query_shape, "query").transpose(0, 2, 1, 3)
    k = _split(key, "key") if key_heads else _heads(key, key_shape, "key")
    k = k.transpose(0, 1, 3, 2) if key_heads else k.transpose(0, 2, 3, 1)
    v = _split(value, "value") if value_heads else _heads(value, value_shape, "value").transpose(0, 2, 1, 3)
    scores = stacked_matmul(xp, q * q.dtype.type(scale), k)
    if bias is not None:
        if broadcasts_into(bias.shape, scores.shape):
            scores += bias
        else:
            scores = scores + bias  # the mask broadcasts to a larger shape: a new array
    probs, nan_free = _softmax_checked(xp, scores, scores.ndim - 1, False, proof=bool(nan_to_zero))
    # Without that proof one fast reduction finds any NaN (7 us on BERT's 2x128x128 scores).
    if nan_to_zero and not nan_free and bool(xp.isnan(probs.sum())):
        xp.copyto(probs, probs.dtype.type(nan_value), where=xp.isnan(probs))
    if xp is np and probs.ndim == 4 and v.ndim == 4 and probs.dtype == v.dtype and not batches(probs, v):
        # The per-head context written in (batch, seq, heads, size) memory and returned as its
        # (batch, heads, seq, size) view: exporters merge the heads next (Transpose<0,2,1,3>,
        # then Reshape to (batch, seq, hidden)), which then needs no copy. (Stacks large enough
        # for OpenBLAS's batched call keep it: it needs the heads' results apart.)
        # (Per-head inputs may broadcast over batch or heads, as MatMul's operands do.)
        (b, h), s, d = _broadcast_pair(probs.shape[:2], v.shape[:2]), probs.shape[2], v.shape[3]
        context = np.empty((b, s, h, d), dtype=v.dtype).transpose(0, 2, 1, 3)
        return np.matmul(probs, v, out=context)
    return stacked_matmul(xp, probs, v)
