"""Row bands of plan steps: which steps have them and which input rows a band reads."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from onnxpy.ops.conv import conv_nd
from onnxpy.runtime.split.geometry import FUSED, halves, read_rows, row_rule, window_rows


def _kernel(**keywords: object) -> functools.partial:
    return functools.partial(lambda *a, **k: None, np, **keywords)


def test_a_padded_3x3_convolution_reads_one_halo_row_each_side() -> None:
    conv = _kernel(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    rule = row_rule(("", "Conv"), conv, [(1, 8, 16, 16), (4, 8, 3, 3)], [(1, 4, 16, 16)], [False, True])
    assert rule is not None and rule.reads == ("window", "whole")
    # the top half: the image's top pad, one real row below the band
    assert window_rows(rule.windows[0], 0, 8, 16) == (0, 9, 1, 0)
    # the bottom half: one real row above, the image's bottom pad
    assert window_rows(rule.windows[0], 8, 16, 16) == (7, 16, 0, 1)


def test_strided_and_dilated_windows() -> None:
    conv = _kernel(kernel_shape=[3, 3], pads=[2, 0, 2, 0], strides=[2, 2], dilations=[2, 2])
    # (20 + 4 - 4 - 1) // 2 + 1 = 10 output rows
    rule = row_rule(("", "Conv"), conv, [(1, 3, 20, 9), (5, 3, 3, 3)], [(1, 5, 10, 3)], [False, True])
    assert rule is not None
    # output rows [5, 10): first tap row 5*2-2 = 8, last 9*2-2+4 = 20 -> [8, 21) clamped to 20
    assert window_rows(rule.windows[0], 5, 10, 20) == (8, 20, 0, 1)
    assert read_rows(rule, 0, 5, 10, 20) == (8, 20)
    assert read_rows(rule, 1, 5, 10, 20) is None


@pytest.mark.parametrize(
    ("h", "k", "s", "d", "p"),
    [(16, 3, 1, 1, 1), (17, 3, 2, 1, 1), (15, 5, 2, 1, 2), (19, 3, 1, 2, 2), (12, 1, 1, 1, 0)],
)
def test_two_bands_of_a_convolution_make_the_whole(h: int, k: int, s: int, d: int, p: int) -> None:
    """The rows rule checked against the kernel itself: each band computed from its input rows
    with its own pads, stacked, equals the whole convolution."""
    rng = np.random.default_rng(h + k)
    x = rng.standard_normal((1, 3, h, 11)).astype(np.float32)
    w = rng.standard_normal((4, 3, k, k)).astype(np.float32)
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "dilations": [d, d], "pads": [p, 1, p, 1]}
    whole = conv_nd(np, x, w, **attrs)
    rule = row_rule(("", "Conv"), _kernel(**attrs), [x.shape, w.shape], [whole.shape], [False, True])
    assert rule is not None
    parts = []
    for o0, o1 in halves(whole.shape[2]):
        i0, i1, top, bottom = window_rows(rule.windows[0], o0, o1, h)
        parts.append(conv_nd(np, x[:, :, i0:i1], w, **{**attrs, "pads": [top, 1, bottom, 1]}))
    np.testing.assert_allclose(np.concatenate(parts, axis=2), whole, rtol=1e-5, atol=1e-5)


def test_a_fused_residual_is_read_at_the_output_rows() -> None:
    conv = _kernel(kernel_shape=[1, 1], pads=[0, 0, 0, 0], strides=[1, 1])
    shapes = [(1, 8, 10, 10), (4, 8, 1, 1), (4,), (1, 4, 10, 10)]
    rule = row_rule((FUSED, "FusedConv"), conv, shapes, [(1, 4, 10, 10)], [False, True, True, False])
    assert rule is not None and rule.reads == ("window", "whole", "whole", "rows")


def test_position_steps_read_rows_and_broadcast_operands_whole() -> None:
    relu = _kernel()
    shapes = [(1, 4, 12, 12), (1, 4, 1, 1), (12,), (4, 12, 12)]
    rule = row_rule(("", "Add"), relu, shapes, [(1, 4, 12, 12)])
    assert rule is not None and rule.reads == ("rows", "whole", "whole", "rows")
    assert read_rows(rule, 3, 6, 12, 12) == (6, 12)


@pytest.mark.parametrize(
    ("op", "kernel", "ins", "outs"),
    [
        # too few rows to be worth halving
        (("", "Conv"), _kernel(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), [(1, 8, 7, 7), (8, 8, 3, 3)], [(1, 8, 7, 7)]),
        # padding computed at run time
        (
            ("", "Conv"),
            _kernel(kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
            [(1, 8, 16, 16), (8, 8, 3, 3)],
            [(1, 8, 16, 16)],
        ),
        # ceil_mode changes an average's last window count
        (
            ("", "AveragePool"),
            _kernel(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
            [(1, 8, 16, 16)],
            [(1, 8, 8, 8)],
        ),
        # MaxPool's indices are positions in the whole input
        (("", "MaxPool"), _kernel(kernel_shape=[2, 2], strides=[2, 2]), [(1, 8, 16, 16)], [(1, 8, 8, 8), (1, 8, 8, 8)]),
        # a 1-D convolution
        (("", "Conv"), _kernel(kernel_shape=[3], pads=[1, 1]), [(1, 8, 16), (8, 8, 3)], [(1, 8, 16)]),
        # concatenation along the rows themselves
        (("", "Concat"), _kernel(axis=2), [(1, 8, 8, 8), (1, 8, 8, 8)], [(1, 8, 16, 8)]),
        # an input whose rows are neither the output's nor broadcast
        (("", "Add"), _kernel(), [(1, 8, 16, 16), (1, 8, 4, 16)], [(1, 8, 16, 16)]),
        # an operator without a rule
        (("", "Softmax"), _kernel(axis=1), [(1, 8, 16, 16)], [(1, 8, 16, 16)]),
    ],
)
def test_steps_without_bands(op: tuple[str, str], kernel: object, ins: list, outs: list) -> None:
    assert row_rule(op, kernel, ins, outs, [False] * len(ins)) is None


def test_the_traced_geometry_must_match_the_rule() -> None:
    # 16 input rows, 3x3 window, no pads: 14 output rows; a trace claiming 16 is refused
    conv = _kernel(kernel_shape=[3, 3], pads=[0, 0, 0, 0])
    assert row_rule(("", "Conv"), conv, [(1, 2, 16, 16), (2, 2, 3, 3)], [(1, 2, 16, 14)], [False, True]) is None
    assert row_rule(("", "Conv"), conv, [(1, 2, 16, 16), (2, 2, 3, 3)], [(1, 2, 14, 14)], [False, True]) is not None


@pytest.mark.parametrize(
    ("h", "k", "s", "p"), [(16, 3, 2, 0), (17, 3, 2, 0), (20, 2, 2, 0), (19, 3, 2, 1), (23, 5, 3, 1)]
)
def test_two_bands_of_a_ceil_mode_max_pool_make_the_whole(h: int, k: int, s: int, p: int) -> None:
    from onnxpy.ops.pool import max_pool

    x = np.random.default_rng(h).standard_normal((1, 2, h, 9)).astype(np.float32)
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p, 0, p, 0], "ceil_mode": 1}
    whole = max_pool(np, x, **attrs)
    whole = whole[0] if isinstance(whole, tuple) else whole
    rule = row_rule(("", "MaxPool"), _kernel(**attrs), [x.shape], [whole.shape])
    assert rule is not None
    parts = []
    for o0, o1 in halves(whole.shape[2]):
        i0, i1, top, bottom = window_rows(rule.windows[0], o0, o1, h)
        part = max_pool(np, x[:, :, i0:i1], **{**attrs, "pads": [top, 0, bottom, 0]})
        parts.append(part[0] if isinstance(part, tuple) else part)
    np.testing.assert_array_equal(np.concatenate(parts, axis=2), whole)


@pytest.mark.parametrize(
    ("c", "m", "k", "s", "group", "h"),
    [
        (16, 32, 1, 1, 1, 14),  # 1x1: one GEMM
        (8, 16, 3, 1, 1, 12),  # 3x3 im2col
        (64, 64, 3, 1, 1, 28),  # sizes where Winograd runs
        (128, 128, 3, 1, 1, 14),
        (16, 16, 3, 2, 1, 16),  # strided
        (16, 32, 3, 1, 4, 12),  # grouped
        (256, 16, 3, 1, 1, 10),  # the tap sum (M <= C/4)
    ],
)
def test_conv_writes_a_band_of_a_larger_output_in_place(c: int, m: int, k: int, s: int, group: int, h: int) -> None:
    """A split run hands conv_nd a band of its output slot as ``into``: rows [o0, o1) of an
    NCHW buffer, not C-contiguous. Every path must fill exactly that band."""
    rng = np.random.default_rng(c + m + k)
    x = rng.standard_normal((1, c, h, h)).astype(np.float32)
    w = rng.standard_normal((m, c // group, k, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    p = k // 2
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p, p, p, p], "group": group}
    whole = conv_nd(np, x, w, b, **attrs)
    slot = np.full(whole.shape, np.nan, np.float32)
    rule = row_rule(("", "Conv"), _kernel(**attrs), [x.shape, w.shape, b.shape], [whole.shape], [False, True, True])
    assert rule is not None
    for o0, o1 in halves(whole.shape[2]):
        i0, i1, top, bottom = window_rows(rule.windows[0], o0, o1, h)
        band = slot[:, :, o0:o1]
        got = conv_nd(np, x[:, :, i0:i1], w, b, **{**attrs, "pads": [top, p, bottom, p]}, into=band)
        assert got is band
    # both float32, by different algorithms where Winograd runs on one and not the other
    np.testing.assert_allclose(slot, whole, rtol=1e-4, atol=2e-5 * float(np.abs(whole).max()))


# -- token sequences (batch, tokens, features): rows are tokens --------------------------------


def test_a_matmul_with_shared_weights_splits_its_tokens() -> None:
    mm = _kernel()
    rule = row_rule(("", "MatMul"), mm, [(1, 64, 32), (32, 48)], [(1, 64, 48)], [False, True])
    assert rule is not None and rule.reads == ("rows", "whole")
    assert read_rows(rule, 0, 32, 64, 64) == (32, 64)
    # bias whole, residual at the band's tokens
    fused = row_rule(
        (FUSED, "FusedMatMul"),
        mm,
        [(1, 64, 32), (32, 48), (48,), (1, 64, 48)],
        [(1, 64, 48)],
        [False, True, True, False],
    )
    assert fused is not None and fused.reads == ("rows", "whole", "whole", "rows")
    # Q, K and V from one product: three outputs with the same tokens
    packed = row_rule((FUSED, "PackedMatMul"), mm, [(1, 64, 32), (32, 96)], [(1, 64, 32)] * 3, [False, True])
    assert packed is not None and packed.reads == ("rows", "whole")
    # a gated MLP's gate and up projections in one product: its band of tokens too
    gated = row_rule((FUSED, "GatedMatMul"), mm, [(1, 64, 32), (32, 96)], [(1, 64, 48)], [False, True])
    assert gated is not None and gated.reads == ("rows", "whole")


@pytest.mark.parametrize(
    ("op", "keywords", "ins", "outs", "constant"),
    [
        # a batch of matrices (attention's Q K^T): every token of B is read, B is no weight
        (("", "MatMul"), {}, [(2, 64, 32), (2, 32, 64)], [(2, 64, 64)], [False, False]),
        # normalized over the tokens and the features together
        (("", "LayerNormalization"), {"axis": 1}, [(1, 64, 32), (64, 32)], [(1, 64, 32)], [False, True]),
        # a channel op of a 3-D (N, C, L) tensor: axis -2 is its channels, not tokens
        (("", "BatchNormalization"), {}, [(1, 64, 32)] + [(64,)] * 4, [(1, 64, 32)], [False] + [True] * 4),
        (("", "Concat"), {"axis": 1}, [(1, 32, 16), (1, 32, 16)], [(1, 64, 16)], [False, False]),
        # too few tokens to halve
        (("", "MatMul"), {}, [(1, 4, 32), (32, 48)], [(1, 4, 48)], [False, True]),
        # LayerNormalization's mean and inverse deviation outputs
        (("", "LayerNormalization"), {}, [(1, 64, 32), (32,)], [(1, 64, 32), (1, 64, 1), (1, 64, 1)], [False, True]),
    ],
)
def test_token_steps_that_run_whole(
    op: tuple[str, str], keywords: dict, ins: list, outs: list, constant: list[bool]
) -> None:
    assert row_rule(op, _kernel(**keywords), ins, outs, constant) is None


def test_layer_norm_and_gelu_split_their_tokens() -> None:
    ln = row_rule(("", "LayerNormalization"), _kernel(axis=-1), [(1, 64, 32), (32,), (32,)], [(1, 64, 32)])
    assert ln is not None and ln.reads == ("rows", "whole", "whole")
    gelu = row_rule((FUSED, "Gelu"), _kernel(), [(1, 64, 32)], [(1, 64, 32)])
    assert gelu is not None and gelu.reads == ("rows",)
    # an elementwise op on tokens: a per-token operand by rows, a per-feature one whole
    add = row_rule(("", "Add"), _kernel(), [(1, 64, 32), (64, 1), (32,)], [(1, 64, 32)])
    assert add is not None and add.reads == ("rows", "rows", "whole")


@pytest.mark.parametrize(("mask", "read"), [((1, 1, 1, 64), "whole"), ((1, 1, 64, 64), "rows"), (None, None)])
def test_attention_reads_its_band_of_queries_and_every_key(mask: tuple | None, read: str | None) -> None:
    ins: list = [(1, 64, 32), (1, 64, 32), (1, 64, 32), (4,), (4,), (4,)]
    if mask is not None:
        ins.append(mask)
    rule = row_rule((FUSED, "Attention"), _kernel(scale=0.25), ins, [(1, 2, 64, 16)], [False] * len(ins))
    assert rule is not None
    assert rule.reads[:6] == ("rows", "whole", "whole", "whole", "whole", "whole")
    assert rule.reads[6:] == (() if read is None else (read,))


def test_a_band_of_queries_gets_its_own_head_shape() -> None:
    """The exporter's Reshape target names the token count: the band's count replaces it, in a
    copy (the same array may be the key's shape too), and attention over each band of queries
    makes the whole."""
    from onnxpy.ops.fused_attention import attention
    from onnxpy.runtime.split.bands import _band_of_queries

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 16, 8)).astype(np.float32) for _ in range(3))
    shape = np.array([1, 16, 2, 4], dtype=np.int64)
    kernel = functools.partial(attention, np, scale=0.5)
    whole = kernel(q, k, v, shape, shape, shape)
    parts = [_band_of_queries(kernel, 16, b - a)(q[:, a:b], k, v, shape, shape, shape) for a, b in halves(16)]
    np.testing.assert_allclose(np.concatenate(parts, axis=2), whole, rtol=1e-5, atol=1e-6)
    assert shape.tolist() == [1, 16, 2, 4]  # the caller's array untouched
