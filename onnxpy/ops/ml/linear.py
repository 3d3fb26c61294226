"""ai.onnx.ml linear models and support vector machines.

Scores are computed in float64 and returned as float32 (the spec's output type). Where the spec
leaves the binary cases open, the outputs follow onnxruntime's observable behaviour (noted at
each place), since models exported for it expect exactly that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..registry import op
from ._common import ML, as_2d, check_post_transform, labels, logistic, probit
from ._common import post_transform as apply_transform


def _scores_input(xp: Any, X: Any) -> Any:
    return as_2d(X).astype(xp.float64)


def _pick_labels(xp: Any, classes: np.ndarray, index: Any) -> Any:
    """Label of each row's class index; string labels come back as a host object array."""
    if classes.dtype == object:
        host = index.get() if hasattr(index, "get") and not isinstance(index, np.ndarray) else np.asarray(index)
        return classes[host]
    return xp.asarray(classes)[index]


def _single_column(xp: Any, scores: Any, transform: str) -> Any:
    # onnxruntime applies only PROBIT to a lone score column; the other transforms leave it.
    return probit(xp, scores) if transform == "PROBIT" else scores


@op("LinearClassifier", 1, domain=ML)
def linear_classifier(
    xp: Any,
    X: Any,
    *,
    coefficients: list[float],
    classlabels_ints: list[int] | None = None,
    classlabels_strings: list[str] | None = None,
    intercepts: list[float] | None = None,
    multi_class: int = 0,
    post_transform: str = "NONE",
) -> Any:
    transform = check_post_transform(post_transform)
    classes = labels(classlabels_ints, classlabels_strings)
    x = _scores_input(xp, X)
    n_features = int(x.shape[1])
    coef = np.asarray(coefficients, dtype=np.float64)
    if n_features == 0 or coef.size % n_features:
        raise ValueError(f"{coef.size} coefficients do not split into rows of {n_features} features")
    n_rows = coef.size // n_features
    w = xp.asarray(coef.reshape(n_rows, n_features))
    b = np.asarray(list(intercepts or []), dtype=np.float64)
    if b.size not in (0, n_rows):
        raise ValueError(f"{b.size} intercepts for {n_rows} coefficient rows")
    scores = x @ w.T
    if b.size:
        scores = scores + xp.asarray(b)
    if n_rows == 1 and classes.size == 2:
        # One score row for two classes: the score s favours the second class. onnxruntime
        # reports [1 - s, s] (through the logistic when asked).
        s = scores[:, 0]
        label = _pick_labels(xp, classes, (s > 0).astype(xp.int64))
        if transform == "LOGISTIC":
            p = logistic(xp, s)
            z = xp.stack([1 - p, p], axis=1)
        elif transform == "PROBIT":
            z = xp.stack([probit(xp, 1 - s), probit(xp, s)], axis=1)
        else:
            z = xp.stack([1 - s, s], axis=1)
        return label, z.astype(xp.float32)
    if classes.size != n_rows:
        raise ValueError(f"{classes.size} class labels for {n_rows} coefficient rows")
    label = _pick_labels(xp, classes, xp.argmax(scores, axis=1))
    z = apply_transform(xp, scores, transform) if n_rows > 1 else _single_column(xp, scores, transform)
    return label, z.astype(xp.float32)


@op("LinearRegressor", 1, domain=ML)
def linear_regressor(
    xp: Any,
    X: Any,
    *,
    coefficients: list[float] | None = None,
    intercepts: list[float] | None = None,
    post_transform: str = "NONE",
    targets: int = 1,
) -> Any:
    transform = check_post_transform(post_transform)
    x = _scores_input(xp, X)
    coef = np.asarray(list(coefficients or []), dtype=np.float64)
    if targets <= 0 or coef.size != targets * int(x.shape[1]):
        raise ValueError(f"{coef.size} coefficients for {targets} targets of {int(x.shape[1])} features")
    y = x @ xp.asarray(coef.reshape(targets, -1)).T
    b = list(intercepts or [])
    if b:
        if len(b) != targets:
            raise ValueError(f"{len(b)} intercepts for {targets} targets")
        y = y + xp.asarray(b, dtype=xp.float64)
    y = apply_transform(xp, y, transform) if targets > 1 else _single_column(xp, y, transform)
    return y.astype(xp.float32)


# -- SVM ---------------------------------------------------------------------------------------

_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


def _kernel(xp: Any, x: Any, sv: Any, kind: str, params: list[float]) -> Any:
    """[N, n_sv] kernel values between samples and support vectors."""
    gamma, coef0, degree = (list(params) + [0.0, 0.0, 0.0])[:3]
    if kind == "LINEAR":
        return x @ sv.T
    if kind == "POLY":
        return (gamma * (x @ sv.T) + coef0) ** degree
    if kind == "SIGMOID":
        return xp.tanh(gamma * (x @ sv.T) + coef0)
    if kind == "RBF":
        d2 = xp.sum(x * x, axis=1)[:, None] + xp.sum(sv * sv, axis=1)[None, :] - 2.0 * (x @ sv.T)
        return xp.exp(-gamma * xp.maximum(d2, 0.0))
    raise ValueError(f"kernel_type '{kind}' is not one of {list(_KERNELS)}")


def _support_vectors(support_vectors: list[float] | None, n_features: int) -> np.ndarray:
    sv = np.asarray(list(support_vectors or []), dtype=np.float64)
    if n_features == 0 or sv.size % n_features:
        raise ValueError(f"{sv.size} support vector values do not split into vectors of {n_features} features")
    return sv.reshape(-1, n_features)


def _platt(xp: Any, d: Any, a: float, b: float) -> Any:
    """Probability of the first class of a pair from its decision value (libsvm's sigmoid)."""
    p = 1.0 / (1.0 + xp.exp(a * d + b))
    return xp.clip(p, 1e-7, 1 - 1e-7)


def _couple(xp: Any, r: Any) -> Any:
    """Class probabilities from pairwise ones (Wu, Lin & Weng 2004, method 2), per sample.

    ``r[n, i, j]`` is P(class i | i or j). Solves min p'Qp subject to sum(p) = 1 with the
    fixed-point iteration of the paper, vectorized over samples; a converged sample stops moving.
    """
    n, k, _ = r.shape
    eye = xp.eye(k, dtype=bool)
    rt = xp.swapaxes(r, 1, 2)
    q = xp.where(eye, 0.0, -rt * r)
    diag = xp.sum(xp.where(eye, 0.0, rt * rt), axis=2)
    q = q + xp.eye(k) * diag[:, :, None]
    p = xp.full((n, k), 1.0 / k)
    eps = 0.005 / k
    for _ in range(max(100, k)):
        qp = xp.einsum("nij,nj->ni", q, p)
        pqp = xp.sum(p * qp, axis=1)
        active = xp.max(xp.abs(qp - pqp[:, None]), axis=1) >= eps
        if not bool(active.any()):
            break
        for t in range(k):
            diff = xp.where(active, (pqp - qp[:, t]) / diag[:, t], 0.0)
            p_t = p[:, t] + diff
            pqp = (pqp + diff * (diff * diag[:, t] + 2 * qp[:, t])) / (1 + diff) ** 2
            qp = (qp + diff[:, None] * q[:, t, :]) / (1 + diff)[:, None]
            p = xp.concatenate([p[:, :t], p_t[:, None], p[:, t + 1 :]], axis=1) / (1 + diff)[:, None]
    return p


@op("SVMClassifier", 1, domain=ML)
def svm_classifier(
    xp: Any,
    X: Any,
    *,
    classlabels_ints: list[int] | None = None,
    classlabels_strings: list[str] | None = None,
    coefficients: list[float] | None = None,
    kernel_params: list[float] | None = None,
    kernel_type: str = "LINEAR",
    post_transform: str = "NONE",
    prob_a: list[float] | None = None,
    prob_b: list[float] | None = None,
    rho: list[float] | None = None,
    support_vectors: list[float] | None = None,
    vectors_per_class: list[int] | None = None,
) -> Any:
    transform = check_post_transform(post_transform)
    classes = labels(classlabels_ints, classlabels_strings)
    k = int(classes.size)
    x = _scores_input(xp, X)
    n_features = int(x.shape[1])
    coef = np.asarray(list(coefficients or []), dtype=np.float64)
    rho_v = np.asarray(list(rho or []), dtype=np.float64)
    params = list(kernel_params or [])
    pa = list(prob_a or [])
    pb = list(prob_b or [])
    if len(pa) != len(pb):
        raise ValueError(f"prob_a has {len(pa)} values, prob_b {len(pb)}")
    vpc = list(vectors_per_class or [])
    if not vpc:
        # No support vectors: one linear score per class. onnxruntime adds rho[0] to every
        # class's score, which is what exported models rely on.
        if k == 0 or coef.size % k or coef.size // k != n_features:
            raise ValueError(f"{coef.size} coefficients do not give {k} classes of {n_features} features")
        # The kernel is not applied in this mode (onnxruntime: a plain dot product whatever
        # kernel_type says; the spec is silent).
        scores = x @ xp.asarray(coef.reshape(k, n_features)).T
        if rho_v.size:
            scores = scores + float(rho_v[0])
        label = _pick_labels(xp, classes, xp.argmax(scores, axis=1))
        return label, apply_transform(xp, scores, transform).astype(xp.float32)
    if len(vpc) != k:
        raise ValueError(f"vectors_per_class has {len(vpc)} entries for {k} classes")
    sv = _support_vectors(support_vectors, n_features)
    n_sv = sv.shape[0]
    if sum(vpc) != n_sv:
        raise ValueError(f"vectors_per_class sums to {sum(vpc)}, there are {n_sv} support vectors")
    if coef.size != (k - 1) * n_sv:
        raise ValueError(f"{coef.size} coefficients, expected (classes - 1) * support vectors = {(k - 1) * n_sv}")
    coef = coef.reshape(k - 1, n_sv)
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    if rho_v.size != len(pairs):
        raise ValueError(f"rho has {rho_v.size} values for {len(pairs)} class pairs")
    starts = np.concatenate([[0], np.cumsum(vpc)]).astype(np.int64)
    # One weight column per pair (i, j): class i's vectors weigh with coef[j-1], class j's
    # with coef[i] (libsvm's one-vs-one layout).
    w = np.zeros((n_sv, len(pairs)))
    for p, (i, j) in enumerate(pairs):
        w[starts[i] : starts[i + 1], p] = coef[j - 1, starts[i] : starts[i + 1]]
        w[starts[j] : starts[j + 1], p] = coef[i, starts[j] : starts[j + 1]]
    kv = _kernel(xp, x, xp.asarray(sv), kernel_type, params)
    dec = kv @ xp.asarray(w) + xp.asarray(rho_v)
    first = np.zeros((len(pairs), k))
    second = np.zeros((len(pairs), k))
    for p, (i, j) in enumerate(pairs):
        first[p, i] = 1
        second[p, j] = 1
    wins = (dec > 0).astype(xp.float64)
    votes = wins @ xp.asarray(first) + (1 - wins) @ xp.asarray(second)
    label = _pick_labels(xp, classes, xp.argmax(votes, axis=1))
    if pa:
        if len(pa) != len(pairs):
            raise ValueError(f"prob_a has {len(pa)} values for {len(pairs)} class pairs")
        r = xp.full((x.shape[0], k, k), 0.0)
        for p, (i, j) in enumerate(pairs):
            rij = _platt(xp, dec[:, p], pa[p], pb[p])
            r[:, i, j] = rij
            r[:, j, i] = 1 - rij
        # Two classes too go through the coupling (which stops at a tolerance), as in onnxruntime.
        z = _couple(xp, r)
        # post_transform applies to the coupled probabilities too (onnxruntime: softmax of them).
        return label, apply_transform(xp, z, transform).astype(xp.float32)
    if k == 2:
        # onnxruntime's two-class layout: [-d, d], or [1 - d, d] under (zero-)softmax.
        d = dec[:, 0]
        if transform == "LOGISTIC":
            z = xp.stack([logistic(xp, -d), logistic(xp, d)], axis=1)
        elif transform in ("SOFTMAX", "SOFTMAX_ZERO"):
            z = xp.stack([1 - d, d], axis=1)
        elif transform == "PROBIT":
            z = xp.stack([probit(xp, -d), probit(xp, d)], axis=1)
        else:
            z = xp.stack([-d, d], axis=1)
        return label, z.astype(xp.float32)
    return label, apply_transform(xp, dec, transform).astype(xp.float32)


@op("SVMRegressor", 1, domain=ML)
def svm_regressor(
    xp: Any,
    X: Any,
    *,
    coefficients: list[float] | None = None,
    kernel_params: list[float] | None = None,
    kernel_type: str = "LINEAR",
    n_supports: int = 0,
    one_class: int = 0,
    post_transform: str = "NONE",
    rho: list[float] | None = None,
    support_vectors: list[float] | None = None,
) -> Any:
    check_post_transform(post_transform)
    x = _scores_input(xp, X)
    n_features = int(x.shape[1])
    coef = np.asarray(list(coefficients or []), dtype=np.float64)
    bias = float(list(rho or [0.0])[0])
    if n_supports > 0:
        sv = _support_vectors(support_vectors, n_features)
        if sv.shape[0] != n_supports or coef.size != n_supports:
            raise ValueError(
                f"n_supports {n_supports}, {sv.shape[0]} support vectors and {coef.size} coefficients must agree"
            )
        y = _kernel(xp, x, xp.asarray(sv), kernel_type, list(kernel_params or [])) @ xp.asarray(coef) + bias
    else:
        if coef.size != n_features:
            raise ValueError(f"{coef.size} coefficients for {n_features} features")
        y = x @ xp.asarray(coef) + bias
    if one_class:
        y = xp.where(y > 0, 1.0, -1.0)
    # onnxruntime applies no post transform to an SVM regressor's single score.
    return y.reshape(-1, 1).astype(xp.float32)
