"""Channels-last depthwise convolution (onnxpy/ops/_depthwise.py) and the channels-last 1x1
path that keeps its results channels-last, against the direct definition in test_conv."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import onnxpy
from onnxpy.ops import _depthwise, _derived, _layout
from onnxpy.ops.conv import conv_nd
from onnxpy.ops.fused import fused_conv
from tests.ops.test_conv import reference_conv

CASES = [
    # x shape, kernel, strides, pads (begin..., end...)
    ((1, 8, 12, 12), (3, 3), [1, 1], [1, 1, 1, 1]),
    ((2, 5, 9, 11), (3, 3), [2, 2], [1, 1, 1, 1]),
    ((1, 6, 10, 9), (5, 5), [1, 1], [2, 2, 2, 2]),
    ((1, 6, 13, 12), (5, 5), [2, 2], [2, 1, 0, 3]),
    ((1, 4, 11, 10), (3, 2), [3, 2], [0, 2, 3, 1]),  # stride 3: three phase planes per axis
    ((1, 3, 7, 8), (1, 3), [1, 2], [0, 1, 0, 1]),
    ((1, 7, 6, 6), (3, 3), [1, 1], [0, 0, 0, 0]),  # no padding
    ((1, 4, 5, 5), (3, 3), [2, 2], [4, 0, 0, 4]),  # whole rows and columns of padding
    ((1, 3, 3, 3), (3, 3), [1, 1], [1, 1, 1, 1]),
    ((1, 2, 1, 1), (2, 2), [4, 4], [4, 4, 0, 0]),  # the windows read only padding
    ((1, 2, 3, 9), (2, 3), [4, 3], [0, 1, 5, 0]),  # the last input rows are never read
    # Column stride 2 on rows of 28 outputs and more: the input stored by column parity.
    ((2, 5, 9, 58), (3, 3), [2, 2], [1, 1, 1, 1]),
    ((1, 3, 7, 60), (5, 5), [2, 2], [2, 1, 0, 3]),
    ((1, 4, 6, 57), (2, 4), [1, 2], [1, 2, 0, 1]),  # even kernel width
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,k,strides,pads", CASES)
def test_matches_the_direct_definition(
    xs: tuple[int, ...], k: tuple[int, int], strides: list[int], pads: list[int], dtype: Any
) -> None:
    rng = np.random.default_rng(sum(xs) * 7 + sum(k) + sum(pads))
    c = xs[1]
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((c, 1, *k)).astype(dtype)
    b = rng.standard_normal(c).astype(dtype)
    got = conv_nd(np, x, w, b, group=c, strides=strides, pads=pads)
    want = reference_conv(x, w, b, strides, pads, [1, 1], c)
    assert got.shape == want.shape and got.dtype == dtype
    assert _layout.is_channels_last(got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_positions", [1, 2, 3])
@pytest.mark.parametrize("xs,k,strides,pads", [case for case in CASES if case[2][1] == 1])
def test_stride_1_rows_in_chunks_of_positions(
    monkeypatch: pytest.MonkeyPatch,
    xs: tuple[int, ...],
    k: tuple[int, int],
    strides: list[int],
    pads: list[int],
    chunk_positions: int,
) -> None:
    """At stride 1 each output row is reduced in chunks of q positions (the largest divisor of
    the row length with q * C within _CHUNK_VALUES): forced here to chunks of 1-3 positions."""
    c = xs[1]
    monkeypatch.setattr(_depthwise, "_CHUNK_VALUES", chunk_positions * c)
    rng = np.random.default_rng(sum(xs) + chunk_positions)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((c, 1, *k)).astype(np.float32)
    got = conv_nd(np, x, w, None, group=c, strides=strides, pads=pads)
    want = reference_conv(x, w, None, strides, pads, [1, 1], c)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "cols,q0,q1", [(9, 0, 9), (9, 2, 7), (9, 3, 8), (8, 1, 2), (8, 5, 5), (7, 6, 7), (7, 0, 12), (6, 4, 9)]
)
def test_put_writes_columns_stored_by_parity(cols: int, q0: int, q1: int) -> None:
    """At column stride 2 the zero-bordered buffer holds its even columns, then its odd ones."""
    rng = np.random.default_rng(cols + q0 + q1)
    plain = rng.standard_normal((3, cols, 2))
    phased = np.concatenate([plain[:, 0::2], plain[:, 1::2]], axis=1)
    value = rng.standard_normal((2, min(q1, cols) - q0, 2))
    plain[1:3, q0:q1] = value
    _depthwise._put(phased, 1, 3, q0, q1, value)
    np.testing.assert_array_equal(phased, np.concatenate([plain[:, 0::2], plain[:, 1::2]], axis=1))
    _depthwise._put(phased, 0, 1, q0, q1, 0)
    plain[0:1, q0:q1] = 0
    np.testing.assert_array_equal(phased, np.concatenate([plain[:, 0::2], plain[:, 1::2]], axis=1))


def test_stride_2_columns_run_phased(monkeypatch: pytest.MonkeyPatch) -> None:
    phased: list[bool] = []
    original = _depthwise._depthwise_image

    def spy(*args: Any) -> None:
        phased.append(args[6])  # (p, w, bias, strides, y, epilogue, phased, dilations)
        original(*args)

    monkeypatch.setattr(_depthwise, "_depthwise_image", spy)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 6, 11, 60)).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    for strides in ([2, 2], [1, 1], [2, 3]):
        got = conv_nd(np, x, w, None, group=6, strides=strides, pads=[1, 1, 1, 1])
        want = reference_conv(x, w, None, strides, [1, 1, 1, 1], [1, 1], 6)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert phased == [True, False, False]
    conv_nd(np, x[..., :40], w, None, group=6, strides=[2, 2], pads=[1, 1, 1, 1])  # 20 outputs a row
    assert phased[-1] is False


def test_row_chunk_is_the_largest_divisor_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_depthwise, "_CHUNK_VALUES", 1400)
    assert _depthwise._row_chunk(112, 32) == 28  # 28 * 32 = 896 <= 1400 < 56 * 32
    assert _depthwise._row_chunk(56, 144) == 8
    assert _depthwise._row_chunk(7, 960) == 1
    assert _depthwise._row_chunk(13, 4000) == 1  # wider than the budget: one position


def test_channels_last_input_gives_the_same_result() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 16, 10, 10)).astype(np.float32)
    w = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    x_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    assert _layout.is_channels_last(x_last) and not _layout.is_channels_last(x)
    np.testing.assert_array_equal(
        conv_nd(np, x_last, w, group=16, pads=[1, 1, 1, 1]), conv_nd(np, x, w, group=16, pads=[1, 1, 1, 1])
    )


def test_several_row_blocks_and_the_fused_activation_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    # A block of 2 output rows: 7 rows make 4 blocks, the last one short.
    monkeypatch.setattr(_depthwise, "_BLOCK_VALUES", 2 * 7 * 6)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 6, 7, 7)).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    got = fused_conv(np, x, w, b, group=6, pads=[1, 1, 1, 1], activation="Clip", activation_params=[0.0, 0.5])
    want = np.clip(reference_conv(x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], 6), 0.0, 0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (got == 0.5).any() and (got == 0).any()  # both bounds were really applied


def test_tiled_weights_are_cached_only_for_read_only_weights() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    first = conv_nd(np, x, w, group=4, pads=[1, 1, 1, 1])
    w *= 2  # a writable weight may change between calls: never a stale tiling
    np.testing.assert_allclose(conv_nd(np, x, w, group=4, pads=[1, 1, 1, 1]), 2 * first, rtol=1e-6)
    w.flags.writeable = False
    conv_nd(np, x, w, group=4, pads=[1, 1, 1, 1])
    assert any(any(ref() is w for ref in refs) for refs, _ in _derived._CACHE.values())


@pytest.mark.parametrize("outputs", [7, 3])  # more outputs than inputs: the bias rides in the GEMM
@pytest.mark.parametrize("with_bias", [False, True])
def test_1x1_on_a_channels_last_input_stays_channels_last(with_bias: bool, outputs: int) -> None:
    rng = np.random.default_rng(4)
    x = np.ascontiguousarray(rng.standard_normal((2, 5, 4, 3)).astype(np.float32).transpose(0, 2, 3, 1))
    x = x.transpose(0, 3, 1, 2)  # NCHW shape, channels-last memory
    w = rng.standard_normal((outputs, 5, 1, 1)).astype(np.float32)
    b = rng.standard_normal(outputs).astype(np.float32) if with_bias else None
    got = conv_nd(np, x, w, b)
    assert _layout.is_channels_last(got)
    np.testing.assert_allclose(got, reference_conv(x, w, b, [1, 1], [0, 0, 0, 0], [1, 1], 1), rtol=1e-5, atol=1e-5)


def test_session_outputs_are_c_contiguous() -> None:
    """A model ending in a depthwise convolution still hands back a C-contiguous array."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=3, pads=[1, 1, 1, 1])],
        "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 5, 5])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    (y,) = onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert y.flags.c_contiguous and y.flags.owndata
    np.testing.assert_allclose(y, reference_conv(x, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 3), rtol=1e-5, atol=1e-5)
