"""The host fast paths of Softmax (shared shift) and LayerNormalization (BLAS row statistics)
against float64 definitions, including the rows that force their fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from onnxpy.ops import nn


def _softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_rows_far_below_the_tensor_maximum_are_exact(dtype: type) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 3, 16, 40)) * 8).astype(dtype)
    x[0, 0, 3] = -10_000.0  # a fully masked attention row
    x[0, 1, 5, :20] = -1e9  # a partly masked row
    x[1, 2, 7] += -200.0  # a row whose maximum is far below the tensor's
    x[1, 0, 0, 0] = 80.0  # one large value sets the shared shift
    got = nn.softmax(np, x, axis=-1)
    assert got.dtype == dtype and got.shape == x.shape
    # Entries below 1e-9 of their row may sit near float32's subnormal range after the shared shift.
    np.testing.assert_allclose(got, _softmax64(x), rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(got[0, 0, 3], np.full(40, 1 / 40), rtol=1e-6)


def test_softmax_non_finite_inputs_follow_the_per_row_form() -> None:
    x = np.zeros((4, 5), dtype=np.float32)
    x[0] = -np.inf  # all -inf: NaN, as onnxruntime
    x[1, 2] = -np.inf  # one -inf: zero weight
    x[2, 1] = np.nan
    x[3, 4] = np.inf
    with np.errstate(all="ignore"):
        got = nn.softmax(np, x, axis=-1)
    assert np.isnan(got[0]).all()
    np.testing.assert_allclose(got[1], [0.25, 0.25, 0, 0.25, 0.25])
    assert np.isnan(got[2]).all()
    assert got[3, 4] == 1 or np.isnan(got[3, 4])


def test_softmax_says_no_nan_only_when_it_can_prove_it() -> None:
    # Attention skips its NaN guard's scan when Softmax proves every row finite.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8, 16)).astype(np.float32)
    probs, nan_free = nn._softmax_checked(np, x, 2, False)
    assert nan_free and not np.isnan(probs).any()
    masked = x.copy()
    masked[1, 3, :4] = -np.inf  # partly hidden rows stay finite
    probs, nan_free = nn._softmax_checked(np, masked, 2, False)
    assert nan_free and not np.isnan(probs).any()
    masked[0, 2] = -np.inf  # a fully hidden row is NaN: no proof
    with np.errstate(invalid="ignore"):  # as sessions run kernels
        probs, nan_free = nn._softmax_checked(np, masked, 2, False)
    assert not nan_free and np.isnan(probs[0, 2]).all()
    with_nan = x.copy()
    with_nan[0, 0, 0] = np.nan
    probs, nan_free = nn._softmax_checked(np, with_nan, 2, False)
    assert not nan_free and np.isnan(probs[0, 0]).all()


@pytest.mark.parametrize("shape,axis", [((2, 7, 64), -1), ((3, 4, 5, 6), 2), ((1, 1), -1), ((5, 300), 1)])
def test_layer_norm_fast_path_matches_float64(shape: tuple[int, ...], axis: int) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 3 + 5).astype(np.float32)
    inner = shape[axis:]
    scale = rng.standard_normal(inner).astype(np.float32)
    bias = rng.standard_normal(inner).astype(np.float32)
    got, mean, inv = nn.layer_norm(np, x, scale, bias, axis=axis, ctx=_Ctx(3))
    axes = tuple(range(axis % x.ndim, x.ndim))
    x64 = x.astype(np.float64)
    m = x64.mean(axis=axes, keepdims=True)
    v = ((x64 - m) ** 2).mean(axis=axes, keepdims=True)
    want = (x64 - m) / np.sqrt(v + 1e-5) * scale + bias
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(mean, m, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(inv, 1 / np.sqrt(v + 1e-5), rtol=1e-5)
    assert got.dtype == np.float32 and mean.shape == m.shape


@pytest.mark.parametrize("shape", [(1, 1, 256), (1, 768), (3000,), (1, 1, 1, 8)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_of_one_row_matches_float64_and_the_rows_form(
    shape: tuple[int, ...], dtype: type, with_bias: bool
) -> None:
    # One row (a decoder step's token) takes the scalar-statistics path; several rows the
    # BLAS row statistics. Both agree with float64 and with each other.
    rng = np.random.default_rng(2)
    n = shape[-1]
    x = (rng.standard_normal(shape) * 4 + 3).astype(dtype)
    scale = rng.standard_normal(n).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype) if with_bias else None
    got = nn.layer_norm(np, x, scale, bias)
    assert got.shape == x.shape and got.dtype == dtype
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean()) / np.sqrt(x64.var() + 1e-5) * scale + (0 if bias is None else bias)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    rows = np.stack([x.reshape(-1), x.reshape(-1)[::-1]])  # two rows: the other path
    np.testing.assert_allclose(nn.layer_norm(np, rows, scale, bias)[0], got.reshape(-1), rtol=tol, atol=tol)


class _Ctx:
    def __init__(self, n_outputs: int) -> None:
        self.n_outputs = n_outputs
        self.output_elem_types = (1, 1, 1)


def test_layer_norm_over_an_empty_axis_is_refused_like_onnxruntime() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        nn.layer_norm(np, np.zeros((3, 0), np.float32), np.ones(0, np.float32), None, axis=-1)
    empty_rows = nn.layer_norm(np, np.zeros((0, 4), np.float32), np.ones(4, np.float32), None, axis=-1)
    assert empty_rows.shape == (0, 4)


@pytest.mark.parametrize("shape", [(1, 4, 1, 1), (1, 4, 1, 33), (2, 5), (64, 16), (1, 12, 1, 600)])
def test_small_softmax_matches_the_blocked_form_and_proves_what_it_can(shape: tuple[int, ...]) -> None:
    """Small arrays (a decoder step's scores) take five ufunc calls with per-row shifts: the
    values of the shared-shift form, the same non-finite rows, and the same NaN-free proof."""
    rng = np.random.default_rng(len(shape) + shape[-1])
    x = (rng.standard_normal(shape) * 5).astype(np.float32)
    assert x.size <= nn._SOFTMAX_SMALL_VALUES and x.size <= nn._SOFTMAX_SMALL_ROWS * shape[-1]
    probs, nan_free = nn._softmax_checked(np, x, x.ndim - 1, False)
    blocked, blocked_free = nn._softmax_rows_shared_shift(x)
    assert nan_free and blocked_free
    np.testing.assert_allclose(probs, _softmax64(x), rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(probs, blocked, rtol=2e-6, atol=1e-9)
    rows = x.reshape(-1, shape[-1])
    if rows.shape[0] >= 2:
        rows[0] = -np.inf  # a fully masked row: NaN, and no proof
        rows[-1, 0] = np.nan
        with np.errstate(invalid="ignore"):
            probs, nan_free = nn._softmax_checked(np, x, x.ndim - 1, False)
        flat = probs.reshape(rows.shape)
        assert not nan_free and np.isnan(flat[0]).all() and np.isnan(flat[-1]).all()
        np.testing.assert_allclose(flat[1:-1], _softmax64(rows[1:-1]), rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("shape", [(1, 1, 32), (32,), (4, 7, 16)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_single_output_path_gives_the_general_values(shape, dtype, with_bias: bool) -> None:
    """One output over the last axis with vector scale and bias takes the short path: the same
    operations as the general form's (which the three-output call takes), so the same bits."""
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    scale = rng.standard_normal(shape[-1]).astype(dtype)
    bias = rng.standard_normal(shape[-1]).astype(dtype) if with_bias else None
    short = nn.layer_norm(np, x, scale, bias, ctx=_Ctx(1))
    general = nn.layer_norm(np, x, scale, bias, ctx=_Ctx(3))[0]
    assert short.dtype == dtype and short.shape == x.shape
    np.testing.assert_array_equal(short, general)
    # a (1, W) scale broadcasts the general way, to the same values
    broadcast = nn.layer_norm(np, x, scale.reshape(1, -1), bias)
    np.testing.assert_array_equal(broadcast, general if x.ndim > 1 else general[None])
    with pytest.raises(ValueError, match="rank >= 1"):
        nn.layer_norm(np, np.array(1.0, dtype), np.array(1.0, dtype), None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log_softmax_rows_against_the_definition(dtype: type) -> None:
    # One shift per block, rows far below it redone with their own; an all -inf row is NaN as
    # in the general form; +inf anywhere leaves the rows form (None).
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 40, 64)) * 8).astype(dtype)
    x[0, 3, :20] = -np.inf  # partly masked
    x[1, 7] -= 500.0  # far below the shared shift: its sum would underflow
    x[2, 0, 0] = 90.0
    x[2, 5] = -np.inf  # fully masked
    with np.errstate(all="ignore"):
        got = nn._log_softmax_rows(x)
        general = nn._softmax_general(np, x, 2, True)
    x64 = x.astype(np.float64)
    top = x64.max(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        want = x64 - top - np.log(np.exp(x64 - top).sum(axis=-1, keepdims=True))
    assert got is not None and got.dtype == dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(general))
    assert np.isnan(got[2, 5]).all() and np.isneginf(got[0, 3, :20]).all()
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=2e-5)
    x[1, 2, 3] = np.inf
    assert nn._log_softmax_rows(x) is None
