"""Helpers shared by the ai.onnx.ml kernels: post transforms, lookups, map inputs, host arrays."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._erf import erf

ML = "ai.onnx.ml"

# TreeEnsemble (ml opset 5) numbers its post transforms; the older ops name them.
POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def to_host(x: Any) -> np.ndarray:
    """String tensors and small lookups run on the host; CuPy arrays come back with .get()."""
    if isinstance(x, np.ndarray):
        return x
    return x.get() if hasattr(x, "get") else np.asarray(x)


def as_map(x: Any, what: str = "input") -> dict[Any, Any]:
    """A map value: a dict, or a 0-d object array holding one (how a session may wrap it)."""
    if isinstance(x, dict):
        return x
    if isinstance(x, np.ndarray) and x.dtype == object and x.ndim == 0 and isinstance(x.item(), dict):
        return x.item()
    raise TypeError(f"{what} must be a map (dict), got {type(x).__name__}")


def is_string(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "OUS"


def string_array(values: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


class Lookup:
    """key -> position in a key list, vectorized; the first of repeated keys wins (as onnxruntime).

    Numeric keys use a sorted copy and searchsorted; string keys a dict (object arrays hold Python
    strings, so a per-element dict lookup is as fast as anything numpy offers for them).
    ``nan_matches``: a NaN key matches NaN inputs (LabelEncoder from ml opset 4).
    """

    def __init__(self, keys: list[Any] | np.ndarray, nan_matches: bool = False) -> None:
        keys_arr = np.asarray(keys) if not isinstance(keys, np.ndarray) else keys
        self.strings = keys_arr.dtype.kind in "OUS"
        self.nan_pos = -1
        if self.strings:
            table: dict[Any, int] = {}
            for i, k in enumerate(keys_arr.reshape(-1).tolist()):
                table.setdefault(k.decode() if isinstance(k, bytes) else k, i)
            self.table = table
            return
        flat = keys_arr.reshape(-1)
        if flat.dtype.kind == "f":
            nan = np.isnan(flat)
            if nan_matches and nan.any():
                self.nan_pos = int(np.argmax(nan))
            idx = np.flatnonzero(~nan)
        else:
            idx = np.arange(flat.size)
        # Stable sort keeps the first occurrence of a repeated key first.
        order = idx[np.argsort(flat[idx], kind="stable")]
        k_sorted = flat[order]
        first = np.ones(k_sorted.size, dtype=bool)
        first[1:] = k_sorted[1:] != k_sorted[:-1]
        self.sorted_keys = k_sorted[first]
        self.positions = order[first]

    def find(self, x: np.ndarray) -> np.ndarray:
        """Position of each element of ``x`` in the keys, -1 where absent (same shape as x)."""
        if self.strings:
            get = self.table.get
            flat = [get(v.decode() if isinstance(v, bytes) else v, -1) for v in x.reshape(-1).tolist()]
            return np.asarray(flat, dtype=np.int64).reshape(x.shape)
        if x.dtype.kind in "OUS":
            raise TypeError(f"numeric keys cannot look up {x.dtype} input")
        n = self.sorted_keys.size
        if n == 0:
            pos = np.full(x.shape, -1, dtype=np.int64)
        else:
            i = np.searchsorted(self.sorted_keys, x)
            i_c = np.minimum(i, n - 1)
            hit = self.sorted_keys[i_c] == x
            pos = np.where(hit, self.positions[i_c], -1).astype(np.int64)
        if self.nan_pos >= 0 and x.dtype.kind == "f":
            pos = np.where(np.isnan(x), self.nan_pos, pos)
        return pos


def map_values(x: np.ndarray, lookup: Lookup, values: np.ndarray, default: Any) -> np.ndarray:
    """values[position of x in keys], ``default`` where x is not a key."""
    pos = lookup.find(x)
    if values.dtype == object:
        vals = values.reshape(-1).tolist()
        flat = [vals[p] if p >= 0 else default for p in pos.reshape(-1).tolist()]
        return string_array(flat, x.shape)
    if values.size == 0:
        return np.full(x.shape, default, dtype=values.dtype)
    return np.where(pos >= 0, values[np.maximum(pos, 0)], np.asarray(default, dtype=values.dtype))


# -- post transforms ---------------------------------------------------------------------------


def _erfinv(xp: Any, y: Any) -> Any:
    """Inverse erf: a closed-form first guess refined by Newton steps on the vectorized erf."""
    a = 0.147
    ln = xp.log1p(-y * y)
    t = 2.0 / (math.pi * a) + ln / 2.0
    x = xp.sign(y) * xp.sqrt(xp.sqrt(t * t - ln / a) - t)
    for _ in range(3):
        x = x - (erf(xp, x) - y) / (2.0 / math.sqrt(math.pi) * xp.exp(-x * x))
    return x


def probit(xp: Any, p: Any) -> Any:
    z = math.sqrt(2.0) * _erfinv(xp, 2.0 * p - 1.0)
    # The inverse normal CDF is -inf at 0 and +inf at 1 (a score no tree reached is 0).
    # (Outside [0, 1] it stays NaN.)
    edge = (p == 0) | (p == 1)
    return xp.where(edge, xp.where(p == 0, -xp.inf, xp.inf), z) if bool(xp.any(edge)) else z


def logistic(xp: Any, x: Any) -> Any:
    # Split by sign so exp never overflows.
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def softmax(xp: Any, s: Any) -> Any:
    e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
    return e / xp.sum(e, axis=-1, keepdims=True)


def softmax_zero(xp: Any, s: Any) -> Any:
    """Softmax over the non-zero scores of each row; zero scores stay zero."""
    nz = s != 0
    m = xp.max(xp.where(nz, s, -xp.inf), axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    e = xp.where(nz, xp.exp(s - m), 0)
    total = xp.sum(e, axis=-1, keepdims=True)
    return xp.where(total > 0, e / xp.where(total > 0, total, 1), 0)


def post_transform(xp: Any, scores: Any, name: str) -> Any:
    if name == "NONE":
        return scores
    if scores.shape[-1] == 0:
        return scores
    if name == "SOFTMAX":
        return softmax(xp, scores)
    if name == "LOGISTIC":
        return logistic(xp, scores)
    if name == "SOFTMAX_ZERO":
        return softmax_zero(xp, scores)
    if name == "PROBIT":
        return probit(xp, scores)
    raise ValueError(f"post_transform '{name}' is not one of {list(POST_TRANSFORMS)}")


def check_post_transform(name: str) -> str:
    if name not in POST_TRANSFORMS:
        raise ValueError(f"post_transform '{name}' is not one of {list(POST_TRANSFORMS)}")
    return name


def as_2d(x: Any, what: str = "X") -> Any:
    """[N, C] view of a classifier / regressor input; a 1-D input is one sample."""
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim == 2:
        return x
    if x.ndim == 0:
        return x.reshape(1, 1)
    return x.reshape(x.shape[0], -1)


def labels(ints: list[int] | None, strings: list[str] | None, what: str = "classlabels") -> np.ndarray:
    if strings:
        return string_array(list(strings), (len(strings),))
    return np.asarray(list(ints or []), dtype=np.int64)
