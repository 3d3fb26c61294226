"""Random generators (onnxpy/ops/randomness.py): shapes, dtypes, value ranges, determinism for a
seed (the same sequence from two sessions, a new draw on each run), and the distributions'
moments on enough samples that a wrong formula fails while chance does not."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

import onnxpy

from .test_tensor import node_model, run_error

F, D, H, BF = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16


def _session(
    op: str, inputs: dict[str, Any], outputs: dict[str, int], **kw: Any
) -> tuple[onnxpy.InferenceSession, Any]:
    model, feeds = node_model(op, inputs, outputs, **kw)
    return onnxpy.InferenceSession(model), feeds


@pytest.mark.parametrize(("elem", "dt"), [(F, np.float32), (D, np.float64), (H, np.float16), (BF, ml_dtypes.bfloat16)])
def test_random_uniform_shape_dtype_range(elem: int, dt: Any) -> None:
    sess, feeds = _session("RandomUniform", {}, {"y": elem}, shape=[200, 50], dtype=elem, low=-2.0, high=3.0)
    y = sess.run(None, feeds)[0]
    assert y.shape == (200, 50) and y.dtype == np.dtype(dt)
    v = y.astype(np.float64)
    assert v.min() >= -2.0 and v.max() <= 3.0
    assert abs(v.mean() - 0.5) < 0.1
    assert abs(v.std() - 5 / np.sqrt(12)) < 0.1


def test_random_normal_moments() -> None:
    sess, feeds = _session("RandomNormal", {}, {"y": F}, shape=[100000], mean=3.0, scale=0.5, seed=7.0)
    y = sess.run(None, feeds)[0]
    assert y.dtype == np.float32 and y.shape == (100000,)
    assert abs(float(y.mean()) - 3.0) < 0.01 and abs(float(y.std()) - 0.5) < 0.01


@pytest.mark.parametrize("op", ["RandomUniform", "RandomNormal"])
def test_seed_gives_a_reproducible_sequence(op: str) -> None:
    s1, feeds = _session(op, {}, {"y": F}, shape=[4, 3], seed=3.0)
    s2, _ = _session(op, {}, {"y": F}, shape=[4, 3], seed=3.0)
    s3, _ = _session(op, {}, {"y": F}, shape=[4, 3], seed=4.0)
    a1, a2 = s1.run(None, feeds)[0], s1.run(None, feeds)[0]
    b1, b2 = s2.run(None, feeds)[0], s2.run(None, feeds)[0]
    np.testing.assert_array_equal(a1, b1)
    np.testing.assert_array_equal(a2, b2)
    assert not np.array_equal(a1, a2), "each run draws new values"
    assert not np.array_equal(a1, s3.run(None, feeds)[0]), "another seed gives other values"


def test_no_seed_differs_between_sessions() -> None:
    s1, feeds = _session("RandomUniform", {}, {"y": F}, shape=[16])
    s2, _ = _session("RandomUniform", {}, {"y": F}, shape=[16])
    assert not np.array_equal(s1.run(None, feeds)[0], s2.run(None, feeds)[0])


@pytest.mark.parametrize("op", ["RandomUniformLike", "RandomNormalLike"])
def test_like_ops_take_shape_and_dtype(op: str) -> None:
    x = np.zeros((3, 5), np.float16)
    sess, feeds = _session(op, {"x": x}, {"y": H})
    y = sess.run(None, feeds)[0]
    assert y.shape == (3, 5) and y.dtype == np.float16
    xi = np.zeros((2, 2), np.int32)
    sess, feeds = _session(op, {"x": xi}, {"y": D}, dtype=D, seed=1.0)
    y = sess.run(None, feeds)[0]
    assert y.shape == (2, 2) and y.dtype == np.float64


def test_like_op_on_int_input_without_dtype_raises() -> None:
    msg = run_error("RandomUniformLike", {"x": np.zeros(3, np.int32)}, {"y": F})
    assert "dtype" in msg


@pytest.mark.parametrize(("elem", "dt"), [(TensorProto.INT32, np.int32), (TensorProto.INT64, np.int64)])
def test_multinomial_frequencies(elem: int, dt: Any) -> None:
    p = np.array([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    logits = np.log(np.maximum(p, 1e-30)).astype(np.float32)
    sess, feeds = _session("Multinomial", {"x": logits}, {"y": elem}, dtype=elem, sample_size=40000, seed=5.0)
    y = sess.run(None, feeds)[0]
    assert y.shape == (3, 40000) and y.dtype == np.dtype(dt)
    assert y.min() >= 0 and y.max() <= 2
    freq = np.stack([np.bincount(r, minlength=3) / r.size for r in y])
    np.testing.assert_allclose(freq, p, atol=0.015)
    assert freq[1, 2] == 0 and freq[2, 2] == 1


def test_multinomial_logits_are_unnormalized() -> None:
    # Adding a constant to a row's log-probabilities does not change the distribution.
    logits = np.array([[100.0, 100.0 + np.log(3.0)]], np.float64)
    sess, feeds = _session("Multinomial", {"x": logits}, {"y": TensorProto.INT32}, sample_size=20000, seed=2.0)
    y = sess.run(None, feeds)[0]
    assert abs(float(y.mean()) - 0.75) < 0.02


@pytest.mark.parametrize(
    ("dtype", "want"), [(None, np.float32), (TensorProto.BOOL, np.bool_), (TensorProto.INT64, np.int64)]
)
def test_bernoulli(dtype: int | None, want: Any) -> None:
    p = np.tile(np.array([0.0, 0.25, 1.0], np.float32), (20000, 1))
    kw = {} if dtype is None else {"dtype": dtype}
    elem = F if dtype is None else dtype
    sess, feeds = _session("Bernoulli", {"p": p}, {"y": elem}, opset=15, seed=0.0, **kw)
    y = sess.run(None, feeds)[0]
    assert y.shape == p.shape and y.dtype == np.dtype(want)
    v = y.astype(np.float64)
    assert set(np.unique(v).tolist()) <= {0.0, 1.0}
    assert v[:, 0].max() == 0 and v[:, 2].min() == 1
    assert abs(v[:, 1].mean() - 0.25) < 0.015
    again, _ = _session("Bernoulli", {"p": p}, {"y": elem}, opset=15, seed=0.0, **kw)
    np.testing.assert_array_equal(again.run(None, feeds)[0], y)
