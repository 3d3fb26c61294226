"""Random generators: RandomUniform(Like), RandomNormal(Like), Multinomial, Bernoulli.

Each node owns one numpy Generator for the life of the session, created on first use from the
node's ``seed`` (or from fresh OS entropy without one) and advanced by every run, as onnxruntime
does: two sessions of the same seeded model produce the same sequence of outputs. Values are drawn
on the host in float64 and then cast; random ops are rarely large enough for that to matter.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from ..model import dtypes
from ._compat import check_alloc
from .registry import op

_LOCK = threading.Lock()
_GENERATORS: dict[int, np.random.Generator] = {}
#: the seed of nodes without a ``seed`` attribute, once set_seed was called (else OS entropy)
_DEFAULT_SEED: int | None = None


def set_seed(seed: int) -> None:
    """Sets the seed used for random number generation: every random node without a ``seed``
    attribute whose generator is created from now on (at its first run) starts from it, as
    onnxruntime's nodes start from its global seed. Any int; negative ones wrap to 64 bits."""
    global _DEFAULT_SEED
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"set_seed: the seed must be an int, got {type(seed).__name__}")
    _DEFAULT_SEED = int(seed) & 0xFFFFFFFFFFFFFFFF


_FLOAT_OUT = frozenset(
    np.dtype(d)
    for d in (np.float16, np.float32, np.float64, dtypes.np_dtype(16))  # 16: bfloat16
)


def _seed_value(seed: float) -> int:
    """The float ``seed`` attribute as a non-negative integer seed (distinct floats stay distinct)."""
    f = float(seed)
    if f.is_integer() and f >= 0:
        return int(f)
    return int(np.float64(f).view(np.uint64))


def _generator(ctx: Any, seed: float | None) -> np.random.Generator:
    def fresh() -> np.random.Generator:
        return np.random.default_rng(_DEFAULT_SEED if seed is None else _seed_value(seed))

    if ctx is None:
        return fresh()
    key = id(ctx)
    with _LOCK:
        gen = _GENERATORS.get(key)
        if gen is None:
            gen = fresh()
            _GENERATORS[key] = gen
            # Forget the generator with its node (the session that owns the context).
            weakref.finalize(ctx, _GENERATORS.pop, key, None)
        return gen


def _float_dtype(elem: int, what: str) -> np.dtype:
    dt = dtypes.np_dtype(elem)
    if dt not in _FLOAT_OUT:
        raise TypeError(f"{what}: dtype must be float16, bfloat16, float or double, got {dt}")
    return dt


def _like_dtype(input: Any, dtype: int | None, what: str) -> np.dtype:  # noqa: A002 - spec name
    if dtype is not None:
        return _float_dtype(dtype, what)
    if input.dtype not in _FLOAT_OUT:
        raise TypeError(f"{what}: the input is {input.dtype}; set the 'dtype' attribute to a float type")
    return input.dtype


def _uniform(xp: Any, shape: tuple[int, ...], dt: np.dtype, low: float, high: float, seed: Any, ctx: Any) -> Any:
    check_alloc(shape, dt, ctx, "RandomUniform")
    vals = _generator(ctx, seed).uniform(low, high, size=shape)
    return xp.asarray(vals.astype(dt))


def _normal(xp: Any, shape: tuple[int, ...], dt: np.dtype, mean: float, scale: float, seed: Any, ctx: Any) -> Any:
    check_alloc(shape, dt, ctx, "RandomNormal")
    vals = _generator(ctx, seed).normal(mean, scale, size=shape)
    return xp.asarray(vals.astype(dt))


@op("RandomUniform", 1)
def random_uniform(
    xp: Any,
    *,
    shape: list[int],
    dtype: int = 1,
    high: float = 1.0,
    low: float = 0.0,
    seed: float | None = None,
    ctx: Any = None,
) -> Any:
    return _uniform(xp, tuple(shape), _float_dtype(dtype, "RandomUniform"), low, high, seed, ctx)


@op("RandomNormal", 1)
def random_normal(
    xp: Any,
    *,
    shape: list[int],
    dtype: int = 1,
    mean: float = 0.0,
    scale: float = 1.0,
    seed: float | None = None,
    ctx: Any = None,
) -> Any:
    return _normal(xp, tuple(shape), _float_dtype(dtype, "RandomNormal"), mean, scale, seed, ctx)


@op("RandomUniformLike", 1)
def random_uniform_like(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    *,
    dtype: int | None = None,
    high: float = 1.0,
    low: float = 0.0,
    seed: float | None = None,
    ctx: Any = None,
) -> Any:
    dt = _like_dtype(input, dtype, "RandomUniformLike")
    return _uniform(xp, tuple(input.shape), dt, low, high, seed, ctx)


@op("RandomNormalLike", 1)
def random_normal_like(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    *,
    dtype: int | None = None,
    mean: float = 0.0,
    scale: float = 1.0,
    seed: float | None = None,
    ctx: Any = None,
) -> Any:
    dt = _like_dtype(input, dtype, "RandomNormalLike")
    return _normal(xp, tuple(input.shape), dt, mean, scale, seed, ctx)


@op("Multinomial", 7)
def multinomial(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    *,
    dtype: int = 6,
    sample_size: int = 1,
    seed: float | None = None,
    ctx: Any = None,
) -> Any:
    out_dt = dtypes.np_dtype(dtype)
    if out_dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"Multinomial: dtype must be int32 or int64, got {out_dt}")
    if input.ndim != 2:
        raise ValueError(f"Multinomial: input must be [batch_size, class_size], got shape {list(input.shape)}")
    if sample_size < 1:
        raise ValueError(f"Multinomial: sample_size must be >= 1, got {sample_size}")
    batch, classes = input.shape
    if classes == 0:
        raise ValueError("Multinomial: class_size must be >= 1")
    check_alloc((batch, sample_size), out_dt, ctx, "Multinomial")
    logits = np.asarray(input.get() if hasattr(input, "get") and not isinstance(input, np.ndarray) else input)
    logits = logits.astype(np.float64)
    # The input holds unnormalized log-probabilities: softmax per row, then invert the CDF.
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    cdf = np.cumsum(probs, axis=1)
    cdf /= cdf[:, -1:]
    u = _generator(ctx, seed).random((batch, sample_size))
    # One searchsorted over all rows: shift row r's CDF and draws by r so the rows stay sorted.
    rows = np.arange(batch, dtype=np.float64)[:, None]
    flat = (cdf + rows).reshape(-1)
    pos = np.searchsorted(flat, (u + rows).reshape(-1), side="right").reshape(batch, sample_size)
    pos = np.minimum(pos - np.arange(batch)[:, None] * classes, classes - 1)
    return xp.asarray(pos.astype(out_dt))


@op("Bernoulli", 15)
def bernoulli(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    *,
    dtype: int | None = None,
    seed: float | None = None,
    ctx: Any = None,
) -> Any:
    out_dt = input.dtype if dtype is None else dtypes.np_dtype(dtype)
    check_alloc(input.shape, out_dt, ctx, "Bernoulli")
    p = np.asarray(input.get() if hasattr(input, "get") and not isinstance(input, np.ndarray) else input)
    u = _generator(ctx, seed).random(p.shape)
    return xp.asarray((u < p.astype(np.float64)).astype(out_dt))
