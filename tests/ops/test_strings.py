"""String kernels (onnxpy/ops/strings.py) against onnxruntime, or a Python oracle where
onnxruntime cannot run the case (StringNormalizer needs an installed en_US locale): stop words with
and without case, [C] and [1, C] inputs, split modes and maxsplit, broadcasting concat, regexes, and
TfIdfVectorizer's modes, skips and pools."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

from tests.helpers import skip_before_onnxruntime

from .test_tensor import node_model, onnxpy_only, run_error, run_ort, vs_ort

S, F, I64, BOOL = TensorProto.STRING, TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _s(*v: Any) -> np.ndarray:
    return np.array(v, dtype=object)


# -- StringNormalizer ----------------------------------------------------------------------------


def _normalize_oracle(words: list[str], stop: list[str], sensitive: int, action: str) -> list[str]:
    kept = [w for w in words if (w if sensitive else w.lower()) not in {(t if sensitive else t.lower()) for t in stop}]

    # One code point at a time, as onnxruntime's towupper/towlower: ß stays ß in upper case.
    def one_by_one(w: str, change: Any) -> str:
        return "".join(change(ch) if len(change(ch)) == 1 else ch for ch in w)

    kept = [{"LOWER": one_by_one(w, str.lower), "UPPER": one_by_one(w, str.upper)}.get(action, w) for w in kept]
    return kept or [""]


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("sensitive", [0, 1])
@pytest.mark.parametrize("two_d", [False, True])
def test_string_normalizer(action: str, sensitive: int, two_d: bool) -> None:
    words = ["Monday", "tuesday", "MONDAY", "wednesday", "Straße"]
    stop = ["monday", "WEDNESDAY"]
    x = _s(*words).reshape(1, -1) if two_d else _s(*words)
    got = onnxpy_only(
        "StringNormalizer",
        {"x": x},
        {"y": S},
        opset=10,
        case_change_action=action,
        is_case_sensitive=sensitive,
        stopwords=stop,
    )[0]
    want = _normalize_oracle(words, stop, sensitive, action)
    assert got.shape == ((1, len(want)) if two_d else (len(want),))
    assert got.reshape(-1).tolist() == want


@pytest.mark.parametrize("action", ["LOWER", "UPPER"])
def test_string_normalizer_changes_case_one_code_point_at_a_time(action: str) -> None:
    # onnxruntime maps each code point alone (towupper/towlower): no ß -> SS, no final sigma,
    # İ lowers to plain i. Python's whole-string mapping differed on all three.
    words = ["Straße", "ﬁx", "İSTANBUL", "ΣΑΣ", "plain"]
    got = onnxpy_only("StringNormalizer", {"x": _s(*words)}, {"y": S}, opset=10, case_change_action=action)[0]
    want = {
        "UPPER": ["STRAßE", "ﬁX", "İSTANBUL", "ΣΑΣ", "PLAIN"],
        "LOWER": ["straße", "ﬁx", "istanbul", "σασ", "plain"],
    }[action]
    assert got.tolist() == want
    # onnxruntime agrees where it can load the model (it needs the locale installed).
    model, feeds = node_model(
        "StringNormalizer", {"x": _s(*words)}, {"y": S}, opset=10, case_change_action=action, locale="C.UTF-8"
    )
    try:
        theirs = run_ort(model, feeds)
    except Exception:  # noqa: BLE001 - no such locale on this machine: the literal above stands
        return
    assert theirs[0].tolist() == want


@pytest.mark.parametrize("two_d", [False, True])
def test_string_normalizer_everything_removed(two_d: bool) -> None:
    x = _s("a", "A").reshape(1, -1) if two_d else _s("a", "A")
    got = onnxpy_only("StringNormalizer", {"x": x}, {"y": S}, opset=10, stopwords=["a"])[0]
    assert got.shape == ((1, 1) if two_d else (1,)) and got.reshape(-1).tolist() == [""]


def test_string_normalizer_no_stopwords_keeps_all() -> None:
    got = onnxpy_only("StringNormalizer", {"x": _s("x", "Y")}, {"y": S}, opset=10)[0]
    assert got.tolist() == ["x", "Y"]


def test_string_normalizer_bad_shape_raises() -> None:
    assert "[C]" in run_error("StringNormalizer", {"x": _s("a", "b", "c", "d").reshape(2, 2)}, {"y": S}, opset=10)


# -- StringConcat / StringSplit / RegexFullMatch -------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (_s("a", "b"), _s("1", "22")),
        (_s("a", "b").reshape(2, 1), _s("1", "22", "é")),
        (np.array("x", dtype=object), _s("", "y")),
        (_s(), _s("z")),
    ],
)
def test_string_concat(a: np.ndarray, b: np.ndarray) -> None:
    vs_ort("StringConcat", {"a": a, "b": b}, {"y": S}, opset=20)


@pytest.mark.parametrize(
    ("delimiter", "maxsplit"),
    [(None, None), ("", None), (",", None), (",", 1), (None, 1), ("--", None), (None, 0)],
)
def test_string_split(delimiter: str | None, maxsplit: int | None) -> None:
    x = _s("  a  b c ", "x,,y,", "", "p--q----r", "single").reshape(1, 5)
    kw = {k: v for k, v in (("delimiter", delimiter), ("maxsplit", maxsplit)) if v is not None}
    vs_ort("StringSplit", {"x": x}, {"y": S, "n": I64}, opset=20, **kw)


@pytest.mark.parametrize(
    "pattern", [r"www\.[\w.-]+\.\bcom\b", r"[a-z]+@[a-z]+\.(com|org)", r"", r".*", r"(ab)*c?", r"\d{2,3}"]
)
def test_regex_full_match(pattern: str) -> None:
    x = _s("www.google.com", "abc", "ab", "abababc", "me@site.org", "12", "1234", "", "www.a.b.com").reshape(3, 3)
    vs_ort("RegexFullMatch", {"x": x}, {"y": BOOL}, opset=20, pattern=pattern)


@pytest.mark.parametrize(
    "pattern",
    ["[[:alpha:]]+", "[[:digit:]a-z]+", r"\w+", r"\d+\s?", "[[:^digit:]]+", "[^[:space:]]+", "[[:punct:][:upper:]]+"],
)
def test_regex_full_match_has_re2_meaning(pattern: str) -> None:
    """RE2 syntax, as the spec says: POSIX classes in brackets, and ASCII \\w, \\d, \\s.
    Python's re read [[:alpha:]] as a nested set and its \\w matched 'ü'."""
    x = _s("abc", "\u00fcn\u00ef", "ab12", "A_9", " \t", "X-Y!", "42 ", "\u0663").reshape(2, 4)
    vs_ort("RegexFullMatch", {"x": x}, {"y": BOOL}, opset=20, pattern=pattern)


@pytest.mark.parametrize(
    "pattern",
    [
        "(?i)\u00e9",  # RE2 folds Unicode case (Python's re.ASCII only ASCII)
        "(?i)s",  # matches the long s, as RE2
        r"a\sb",  # RE2's \s has no vertical tab
        r"[\s]+",
        r"\S+",
        "a{,2}",  # not a repetition in RE2: literal text
        r"\Aab\z",
        r"\x{e9}",
        r"\Qa.c\E",
        r"(?<n>a)bc",
        r"\bab\b",
        r"\w+\B",
    ],
)
def test_regex_full_match_translates_re2_syntax(pattern: str) -> None:
    x = _s("\u00c9", "\u00e9", "\u017f", "a\x0bb", "a b", "a{,2}", "aa", "ab", "a.c", "abc", "abx", "").reshape(3, 4)
    vs_ort("RegexFullMatch", {"x": x}, {"y": BOOL}, opset=20, pattern=pattern)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(?=a)abc", "lookaround"),
        ("(?<=a)bc", "lookaround"),
        (r"(a)\1", "backreferences"),
        ("a++", "possessive"),
        (r"abc\Z", "RE2 spells the end of text"),
        (r"\u00e9", "RE2 spells them"),
        ("(?x)a b", "x flag"),
        ("(?#c)abc", "comment"),
        (r"\pL", "Unicode classes"),
    ],
)
def test_regex_refuses_what_re2_does_not_have(pattern: str, why: str) -> None:
    # Python would match these with its own meaning; onnxruntime (RE2) refuses them.
    message = run_error("RegexFullMatch", {"x": _s("abc")}, {"y": BOOL}, opset=20, pattern=pattern)
    assert why in message


def test_regex_bad_pattern_raises() -> None:
    assert "pattern" in run_error("RegexFullMatch", {"x": _s("a")}, {"y": BOOL}, opset=20, pattern="(a")


# -- TfIdfVectorizer -----------------------------------------------------------------------------

INT_POOL = {
    "ngram_counts": [0, 4],
    "ngram_indexes": [0, 1, 2, 3, 4, 5, 6],
    "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7],  # 1-grams: 2 3 5 4; 2-grams: (5,6) (7,8) (6,7)
}


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize(("lo", "hi", "skip"), [(1, 1, 0), (2, 2, 0), (2, 2, 5), (1, 2, 3), (1, 2, 0)])
@pytest.mark.parametrize("batch", [False, True])
def test_tfidf_int_pool(mode: str, lo: int, hi: int, skip: int, batch: bool) -> None:
    x = np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], dtype=np.int32)
    if not batch:
        x = x.reshape(-1)
    vs_ort(
        "TfIdfVectorizer",
        {"x": x},
        {"y": F},
        opset=9,
        mode=mode,
        min_gram_length=lo,
        max_gram_length=hi,
        max_skip_count=skip,
        weights=[0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5],
        **INT_POOL,
    )


def test_tfidf_string_pool_and_shared_output_index() -> None:
    skip_before_onnxruntime((1, 24), "counts n-grams that share an output index differently from later versions")
    x = _s("a", "b", "c", "a", "b", "b", "c", "x", "a", "b").reshape(2, 5)
    vs_ort(
        "TfIdfVectorizer",
        {"x": x},
        {"y": F},
        opset=9,
        mode="TFIDF",
        min_gram_length=1,
        max_gram_length=2,
        max_skip_count=1,
        ngram_counts=[0, 3],
        ngram_indexes=[4, 1, 2, 3, 0],
        pool_strings=["a", "b", "c", "a", "b", "b", "c"],
        weights=[1.0, 2.0, 3.0, 4.0, 5.0],
    )


def test_tfidf_int64_input_and_short_rows() -> None:
    x = np.array([[7], [5]], dtype=np.int64)  # rows shorter than any 2-gram
    vs_ort(
        "TfIdfVectorizer",
        {"x": x},
        {"y": F},
        opset=9,
        mode="TF",
        min_gram_length=1,
        max_gram_length=2,
        max_skip_count=2,
        **INT_POOL,
    )


def test_tfidf_needs_one_pool() -> None:
    msg = run_error(
        "TfIdfVectorizer",
        {"x": np.array([1, 2], np.int64)},
        {"y": F},
        opset=9,
        mode="TF",
        min_gram_length=1,
        max_gram_length=1,
        max_skip_count=0,
        ngram_counts=[0],
        ngram_indexes=[0],
    )
    assert "pool" in msg
