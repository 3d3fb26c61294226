"""New keys or values split into heads and appended to a decoder's cache, in one step.

A decoder step exported with its past (GPT-2 as torch.onnx writes it) splits each layer's new
keys and values into heads and appends them to the past ones, which the graph returns as its
present state: Concat(past, Transpose<0,2,1,3>(Reshape(new, shape)), axis=2).
optimizer/passes/fuse_kv_append.py replaces those three nodes by onnxpy.fused.AppendHeads,
which writes the concatenation from the reshaped view of ``new`` directly. The copies are the
Concat's; the Reshape and Transpose steps go, each of which cost several microseconds of
Python in a step whose weight-streaming products leave the caches cold.
"""

from __future__ import annotations

from typing import Any

from ._compat import host_ints
from .registry import memoized, op
from .tensor import _reshape_target

DOMAIN = "onnxpy.fused"


@op("AppendHeads", 1, domain=DOMAIN, host_inputs=(2,))
def append_heads(xp: Any, past: Any, new: Any, shape: Any, *, allowzero: int = 0, ctx: Any = None) -> Any:
    """Concat(past, Transpose<0,2,1,3>(Reshape(new, shape)), axis=2): ``past`` (batch, heads,
    past_len, size), ``new`` reshaped by ``shape`` (Reshape's rules and ``allowzero``) to
    (batch, seq, heads, size); returns (batch, heads, past_len + seq, size)."""
    requested = tuple(host_ints(shape))
    target = memoized(
        ctx,
        ("append-heads", new.shape, requested, allowzero),
        lambda: tuple(_reshape_target(new.shape, list(requested), allowzero)),
    )
    if len(target) != 4:
        raise ValueError(
            f"AppendHeads: the new values {list(new.shape)} reshaped to {list(target)}, expected 4 dimensions "
            "(batch, seq, heads, size)"
        )
    b, s, h, d = target
    if past.ndim != 4 or (past.shape[0], past.shape[1], past.shape[3]) != (b, h, d):
        raise ValueError(
            f"AppendHeads: cannot append heads of shape {[b, h, s, d]} to the past {list(past.shape)} along "
            "axis 2: the other dimensions must be equal"
        )
    if past.dtype != new.dtype:
        raise ValueError(f"AppendHeads: the past is {past.dtype} and the new values {new.dtype}, expected one type")
    t = past.shape[2]
    out = xp.empty((b, h, t + s, d), dtype=past.dtype)
    out[:, :, :t] = past
    out[:, :, t:] = new.reshape(target).transpose(0, 2, 1, 3)
    return out
