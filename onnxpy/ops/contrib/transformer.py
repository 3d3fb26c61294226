"""com.microsoft fused transformer operators written by onnxruntime's transformer optimizer.

Semantics are onnxruntime's ContribOperators documentation, with the details the document leaves
open (mask encodings, optional statistics outputs, FusedMatMul's batch transposes) fixed by
onnxruntime's observed behaviour (tests/ops/test_contrib_transformer.py). Half-precision inputs
are computed in float32 and cast back, as onnxruntime does.

Also here, in the default domain: SimplifiedLayerNormalization-1, which onnxruntime registers
under ai.onnx (not an onnx operator) and its optimizer writes for T5/LLaMA-style RMS norms.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import host_ints
from ..elementwise import gelu as _gelu_kernel
from ..elementwise import logistic
from ..nn import _normalize, _normalize_trailing, _softmax, _up, matmul
from ..nn import layer_norm as _layer_norm
from ..registry import op
from . import DOMAIN

# -- activations ---------------------------------------------------------------------------------


def _gelu(xp: Any, x: Any) -> Any:
    """Exact (erf) GELU of an array already in its compute dtype (float32 / float64)."""
    return _gelu_kernel(xp, x)


def _fast_gelu(xp: Any, x: Any) -> Any:
    """0.5 x (1 + tanh(0.797885 x + 0.035677 x^3)) in x's dtype, with the document's rounded
    constants, as onnxruntime computes it (sqrt(2/pi) in full differs by 2e-7 in float64)."""
    t = x.dtype.type
    inner = x * (t(0.797885) + t(0.035677) * x * x)
    return t(0.5) * x * (1 + xp.tanh(inner))


def _bias_shape_check(x: Any, bias: Any, op_name: str, what: str = "bias") -> None:
    if bias.ndim != 1 or x.ndim == 0 or bias.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{op_name}: {what} has shape {list(bias.shape)}, expected [{x.shape[-1] if x.ndim else '?'}] "
            f"(the last dimension of the input {list(x.shape)})"
        )


@op("Gelu", 1, domain=DOMAIN)
def gelu(xp: Any, X: Any) -> Any:  # noqa: N803 - spec name
    return _gelu(xp, _up(X)).astype(X.dtype, copy=False)


@op("BiasGelu", 1, domain=DOMAIN)
def bias_gelu(xp: Any, A: Any, B: Any) -> Any:  # noqa: N803 - spec names
    _bias_shape_check(A, B, "BiasGelu", "B")
    return _gelu(xp, _up(A) + _up(B)).astype(A.dtype, copy=False)


@op("FastGelu", 1, domain=DOMAIN)
def fast_gelu(xp: Any, X: Any, bias: Any = None) -> Any:  # noqa: N803 - spec name
    x = _up(X)
    if bias is not None:
        _bias_shape_check(X, bias, "FastGelu")
        x = x + _up(bias)
    return _fast_gelu(xp, x).astype(X.dtype, copy=False)


@op("QuickGelu", 1, domain=DOMAIN)
def quick_gelu(xp: Any, X: Any, *, alpha: float = 1.702) -> Any:  # noqa: N803 - spec name
    x = _up(X)
    return (x * logistic(xp, x * x.dtype.type(alpha))).astype(X.dtype, copy=False)


@op("BiasSplitGelu", 1, domain=DOMAIN)
def bias_split_gelu(xp: Any, X: Any, bias: Any) -> Any:  # noqa: N803 - spec name
    if X.ndim != 3 or X.shape[-1] % 2:
        raise ValueError(f"BiasSplitGelu: X has shape {list(X.shape)}, expected (N, S, D) with an even D")
    _bias_shape_check(X, bias, "BiasSplitGelu")
    x = _up(X) + _up(bias)
    half = x.shape[-1] // 2
    return (x[..., :half] * _gelu(xp, x[..., half:])).astype(X.dtype, copy=False)


@op("BiasAdd", 1, domain=DOMAIN)
def bias_add(xp: Any, X: Any, bias: Any, skip: Any) -> Any:  # noqa: N803 - spec name
    if X.ndim != 3:
        raise ValueError(f"BiasAdd: X has shape {list(X.shape)}, expected 3 dimensions (N, S, C)")
    _bias_shape_check(X, bias, "BiasAdd")
    if skip.shape != X.shape:
        raise ValueError(f"BiasAdd: skip has shape {list(skip.shape)}, expected X's shape {list(X.shape)}")
    return (_up(X) + _up(bias) + _up(skip)).astype(X.dtype, copy=False)


@op("GemmFastGelu", 1, domain=DOMAIN)
def gemm_fast_gelu(xp: Any, X: Any, W: Any, bias: Any = None) -> Any:  # noqa: N803 - spec names
    y = _up(matmul(xp, _up(X), _up(W)))
    if bias is not None:
        _bias_shape_check(y, bias, "GemmFastGelu")
        y = y + _up(bias)
    return _fast_gelu(xp, y).astype(X.dtype, copy=False)


# -- FusedMatMul ---------------------------------------------------------------------------------


def _fused_operand(x: Any, trans: int, trans_batch: int, rank: int, what: str) -> Any:
    if trans_batch:
        if x.ndim < 3 or x.ndim != rank:
            raise ValueError(
                f"FusedMatMul: transBatch{what} needs A and B of one rank >= 3, got {what} of shape {list(x.shape)}"
            )
        # The leading (batch) dimension moves to the rows: (d0, d1.., m, k) -> (d1.., m, d0, k).
        x = x.transpose(*range(1, x.ndim - 1), 0, x.ndim - 1)
    if trans and x.ndim >= 2:  # a vector has nothing to transpose
        x = x.swapaxes(-1, -2)
    return x


@op("FusedMatMul", 1, domain=DOMAIN)
def fused_matmul(
    xp: Any,
    A: Any,  # noqa: N803 - spec name
    B: Any,  # noqa: N803 - spec name
    *,
    alpha: float = 1.0,
    transA: int = 0,  # noqa: N803 - spec name
    transB: int = 0,  # noqa: N803 - spec name
    transBatchA: int = 0,  # noqa: N803 - spec name
    transBatchB: int = 0,  # noqa: N803 - spec name
) -> Any:
    rank = max(A.ndim, B.ndim) if not (transBatchA or transBatchB) else A.ndim
    a = _fused_operand(A, transA, transBatchA, rank, "A")
    b = _fused_operand(B, transB, transBatchB, rank, "B")
    ka = a.shape[-1] if a.ndim else None
    kb = b.shape[-2] if b.ndim >= 2 else (b.shape[0] if b.ndim else None)
    if ka is None or kb is None or ka != kb:
        raise ValueError(
            f"FusedMatMul: A {list(A.shape)} and B {list(B.shape)} (as {list(a.shape)} and {list(b.shape)} after "
            "the transposes) do not chain"
        )
    y = matmul(xp, a, b)
    if alpha != 1.0:
        y = (_up(y) * _up(y).dtype.type(alpha)).astype(y.dtype, copy=False)
    return y


# -- normalizations ------------------------------------------------------------------------------


def _ln_last(xp: Any, x: Any, epsilon: float) -> tuple[Any, Any, Any]:
    """(normalized, mean, 1/std) over the last axis of a float32/float64 array (stats keepdims)."""
    if xp is np and x.size:
        return _normalize_trailing(np.ascontiguousarray(x), x.ndim - 1, epsilon)
    return _normalize(xp, x, (x.ndim - 1,), epsilon)


def _rms_inv(xp: Any, x: Any, axes: tuple[int, ...], epsilon: float) -> Any:
    """1 / sqrt(mean(x^2) + epsilon) over ``axes`` (keepdims)."""
    ms = (x * x).mean(axis=axes, keepdims=True)
    return 1 / xp.sqrt(ms + x.dtype.type(epsilon))


def _skip_sum(xp: Any, input: Any, skip: Any, gamma: Any, beta: Any, bias: Any, op_name: str) -> Any:  # noqa: A002
    """input + skip (+ bias) in the compute dtype, after checking the documented shapes."""
    if input.ndim not in (2, 3):
        raise ValueError(f"{op_name}: input has shape {list(input.shape)}, expected (batch, seq, hidden) or 2-D")
    hidden = input.shape[-1]
    # skip: input's shape, or one (1, seq, hidden) / (seq, hidden) shared by the batch.
    if (
        skip.shape != input.shape
        and not (skip.ndim <= input.ndim and skip.shape == input.shape[-skip.ndim :])
        and not (skip.ndim == 3 and skip.shape[0] == 1 and skip.shape[1:] == input.shape[1:])
    ):
        raise ValueError(f"{op_name}: skip has shape {list(skip.shape)}, expected {list(input.shape)} or a broadcast")
    for what, v in (("gamma", gamma), ("beta", beta), ("bias", bias)):
        if v is not None and v.shape != (hidden,):
            raise ValueError(f"{op_name}: {what} has shape {list(v.shape)}, expected [{hidden}] (hidden size)")
    s = _up(input) + _up(skip)
    if bias is not None:
        s += _up(bias)
    return s


def _n_outputs(ctx: Any, default: int = 1) -> int:
    return ctx.n_outputs if ctx is not None else default


@op("SkipLayerNormalization", 1, domain=DOMAIN)
def skip_layer_norm(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    skip: Any,
    gamma: Any,
    beta: Any = None,
    bias: Any = None,
    *,
    epsilon: float = 1e-12,
    ctx: Any = None,
) -> Any:
    s = _skip_sum(xp, input, skip, gamma, beta, bias, "SkipLayerNormalization")
    normed, mean, inv_std = _ln_last(xp, s, epsilon)
    y = normed * _up(gamma)
    if beta is not None:
        y += _up(beta)
    n = _n_outputs(ctx)
    outs = (y.astype(input.dtype, copy=False), mean.astype(np.float32), inv_std.astype(np.float32))
    return _with_sum(outs, s, input.dtype, n)


def _with_sum(outs: tuple[Any, ...], s: Any, dtype: Any, n: int) -> Any:
    if n <= 1:
        return outs[0]
    return (*outs, s.astype(dtype, copy=False))[:n]


@op("SkipSimplifiedLayerNormalization", 1, domain=DOMAIN)
def skip_simplified_layer_norm(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    skip: Any,
    gamma: Any,
    bias: Any = None,
    *,
    epsilon: float = 1e-12,
    ctx: Any = None,
) -> Any:
    s = _skip_sum(xp, input, skip, gamma, None, bias, "SkipSimplifiedLayerNormalization")
    inv = _rms_inv(xp, s, (s.ndim - 1,), epsilon)
    y = (s * inv * _up(gamma)).astype(input.dtype, copy=False)
    n = _n_outputs(ctx)
    # An RMS norm has no mean: onnxruntime writes zeros there.
    outs = (y, xp.zeros(inv.shape, dtype=np.float32), inv.astype(np.float32))
    return _with_sum(outs, s, input.dtype, n)


@op("SimplifiedLayerNormalization", 1)
def simplified_layer_norm(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    scale: Any,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
    ctx: Any = None,
) -> Any:
    """RMS normalization (onnxruntime's ai.onnx SimplifiedLayerNormalization-1); Y has scale's type."""
    if X.ndim == 0:
        raise ValueError("SimplifiedLayerNormalization needs X of rank >= 1")
    ax = axis + X.ndim if axis < 0 else axis
    if not 0 <= ax < X.ndim:
        raise ValueError(f"SimplifiedLayerNormalization: axis {axis} is out of range for X of shape {list(X.shape)}")
    x = _up(X)
    inv = _rms_inv(xp, x, tuple(range(ax, X.ndim)), epsilon)
    y = (x * inv * _up(scale)).astype(scale.dtype, copy=False)
    if _n_outputs(ctx) > 1:
        stat = np.float64 if x.dtype == np.float64 else np.float32
        return y, inv.astype(stat, copy=False)
    return y


@op("LayerNormalization", 1)
def layer_norm_1(
    xp: Any,
    X: Any,  # noqa: N803 - spec names
    Scale: Any,  # noqa: N803
    B: Any = None,  # noqa: N803
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
    ctx: Any = None,
) -> Any:
    """onnxruntime's own ai.onnx LayerNormalization-1, which its optimizer writes into models below
    opset 17 (where onnx has none): the same computation as onnx's LayerNormalization-17."""
    return _layer_norm(xp, X, Scale, B, axis=axis, epsilon=epsilon, stash_type=stash_type, ctx=ctx)


@op("EmbedLayerNormalization", 1, domain=DOMAIN)
def embed_layer_norm(
    xp: Any,
    input_ids: Any,
    segment_ids: Any,
    word_embedding: Any,
    position_embedding: Any,
    segment_embedding: Any,
    gamma: Any,
    beta: Any,
    mask: Any = None,
    position_ids: Any = None,
    *,
    epsilon: float = 1e-12,
    mask_index_type: int = 1,
    ctx: Any = None,
) -> Any:
    op_name = "EmbedLayerNormalization"
    if input_ids.ndim != 2:
        raise ValueError(f"{op_name}: input_ids has shape {list(input_ids.shape)}, expected (batch, seq)")
    b, s = input_ids.shape
    for what, v in (("segment_ids", segment_ids), ("mask", mask)):
        if v is not None and v.shape != input_ids.shape:
            raise ValueError(f"{op_name}: {what} has shape {list(v.shape)}, expected input_ids' {[b, s]}")
    if (segment_ids is None) != (segment_embedding is None):
        raise ValueError(f"{op_name}: segment_ids and segment_embedding must be given together")
    hidden = word_embedding.shape[-1] if word_embedding.ndim == 2 else -1
    for what, v in (("word_embedding", word_embedding), ("position_embedding", position_embedding)) + (
        (("segment_embedding", segment_embedding),) if segment_embedding is not None else ()
    ):
        if v.ndim != 2 or v.shape[1] != hidden:
            raise ValueError(f"{op_name}: {what} has shape {list(v.shape)}, expected (rows, {hidden})")
    for what, v in (("gamma", gamma), ("beta", beta)):
        if v.shape != (hidden,):
            raise ValueError(f"{op_name}: {what} has shape {list(v.shape)}, expected [{hidden}]")
    if position_ids is None:
        pos = xp.arange(s).reshape(1, s)
    elif position_ids.shape in ((b, s), (1, s)):
        pos = position_ids
    else:
        raise ValueError(
            f"{op_name}: position_ids has shape {list(position_ids.shape)}, expected [{b}, {s}] or [1, {s}]"
        )
    total = _up(_lookup(xp, word_embedding, input_ids, "input_ids", "word_embedding"))
    total = total + _up(_lookup(xp, position_embedding, pos, "position ids", "position_embedding"))
    if segment_ids is not None:
        total += _up(_lookup(xp, segment_embedding, segment_ids, "segment_ids", "segment_embedding"))
    normed, _, _ = _ln_last(xp, total, epsilon)
    y = (normed * _up(gamma) + _up(beta)).astype(word_embedding.dtype, copy=False)
    n = _n_outputs(ctx)
    if n == 1:
        return y
    # mask_index: the number of words (non-zero mask entries) of each sequence.
    if mask is None:
        mask_index = xp.zeros((b,), dtype=np.int32)
    else:
        mask_index = xp.count_nonzero(mask, axis=1).astype(np.int32)
    return (y, mask_index, total.astype(word_embedding.dtype, copy=False))[:n]


def _lookup(xp: Any, table: Any, ids: Any, what: str, table_name: str) -> Any:
    rows = table.shape[0]
    if ids.size:
        lo, hi = host_ints(xp.stack([ids.min(), ids.max()]))  # one device-to-host read
        if lo < 0 or hi >= rows:
            raise IndexError(f"EmbedLayerNormalization: {what} must lie in [0, {rows}) (the rows of {table_name})")
    return table[ids]


# -- attention -----------------------------------------------------------------------------------


def _mask_bias(
    xp: Any, mask: Any, b: int, s: int, total: int, kv_len: int, fill: float, op_name: str, what: str
) -> Any:
    """The key mask as an additive float32 bias broadcastable to (B, heads, S, total): ``fill``
    (mask_filter_value) where a key is masked, 0 elsewhere. Formats: (B) lengths of right-padded
    keys, (2B) exclusive ends then inclusive starts, (B, total) or (B, kv_len) and (B, S, total)
    with 0 for masked."""
    # A host input: a host array where the mask is a constant, a device array where it is fed.
    m = mask.get() if hasattr(mask, "get") and not isinstance(mask, np.ndarray) else np.asarray(mask)
    j = np.arange(total)
    if m.ndim == 1 and m.shape[0] in (b, 2 * b):
        if (m < 0).any():  # onnxruntime refuses them; here every key was masked, silently
            raise ValueError(f"{op_name}: {what} holds negative lengths or positions: {m.tolist()}")
        ends = m[:b].reshape(b, 1)
        allowed = j < ends
        if m.shape[0] == 2 * b:
            allowed &= j >= m[b:].reshape(b, 1)
        allowed = allowed[:, None, None, :]
    elif m.ndim == 2 and m.shape[0] == b and m.shape[1] in (total, kv_len):
        allowed = m != 0
        if m.shape[1] != total:  # a kv-length mask with a past: the past keys stay visible
            allowed = np.concatenate([np.ones((b, total - kv_len), dtype=bool), allowed], axis=1)
        allowed = allowed[:, None, None, :]
    elif m.ndim == 3 and m.shape == (b, s, total):
        allowed = (m != 0)[:, None]
    else:
        raise ValueError(
            f"{op_name}: {what} has shape {list(m.shape)}, expected [{b}], [{2 * b}], [{b}, {total}] or "
            f"[{b}, {s}, {total}] (batch {b}, sequence {s}, total sequence {total})"
        )
    return xp.asarray(np.where(allowed, np.float32(0), np.float32(fill)))


def _attend(
    xp: Any,
    q: Any,
    k: Any,
    v: Any,
    scale: float | None,
    biases: list[Any],
    unidirectional: int,
    past: int | None = None,
    causal_fill: float = -np.inf,
) -> Any:
    """softmax(Q K^T * scale + biases) V on (B, heads, S|T, size) float arrays, causal when asked
    (query i sits at position ``past`` + i, by default the keys beyond the queries; a future key
    gets ``causal_fill``); returns (B, S, heads * v_size)."""
    b, n, s, h = q.shape
    total = k.shape[2]
    sc = 1.0 / math.sqrt(h) if scale is None or scale == 0.0 else float(scale)
    scores = xp.matmul(q * q.dtype.type(sc), k.swapaxes(-1, -2))
    for bias in biases:
        scores = scores + bias
    if unidirectional:
        # Query i (at absolute position past + i) sees keys up to its own position. Attention
        # removes the others (-inf, as onnxruntime); MultiHeadAttention gives them its
        # mask_filter_value, so a query with no key before it is uniform, not NaN.
        past = total - s if past is None else past
        future = np.arange(total)[None, :] > np.arange(s)[:, None] + past
        scores = scores + xp.asarray(np.where(future, causal_fill, 0.0).astype(scores.dtype))
    probs = _softmax(xp, scores, scores.ndim - 1, False)
    out = xp.matmul(probs, v)
    return out.transpose(0, 2, 1, 3).reshape(b, s, n * v.shape[3])


def _check_heads(n: int, op_name: str) -> None:
    if n <= 0:  # onnxruntime refuses it when loading; here it divided by zero
        raise ValueError(f"{op_name}: num_heads must be positive, got {n}")


def _split_heads(x: Any, n: int, what: str, op_name: str) -> Any:
    b, s, d = x.shape
    if d % n:
        raise ValueError(f"{op_name}: {what} hidden size {d} (shape {list(x.shape)}) is not divisible by num_heads={n}")
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def _attention_bias_check(ab: Any, b: int, n: int, s: int, total: int, op_name: str) -> Any:
    if ab.ndim != 4 or ab.shape[0] not in (1, b) or ab.shape[1] not in (1, n) or ab.shape[2:] != (s, total):
        raise ValueError(
            f"{op_name}: attention_bias has shape {list(ab.shape)}, expected [{b} or 1, {n} or 1, {s}, {total}]"
        )
    return _up(ab)


@op("Attention", 1, domain=DOMAIN, host_inputs=(3, 6))
def attention(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    weights: Any,
    bias: Any = None,
    mask_index: Any = None,
    past: Any = None,
    attention_bias: Any = None,
    past_sequence_length: Any = None,
    *,
    num_heads: int,
    do_rotary: int = 0,
    mask_filter_value: float = -10000.0,
    past_present_share_buffer: int = 0,
    qkv_hidden_sizes: list[int] | None = None,
    rotary_embedding_dim: int = 0,
    scale: float | None = None,
    unidirectional: int = 0,
    ctx: Any = None,
) -> Any:
    name = "Attention"
    _check_heads(num_heads, name)
    if do_rotary or past_present_share_buffer or past_sequence_length is not None:
        raise ValueError(f"{name}: do_rotary, past_present_share_buffer and past_sequence_length are not supported")
    if input.ndim != 3:
        raise ValueError(f"{name}: input has shape {list(input.shape)}, expected (batch, seq, input_hidden)")
    b, s, hin = input.shape
    if weights.ndim != 2 or weights.shape[0] != hin:
        raise ValueError(f"{name}: weights has shape {list(weights.shape)}, expected ({hin}, q + k + v hidden)")
    sizes = list(qkv_hidden_sizes) if qkv_hidden_sizes else [weights.shape[1] // 3] * 3
    if (
        len(sizes) != 3
        or sum(sizes) != weights.shape[1]
        or sizes[0] != sizes[1]
        or any(d <= 0 or d % num_heads for d in sizes)
    ):
        raise ValueError(
            f"{name}: weights' second dimension {weights.shape[1]} and qkv_hidden_sizes {qkv_hidden_sizes} must give "
            f"Q, K, V hidden sizes (Q = K) that are positive multiples of num_heads={num_heads}"
        )
    if bias is not None and bias.shape != (weights.shape[1],):
        raise ValueError(f"{name}: bias has shape {list(bias.shape)}, expected [{weights.shape[1]}]")
    qkv = _up(matmul(xp, _up(input), _up(weights)))
    if bias is not None:
        qkv += _up(bias)
    dq, dk = sizes[0], sizes[1]
    q = _split_heads(qkv[..., :dq], num_heads, "Q", name)
    k = _split_heads(qkv[..., dq : dq + dk], num_heads, "K", name)
    v = _split_heads(qkv[..., dq + dk :], num_heads, "V", name)
    if past is not None:
        head = dq // num_heads
        if past.ndim != 5 or past.shape[:3] != (2, b, num_heads) or past.shape[4] != head or sizes[2] != dq:
            raise ValueError(
                f"{name}: past has shape {list(past.shape)}, expected (2, {b}, {num_heads}, past_seq, {head}) "
                "and Q, K, V of one hidden size"
            )
        k = xp.concatenate([_up(past[0]), k], axis=2)
        v = xp.concatenate([_up(past[1]), v], axis=2)
    total = k.shape[2]
    biases = []
    if mask_index is not None:
        biases.append(_mask_bias(xp, mask_index, b, s, total, total, mask_filter_value, name, "mask_index"))
    if attention_bias is not None:
        biases.append(_attention_bias_check(attention_bias, b, num_heads, s, total, name))
    y = _attend(xp, q, k, v, scale, biases, unidirectional).astype(input.dtype, copy=False)
    if _n_outputs(ctx) > 1:
        if sizes[2] != dq:
            raise ValueError(f"{name}: the present output needs Q, K and V of one hidden size, got {sizes}")
        return y, xp.stack([k, v]).astype(input.dtype, copy=False)
    return y


@op("MultiHeadAttention", 1, domain=DOMAIN, host_inputs=(4, 8))
def multi_head_attention(
    xp: Any,
    query: Any,
    key: Any = None,
    value: Any = None,
    bias: Any = None,
    key_padding_mask: Any = None,
    attention_bias: Any = None,
    past_key: Any = None,
    past_value: Any = None,
    past_sequence_length: Any = None,
    cache_indirection: Any = None,
    *,
    num_heads: int,
    mask_filter_value: float = -10000.0,
    scale: float | None = None,
    unidirectional: int = 0,
    ctx: Any = None,
) -> Any:
    name = "MultiHeadAttention"
    _check_heads(num_heads, name)
    if past_sequence_length is not None or cache_indirection is not None:
        raise ValueError(f"{name}: past_sequence_length and cache_indirection (buffer sharing) are not supported")
    n = num_heads
    dt = query.dtype
    q_in = _up(query)
    projected = False  # key and value given as (B, heads, L, size), already projected
    if q_in.ndim == 5:  # packed QKV (B, L, heads, 3, size)
        if key is not None or value is not None or q_in.shape[2:4] != (n, 3):
            raise ValueError(f"{name}: packed query {list(q_in.shape)} needs (B, L, {n}, 3, size) and no key/value")
        q, k, v = (q_in[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
        k_heads = True
    else:
        if q_in.ndim != 3 or key is None:
            raise ValueError(f"{name}: query has shape {list(q_in.shape)}, expected (B, S, hidden) and a key")
        k_in = _up(key)
        if k_in.ndim == 5:  # packed KV (B, L, heads, 2, size)
            if value is not None or k_in.shape[2:4] != (n, 2):
                raise ValueError(f"{name}: packed key {list(k_in.shape)} needs (B, L, {n}, 2, size) and no value")
            k, v = (k_in[:, :, :, i].transpose(0, 2, 1, 3) for i in range(2))
            k_heads = True
        elif value is None:
            raise ValueError(f"{name}: key of shape {list(k_in.shape)} needs a value")
        else:
            k, v = k_in, _up(value)
            projected = k_heads = k.ndim == 4
            if projected and v.ndim != 4:
                raise ValueError(
                    f"{name}: key {list(k.shape)} is (B, heads, L, size): value {list(v.shape)} must be too"
                )
        q = q_in
    b = q.shape[0]
    if bias is not None:
        dq = q.shape[-1] if q.ndim == 3 else q.shape[1] * q.shape[3]
        dv = v.shape[-1] if v.ndim == 3 else v.shape[1] * v.shape[3]
        if bias.shape != (2 * dq + dv,):
            raise ValueError(f"{name}: bias has shape {list(bias.shape)}, expected [{2 * dq + dv}]")
        bb = _up(bias)
        q = q + (bb[:dq] if q.ndim == 3 else bb[:dq].reshape(n, 1, -1))
        if projected:
            pass  # onnxruntime adds only Q's bias to projected keys and values
        elif k_heads:  # packed K/V, as (B, heads, L, size) views
            k = k + bb[dq : 2 * dq].reshape(n, 1, -1)
            v = v + bb[2 * dq :].reshape(n, 1, -1)
        else:
            k = k + bb[dq : 2 * dq]
            v = v + bb[2 * dq :]
    if q.ndim == 3:
        q = _split_heads(q, n, "query", name)
    if not k_heads:
        if k.ndim != 3 or v.ndim != 3 or k.shape[:2] != v.shape[:2] or k.shape[0] != b:
            raise ValueError(f"{name}: key {list(k.shape)} and value {list(v.shape)} must be (B, L, hidden) alike")
        k = _split_heads(k, n, "key", name)
        v = _split_heads(v, n, "value", name)
    if k.shape[:3] != v.shape[:3] or k.shape[:2] != (b, n) or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"{name}: key {list(k.shape)} and value {list(v.shape)} (as B, heads, L, size) do not match "
            f"query {list(q.shape)}"
        )
    kv_len = k.shape[2]
    if (past_key is None) != (past_value is None):
        raise ValueError(f"{name}: past_key and past_value must be given together")
    if past_key is not None:
        for what, p, cur in (("past_key", past_key, k), ("past_value", past_value, v)):
            if p.ndim != 4 or p.shape[:2] != (b, n) or p.shape[3] != cur.shape[3]:
                raise ValueError(
                    f"{name}: {what} has shape {list(p.shape)}, expected ({b}, {n}, past_seq, {cur.shape[3]})"
                )
        k = xp.concatenate([_up(past_key), k], axis=2)
        v = xp.concatenate([_up(past_value), v], axis=2)
    s, total = q.shape[2], k.shape[2]
    biases = []
    if key_padding_mask is not None:
        biases.append(
            _mask_bias(xp, key_padding_mask, b, s, total, kv_len, mask_filter_value, name, "key_padding_mask")
        )
    if attention_bias is not None:
        biases.append(_attention_bias_check(attention_bias, b, n, s, total, name))
    # The causal diagonal sits past the cached keys only (onnxruntime), whatever key length
    # the current call brings.
    past_len = 0 if past_key is None else int(past_key.shape[2])
    y = _attend(xp, q, k, v, scale, biases, unidirectional, past_len, mask_filter_value).astype(dt, copy=False)
    n_out = _n_outputs(ctx)
    if n_out > 3:
        raise ValueError(f"{name}: the qk output is not supported")
    return y if n_out == 1 else (y, k.astype(dt, copy=False), v.astype(dt, copy=False))[:n_out]


# -- rotary embedding ----------------------------------------------------------------------------


@op("RotaryEmbedding", 1, domain=DOMAIN)
def rotary_embedding(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    position_ids: Any,
    cos_cache: Any,
    sin_cache: Any,
    *,
    interleaved: int = 0,
    is_packed_batching: int = 0,
    num_heads: int = 0,
    rotary_embedding_dim: int = 0,
    scale: float = 1.0,
) -> Any:
    from ..nn import rotary_embedding as rope

    name = "RotaryEmbedding"
    if is_packed_batching:
        raise ValueError(f"{name}: is_packed_batching is not supported")
    if input.ndim not in (3, 4):
        raise ValueError(f"{name}: input has shape {list(input.shape)}, expected 3-D (B, S, hidden) or 4-D")
    if cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape:
        raise ValueError(
            f"{name}: cos_cache {list(cos_cache.shape)} and sin_cache {list(sin_cache.shape)} must be 2-D alike"
        )
    b, s = input.shape[0], input.shape[-2] if input.ndim == 4 else input.shape[1]
    # position_ids: one start position for every sequence, or (B, S) positions.
    if position_ids.shape == (1,):
        start = host_ints(position_ids)[0]
        pid = xp.broadcast_to(xp.arange(start, start + s, dtype=np.int64), (b, s))
    elif position_ids.shape == (b, s):
        pid = position_ids
    else:
        raise ValueError(f"{name}: position_ids has shape {list(position_ids.shape)}, expected [1] or [{b}, {s}]")
    heads = num_heads
    if input.ndim == 3 and not heads:
        head = 2 * cos_cache.shape[1]
        if input.shape[2] % head:
            raise ValueError(
                f"{name}: hidden size {input.shape[2]} is not a multiple of the head size {head} (2 x cos_cache's "
                "last dimension); give num_heads"
            )
        heads = input.shape[2] // head
    return rope(
        xp, input, cos_cache, sin_cache, pid,
        interleaved=interleaved, num_heads=heads or None, rotary_embedding_dim=rotary_embedding_dim,
    )  # fmt: skip
