"""Stacks of matrix products in one batched OpenBLAS call (``_blas.stacked_matmul``): the
same result as numpy's matmul for every layout, the batched route taken where it should be,
and numpy's route (no crash) for the small products OpenBLAS's batch cannot take."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from onnxpy.ops import _blas

batch_available = pytest.mark.skipif(
    _blas._batch_routine(np.dtype(np.float32)) is None,
    reason="numpy here bundles no OpenBLAS with a ?gemm_batch_strided known to be safe (another numpy build)",
)


@pytest.fixture
def batched_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records each attempt at the batched call: True where it ran."""
    calls: list[bool] = []
    real = _blas._gemm_stack

    def spy(*args: Any) -> bool:
        done = real(*args)
        calls.append(done)
        return done

    monkeypatch.setattr(_blas, "_gemm_stack", spy)
    return calls


def _stack(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, transposed: bool = False) -> np.ndarray:
    if transposed:  # the same values, stored with the last two axes swapped
        return np.ascontiguousarray(rng.standard_normal(shape).astype(dtype).swapaxes(-1, -2)).swapaxes(-1, -2)
    return rng.standard_normal(shape).astype(dtype)


@batch_available
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "layout", ["rows", "a transposed", "b transposed", "4-D", "head split", "out strided", "out given"]
)
def test_batched_product_matches_numpy(dtype: type, layout: str, batched_calls: list[bool]) -> None:
    rng = np.random.default_rng(3)
    lead = (2, 3) if layout == "4-D" else (8,)
    a = _stack(rng, (*lead, 160, 96), dtype, transposed=layout == "a transposed")
    b = _stack(rng, (*lead, 96, 200), dtype, transposed=layout == "b transposed")
    out = None
    if layout == "head split":  # attention's heads: a (batch, heads, seq, size) view of packed rows
        packed = rng.standard_normal((1, 160, 8 * 96)).astype(dtype)
        a = packed.reshape(1, 160, 8, 96).transpose(0, 2, 1, 3)
        b = _stack(rng, (1, 8, 96, 200), dtype)
    if layout == "out strided":
        wide = np.full((8, 160, 230), 7.0, dtype)
        out = wide[:, :, 10:210]
    if layout == "out given":
        out = np.empty((8, 160, 200), dtype)
    want = np.matmul(a, b)
    got = _blas.stacked_matmul(np, a, b, out)
    assert batched_calls == [True]
    if out is not None:
        assert got is out
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)
    if layout == "out strided":  # the columns around the slice are untouched
        assert np.all(wide[:, :, :10] == 7.0) and np.all(wide[:, :, 210:] == 7.0)


@batch_available
@pytest.mark.parametrize(
    "case",
    [
        "small products",  # at most 100^3 multiply-adds each: OpenBLAS's batch would crash
        "small stack",  # too little work in all to wake a second thread
        "one product",
        "float16",
        "unmergeable leading axes",
        "broadcast leading axes",
        "out overlaps a",
    ],
)
def test_numpy_route_where_the_batch_cannot_go(case: str, batched_calls: list[bool]) -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((16, 160, 96)).astype(np.float32)
    b = rng.standard_normal((16, 96, 200)).astype(np.float32)
    out = None
    if case == "small products":
        a, b = a[:, :64, :64], b[:, :64, :64]
    if case == "small stack":
        a, b = a[:2, :128, :64], b[:2, :64, :128]
    if case == "one product":
        a, b = a[:1], b[:1]
    if case == "float16":
        a, b = a.astype(np.float16), b.astype(np.float16)
    if case == "unmergeable leading axes":
        a = rng.standard_normal((4, 4, 160, 96)).astype(np.float32).transpose(1, 0, 2, 3)
        b = rng.standard_normal((4, 4, 96, 200)).astype(np.float32)
    if case == "broadcast leading axes":
        a = rng.standard_normal((4, 4, 160, 96)).astype(np.float32)
        b = rng.standard_normal((1, 4, 96, 200)).astype(np.float32)
    if case == "out overlaps a":  # the product written over its own left operand
        a = rng.standard_normal((16, 200, 200)).astype(np.float32)
        b = rng.standard_normal((16, 200, 200)).astype(np.float32)
        want = np.matmul(a, b)
        got = _blas.stacked_matmul(np, a, b, a)
        assert got is a and True not in batched_calls
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        return
    want = np.matmul(a, b)
    got = _blas.stacked_matmul(np, a, b, out)
    assert True not in batched_calls
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@batch_available
def test_out_sharing_a_buffer_with_a_goes_to_numpy(batched_calls: list[bool]) -> None:
    rng = np.random.default_rng(5)
    buf = rng.standard_normal((16, 200, 400)).astype(np.float32)
    a, out = buf[:, :, :200], buf[:, :, 200:]  # disjoint columns of one buffer
    b = rng.standard_normal((16, 200, 200)).astype(np.float32)
    want = np.matmul(a, b)
    got = _blas.stacked_matmul(np, a, b, out)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert batched_calls == [False]  # may_share_memory is bounds-based: BLAS is not trusted here


class _RecordingNumpy:
    """numpy for stacked_matmul, recording the operand ranks of each matmul it makes."""

    def __init__(self) -> None:
        self.ranks: list[tuple[int, int]] = []

    def matmul(self, a: Any, b: Any, out: Any = None) -> Any:
        self.ranks.append((a.ndim, b.ndim))
        return np.matmul(a, b, out=out)


@pytest.mark.parametrize(
    "layout", ["rows", "sequence first", "a transposed", "4-D", "out given", "out strided", "out is a", "empty"]
)
def test_a_stack_times_a_shared_matrix_is_one_product(layout: str) -> None:
    """(..., m, k) @ (k, n): numpy would make one product per matrix of the stack, 197 row
    products for a sequence-first attention projection (130 ms against 5 for one product)."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((8, 20, 48)).astype(np.float32)
    b = rng.standard_normal((48, 30)).astype(np.float32)
    out = None
    if layout == "sequence first":  # (tokens, batch 1, features) as a transposed view
        a = rng.standard_normal((1, 197, 48)).astype(np.float32).transpose(1, 0, 2)
    if layout == "a transposed":  # rows not evenly spaced: merged through one copy
        a = np.ascontiguousarray(a.swapaxes(-1, -2)).swapaxes(-1, -2)
    if layout == "4-D":
        a = a.reshape(2, 4, 20, 48)
    if layout == "out given":
        out = np.empty((8, 20, 30), np.float32)
    if layout == "out strided":  # not contiguous: numpy's own route
        out = np.empty((8, 20, 60), np.float32)[:, :, ::2]
    if layout == "out is a":
        a = rng.standard_normal((8, 20, 48)).astype(np.float32)
        b = rng.standard_normal((48, 48)).astype(np.float32)
        out = a
    if layout == "empty":
        a = np.zeros((3, 0, 48), np.float32)
    want = np.matmul(a, b)
    xp = _RecordingNumpy()
    got = _blas.stacked_matmul(xp, a, b, out)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if out is not None:
        assert got is out
    assert xp.ranks == [(3 if layout == "out strided" else 2, 2)]


def test_switch_off_keeps_numpy(monkeypatch: pytest.MonkeyPatch, batched_calls: list[bool]) -> None:
    monkeypatch.setattr(_blas, "batching_enabled", False)
    rng = np.random.default_rng(6)
    a = rng.standard_normal((8, 160, 96)).astype(np.float32)
    b = rng.standard_normal((8, 96, 200)).astype(np.float32)
    np.testing.assert_allclose(_blas.stacked_matmul(np, a, b), np.matmul(a, b), rtol=1e-5)
    assert batched_calls == []


def test_version_gate_refuses_unknown_openblas(monkeypatch: pytest.MonkeyPatch) -> None:
    """A version whose small-matrix threshold was not checked here keeps numpy's matmul."""
    monkeypatch.setattr(_blas, "_batch_routines", {})
    monkeypatch.setattr(_blas, "_openblas_config", lambda: "OpenBLAS 0.3.40 USE64BITINT DYNAMIC_ARCH")
    assert _blas._batch_routine(np.dtype(np.float32)) is None
    monkeypatch.setattr(_blas, "_batch_routines", {})
    monkeypatch.setattr(_blas, "_openblas_config", lambda: "")
    assert _blas._batch_routine(np.dtype(np.float64)) is None


@batch_available
def test_the_batched_call_itself_refuses_small_products() -> None:
    """The batched call refuses products OpenBLAS would send to its crashing small-matrix
    kernels, whoever calls it (not only through ``batches``): False, ``out`` untouched."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((4, 34, 34)).astype(np.float32)  # ShuffleNet's grouped 1x1 shape
    b = rng.standard_normal((4, 34, 784)).astype(np.float32)
    out = np.full((4, 34, 784), 5.0, dtype=np.float32)
    assert not _blas._gemm_stack(a, b, out, 4)
    assert np.all(out == 5.0)
    big_a = rng.standard_normal((2, 101, 101)).astype(np.float32)
    big_b = rng.standard_normal((2, 101, 101)).astype(np.float32)
    big_out = np.empty((2, 101, 101), dtype=np.float32)
    assert _blas._gemm_stack(big_a, big_b, big_out, 2)
    np.testing.assert_allclose(big_out, big_a @ big_b, rtol=1e-4, atol=1e-3)


def test_padded_rows_lift_winograd_sized_products_past_the_minimum() -> None:
    mnk = _blas._BATCH_MIN_MNK
    # 36 frequencies of (49 tiles x 128) @ (128 x 128): 0.80 M each, 62 rows make them 1.02 M.
    rows = _blas.padded_rows(36, 49, 128, 128, np.float32)
    assert rows == 62 and rows * 128 * 128 > mnk >= (rows - 1) * 128 * 128
    assert _blas.padded_rows(36, 49, 128, 160, np.float32) == 49  # already past it: no padding
    assert _blas.padded_rows(36, 49, 96, 96, np.float32) == 49  # 109 rows would be 2.2x the work
    assert _blas.padded_rows(36, 196, 64, 64, np.float32) == 196  # K = N = 64: measured slower padded
    assert _blas.padded_rows(4, 49, 128, 128, np.float32) == 49  # too few products to share out


def test_padded_rows_stay_when_batching_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_blas, "batching_enabled", False)
    assert _blas.padded_rows(36, 49, 128, 128, np.float32) == 49


def test_padded_rows_stay_without_the_batched_routine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another numpy build (no known-safe batched routine): padding would only add work."""
    monkeypatch.setattr(_blas, "_batch_routine", lambda dtype: None)
    assert _blas.padded_rows(36, 49, 128, 128, np.float32) == 49
    assert _blas.padded_rows(36, 49, 128, 128, np.float16) == 49


@batch_available
def test_many_products_are_batched_below_the_total(batched_calls: list[bool]) -> None:
    """16 products of just over the product minimum: 16 M multiply-adds in all, under the
    total a stack needs by default, batched when the caller says the stack is a Winograd one."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((16, 49, 128)).astype(np.float32)
    b = rng.standard_normal((16, 128, 160)).astype(np.float32)
    assert 16 * 49 * 128 * 160 < _blas._BATCH_MIN_TOTAL
    want = np.matmul(a, b)
    np.testing.assert_allclose(_blas.stacked_matmul(np, a, b), want, rtol=1e-4, atol=1e-3)
    assert batched_calls == []
    np.testing.assert_allclose(_blas.stacked_matmul(np, a, b, many=True), want, rtol=1e-4, atol=1e-3)
    assert batched_calls == [True]


@batch_available
def test_winograd_with_padded_products_matches_the_plain_one(batched_calls: list[bool]) -> None:
    """Channels-last Winograd on a 28x28 map of 128 channels (49 tiles of F(4x4)): its products
    go to the batched call padded with zero rows, and the result equals the unpadded route's."""
    from onnxpy.ops import _winograd_cl, conv

    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 128, 28, 28)).astype(np.float32)
    w = rng.standard_normal((128, 128, 3, 3)).astype(np.float32) * 0.05
    b = rng.standard_normal(128).astype(np.float32)
    u_cl = np.ascontiguousarray(conv._transform_weights(np, w, 4).transpose(0, 2, 1))
    matrices = conv._transforms(4, np.float32)
    got = _winograd_cl.winograd_channels_last(x, u_cl, matrices, 4, [1, 1], [28, 28], b)
    assert batched_calls == [True]
    _blas.batching_enabled = False
    try:
        want = _winograd_cl.winograd_channels_last(x, u_cl, matrices, 4, [1, 1], [28, 28], b)
    finally:
        _blas.batching_enabled = True
    assert batched_calls == [True]  # the second run took numpy's route
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
