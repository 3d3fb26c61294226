"""The per-call shortcuts for small arrays (a batch-1 classifier head): ReLU against a cached
0-d zero, a bias added as a row of the product's rank. Same values, dtypes and shapes as the
general forms, NaN and -0.0 included."""

from __future__ import annotations

import numpy as np
import pytest

from onnxpy.ops._clamp import _SMALL, floor_at
from onnxpy.ops.fused import fused_matmul


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
@pytest.mark.parametrize("shape", [(), (1,), (1, 128), (3, 5, 7)])
def test_relu_of_small_arrays_matches_maximum(dtype: type, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    x = np.asarray((rng.standard_normal(shape) * 10).astype(dtype))
    if x.dtype.kind == "f" and x.size >= 3:
        x.reshape(-1)[:3] = [np.nan, -0.0, 0.0]
    want = np.maximum(x, 0)
    got = floor_at(np, x.copy(), 0)
    assert np.asarray(got).dtype == x.dtype and np.shape(got) == x.shape
    np.testing.assert_array_equal(got, want)
    assert x.size < _SMALL  # the small-array path is the one under test
    if x.ndim:  # in place (a 0-d array's result is a scalar, as numpy's own maximum gives)
        inplace = x.copy()
        assert floor_at(np, inplace, 0, out=inplace) is inplace
        np.testing.assert_array_equal(inplace, want)


@pytest.mark.parametrize("a_shape", [(64,), (1, 64), (5, 64), (1, 1, 64), (2, 3, 64)])
@pytest.mark.parametrize("activation", ["", "Relu"])
def test_fused_matmul_bias_for_every_rank(a_shape: tuple[int, ...], activation: str) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal((64, 16)).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    want = a @ b + bias
    if activation:
        want = np.maximum(want, 0)
    got = fused_matmul(np, a, b, bias, activation=activation)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
