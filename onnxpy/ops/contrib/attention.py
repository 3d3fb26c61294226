"""com.microsoft quantized and generative attention operators (onnxruntime's dynamic
quantization of transformers, and its decoder optimizations).

QAttention and QEmbedLayerNormalization are what ``quantize_dynamic`` makes of a fused
Attention / EmbedLayerNormalization: the float operator on dequantized operands, with the
projection as an exact integer product rescaled in float32 (quant.py's helper). GroupQueryAttention
is the KV-cached decoder attention of LLaMA-style models (grouped KV heads, per-sequence lengths,
optional rotary embedding). Semantics are onnxruntime's ContribOperators documentation, with the
details it leaves open fixed by onnxruntime's observed behaviour (tests/ops/test_contrib_attention.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._compat import host_ints
from ..nn import _softmax, _up
from ..nn import rotary_embedding as _rotary
from ..registry import op
from . import DOMAIN
from .quant import _F32, _int_matmul_to_float, _per_column, _scalar
from .transformer import _attend, _check_heads, _ln_last, _lookup, _mask_bias, _n_outputs, _split_heads

# -- QAttention ----------------------------------------------------------------------------------


@op("QAttention", 1, domain=DOMAIN, host_inputs=(5,))
def q_attention(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    weight: Any,
    bias: Any,
    input_scale: Any,
    weight_scale: Any,
    mask_index: Any = None,
    input_zero_point: Any = None,
    weight_zero_point: Any = None,
    past: Any = None,
    *,
    num_heads: int,
    do_rotary: int = 0,
    mask_filter_value: float = -10000.0,
    past_present_share_buffer: int = 0,
    scale: float | None = None,
    unidirectional: int = 0,
    ctx: Any = None,
) -> Any:
    name = "QAttention"
    _check_heads(num_heads, name)
    if do_rotary or past_present_share_buffer:
        raise ValueError(f"{name}: do_rotary and past_present_share_buffer are not supported")
    if input.ndim != 3:
        raise ValueError(f"{name}: input has shape {list(input.shape)}, expected (batch, seq, input_hidden)")
    b, s, hin = input.shape
    if weight.ndim != 2 or weight.shape[0] != hin or weight.shape[1] % 3:
        raise ValueError(f"{name}: weight has shape {list(weight.shape)}, expected ({hin}, 3 * hidden)")
    d = weight.shape[1] // 3
    if d % num_heads:
        raise ValueError(
            f"{name}: hidden size {d} (weight {list(weight.shape)}) is not divisible by num_heads={num_heads}"
        )
    if bias.shape != (3 * d,):
        raise ValueError(f"{name}: bias has shape {list(bias.shape)}, expected [{3 * d}]")
    za = None if input_zero_point is None else _scalar(input_zero_point, f"{name}: input_zero_point")
    factor = _scalar(input_scale, f"{name}: input_scale").astype(_F32) * _per_column(
        weight_scale, 3 * d, f"{name}: weight_scale"
    ).astype(_F32)
    # The integer product is exact; one float32 rescale per column, then the bias.
    qkv = _int_matmul_to_float(xp, input, za, weight, weight_zero_point, factor, bias, name)
    q, k, v = (_split_heads(qkv[..., i * d : (i + 1) * d], num_heads, "QKV", name) for i in range(3))
    if past is not None:
        hd = d // num_heads
        if past.ndim != 5 or past.shape[:3] != (2, b, num_heads) or past.shape[4] != hd:
            raise ValueError(
                f"{name}: past has shape {list(past.shape)}, expected (2, {b}, {num_heads}, past_seq, {hd})"
            )
        k = xp.concatenate([_up(past[0]), k], axis=2)
        v = xp.concatenate([_up(past[1]), v], axis=2)
    total = k.shape[2]
    biases = []
    if mask_index is not None:
        biases.append(_mask_bias(xp, mask_index, b, s, total, total, mask_filter_value, name, "mask_index"))
    dt = bias.dtype
    y = _attend(xp, q, k, v, scale, biases, unidirectional).astype(dt, copy=False)
    if _n_outputs(ctx) > 1:
        return y, xp.stack([k, v]).astype(dt, copy=False)
    return y


# -- QEmbedLayerNormalization --------------------------------------------------------------------


@op("QEmbedLayerNormalization", 1, domain=DOMAIN)
def q_embed_layer_norm(
    xp: Any,
    input_ids: Any,
    segment_ids: Any,
    word_embedding_quant: Any,
    position_embedding_quant: Any,
    segment_embedding: Any,
    gamma_quant: Any,
    beta_quant: Any,
    mask: Any,
    word_embedding_scale: Any,
    position_embedding_scale: Any,
    segment_embedding_scale: Any,
    gamma_scale: Any,
    beta_scale: Any,
    word_embedding_zero_point: Any,
    position_embedding_zero_point: Any,
    segment_embedding_zero_point: Any,
    gamma_zero_point: Any,
    beta_zero_point: Any,
    *,
    epsilon: float = 1e-12,
    ctx: Any = None,
) -> Any:
    name = "QEmbedLayerNormalization"
    if input_ids.ndim != 2:
        raise ValueError(f"{name}: input_ids has shape {list(input_ids.shape)}, expected (batch, seq)")
    b, s = input_ids.shape
    segment = (segment_ids, segment_embedding, segment_embedding_scale, segment_embedding_zero_point)
    if any(v is None for v in segment) and any(v is not None for v in segment):
        raise ValueError(f"{name}: segment_ids, segment_embedding, its scale and zero point must be given all or none")
    for what, v in (("segment_ids", segment_ids), ("mask", mask)):
        if v is not None and v.shape != input_ids.shape:
            raise ValueError(f"{name}: {what} has shape {list(v.shape)}, expected input_ids' {[b, s]}")
    hidden = word_embedding_quant.shape[-1] if word_embedding_quant.ndim == 2 else -1
    tables = [("word_embedding", word_embedding_quant), ("position_embedding", position_embedding_quant)]
    if segment_embedding is not None:
        tables.append(("segment_embedding", segment_embedding))
    for what, v in tables:
        if v.ndim != 2 or v.shape[1] != hidden:
            raise ValueError(f"{name}: {what} has shape {list(v.shape)}, expected (rows, {hidden})")
    for what, v in (("gamma", gamma_quant), ("beta", beta_quant)):
        if v.shape != (hidden,):
            raise ValueError(f"{name}: {what} has shape {list(v.shape)}, expected [{hidden}]")

    def deq(x: Any, sc: Any, zp: Any, what: str) -> Any:
        # Per-tensor (x - zp) * scale in float32, on the gathered rows only.
        zero = _scalar(zp, f"{name}: {what}'s zero point").astype(np.int32)
        return (x.astype(np.int32) - zero).astype(_F32) * _scalar(sc, f"{name}: {what}'s scale").astype(_F32)

    pos = xp.arange(s).reshape(1, s)
    total = deq(
        _lookup(xp, word_embedding_quant, input_ids, "input_ids", "word_embedding"),
        word_embedding_scale,
        word_embedding_zero_point,
        "word_embedding",
    )
    total = total + deq(
        _lookup(xp, position_embedding_quant, pos, "position ids", "position_embedding"),
        position_embedding_scale,
        position_embedding_zero_point,
        "position_embedding",
    )
    if segment_ids is not None:
        total = total + deq(
            _lookup(xp, segment_embedding, segment_ids, "segment_ids", "segment_embedding"),
            segment_embedding_scale,
            segment_embedding_zero_point,
            "segment_embedding",
        )
    normed, _, _ = _ln_last(xp, total, epsilon)
    gamma = deq(gamma_quant, gamma_scale, gamma_zero_point, "gamma")
    beta = deq(beta_quant, beta_scale, beta_zero_point, "beta")
    y = (normed * gamma + beta).astype(_F32, copy=False)
    if _n_outputs(ctx) == 1:
        return y
    # mask_index: the number of words (non-zero mask entries) of each sequence.
    if mask is None:
        mask_index = xp.zeros((b,), dtype=np.int32)
    else:
        mask_index = xp.count_nonzero(mask, axis=1).astype(np.int32)
    return y, mask_index


# -- GroupQueryAttention -------------------------------------------------------------------------


def _gqa_split(q_in: Any, key: Any, value: Any, n: int, n_kv: int, name: str) -> tuple[Any, Any, Any, int]:
    """(q, k, v) as (B, S, hidden) float arrays from separate or packed inputs, and the head size."""
    if q_in.ndim != 3:
        raise ValueError(f"{name}: query has shape {list(q_in.shape)}, expected (batch, seq, hidden)")
    if key is None and value is None:
        d = q_in.shape[2]
        if d % (n + 2 * n_kv):
            raise ValueError(
                f"{name}: packed QKV query has last dimension {d}, expected a multiple of "
                f"num_heads + 2 * kv_num_heads = {n + 2 * n_kv}"
            )
        hd = d // (n + 2 * n_kv)
        return q_in[..., : n * hd], q_in[..., n * hd : (n + n_kv) * hd], q_in[..., (n + n_kv) * hd :], hd
    if key is None or value is None:
        raise ValueError(f"{name}: key and value must be given together (or neither, for a packed query)")
    if q_in.shape[2] % n:
        raise ValueError(f"{name}: query hidden size {q_in.shape[2]} is not divisible by num_heads={n}")
    hd = q_in.shape[2] // n
    for what, t in (("key", key), ("value", value)):
        if t.ndim != 3 or t.shape[:2] != q_in.shape[:2] or t.shape[2] != n_kv * hd:
            raise ValueError(
                f"{name}: {what} has shape {list(t.shape)}, expected {[*q_in.shape[:2], n_kv * hd]} "
                f"(batch, seq, kv_num_heads * head_size)"
            )
    return q_in, _up(key), _up(value), hd


@op("GroupQueryAttention", 1, domain=DOMAIN, host_inputs=(5, 6, 16))
def group_query_attention(
    xp: Any,
    query: Any,
    key: Any = None,
    value: Any = None,
    past_key: Any = None,
    past_value: Any = None,
    seqlens_k: Any = None,
    total_sequence_length: Any = None,
    cos_cache: Any = None,
    sin_cache: Any = None,
    position_ids: Any = None,
    attention_bias: Any = None,
    head_sink: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    q_norm_weight: Any = None,
    k_norm_weight: Any = None,
    query_seqlens: Any = None,
    *,
    num_heads: int,
    kv_num_heads: int,
    causal: int = 1,
    do_rotary: int = 0,
    k_norm_epsilon: float | None = None,
    q_norm_epsilon: float | None = None,
    k_quant_type: str = "NONE",
    kv_cache_bit_width: int = 0,
    local_window_size: int = -1,
    qk_norm_epsilon: float = 1e-6,
    qk_output: int = 0,
    rotary_interleaved: int = 0,
    scale: float | None = None,
    sliding_window_cache: int = 0,
    smooth_softmax: int = -1,
    softcap: float = 0.0,
    v_quant_type: str = "NONE",
    ctx: Any = None,
) -> Any:
    name = "GroupQueryAttention"
    n, n_kv = num_heads, kv_num_heads
    if seqlens_k is None or total_sequence_length is None:
        raise ValueError(f"{name}: seqlens_k and total_sequence_length are required")
    if n <= 0 or n_kv <= 0 or n % n_kv:
        raise ValueError(f"{name}: num_heads={n} must be a positive multiple of kv_num_heads={n_kv}")
    if k_quant_type != "NONE" or v_quant_type != "NONE" or k_scale is not None or v_scale is not None:
        raise ValueError(f"{name}: a quantized KV cache is not supported")
    if sliding_window_cache or q_norm_weight is not None or k_norm_weight is not None or qk_output:
        raise ValueError(f"{name}: sliding_window_cache, q_norm_weight / k_norm_weight and qk_output are not supported")
    if not causal and local_window_size != -1:
        raise ValueError(f"{name}: local_window_size must be -1 when causal is 0, got {local_window_size}")
    dt = query.dtype
    q, k, v, hd = _gqa_split(_up(query), key, value, n, n_kv, name)
    b, s = q.shape[:2]
    lens = host_ints(seqlens_k)
    if len(lens) != b:
        raise ValueError(f"{name}: seqlens_k has shape {list(seqlens_k.shape)}, expected [{b}]")
    totals = [t + 1 for t in lens]  # T: tokens in the cache after this step, per sequence
    if query_seqlens is None:
        valid = [min(s, t) for t in totals]
    else:
        valid = host_ints(query_seqlens)
        if len(valid) != b:
            raise ValueError(f"{name}: query_seqlens has shape {list(query_seqlens.shape)}, expected [{b}]")
    if any(not 0 <= qv <= min(s, t) for qv, t in zip(valid, totals)):
        raise ValueError(
            f"{name}: seqlens_k {lens} and query_seqlens {valid} must give 0 <= valid rows <= min({s}, seqlens_k + 1)"
        )
    pasts = [t - qv for t, qv in zip(totals, valid)]  # P: tokens cached before this step
    total_len = host_ints(total_sequence_length)
    if len(total_len) != 1 or max(totals) > total_len[0]:
        raise ValueError(
            f"{name}: total_sequence_length {total_len} must be a scalar >= seqlens_k + 1 (max {max(totals)})"
        )
    past_len_buf = 0 if past_key is None else past_key.shape[2]
    if (past_key is None) != (past_value is None):
        raise ValueError(f"{name}: past_key and past_value must be given together")
    if past_key is not None:
        want = (b, n_kv, past_key.shape[2] if past_key.ndim == 4 else -1, hd)
        for what, p in (("past_key", past_key), ("past_value", past_value)):
            if p.ndim != 4 or p.shape != want:
                raise ValueError(f"{name}: {what} has shape {list(p.shape)}, expected {list(want)} (BNSH)")
    if max(pasts) > past_len_buf:
        raise ValueError(
            f"{name}: seqlens_k {lens} needs {max(pasts)} cached tokens, but past_key holds {past_len_buf}"
        )
    # Heads first: (B, heads, S, head_size).
    q = q.reshape(b, s, n, hd).transpose(0, 2, 1, 3)
    k = k.reshape(b, s, n_kv, hd).transpose(0, 2, 1, 3)
    v = v.reshape(b, s, n_kv, hd).transpose(0, 2, 1, 3)
    # The first prompt: the whole sequence is new (onnxruntime tells it by total_sequence_length).
    first_prompt = query_seqlens is None and s == total_len[0]
    if do_rotary:
        if cos_cache is None or sin_cache is None:
            raise ValueError(f"{name}: do_rotary needs cos_cache and sin_cache")
        if position_ids is None:
            # Query row i of sequence b sits at absolute position P_b + i.
            pid = xp.asarray(np.asarray(pasts, dtype=np.int64)[:, None] + np.arange(s, dtype=np.int64))
        elif position_ids.shape != (b, s):
            raise ValueError(f"{name}: position_ids has shape {list(position_ids.shape)}, expected [{b}, {s}]")
        elif first_prompt:
            # A first prompt counts up from position_ids' first element, for every sequence.
            start = host_ints(position_ids.reshape(-1)[:1])[0]
            pid = xp.broadcast_to(xp.arange(start, start + s, dtype=np.int64), (b, s))
        else:
            pid = position_ids
        rd = 2 * cos_cache.shape[1] if cos_cache.ndim == 2 else 0
        q = _rotary(xp, q, cos_cache, sin_cache, pid, interleaved=rotary_interleaved, rotary_embedding_dim=rd)
        k = _rotary(xp, k, cos_cache, sin_cache, pid, interleaved=rotary_interleaved, rotary_embedding_dim=rd)
    # The cache: past rows [0, P) then the new rows at [P, P + S) (only the valid ones when
    # query_seqlens is given), zeros elsewhere, as onnxruntime leaves it. Its length is past_key's
    # when that buffer already holds total_sequence_length (a shared buffer), else the total.
    present_len = max(past_len_buf, total_len[0])
    kc = xp.zeros((b, n_kv, present_len, hd), dtype=q.dtype)
    vc = xp.zeros((b, n_kv, present_len, hd), dtype=q.dtype)
    for i in range(b):
        p = pasts[i]
        new = min(s if query_seqlens is None else valid[i], present_len - p)
        if past_key is not None:
            kc[i, :, :p] = _up(past_key[i, :, :p])
            vc[i, :, :p] = _up(past_value[i, :, :p])
        kc[i, :, p : p + new] = k[i, :, :new]
        vc[i, :, p : p + new] = v[i, :, :new]
    tmax = max(totals)
    group = n // n_kv
    keys = xp.repeat(kc[:, :, :tmax], group, axis=1) if group > 1 else kc[:, :, :tmax]
    vals = xp.repeat(vc[:, :, :tmax], group, axis=1) if group > 1 else vc[:, :, :tmax]
    sc = 1.0 / math.sqrt(hd) if scale is None or scale == 0.0 else float(scale)
    scores = xp.matmul(q * q.dtype.type(sc), keys.swapaxes(-1, -2))
    if softcap and softcap > 0:
        cap = scores.dtype.type(softcap)
        scores = cap * xp.tanh(scores / cap)
    if attention_bias is not None:
        ab = attention_bias
        if (
            ab.ndim != 4
            or ab.shape[0] not in (1, b)
            or ab.shape[1] not in (1, n)
            or ab.shape[2] != s
            or ab.shape[3] < tmax
        ):
            raise ValueError(
                f"{name}: attention_bias has shape {list(ab.shape)}, expected [{b} or 1, {n} or 1, {s}, {total_len[0]}]"
            )
        scores = scores + _up(ab[..., :tmax])
    # Key j is visible to row i of sequence b when j < T_b, and (causal) j <= P_b + i, and
    # (local window W) j > P_b + i - W.
    j = np.arange(tmax)[None, None, :]
    pos = np.asarray(pasts)[:, None, None] + np.arange(s)[None, :, None]
    allowed = j < np.asarray(totals)[:, None, None]
    if causal:
        allowed = allowed & (j <= pos)
        if local_window_size >= 0:
            allowed = allowed & (j > pos - local_window_size)
    scores = scores + xp.asarray(np.where(allowed, 0.0, -np.inf).astype(scores.dtype))[:, None]
    if head_sink is not None or smooth_softmax == 1:
        # One more logit per head in the softmax's denominator: head_sink[h], or 0.
        if head_sink is not None and head_sink.shape != (n,):
            raise ValueError(f"{name}: head_sink has shape {list(head_sink.shape)}, expected [{n}]")
        sink = _up(head_sink).reshape(1, n, 1, 1) if head_sink is not None else xp.zeros((1, 1, 1, 1), scores.dtype)
        m = xp.maximum(scores.max(axis=-1, keepdims=True), sink.astype(scores.dtype))
        e = xp.exp(scores - m)
        probs = e / (e.sum(axis=-1, keepdims=True) + xp.exp(sink - m))
    else:
        probs = _softmax(xp, scores, scores.ndim - 1, False)
    out = xp.matmul(probs, vals).transpose(0, 2, 1, 3).reshape(b, s, n * hd).astype(dt, copy=False)
    n_out = _n_outputs(ctx)
    if n_out == 1:
        return out
    return (out, kc.astype(dt, copy=False), vc.astype(dt, copy=False))[:n_out]
