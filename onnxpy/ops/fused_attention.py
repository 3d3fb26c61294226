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
from ._clamp import floor_at
from ._compat import broadcasts_into, host_ints
from .nn import _softmax_checked
from .registry import memoized, op
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


def _repeated_heads(
    x: Any, expand: Any, reshape: Any, allowzero: int, what: str, xp: Any = np, ctx: Any = None
) -> tuple[Any, int, Any]:
    """What transformers' repeat_kv makes of the KV heads ``x`` (batch, kv_heads, seq, size):
    Reshape(Expand(Unsqueeze(x, axis 2), expand), reshape), the nodes optimizer/passes/
    fold_repeat_kv.py folded into the Attention. Returns (x, n, copy) where that is each KV
    head repeated n times in place (batch, kv_heads * n, seq, size), which attention then
    reads without the copy (``copy()`` makes it where needed); otherwise (the copy the three
    nodes make, 1, None)."""
    if x.ndim < 2:
        raise ValueError(f"Attention: {what} of shape {list(x.shape)} cannot take a new axis 2 (repeat_kv)")
    lifted = x.reshape(*x.shape[:2], 1, *x.shape[2:])
    expand, reshape = _ints(expand), _ints(reshape)
    # Remembered per node: a decoder step asks the same each call with a cache one longer, and
    # Expand's and Reshape's rules worked out each time cost ~25 us of a 70 us attention.
    n, wide, target = memoized(
        ctx,
        ("repeat_kv", lifted.shape, expand, reshape, allowzero),
        lambda: _repeat_plan(lifted.shape, expand, reshape, allowzero, what),
    )
    if n > 1 and x.dtype in (np.float32, np.float64):
        return x, n, lambda: xp.broadcast_to(lifted, wide).reshape(target)
    return xp.broadcast_to(lifted, wide).reshape(target), 1, None


def _one_value(factor: Any, what: str) -> float:
    """A scale factor computed at run time (inputs 18-19), which must hold one value."""
    values = np.asarray(factor).reshape(-1)
    if values.size != 1:
        raise ValueError(f"Attention: the {what} scale factor must hold one value, got shape {list(np.shape(factor))}")
    return float(values[0])


def _ints(v: Any) -> tuple[int, ...]:
    return tuple(v.tolist()) if isinstance(v, np.ndarray) and v.ndim == 1 else tuple(host_ints(v))


def _repeat_plan(
    lifted: tuple[int, ...], expand: tuple[int, ...], reshape: tuple[int, ...], allowzero: int, what: str
) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(n, Expand's shape, Reshape's shape) for the KV heads ``lifted`` (their new axis 2
    inserted); n > 1 only where that is each head repeated n times, else 1."""
    try:
        wide = np.broadcast_shapes(lifted, expand)
    except ValueError:
        raise ValueError(f"Attention: cannot expand {what} {list(lifted)} to {list(expand)}") from None
    target = tuple(_reshape_target(wide, list(reshape), allowzero))
    n = 1
    if len(lifted) == 5 and len(wide) == 5:
        b, kvh, _, t, d = lifted
        if wide[1] == kvh and wide[3:] == (t, d) and b in (1, wide[0]) and target == (wide[0], kvh * wide[2], t, d):
            n = wide[2]
    return n, wide, target


def _grouped_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    n: int,
    bias: Any,
    scale: float,
    nan_to_zero: int,
    nan_value: float,
    mask: tuple[Any, float, int] | None = None,
) -> np.ndarray | None:
    """Attention with each of the KV heads of k and v (batch, kv_heads, seq, size) serving n
    consecutive query heads of q (batch, kv_heads * n, seq_q, size), read in place; None (use
    the repeated copies) where the shapes or dtypes do not fit. One query (a decoder step):
    each KV head's n query rows form one product. Returns (batch, heads, seq_q, size), in
    (batch, seq_q, heads, size) memory as the ungrouped form writes it."""
    if q.ndim != 4 or q.dtype != k.dtype or v.dtype != k.dtype or k.shape[1] != v.shape[1]:
        return None
    if bias is not None and not isinstance(bias, np.ndarray):
        return None
    b, heads, sq, d = q.shape
    kvh = k.shape[1]
    if heads != kvh * n or v.shape[2] != k.shape[2] or d != k.shape[3]:
        return None
    batch = max(b, k.shape[0], v.shape[0])
    if any(x not in (1, batch) for x in (b, k.shape[0], v.shape[0])):
        return None
    if bias is not None and not broadcasts_into(bias.shape, (batch, heads, sq, k.shape[2])):
        return None  # the mask would broadcast the scores further: the general form
    if mask is not None and not broadcasts_into(mask[0].shape, (batch, heads, sq, k.shape[2])):
        return None
    qs = q * q.dtype.type(scale)
    kt = k.transpose(0, 1, 3, 2)
    if sq == 1:
        scores = np.matmul(qs.reshape(b, kvh, n, d), kt).reshape(batch, heads, 1, k.shape[2])
    else:
        scores = np.matmul(qs.reshape(b, kvh, n, sq, d), kt[:, :, None]).reshape(batch, heads, sq, k.shape[2])
    if mask is not None:
        scores = _masked(np, scores, *mask)
    if bias is not None:
        scores += bias
    probs, nan_free = _softmax_checked(np, scores, 3, False, proof=bool(nan_to_zero))
    if nan_to_zero and not nan_free and bool(np.isnan(probs.sum())):
        np.copyto(probs, probs.dtype.type(nan_value), where=np.isnan(probs))
    # The products write (batch, seq_q, kv_heads, n, size) memory through views of it.
    dv = v.shape[3]
    memory = np.empty((batch, sq, kvh, n, dv), dtype=v.dtype)
    if sq == 1:
        np.matmul(probs.reshape(batch, kvh, n, -1), v, out=memory.reshape(batch, kvh, n, dv))
    else:
        np.matmul(probs.reshape(batch, kvh, n, sq, -1), v[:, :, None], out=memory.transpose(0, 2, 3, 1, 4))
    return memory.reshape(batch, sq, heads, dv).transpose(0, 2, 1, 3)


def _masked(xp: Any, scores: Any, condition: Any, fill: float, keep: int) -> Any:
    """Where(condition, scores, fill) (``keep`` 1) or Where(condition, fill, scores) (0): in
    place where the condition broadcasts into the scores, else the larger result."""
    if condition.dtype != np.bool_:
        raise ValueError(f"Attention: the Where condition must be bool, got {condition.dtype}")
    hide = xp.logical_not(condition) if keep else condition
    if broadcasts_into(tuple(condition.shape), tuple(scores.shape)):
        xp.copyto(scores, scores.dtype.type(fill), where=hide)
        return scores
    return xp.where(hide, scores.dtype.type(fill), scores)


@op("Attention", 1, domain=DOMAIN, host_inputs=(3, 4, 5, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17, 18, 19))
def attention(
    xp: Any,
    query: Any,
    key: Any,
    value: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    bias: Any = None,
    key_expand: Any = None,
    key_reshape: Any = None,
    value_expand: Any = None,
    value_reshape: Any = None,
    where_condition: Any = None,
    query_merge: Any = None,
    key_merge: Any = None,
    value_merge: Any = None,
    scores_split: Any = None,
    scores_merge: Any = None,
    output_split: Any = None,
    query_factor: Any = None,
    key_factor: Any = None,
    *,
    scale: float = 1.0,
    nan_to_zero: int = 0,
    nan_value: float = 0.0,
    query_heads: int = 0,
    key_heads: int = 0,
    value_heads: int = 0,
    kv_repeat: int = 0,
    key_allowzero: int = 0,
    value_allowzero: int = 0,
    where_fill: float = 0.0,
    where_keep: int = 1,
    merged_heads: int = 0,
    floor: float = 0.0,
    floored: int = 0,
    ctx: Any = None,
) -> Any:
    """softmax(Q K^T * scale + bias) V per head, Q/K/V given as (batch, seq, hidden) and split
    into heads by the shapes their Reshapes had; returns (batch, heads, seq, size).
    ``query_heads`` / ``key_heads`` / ``value_heads``: Q / K / V are given already split,
    (batch, heads, seq, size), their shape inputs absent (a decoder's keys and values with the
    past ones concatenated in front, which the graph also returns as its present state; timm's
    ViT splitting one packed projection by Reshape, Transpose and Split).

    ``nan_to_zero`` replaces NaN probabilities (rows where the mask hides every key) by
    ``nan_value``, as the graph's IsNaN/Where guard did.

    ``kv_repeat``: keys and values are given per KV head with the shapes of the repeat_kv
    Expand and Reshape that made one copy of them per query head (grouped-query attention, see
    _repeated_heads); ``key_allowzero`` / ``value_allowzero`` are those Reshapes' attribute.

    ``where_condition`` (bool, broadcasting to the scores): the graph's Where before the mask
    (GPT-2's causal buffer, DistilBERT's masked_fill) set the scaled scores to ``where_fill``
    where the condition is false (``where_keep`` 1: it marks the scores kept) or true (0).

    ``merged_heads``: the graph computed the products over (batch * heads, seq, size) tensors
    (transformers' bmm form); inputs 12-17 are the shapes of its Reshapes of Q, K and V to
    3-D, of the scores to 4-D before the mask and back after it, and of the context to 4-D
    (the last three optional), and the result is what the graph had after its last one (see
    _merged_heads). ``floored``: the masked scores went through Max(scores, ``floor``) (OPT).

    ``query_factor`` / ``key_factor`` (inputs 18-19, one value each): factors of Q and K^T
    computed at run time, which multiply ``scale`` (torch's SDPA export takes its default scale
    from the head size, unknown to the optimizer where the exporter computed it)."""
    mask = None if where_condition is None else (where_condition, where_fill, where_keep)
    for factor, what in ((query_factor, "query"), (key_factor, "key")):
        if factor is not None:
            scale *= _one_value(factor, what)
    if kv_repeat:
        if key_expand is None or key_reshape is None or value_expand is None or value_reshape is None:
            raise ValueError("Attention: kv_repeat needs the key and value expand and reshape shapes (inputs 7-10)")
        key, nk, key_copy = _repeated_heads(key, key_expand, key_reshape, key_allowzero, "key", xp, ctx)
        value, nv, value_copy = _repeated_heads(value, value_expand, value_reshape, value_allowzero, "value", xp, ctx)
        if nk > 1 and nk == nv and xp is np and query_heads and isinstance(query, np.ndarray):
            found = _grouped_attention(
                _split(query, "query"), key, value, nk, bias, scale, nan_to_zero, nan_value, mask
            )
            if found is not None:
                return found
        # The grouped form does not apply: the copies the graph made.
        key = key if key_copy is None else key_copy()
        value = value if value_copy is None else value_copy()
    q = _split(query, "query") if query_heads else _heads(query, query_shape, "query").transpose(0, 2, 1, 3)
    k = _split(key, "key") if key_heads else _heads(key, key_shape, "key")
    k = k.transpose(0, 1, 3, 2) if key_heads else k.transpose(0, 2, 3, 1)
    v = _split(value, "value") if value_heads else _heads(value, value_shape, "value").transpose(0, 2, 1, 3)
    if merged_heads:
        merges = (query_merge, key_merge, value_merge, scores_split, scores_merge, output_split)
        return _merged_heads(
            xp, q, k, v, bias, mask, merges, scale, floor if floored else None, nan_to_zero, nan_value, ctx
        )
    return _attend(xp, q, k, v, bias, mask, scale, None, nan_to_zero, nan_value)


def _attend(
    xp: Any,
    q: Any,
    k: Any,
    v: Any,
    bias: Any,
    mask: tuple[Any, float, int] | None,
    scale: float,
    floor: float | None,
    nan_to_zero: int,
    nan_value: float,
) -> Any:
    """softmax(Q K^T * scale [masked] + bias [floored]) V for per-head q (batch, heads, seq_q,
    size), k already transposed (batch, heads, size, seq_k) and v (batch, heads, seq_k, size)."""
    scores = stacked_matmul(xp, q * q.dtype.type(scale), k)
    if mask is not None:
        scores = _masked(xp, scores, *mask)
    if bias is not None:
        if broadcasts_into(bias.shape, scores.shape):
            scores += bias
        else:
            scores = scores + bias  # the mask broadcasts to a larger shape: a new array
    if floor is not None:
        floor_at(xp, scores, floor, out=scores)
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


def _merge_plan(
    q: tuple[int, ...],
    k: tuple[int, ...],
    v: tuple[int, ...],
    bias: tuple[int, ...] | None,
    merges: tuple[tuple[int, ...] | None, ...],
) -> bool:
    """Whether the 3-D form's Reshapes (``merges``: of Q, K, V to (batch * heads, seq, size),
    of the scores to 4-D and back, of the context to 4-D; None where the graph had none) do
    exactly that for per-head q (batch, heads, seq_q, size), k^T (batch, heads, size, seq_k) and
    v, with the bias broadcasting into the 4-D scores: then the 4-D computation is the graph's."""
    tq, tk, tv, ts4, ts3, tout = merges
    if len(q) != 4 or len(k) != 4 or len(v) != 4 or q[:2] != k[:2] or q[:2] != v[:2] or k[3] != v[2]:
        return False
    b, h, sq, d = q
    sk = k[3]
    if k[2] != d or _resolved(q, tq) != (b * h, sq, d) or _resolved((b, h, sk, d), tk) != (b * h, sk, d):
        return False
    if _resolved(v, tv) != (b * h, sk, v[3]):
        return False
    scores = (b * h, sq, sk)
    if ts4 is not None:
        if _resolved(scores, ts4) != (b, h, sq, sk):
            return False
        if ts3 is not None and _resolved((b, h, sq, sk), ts3) != scores:
            return False
    elif ts3 is not None or bias is not None:
        return False
    if bias is not None and not broadcasts_into(bias, (b, h, sq, sk)):
        return False
    return tout is None or _resolved((b * h, sq, v[3]), tout) == (b, h, sq, v[3])


def _resolved(shape: tuple[int, ...], target: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Reshape's result shape for ``shape`` and ``target`` (allowzero 0), None where Reshape
    would fail."""
    if target is None:
        return None
    try:
        return tuple(_reshape_target(shape, list(target), 0))
    except ValueError:
        return None


def _merged_heads(
    xp: Any,
    q: Any,
    k: Any,
    v: Any,
    bias: Any,
    mask: tuple[Any, float, int] | None,
    merges: tuple[Any, ...],
    scale: float,
    floor: float | None,
    nan_to_zero: int,
    nan_value: float,
    ctx: Any,
) -> Any:
    """Attention written over (batch * heads, seq, size) tensors (transformers' bmm form: BART,
    OPT, CLIP before 4.48): the Reshapes of Q, K and V to 3-D, of the scores to 4-D (for the
    mask) and back, and of the context to 4-D, as the graph had them. Where they merge and split
    the batch and head axes as that form intends (checked per shape), the 4-D computation
    without copies; otherwise each step as the graph wrote it."""
    targets = tuple(None if t is None else _ints(t) for t in merges)
    fits = memoized(
        ctx,
        ("merged", q.shape, k.shape, v.shape, None if bias is None else bias.shape, targets),
        lambda: _merge_plan(q.shape, k.shape, v.shape, None if bias is None else tuple(bias.shape), targets),
    )
    if fits and mask is None:
        context = _attend(xp, q, k, v, bias, None, scale, floor, nan_to_zero, nan_value)
        if targets[5] is not None:
            return context  # (batch, heads, seq_q, size): the graph's last Reshape
        return context.reshape(-1, *context.shape[2:])
    return _as_written(xp, q, k, v, bias, mask, targets, scale, floor, nan_to_zero, nan_value)


def _as_written(
    xp: Any,
    q: Any,
    k: Any,
    v: Any,
    bias: Any,
    mask: tuple[Any, float, int] | None,
    targets: tuple[tuple[int, ...] | None, ...],
    scale: float,
    floor: float | None,
    nan_to_zero: int,
    nan_value: float,
) -> Any:
    """The 3-D form step by step, Reshape's rules and errors included (see _merged_heads)."""
    tq, tk, tv, ts4, ts3, tout = targets

    def reshaped(x: Any, target: tuple[int, ...] | None, what: str) -> Any:
        if target is None:
            return x
        try:
            return x.reshape(_reshape_target(tuple(x.shape), list(target), 0))
        except ValueError as e:
            raise ValueError(f"Attention: {what}: {e}") from None

    q3 = reshaped(q, tq, "query") * q.dtype.type(scale)
    k3 = reshaped(k.transpose(0, 1, 3, 2), tk, "key")
    v3 = reshaped(v, tv, "value")
    scores = reshaped(stacked_matmul(xp, q3, xp.swapaxes(k3, -1, -2)), ts4, "scores")
    if mask is not None:
        scores = _masked(xp, scores, *mask)
    if bias is not None:
        scores = scores + bias
    if floor is not None:
        scores = xp.maximum(scores, scores.dtype.type(floor))
    scores = reshaped(scores, ts3, "masked scores")
    probs, _ = _softmax_checked(xp, scores, scores.ndim - 1, False, proof=False)
    if nan_to_zero and bool(xp.isnan(probs.sum())):
        xp.copyto(probs, probs.dtype.type(nan_value), where=xp.isnan(probs))
    return reshaped(stacked_matmul(xp, probs, v3), tout, "context")
