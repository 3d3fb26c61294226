"""String kernels: StringNormalizer, StringConcat, StringSplit, RegexFullMatch, TfIdfVectorizer.

String tensors are numpy object arrays of Python ``str`` and always live on the host.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from ._compat import check_alloc
from .registry import op


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _strings(x: Any, what: str) -> np.ndarray:
    """A string tensor as a host object array of str."""
    arr = np.asarray(x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else x)
    if arr.dtype.kind not in "OUS":
        raise TypeError(f"{what}: expected a string tensor, got {arr.dtype}")
    if arr.dtype.kind == "O" and all(isinstance(v, str) for v in arr.reshape(-1)):
        return arr
    out = np.empty(arr.shape, dtype=object)
    out.reshape(-1)[:] = [_text(v) for v in arr.reshape(-1)]
    return out


def _map(fn: Any, arr: np.ndarray, dtype: Any = object) -> np.ndarray:
    out = np.empty(arr.shape, dtype=dtype)
    out.reshape(-1)[:] = [fn(v) for v in arr.reshape(-1)]
    return out


@op("StringNormalizer", 10)
def string_normalizer(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    case_change_action: str = "NONE",
    is_case_sensitive: int = 0,
    locale: str | None = None,
    stopwords: list[str] | None = None,
) -> Any:
    x = _strings(X, "StringNormalizer")
    if x.ndim == 2 and x.shape[0] != 1 or x.ndim not in (1, 2):
        raise ValueError(f"StringNormalizer accepts [C] or [1, C] tensors, got shape {list(x.shape)}")
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(
            f"StringNormalizer: case_change_action must be NONE, LOWER or UPPER, got '{case_change_action}'"
        )
    words = [_text(w) for w in (stopwords or [])]
    row = list(x.reshape(-1))
    if words:
        if is_case_sensitive:
            stop = set(words)
            row = [w for w in row if w not in stop]
        else:
            stop = {w.lower() for w in words}
            row = [w for w in row if w.lower() not in stop]
    if case_change_action == "LOWER":
        row = [w.lower() for w in row]
    elif case_change_action == "UPPER":
        row = [w.upper() for w in row]
    if not row:
        row = [""]  # the spec's empty value keeps one element
    out = np.empty(len(row), dtype=object)
    out[:] = row
    return out.reshape(1, -1) if x.ndim == 2 else out


@op("StringConcat", 20)
def string_concat(xp: Any, X: Any, Y: Any) -> Any:  # noqa: N803 - spec names
    x, y = _strings(X, "StringConcat"), _strings(Y, "StringConcat")
    try:
        shape = np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        raise ValueError(f"StringConcat: shapes {list(x.shape)} and {list(y.shape)} do not broadcast") from None
    out = np.empty(shape, dtype=object)
    bx, by = np.broadcast_to(x, shape), np.broadcast_to(y, shape)
    out.reshape(-1)[:] = [a + b for a, b in zip(bx.reshape(-1), by.reshape(-1))]
    return out


@op("StringSplit", 20)
def string_split(xp: Any, X: Any, *, delimiter: str | None = None, maxsplit: int | None = None) -> Any:  # noqa: N803
    x = _strings(X, "StringSplit")
    sep = delimiter or None  # unset or "": split on runs of whitespace
    limit = -1 if maxsplit is None else int(maxsplit)
    if limit < -1:
        raise ValueError(f"StringSplit: maxsplit must be >= 0, got {maxsplit}")
    # Whitespace mode drops leading and trailing whitespace, also around a maxsplit remainder;
    # an empty string has no substrings at all (as in onnxruntime), whatever the delimiter.
    parts = [
        (s.split(sep, limit) if sep is not None else s.strip().split(None, limit)) if s else [] for s in x.reshape(-1)
    ]
    width = max((len(p) for p in parts), default=0)
    y = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, : len(p)] = p
    counts = np.asarray([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    return y.reshape(tuple(x.shape) + (width,)), xp.asarray(counts)


# RE2's POSIX classes (valid only inside a bracket expression), ASCII as in RE2.
_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7f",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
_POSIX = re.compile(r"\[:(\^?)([a-z]+):\]")


def _re2_to_python(pattern: str) -> str:
    """RE2 syntax (the spec's) for Python's re: POSIX classes inside brackets ([[:alpha:]])
    spelled out, which Python would read as a nested set and match something else silently.
    A negated one ([[:^digit:]]) must stand alone in its brackets; it becomes [^0-9]."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if ch != "[":
            out.append(ch)
            i += 1
            continue
        # A bracket expression: up to its closing ']' (one right after '[' or '[^' is literal).
        whole = re.match(r"\[\[:\^([a-z]+):\]\]", pattern[i:])
        if whole:
            out.append(f"[^{_posix(whole.group(1), pattern)}]")
            i += whole.end()
            continue
        j = i + 1
        if j < n and pattern[j] == "^":
            j += 1
        if j < n and pattern[j] == "]":
            j += 1
        body: list[str] = [pattern[i:j]]
        while j < n and pattern[j] != "]":
            m = _POSIX.match(pattern, j)
            if m:
                if m.group(1):
                    raise ValueError(
                        f"RegexFullMatch: a negated POSIX class [:^{m.group(2)}:] is supported only alone in "
                        f"its brackets ([[:^{m.group(2)}:]]), in pattern {pattern!r}"
                    )
                body.append(_posix(m.group(2), pattern))
                j = m.end()
            elif pattern[j] == "\\":
                body.append(pattern[j : j + 2])
                j += 2
            else:
                body.append(pattern[j])
                j += 1
        out.append("".join(body))
        i = j  # the closing ']' (if any) is copied next
    return "".join(out)


def _posix(name: str, pattern: str) -> str:
    if name not in _POSIX_CLASSES:
        raise ValueError(f"RegexFullMatch: unknown POSIX class [:{name}:] in pattern {pattern!r}")
    return _POSIX_CLASSES[name]


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    """The pattern (RE2 syntax, as the spec says) as a Python regex with RE2's meaning: \\w, \\d,
    \\s and \\b are ASCII in RE2 (Python's match any Unicode letter or digit by default)."""
    try:
        return re.compile(_re2_to_python(pattern), re.ASCII)
    except re.error as e:
        raise ValueError(f"RegexFullMatch: invalid pattern {pattern!r}: {e}") from None


@op("RegexFullMatch", 20)
def regex_full_match(xp: Any, X: Any, *, pattern: str | None = None) -> Any:  # noqa: N803 - spec name
    if pattern is None:
        raise ValueError("RegexFullMatch needs the 'pattern' attribute")
    rx = _compile(pattern)
    x = _strings(X, "RegexFullMatch")
    return xp.asarray(_map(lambda s: rx.fullmatch(s) is not None, x, dtype=np.bool_))


# -- TfIdfVectorizer -----------------------------------------------------------------------------


def _pool_ngrams(pool: np.ndarray, counts: list[int], n: int) -> tuple[np.ndarray, int]:
    """The pool's n-grams as rows (P, n), and the overall n-gram number of the first one."""
    bounds = list(counts) + [len(pool)]
    first = 0
    for m in range(1, n):
        if m - 1 < len(counts):
            first += (bounds[m] - bounds[m - 1]) // m
    if n - 1 >= len(counts):
        return np.zeros((0, n), dtype=pool.dtype), first
    seg = pool[bounds[n - 1] : bounds[n]]
    if len(seg) % n:
        raise ValueError(f"TfIdfVectorizer: the {n}-gram part of the pool has {len(seg)} items, not a multiple of {n}")
    return seg.reshape(-1, n), first


@op("TfIdfVectorizer", 9)
def tfidf_vectorizer(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    max_gram_length: int,
    max_skip_count: int,
    min_gram_length: int,
    mode: str,
    ngram_counts: list[int],
    ngram_indexes: list[int],
    pool_int64s: list[int] | None = None,
    pool_strings: list[str] | None = None,
    weights: list[float] | None = None,
    ctx: Any = None,
) -> Any:
    if (pool_int64s is None) == (pool_strings is None):
        raise ValueError("TfIdfVectorizer needs exactly one of pool_int64s and pool_strings")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"TfIdfVectorizer: mode must be TF, IDF or TFIDF, got '{mode}'")
    if not 1 <= min_gram_length <= max_gram_length:
        raise ValueError(
            f"TfIdfVectorizer: need 1 <= min_gram_length ({min_gram_length}) <= max_gram_length ({max_gram_length})"
        )
    if pool_strings is not None:
        pool = np.empty(len(pool_strings), dtype=object)
        pool[:] = [_text(s) for s in pool_strings]
        x = _strings(X, "TfIdfVectorizer")
    else:
        pool = np.asarray(pool_int64s, dtype=np.int64)
        x = np.asarray(X.get() if hasattr(X, "get") and not isinstance(X, np.ndarray) else X)
        if x.dtype.kind not in "iu":
            raise TypeError(f"TfIdfVectorizer: pool_int64s needs an integer input, got {x.dtype}")
        x = x.astype(np.int64)
    if x.ndim not in (1, 2):
        raise ValueError(f"TfIdfVectorizer: input must be [C] or [N, C], got shape {list(x.shape)}")
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    n_rows, length = rows.shape
    out_index = np.asarray(ngram_indexes, dtype=np.int64)
    size = int(out_index.max()) + 1 if out_index.size else 0
    if out_index.size and int(out_index.min()) < 0:
        raise ValueError(f"TfIdfVectorizer: ngram_indexes must not be negative, got {int(out_index.min())}")
    check_alloc((n_rows, size), np.float32, ctx, "TfIdfVectorizer")
    w = np.ones(len(out_index), dtype=np.float32) if weights is None else np.asarray(weights, dtype=np.float32)

    # Tokens become ids into the pool's sorted vocabulary (-1 for tokens the pool never uses).
    vocab = np.unique(pool)
    pos = np.searchsorted(vocab, rows.reshape(-1)) if vocab.size else np.zeros(rows.size, dtype=np.int64)
    pos = np.minimum(pos, max(vocab.size - 1, 0))
    known = vocab[pos] == rows.reshape(-1) if vocab.size else np.zeros(rows.size, dtype=bool)
    ids = np.where(known, pos, -1).reshape(rows.shape)
    pool_ids = np.searchsorted(vocab, pool) if pool.size else np.zeros(0, dtype=np.int64)

    counts = np.zeros((n_rows, size), dtype=np.float32)
    for n in range(min_gram_length, max_gram_length + 1):
        grams, first = _pool_ngrams(pool_ids, ngram_counts, n)
        if grams.shape[0] == 0:
            continue
        # A 1-gram is the same whatever the skip: count it once.
        for skip in range(1 if n == 1 else max_skip_count + 1):
            step = skip + 1
            span = (n - 1) * step
            starts = length - span
            if starts <= 0:
                break
            cols = np.arange(starts)[:, None] + np.arange(n)[None, :] * step  # (W, n)
            win = ids[:, cols].reshape(-1, n)  # (n_rows * W, n)
            both = np.concatenate([grams, win])
            _, group = np.unique(both, axis=0, return_inverse=True)
            group = group.reshape(-1)
            table = np.full(both.shape[0], -1, dtype=np.int64)
            table[group[: grams.shape[0]]] = np.arange(grams.shape[0])
            hit = table[group[grams.shape[0] :]]  # pool n-gram number, -1 if none
            ok = (hit >= 0) & (win >= 0).all(axis=1)
            row_of = np.repeat(np.arange(n_rows), starts)[ok]
            k = first + hit[ok]
            np.add.at(counts, (row_of, out_index[k]), 1.0)
    if mode != "TF":
        scale = np.zeros(size, dtype=np.float32)
        scale[out_index] = w
        if mode == "IDF":
            counts = np.minimum(counts, 1.0)
        counts = counts * scale
    result = counts.reshape(size) if x.ndim == 1 else counts
    return xp.asarray(result.astype(np.float32, copy=False))
