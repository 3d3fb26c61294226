"""Per-row passes without numpy's operand buffers (ops/_unbuffered.py): only where they pay,
the buffer size restored, and the normalizations' bits unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from onnxpy.ops import _unbuffered, fused, nn


def test_only_long_rows_of_large_arrays_switch_and_the_size_comes_back() -> None:
    before = np.getbufsize()
    with _unbuffered.per_row_passes(3136, 64 * 3136):
        assert np.getbufsize() == 16
    assert np.getbufsize() == before
    for row, values in [(512, 1 << 20), (8192, 1 << 20), (2048, 4096)]:
        with _unbuffered.per_row_passes(row, values):
            assert np.getbufsize() == before, (row, values)
    with pytest.raises(RuntimeError), _unbuffered.per_row_passes(2048, 1 << 20):
        raise RuntimeError("a failing kernel")
    assert np.getbufsize() == before


@pytest.fixture
def unbuffered_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = _unbuffered._unbuffered

    @contextmanager
    def counted() -> Iterator[None]:
        calls.append(np.getbufsize())
        with real():
            yield

    monkeypatch.setattr(_unbuffered, "_unbuffered", counted)
    return calls


def _kernels(shape: tuple[int, ...], calls: list[int]) -> dict[str, tuple[np.ndarray, int]]:
    """Each kernel's result and how many unbuffered contexts it entered."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    c = shape[1]
    s, b = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    rows = x.reshape(-1, shape[-2] * shape[-1])
    hs, hb = (
        rng.standard_normal(rows.shape[1]).astype(np.float32),
        rng.standard_normal(rows.shape[1]).astype(np.float32),
    )
    runs = {
        "instance": lambda: nn.instance_norm(np, x, s, b, epsilon=1e-5),
        "group": lambda: nn.group_norm(np, x, s, b, epsilon=1e-5, num_groups=c // 4),
        "layer": lambda: nn.layer_norm(np, rows, hs, hb, axis=-1, epsilon=1e-5),
        "affine": lambda: fused.channel_affine(np, x, s, b, activation="Relu"),
    }
    results = {}
    for name, run in runs.items():
        start = len(calls)
        results[name] = (run(), len(calls) - start)
    return results


def test_normalizations_give_the_buffered_bits(monkeypatch: pytest.MonkeyPatch, unbuffered_calls: list[int]) -> None:
    shape = (2, 16, 48, 48)  # planes of 2,304 values: unbuffered
    got = _kernels(shape, unbuffered_calls)
    # statistics and scaling per plane (GroupNormalization's groups of 9,216 keep the buffer
    # for their statistics), LayerNormalization's rows the same way, ChannelAffine's planes
    assert {k: n for k, (_, n) in got.items()} == {"instance": 2, "group": 1, "layer": 2, "affine": 1}
    monkeypatch.setattr(_unbuffered, "MIN_ROW", 1 << 40)
    want = _kernels(shape, unbuffered_calls)
    for name, (result, calls) in want.items():
        assert calls == 0, name
        np.testing.assert_array_equal(got[name][0], result, err_msg=name)
