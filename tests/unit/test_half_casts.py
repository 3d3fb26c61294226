"""float32 <-> float16 through vectorized passes (ops/_half.py) against numpy's own casts, bit
for bit, and the Cast kernel's use of them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxpy.ops import _half, tensor


def _same_half_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float16 and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


def _to_half_cases() -> np.ndarray:
    rng = np.random.default_rng(0)
    # every 4,099th float32 bit pattern: all exponents, subnormals, infinities and NaNs
    sweep = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # exact midpoints between neighbouring halves (ties to even), on the normal and subnormal grids
    h = np.arange(0, 0x7BFF, 7, dtype=np.uint16).view(np.float16).astype(np.float64)
    nxt = (np.arange(0, 0x7BFF, 7, dtype=np.uint16) + 1).view(np.float16).astype(np.float64)
    ties = ((h + nxt) / 2).astype(np.float32)
    edges = np.array(
        [65504, 65519.996, 65520, 65536, 3.4e38, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 3 * 2.0**-26, 2.0**-14,
         2.0**-14 * (1 - 2.0**-11), 1e-45, 0.0, np.inf, np.nan],
        dtype=np.float32,
    )  # fmt: skip
    scaled = [rng.standard_normal(50_000).astype(np.float32) * s for s in (1e-6, 1e-3, 1.0, 3e4)]
    values = np.concatenate([sweep, ties, edges, *scaled])
    return np.concatenate([values, -values])


def test_float32_to_float16_gives_numpys_bits() -> None:
    x = _to_half_cases()
    with np.errstate(all="ignore"):
        want = x.astype(np.float16)
    _same_half_bits(_half.float32_to_float16(x), want)


def test_float16_to_float32_gives_numpys_bits_for_every_half() -> None:
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    got = _half.float16_to_float32(h)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), h.astype(np.float32).view(np.uint32))


def test_half_casts_in_blocks_and_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    # Several blocks with a short last one, in the input's memory order (the result keeps it),
    # and views that are not one run of memory.
    monkeypatch.setattr(_half, "_BLOCK", 1 << 15)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 50_001)) * 100).astype(np.float32)
    x[1, :4] = [np.nan, -np.inf, 1e6, -0.0]
    nhwc = rng.standard_normal((1, 30, 40, 64)).astype(np.float32)
    layouts = {"contiguous": x, "transposed": x.T, "strided": x[:, ::2], "channels_last": nhwc.transpose(0, 3, 1, 2)}
    for name, v in layouts.items():
        assert v.size > 2 * _half._BLOCK, name
        with np.errstate(all="ignore"):
            want = v.astype(np.float16)
        half = _half.float32_to_float16(v)
        _same_half_bits(half, want)
        back = _half.float16_to_float32(half)
        np.testing.assert_array_equal(back.view(np.uint32), want.astype(np.float32).view(np.uint32))
        if name in ("transposed", "channels_last"):
            assert half.strides == tuple(s // 2 for s in v.strides), name
            assert back.strides == v.strides, name


@pytest.mark.parametrize(("source", "target"), [(np.float32, np.float16), (np.float16, np.float32)])
def test_cast_kernel_takes_the_passes_from_its_threshold(
    monkeypatch: pytest.MonkeyPatch, source: type, target: type
) -> None:
    calls: list[int] = []
    name = "float32_to_float16" if target == np.float16 else "float16_to_float32"
    real = getattr(_half, name)
    monkeypatch.setattr(_half, name, lambda x: calls.append(x.size) or real(x))
    threshold = _half.MIN_VALUES_TO_HALF if target == np.float16 else _half.MIN_VALUES_FROM_HALF
    for n in (threshold - 1, threshold, 3 * threshold):
        x = (np.random.default_rng(n).standard_normal(n) * 1000).astype(source)
        got = tensor.cast_array(np, x, np.dtype(target))
        assert got.dtype == target
        np.testing.assert_array_equal(got, x.astype(target))
    assert calls == [threshold, 3 * threshold]


@pytest.mark.parametrize(("source", "target"), [(np.float32, np.float16), (np.float16, np.float32)])
def test_cast_model_matches_onnxruntime_bits(source: type, target: type) -> None:
    from onnx import TensorProto

    from tests.ops.test_reduce import node_model, run_ort, run_ours

    if source == np.float32:
        x = _to_half_cases()[:200_000]
    else:
        x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # every half
    to = TensorProto.FLOAT16 if target == np.float16 else TensorProto.FLOAT
    model = node_model("Cast", {"x": x}, 1, 19, to=to)
    got, want = run_ours(model, {"x": x})[0], run_ort(model, {"x": x})[0]
    if target == np.float16:
        _same_half_bits(got, want)
    else:
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def test_bfloat16_to_float32_gives_ml_dtypes_bits_for_every_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_half, "_BLOCK", 1 << 12)  # several blocks
    b = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    for v in (b, b.reshape(256, 256).T):  # and a transposed view (its memory order kept)
        got = _half.bfloat16_to_float32(v)
        assert got.dtype == np.float32 and got.strides == tuple(s * 2 for s in v.strides)
        np.testing.assert_array_equal(got.view(np.uint32), v.astype(np.float32).view(np.uint32))
    calls: list[int] = []
    monkeypatch.setattr(_half, "bfloat16_to_float32", lambda x: calls.append(x.size) or x.astype(np.float32))
    tensor.cast_array(np, b, np.dtype(np.float32))
    tensor.cast_array(np, b[:100], np.dtype(np.float32))
    assert calls == [1 << 16]
