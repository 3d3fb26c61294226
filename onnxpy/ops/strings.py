"""String kernels: StringNormalizer, StringConcat, StringSplit, RegexFullMatch, TfIdfVectorizer.

String tensors are numpy object arrays of Python ``str`` and always live on the host.
"""

from __future__ import annotations

import functools
import re
import unicodedata
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


def _per_code_point(text: str, change: Any) -> str:
    """Case changed one code point at a time, as onnxruntime (towupper/towlower) does: a
    character whose full mapping is several (ß -> SS, ﬁ -> FI) keeps itself, and the final-sigma
    rule does not apply (ΣΑΣ -> σασ). Python's whole-string mapping differed on those."""
    if text.isascii():
        return change(text)
    out = []
    for c in text:
        m = change(c)
        if len(m) > 1 and all(unicodedata.combining(t) for t in m[1:]):
            m = m[0]  # İ lowers to i plus a combining dot: the letter alone, as towlower gives
        out.append(m if len(m) == 1 else c)
    return "".join(out)


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
        row = [_per_code_point(w, str.lower) for w in row]
    elif case_change_action == "UPPER":
        row = [_per_code_point(w, str.upper) for w in row]
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


# RE2's Perl classes are ASCII; Python's are Unicode unless re.ASCII, which would also make
# (?i) ASCII-only (RE2 folds Unicode case: (?i)é matches É). So they are spelled out.
_WORD = "0-9A-Za-z_"
_SPACE = "\\t\\n\\f\\r "  # RE2's \s: no vertical tab
_CLASS_ESCAPES = {"d": "0-9", "w": _WORD, "s": _SPACE}
_ESCAPES = {
    **{k: f"[{v}]" for k, v in _CLASS_ESCAPES.items()},
    **{k.upper(): f"[^{v}]" for k, v in _CLASS_ESCAPES.items()},
    "b": f"(?:(?<![{_WORD}])(?=[{_WORD}])|(?<=[{_WORD}])(?![{_WORD}]))",
    "B": f"(?:(?<![{_WORD}])(?![{_WORD}])|(?<=[{_WORD}])(?=[{_WORD}]))",
    "z": "\\Z",  # RE2's end of text is Python's \Z
}
# Python syntax RE2 does not have: refused, as onnxruntime refuses the pattern, rather than
# matched with Python's meaning.
_NOT_RE2 = {
    "Z": "\\Z (RE2 spells the end of text \\z)",
    "u": "\\u escapes (RE2 spells them \\x{hhhh})",
    "U": "\\U escapes (RE2 spells them \\x{hhhhhhhh})",
    "N": "\\N{name} escapes",
}
_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")


def _re2_to_python(pattern: str) -> str:
    r"""RE2 syntax (the spec's) for Python's re, with RE2's meaning: POSIX classes inside
    brackets ([[:alpha:]], which Python would read as a nested set) and the Perl classes \d \w
    \s \b spelled out in ASCII; \z, \x{hh}, \Q...\E and (?<name>...) translated; '{' that does not
    open a repetition is a literal, as in RE2. What RE2 refuses (lookarounds, backreferences,
    possessive repeats, \Z, (?x)...) raises. A negated POSIX class ([[:^digit:]]) must stand
    alone in its brackets; it becomes [^0-9]."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i = _escape(pattern, i, out)
            continue
        if ch == "(" and pattern.startswith("(?", i):
            i = _group(pattern, i, out)
            continue
        if ch == "{":
            m = _REPEAT.match(pattern, i)
            if m is None:
                out.append("\\{")  # RE2: a brace that opens no repetition is itself
                i += 1
                continue
            out.append(m.group(0))
            i = m.end()
            _no_possessive(pattern, i)
            continue
        if ch in "*+?":
            out.append(ch)
            i += 1
            _no_possessive(pattern, i)
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
            elif pattern[j] == "\\" and j + 1 < n and pattern[j + 1] in _CLASS_ESCAPES:
                body.append(_CLASS_ESCAPES[pattern[j + 1]])
                j += 2
            elif pattern[j] == "\\" and j + 1 < n and pattern[j + 1] in "DWS":
                raise ValueError(
                    f"RegexFullMatch: \\{pattern[j + 1]} inside brackets is not supported, in pattern {pattern!r}"
                )
            elif pattern[j] == "\\":
                body.append(pattern[j : j + 2])
                j += 2
            else:
                body.append(pattern[j])
                j += 1
        out.append("".join(body))
        i = j  # the closing ']' (if any) is copied next
    return "".join(out)


def _escape(pattern: str, i: int, out: list[str]) -> int:
    """Translate the escape at pattern[i] ('\\'); returns where the pattern goes on."""
    c = pattern[i + 1 : i + 2]
    if c in _ESCAPES:
        out.append(_ESCAPES[c])
        return i + 2
    if c in _NOT_RE2 or c.isdigit() and c != "0":
        what = _NOT_RE2.get(c, "backreferences")
        raise ValueError(f"RegexFullMatch: {what} are not RE2 syntax, in pattern {pattern!r}")
    if c == "x" and pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 3)
        code = pattern[i + 3 : end] if end > 0 else ""
        if not code or any(h not in "0123456789abcdefABCDEF" for h in code):
            raise ValueError(f"RegexFullMatch: bad \\x{{...}} escape in pattern {pattern!r}")
        out.append(re.escape(chr(int(code, 16))))
        return end + 1
    if c == "Q":  # \Q...\E: literal text
        end = pattern.find("\\E", i + 2)
        if end < 0:  # no \E: literal to the end
            end = len(pattern)
        out.append(re.escape(pattern[i + 2 : end]))
        return end + 2
    if c in "pP":
        raise ValueError(
            f"RegexFullMatch: Unicode classes (\\p...) are not supported by onnxpy, in pattern {pattern!r}"
        )
    out.append(pattern[i : i + 2])
    return i + 2


def _group(pattern: str, i: int, out: list[str]) -> int:
    """A '(?' construct: named groups become Python's (?P<name>...); lookarounds, comments,
    atomic groups and flags RE2 lacks are refused."""
    rest = pattern[i + 2 :]
    if rest.startswith("<") and not rest.startswith(("<=", "<!")):
        out.append("(?P<")
        return i + 3
    if rest.startswith(("=", "!", "<=", "<!", "#", ">", "(")) or re.match(r"[-imsU]*x", rest):
        raise ValueError(
            f"RegexFullMatch: {pattern[i : i + 4]!r}... (lookaround, comment, atomic or conditional group, "
            f"or the x flag) is not RE2 syntax, in pattern {pattern!r}"
        )
    if re.match(r"[-ims]*U", rest):
        raise ValueError(f"RegexFullMatch: the U (ungreedy) flag is not supported by onnxpy, in pattern {pattern!r}")
    out.append("(?")
    return i + 2


def _no_possessive(pattern: str, i: int) -> None:
    if pattern.startswith("+", i):
        raise ValueError(f"RegexFullMatch: possessive repeats (x++, x*+) are not RE2 syntax, in pattern {pattern!r}")


def _posix(name: str, pattern: str) -> str:
    if name not in _POSIX_CLASSES:
        raise ValueError(f"RegexFullMatch: unknown POSIX class [:{name}:] in pattern {pattern!r}")
    return _POSIX_CLASSES[name]


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    """The pattern (RE2 syntax, as the spec says) as a Python regex with RE2's meaning."""
    try:
        return re.compile(_re2_to_python(pattern))
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
