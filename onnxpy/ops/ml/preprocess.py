"""ai.onnx.ml feature preprocessing: ArrayFeatureExtractor, Binarizer, CastMap, CategoryMapper,
DictVectorizer, FeatureVectorizer, Imputer, LabelEncoder, Normalizer, OneHotEncoder, Scaler, ZipMap.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...model import dtypes
from .._compat import check_alloc, host_ints
from ..registry import op
from ._common import ML, Lookup, as_map, is_string, map_values, string_array, to_host


def _decode(v: Any) -> Any:
    return v.decode("utf-8") if isinstance(v, bytes) else v


def _strings(values: Any) -> np.ndarray:
    """A string tensor / list as an object array of str."""
    arr = np.asarray(values, dtype=object) if not isinstance(values, np.ndarray) else values
    return string_array([_decode(v) for v in arr.reshape(-1).tolist()], arr.shape)


@op("ArrayFeatureExtractor", 1, domain=ML, host_inputs=(1,))
def array_feature_extractor(xp: Any, X: Any, Y: Any) -> Any:
    idx = host_ints(Y)
    last = int(X.shape[-1]) if X.ndim else 0
    bad = [i for i in idx if not 0 <= i < last]
    if bad:
        raise IndexError(f"indices {bad} are out of range for the last axis of size {last}")
    if not idx:
        raise ValueError("Y holds no index")
    if X.ndim == 1:
        return X[idx].reshape(1, len(idx))
    if is_string(X):
        return X[..., idx]
    return xp.take(X, xp.asarray(idx, dtype=xp.int64), axis=-1)


@op("Binarizer", 1, domain=ML)
def binarizer(xp: Any, X: Any, *, threshold: float = 0.0) -> Any:
    if X.dtype.kind == "f" and bool(xp.isnan(X).any()):
        raise ValueError("X holds NaN, which Binarizer cannot classify")
    return (X > threshold).astype(X.dtype)


@op("CastMap", 1, domain=ML)
def cast_map(xp: Any, X: Any, *, cast_to: str = "TO_FLOAT", map_form: str = "DENSE", max_map: int = 1) -> Any:
    m = as_map(X, "X")
    keys = sorted(int(k) for k in m)
    if cast_to not in ("TO_FLOAT", "TO_STRING", "TO_INT64"):
        raise ValueError(f"cast_to '{cast_to}' is not one of TO_FLOAT, TO_STRING, TO_INT64")
    if map_form == "DENSE":
        size = len(keys)
        slots = list(range(size))
    elif map_form == "SPARSE":
        if max_map <= 0:
            raise ValueError(f"max_map must be positive with map_form SPARSE, got {max_map}")
        size = max_map
        if keys and (keys[0] < 0 or keys[-1] >= max_map):
            raise IndexError(f"map keys must lie in [0, {max_map - 1}] with map_form SPARSE, got {keys}")
        slots = keys
    else:
        raise ValueError(f"map_form '{map_form}' is not one of DENSE, SPARSE")
    values = [m[k] for k in keys]
    if cast_to == "TO_STRING":
        # onnxruntime fills the holes of a sparse string map with "0.f".
        out = ["0.f"] * size
        for s, v in zip(slots, values):
            out[s] = v if isinstance(v, str) else f"{float(v):f}"
        return string_array(out, (1, size))
    dtype = np.float32 if cast_to == "TO_FLOAT" else np.int64
    nums = np.zeros(size, dtype=dtype)
    for s, v in zip(slots, values):
        f = float(v) if not isinstance(v, str) else _parse_number(v)
        nums[s] = f if dtype == np.float32 else (int(f) if math.isfinite(f) else 0)
    return xp.asarray(nums.reshape(1, size))


def _parse_number(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return float("nan")


@op("CategoryMapper", 1, domain=ML)
def category_mapper(
    xp: Any,
    X: Any,
    *,
    cats_int64s: list[int] | None = None,
    cats_strings: list[str] | None = None,
    default_int64: int = -1,
    default_string: str = "_Unused",
) -> Any:
    ints = list(cats_int64s or [])
    strs = [_decode(s) for s in (cats_strings or [])]
    if len(ints) != len(strs):
        raise ValueError(f"cats_int64s has {len(ints)} entries, cats_strings {len(strs)}")
    x = to_host(X)
    if is_string(x):
        return map_values(x, Lookup(string_array(strs, (len(strs),))), np.asarray(ints, dtype=np.int64), default_int64)
    values = string_array(strs, (len(strs),))
    return map_values(x.astype(np.int64), Lookup(np.asarray(ints, dtype=np.int64)), values, default_string)


@op("DictVectorizer", 1, domain=ML)
def dict_vectorizer(
    xp: Any,
    X: Any,
    *,
    int64_vocabulary: list[int] | None = None,
    string_vocabulary: list[str] | None = None,
    ctx: Any = None,
) -> Any:
    m = as_map(X, "X")
    vocab: list[Any] = [_decode(s) for s in string_vocabulary] if string_vocabulary else list(int64_vocabulary or [])
    index = {k: i for i, k in enumerate(vocab)}
    # The map's value type is only known statically; guess from the values when it is not.
    et = ctx.output_elem_types[0] if ctx is not None and ctx.output_elem_types else 0
    sample = next(iter(m.values()), None)
    if et == 8 or (et == 0 and isinstance(sample, str)):
        out = string_array([""] * len(vocab), (1, len(vocab)))
    else:
        dtype = dtypes.np_dtype(et) if et else (np.int64 if isinstance(sample, (int, np.integer)) else np.float32)
        out = np.zeros((1, len(vocab)), dtype=dtype)
    for k, v in m.items():
        i = index.get(int(k) if isinstance(k, (int, np.integer)) else _decode(k))
        if i is not None:
            out[0, i] = v
    return out if out.dtype == object else xp.asarray(out)


@op("FeatureVectorizer", 1, domain=ML)
def feature_vectorizer(xp: Any, *X: Any, inputdimensions: list[int] | None = None, ctx: Any = None) -> Any:
    dims = list(inputdimensions or [])
    if len(dims) != len(X):
        raise ValueError(f"inputdimensions has {len(dims)} entries for {len(X)} inputs")
    if any(d < 0 for d in dims):
        raise ValueError(f"inputdimensions {dims} must not be negative")
    # Explicit widths: -1 cannot be inferred when an input has no rows.
    rows = [x.reshape(1, -1) if x.ndim <= 1 else x.reshape(x.shape[0], int(np.prod(x.shape[1:]))) for x in X]
    n = rows[0].shape[0] if rows else 0
    check_alloc((n, sum(dims)), np.float32, ctx, "FeatureVectorizer")  # widths are attributes
    parts = []
    for k, (r, d) in enumerate(zip(rows, dims)):
        if r.shape[0] != n:
            raise ValueError(f"input {k} has {r.shape[0]} rows, input 0 has {n}")
        r = r.astype(xp.float32)
        if r.shape[1] >= d:
            parts.append(r[:, :d])
        else:  # shorter inputs are padded with zeros to their declared size
            parts.append(xp.concatenate([r, xp.zeros((n, d - r.shape[1]), dtype=xp.float32)], axis=1))
    return xp.concatenate(parts, axis=1) if parts else xp.zeros((0, 0), dtype=xp.float32)


@op("Imputer", 1, domain=ML)
def imputer(
    xp: Any,
    X: Any,
    *,
    imputed_value_floats: list[float] | None = None,
    imputed_value_int64s: list[int] | None = None,
    replaced_value_float: float = 0.0,
    replaced_value_int64: int = 0,
) -> Any:
    if X.dtype.kind == "f":
        values, replaced = list(imputed_value_floats or []), replaced_value_float
    else:
        values, replaced = list(imputed_value_int64s or []), replaced_value_int64
    if not values:
        raise ValueError("Imputer needs imputed_value_floats (float input) or imputed_value_int64s (integer input)")
    features = int(X.shape[-1]) if X.ndim else 1
    if len(values) not in (1, features):
        raise ValueError(f"{len(values)} imputed values for {features} features (expected 1 or {features})")
    fill = xp.asarray(values, dtype=X.dtype)
    if isinstance(replaced, float) and math.isnan(replaced):
        mask = xp.isnan(X)
    else:
        mask = X == xp.asarray(replaced, dtype=X.dtype)
    return xp.where(mask, fill if len(values) > 1 else fill[0], X)


# -- LabelEncoder -----------------------------------------------------------------------------


def _label_encode(xp: Any, X: Any, keys: Any, values: Any, default: Any, nan_matches: bool) -> Any:
    keys = np.asarray(keys)
    values = np.asarray(values) if not isinstance(values, np.ndarray) else values
    if keys.size != values.size:
        raise ValueError(f"{keys.size} keys but {values.size} values")
    if keys.dtype.kind in "OUS":
        keys = _strings(keys)
    if values.dtype.kind in "OUS":
        values = _strings(values)
    x = to_host(X)
    if is_string(x) != (keys.dtype == object):
        raise TypeError(
            f"input of {x.dtype} cannot be looked up in {'string' if keys.dtype == object else 'numeric'} keys"
        )
    out = map_values(x, Lookup(keys, nan_matches=nan_matches), values, default)
    return out if out.dtype == object else xp.asarray(out)


@op("LabelEncoder", 1, domain=ML)
def label_encoder_1(
    xp: Any,
    X: Any,
    *,
    classes_strings: list[str] | None = None,
    default_int64: int = -1,
    default_string: str = "_Unused",
) -> Any:
    classes = _strings(list(classes_strings or []))
    positions = np.arange(classes.size, dtype=np.int64)
    x = to_host(X)
    if is_string(x):
        return _label_encode(xp, x, classes, positions, default_int64, False)
    return _label_encode(xp, x.astype(np.int64), positions, classes, default_string, False)


_V2_DEFAULTS = {"int64s": "default_int64", "floats": "default_float", "strings": "default_string"}


def _v2_arrays(attrs: dict[str, Any], prefix: str) -> tuple[str, Any] | None:
    found = [(k, v) for k, v in attrs.items() if k.startswith(prefix) and v is not None]
    if len(found) > 1:
        raise ValueError(f"only one of {[k for k, _ in found]} may be set")
    if not found:
        return None
    name, v = found[0]
    kind = name[len(prefix) :]
    if kind == "int64s":
        return kind, np.asarray(v, dtype=np.int64)
    if kind == "floats":
        return kind, np.asarray(v, dtype=np.float32)
    return kind, _strings(list(v))


@op("LabelEncoder", 2, domain=ML)
def label_encoder_2(
    xp: Any,
    X: Any,
    *,
    keys_int64s: list[int] | None = None,
    keys_floats: list[float] | None = None,
    keys_strings: list[str] | None = None,
    values_int64s: list[int] | None = None,
    values_floats: list[float] | None = None,
    values_strings: list[str] | None = None,
    default_int64: int = -1,
    default_float: float = -0.0,
    default_string: str = "_Unused",
) -> Any:
    return _label_encoder(
        xp,
        X,
        dict(keys_int64s=keys_int64s, keys_floats=keys_floats, keys_strings=keys_strings),
        dict(values_int64s=values_int64s, values_floats=values_floats, values_strings=values_strings),
        dict(default_int64=default_int64, default_float=default_float, default_string=default_string),
        None,
        None,
        None,
        nan_matches=False,
    )


@op("LabelEncoder", 4, domain=ML)
def label_encoder_4(
    xp: Any,
    X: Any,
    *,
    keys_int64s: list[int] | None = None,
    keys_floats: list[float] | None = None,
    keys_strings: list[str] | None = None,
    keys_tensor: Any = None,
    values_int64s: list[int] | None = None,
    values_floats: list[float] | None = None,
    values_strings: list[str] | None = None,
    values_tensor: Any = None,
    default_int64: int = -1,
    default_float: float = -0.0,
    default_string: str = "_Unused",
    default_tensor: Any = None,
) -> Any:
    # From ml opset 4 a NaN key matches NaN inputs. Repeated keys: the first wins, as in
    # onnxruntime (the spec text says the last).
    return _label_encoder(
        xp,
        X,
        dict(keys_int64s=keys_int64s, keys_floats=keys_floats, keys_strings=keys_strings),
        dict(values_int64s=values_int64s, values_floats=values_floats, values_strings=values_strings),
        dict(default_int64=default_int64, default_float=default_float, default_string=default_string),
        keys_tensor,
        values_tensor,
        default_tensor,
        nan_matches=True,
    )


def _label_encoder(
    xp: Any,
    X: Any,
    key_attrs: dict[str, Any],
    value_attrs: dict[str, Any],
    defaults: dict[str, Any],
    keys_tensor: Any,
    values_tensor: Any,
    default_tensor: Any,
    nan_matches: bool,
) -> Any:
    k = _v2_arrays(key_attrs, "keys_")
    v = _v2_arrays(value_attrs, "values_")
    if keys_tensor is not None:
        if k is not None:
            raise ValueError("only one of keys_tensor and keys_* may be set")
        keys = keys_tensor.reshape(-1)
    elif k is not None:
        keys = k[1]
    else:
        raise ValueError("LabelEncoder needs keys (keys_int64s, keys_floats, keys_strings or keys_tensor)")
    if values_tensor is not None:
        if v is not None:
            raise ValueError("only one of values_tensor and values_* may be set")
        values = values_tensor.reshape(-1)
        if values.dtype.kind in "OUS":
            values = _strings(values)
        if default_tensor is not None:
            d = default_tensor.reshape(-1)
            if d.size != 1:
                raise ValueError(f"default_tensor must hold one value, got {d.size}")
            default = _decode(d.tolist()[0]) if values.dtype == object else d[0]
        elif values.dtype == object:
            default = defaults["default_string"]
        elif values.dtype.kind == "f":
            default = defaults["default_float"]
        else:
            default = defaults["default_int64"]
    elif v is not None:
        values = v[1]
        default = defaults[_V2_DEFAULTS[v[0]]]
    else:
        raise ValueError("LabelEncoder needs values (values_int64s, values_floats, values_strings or values_tensor)")
    x = to_host(X)
    if not is_string(x) and keys.dtype.kind in "iuf" and keys.dtype != x.dtype:
        keys = keys.astype(x.dtype) if keys.dtype.kind == x.dtype.kind else keys
    return _label_encode(xp, x, keys, values, default, nan_matches)


# -- Normalizer, OneHotEncoder, Scaler, ZipMap -------------------------------------------------


@op("Normalizer", 1, domain=ML)
def normalizer(xp: Any, X: Any, *, norm: str = "MAX") -> Any:
    x = X.astype(xp.float32) if X.dtype != xp.float64 else X
    if norm not in ("MAX", "L1", "L2"):
        raise ValueError(f"norm '{norm}' is not one of MAX, L1, L2")
    if x.ndim and x.shape[-1] == 0:
        # Rows without features: nothing to scale, and MAX has no identity to reduce to.
        return x.astype(xp.float32)
    if norm == "MAX":
        d = xp.max(x, axis=-1, keepdims=True)
    elif norm == "L1":
        d = xp.sum(xp.abs(x), axis=-1, keepdims=True)
    else:
        d = xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True))
    # A zero divisor leaves the row as it is.
    y = xp.where(d != 0, x / xp.where(d != 0, d, 1), x)
    return y.astype(xp.float32)


@op("OneHotEncoder", 1, domain=ML)
def one_hot_encoder(
    xp: Any, X: Any, *, cats_int64s: list[int] | None = None, cats_strings: list[str] | None = None, zeros: int = 1
) -> Any:
    x = to_host(X)
    if is_string(x):
        cats = string_array([_decode(s) for s in (cats_strings or [])], (len(cats_strings or []),))
        pos = Lookup(cats).find(x)
        n = cats.size
    else:
        cats_i = np.asarray(list(cats_int64s or []), dtype=np.int64)
        # Floats are truncated to integers before the lookup.
        pos = Lookup(cats_i).find(x.astype(np.int64))
        n = cats_i.size
    if not zeros and bool((pos < 0).any()):
        raise ValueError("an input value is not among the categories and zeros = 0")
    p = xp.asarray(pos)
    return (p[..., None] == xp.arange(n, dtype=xp.int64)).astype(xp.float32)


@op("Scaler", 1, domain=ML)
def scaler(xp: Any, X: Any, *, offset: list[float] | None = None, scale: list[float] | None = None) -> Any:
    off = list(offset or [])
    sc = list(scale or [])
    features = int(X.shape[-1]) if X.ndim else 1
    for name, v in (("offset", off), ("scale", sc)):
        if len(v) not in (1, features):
            raise ValueError(f"{name} has {len(v)} values for {features} features (expected 1 or {features})")
    x = X.astype(xp.float64) if X.dtype == xp.float64 else X.astype(xp.float32)
    dt = x.dtype
    y = (x - xp.asarray(off, dtype=dt)) * xp.asarray(sc, dtype=dt)
    return y.astype(xp.float32)


@op("ZipMap", 1, domain=ML)
def zip_map(
    xp: Any, X: Any, *, classlabels_int64s: list[int] | None = None, classlabels_strings: list[str] | None = None
) -> Any:
    if classlabels_strings and classlabels_int64s:
        raise ValueError("only one of classlabels_strings and classlabels_int64s may be set")
    keys: list[Any] = (
        [_decode(s) for s in classlabels_strings] if classlabels_strings else list(classlabels_int64s or [])
    )
    x = to_host(X)
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    if rows.ndim != 2 or rows.shape[1] != len(keys):
        raise ValueError(f"X of shape {list(x.shape)} needs {len(keys)} columns, one per class label")
    return [dict(zip(keys, r)) for r in rows.tolist()]
