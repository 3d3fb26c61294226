"""The vectorized erf and the fitted float32 GELU against the math library, on dense grids."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from onnxpy.ops import _erf
from onnxpy.ops.elementwise import gelu


def _gelu_exact(x: np.ndarray) -> np.ndarray:
    return np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64)])


def test_float32_gelu_is_within_1e6_of_the_definition() -> None:
    x = np.linspace(-12, 12, 240_001, dtype=np.float32)
    got = _erf.gelu32(np, x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _gelu_exact(x), rtol=0, atol=1e-6)


def test_float32_gelu_tails_and_specials() -> None:
    x = np.array([0.0, -0.0, 1e-30, -1e-30, 50.0, -50.0, 1e30, np.inf, np.nan], dtype=np.float32)
    with np.errstate(all="ignore"):
        got = _erf.gelu32(np, x)
    np.testing.assert_allclose(got[:7], [0, 0, 5e-31, -5e-31, 50, 0, 1e30], rtol=1e-6, atol=1e-36)
    assert got[7] == np.inf and np.isnan(got[8])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_gelu_kernel_matches_the_definition_in_each_dtype(dtype: type) -> None:
    x = np.random.default_rng(0).standard_normal(10_000).astype(dtype) * 4
    got = gelu(np, x)
    assert got.dtype == dtype
    tol = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-12}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), _gelu_exact(x), rtol=tol, atol=tol)


def test_float32_erf_matches_math_erf() -> None:
    x = np.linspace(-6, 6, 120_001, dtype=np.float32)
    want = np.array([math.erf(v) for v in x.astype(np.float64)])
    np.testing.assert_allclose(_erf.erf(np, x), want, rtol=0, atol=5e-7)


def test_float32_erf_is_relatively_exact_near_zero_and_saturates_silently() -> None:
    # erf = tanh(x P(x^2)): relative error stays small near 0 (no absolute floor), signed zeros
    # and infinities come out exactly, and past the fit huge |x| (x^2 overflowing) gives +-1
    # without a warning, only ever closer to 1 further out.
    tiny = np.geomspace(1e-38, 0.5, 20_001, dtype=np.float32)
    want = np.array([math.erf(v) for v in tiny.astype(np.float64)])
    big = np.geomspace(3, 3e38, 20_000, dtype=np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(_erf.erf(np, tiny), want, rtol=1e-6, atol=0)
        np.testing.assert_allclose(-_erf.erf(np, -tiny), want, rtol=1e-6, atol=0)
        pos, neg = _erf.erf(np, big), _erf.erf(np, -big)
        got = _erf.erf(np, specials)
    want_big = np.array([math.erf(v) for v in big.astype(np.float64)])
    np.testing.assert_allclose(pos, want_big, rtol=0, atol=5e-7)
    assert np.all(np.diff(pos) >= 0) and np.all(pos <= 1)
    np.testing.assert_array_equal(neg, -pos)
    assert np.all(pos[big > 6] == 1)
    np.testing.assert_array_equal(got[:4], [0.0, -0.0, 1.0, -1.0])
    assert not np.signbit(got[0]) and np.signbit(got[1]) and np.isnan(got[4])


def test_float32_gelu_saturates_beyond_the_fit_without_warnings() -> None:
    # The fit covers |x| <= 5; beyond it the polynomial is not clamped, so every larger |x|
    # (through overflow of x^2 and Q(x^2)) must still give x and -0, silently.
    big = np.geomspace(5, 3e38, 20_000, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pos = _erf.gelu32(np, big)
        neg = _erf.gelu32(np, -big)
    np.testing.assert_allclose(pos, big, rtol=1e-6)
    assert np.all(np.abs(neg) <= 1.5e-6) and np.all(neg <= 0)
    assert np.all(np.diff(neg[big > 6]) >= 0)  # only ever closer to 0 further out


def test_large_gelu_in_blocks_gives_the_whole_array_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    # Over two blocks the GELU runs block by block (cache-sized temporaries): the same passes,
    # so the same bits as one whole-array pass, in any layout, the last block short.
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 50_003)) * 6).astype(np.float32)
    x[0, :5] = [np.nan, np.inf, -np.inf, 3e38, -3e38]
    nhwc = (rng.standard_normal((1, 30, 40, 64)) * 6).astype(np.float32)
    layouts = {"contiguous": x, "transposed": x.T, "strided": x[:, ::2], "channels_last": nhwc.transpose(0, 3, 1, 2)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # overflow stays silent in blocks too
        blocked = {k: _erf.gelu32(np, v) for k, v in layouts.items()}
    monkeypatch.setattr(_erf, "_GELU_BLOCK", 1 << 30)
    for name, v in layouts.items():
        assert v.size > 2 * (1 << 15), name
        whole = _erf.gelu32(np, v)
        assert blocked[name].shape == v.shape and blocked[name].dtype == np.float32
        # blocks run in the input's memory order, and the result keeps it
        if name in ("transposed", "channels_last"):
            assert not blocked[name].flags.c_contiguous and blocked[name].strides == v.strides
        np.testing.assert_array_equal(blocked[name], whole, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_large_erf_in_blocks_gives_the_whole_array_bits(monkeypatch: pytest.MonkeyPatch, dtype: type) -> None:
    # Over two blocks the float32 erf runs block by block in the input's memory order (the
    # result keeps it): the same passes, so the same bits as one whole-array pass, the last
    # block short, specials included, half precision cast per block.
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 50_001)) * 3).astype(dtype)
    x[0, :5] = [np.nan, np.inf, -np.inf, 60000, -60000]
    nhwc = (rng.standard_normal((1, 30, 40, 64)) * 3).astype(dtype)
    layouts = {"contiguous": x, "transposed": x.T, "strided": x[:, ::2], "channels_last": nhwc.transpose(0, 3, 1, 2)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        blocked = {k: _erf.erf(np, v) for k, v in layouts.items()}
        scaled = _erf._erf32(np, x, 0.7071067811865476)
    monkeypatch.setattr(_erf, "_ERF_BLOCK", 1 << 30)
    for name, v in layouts.items():
        assert v.size > 2 * (1 << 15), name
        whole = _erf.erf(np, v)
        assert blocked[name].shape == v.shape and blocked[name].dtype == dtype
        if name in ("transposed", "channels_last"):
            assert blocked[name].strides == v.strides
        np.testing.assert_array_equal(blocked[name], whole)
    np.testing.assert_array_equal(scaled, _erf._erf32(np, x, 0.7071067811865476))
