"""Conv (each fast path against a direct reference), ConvTranspose, DeformConv and Col2Im against
onnxruntime on attribute combinations the conformance suite does not reach."""

from __future__ import annotations

import itertools
import zlib
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy

ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
}


def _model(op_type: str, feeds: dict[str, np.ndarray], opset: int, out_elem: int, **attrs: Any) -> bytes:
    node = helper.make_node(op_type, list(feeds), ["Y"], **attrs)
    vi = [helper.make_tensor_value_info(n, ELEM[v.dtype], list(v.shape)) for n, v in feeds.items()]
    graph = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info("Y", out_elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _ours(op_type: str, feeds: dict[str, np.ndarray], opset: int = 17, **attrs: Any) -> np.ndarray:
    data = _model(op_type, feeds, opset, ELEM[next(iter(feeds.values())).dtype], **attrs)
    return onnxpy.InferenceSession(data).run(None, feeds)[0]


def _both(op_type: str, feeds: dict[str, np.ndarray], opset: int = 17, **attrs: Any) -> tuple[np.ndarray, np.ndarray]:
    data = _model(op_type, feeds, opset, ELEM[next(iter(feeds.values())).dtype], **attrs)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = onnxpy.InferenceSession(data).run(None, feeds)[0]
    return got, want


def _close(got: np.ndarray, want: np.ndarray, tol: float = 1e-4) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    # atol also scales with the output (Winograd's rounding is relative to the output's scale).
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=max(tol, 1e-5 * scale))


# -- a direct convolution: one dot product per output position ----------------------------------


def reference_conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    group: int,
) -> np.ndarray:
    n, c = x.shape[:2]
    m = w.shape[0]
    nd = x.ndim - 2
    k = w.shape[2:]
    xd = x.astype(np.float64)
    xpad = np.pad(xd, [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)])
    ext = [(k[i] - 1) * dilations[i] + 1 for i in range(nd)]
    out = [(xpad.shape[2 + i] - ext[i]) // strides[i] + 1 for i in range(nd)]
    y = np.zeros((n, m, *out))
    cg, mg = c // group, m // group
    for pos in itertools.product(*(range(o) for o in out)):
        window = tuple(slice(pos[i] * strides[i], pos[i] * strides[i] + ext[i], dilations[i]) for i in range(nd))
        patch = xpad[(slice(None), slice(None), *window)]  # (N, C, *k)
        for g in range(group):
            pg = patch[:, g * cg : (g + 1) * cg].reshape(n, -1)
            wg = w[g * mg : (g + 1) * mg].astype(np.float64).reshape(mg, -1)
            y[(slice(None), slice(g * mg, (g + 1) * mg), *pos)] = pg @ wg.T
    if b is not None:
        y += b.astype(np.float64).reshape((1, m) + (1,) * nd)
    return y


def term_scale(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, *conv_args: Any) -> np.ndarray:
    """Per output, the sum of the magnitudes of the terms it adds up: the scale float32 rounding
    (and Winograd's transforms, which mix neighbouring terms) is relative to."""
    return reference_conv(np.abs(x), np.abs(w), None if b is None else np.abs(b), *conv_args)


def assert_conv_close(got: np.ndarray, want: np.ndarray, scale: np.ndarray) -> None:
    # Winograd F(4x4) errs up to ~3e-6 of the term scale on 1152-term sums (12 seeds): 1e-5 holds
    # with room, while a wrong tap or a lost bias errs by a whole term.
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bound = 1e-4 * np.abs(want) + 1e-5 * scale + 1e-6
    worst = np.unravel_index(int(np.argmax(err - bound)), err.shape)
    assert np.all(err <= bound), f"at {worst}: got {got[worst]}, want {want[worst]}, allowed {bound[worst]}"


CONV_CASES = [
    # name, x shape, w shape, group, strides, pads, dilations
    ("1x1", (2, 6, 5, 7), (4, 6, 1, 1), 1, [1, 1], [0, 0, 0, 0], [1, 1]),
    ("1x1_grouped", (2, 6, 5, 7), (4, 3, 1, 1), 2, [1, 1], [0, 0, 0, 0], [1, 1]),
    ("1x1_strided_padded", (1, 4, 6, 7), (5, 4, 1, 1), 1, [2, 3], [1, 0, 2, 1], [1, 1]),
    # More output than input channels: the bias rides in the GEMM as an extra column.
    ("1x1_expand_bias_in_gemm", (2, 3, 5, 7), (8, 3, 1, 1), 1, [1, 1], [0, 0, 0, 0], [1, 1]),
    ("1x1_expand_strided_padded", (1, 3, 6, 7), (8, 3, 1, 1), 1, [2, 1], [1, 0, 0, 1], [1, 1]),
    ("depthwise", (2, 5, 8, 9), (5, 1, 3, 3), 5, [1, 1], [1, 1, 1, 1], [1, 1]),
    ("depthwise_padded_width_dilated", (1, 6, 9, 8), (6, 1, 3, 3), 6, [1, 1], [2, 0, 1, 3], [2, 1]),
    ("depthwise_strided", (2, 5, 9, 9), (5, 1, 3, 3), 5, [2, 2], [1, 1, 1, 1], [1, 1]),
    ("depthwise_dilated_strided", (1, 4, 11, 10), (4, 1, 3, 2), 4, [2, 3], [2, 0, 1, 3], [2, 3]),
    ("depthwise_multiplier", (1, 3, 7, 7), (6, 1, 3, 3), 3, [1, 2], [1, 1, 0, 0], [1, 1]),
    # Dilated depthwise layers run channels-last too (taps spaced in the padded copy): at stride
    # 1 (row chunks), at column stride 2 with row dilation (columns stored by parity, 30 output
    # columns) and with column dilation (no parity form).
    ("depthwise_dilated_5x5", (2, 7, 12, 11), (7, 1, 5, 5), 7, [1, 1], [4, 4, 4, 4], [2, 2]),
    ("depthwise_dilated_rows_phased", (1, 3, 20, 60), (3, 1, 3, 3), 3, [2, 2], [2, 1, 2, 1], [2, 1]),
    ("depthwise_dilated_cols_strided", (1, 5, 13, 21), (5, 1, 3, 3), 5, [2, 2], [1, 2, 0, 2], [1, 2]),
    # Outputs more than 14 wide take the NCHW im2col (narrower ones the channels-last columns).
    ("im2col", (2, 3, 9, 20), (4, 3, 3, 3), 1, [1, 1], [0, 0, 0, 0], [1, 1]),
    ("im2col_grouped_dilated_strided", (2, 6, 13, 12), (8, 3, 3, 2), 2, [2, 3], [1, 2, 3, 0], [2, 2]),
    ("im2col_asymmetric_pads", (1, 2, 6, 16), (3, 2, 2, 3), 1, [1, 1], [0, 2, 3, 1], [1, 1]),
    # Large strided kernels: the columns come from the input's stride phases (_strided_columns).
    ("im2col_stride_phases_7x7", (1, 3, 23, 41), (5, 3, 7, 7), 1, [2, 2], [3, 2, 1, 3], [1, 1]),
    ("im2col_stride_phases_uneven", (2, 4, 19, 50), (6, 4, 5, 6), 1, [1, 3], [2, 1, 0, 2], [1, 1]),
    # Outputs at most 14 wide: channels-last columns (_im2col_channels_last), at strides and
    # dilations, asymmetric pads, pads past the kernel's reach, one-row and one-column kernels,
    # two images (one GEMM over both).
    ("cl_columns", (1, 20, 7, 7), (24, 20, 3, 3), 1, [1, 1], [1, 1, 1, 1], [1, 1]),
    ("cl_columns_two_images", (2, 12, 9, 11), (10, 12, 3, 3), 1, [1, 1], [1, 1, 1, 1], [1, 1]),
    ("cl_columns_strided_dilated", (2, 6, 13, 12), (8, 6, 3, 2), 1, [2, 3], [1, 2, 3, 0], [2, 2]),
    ("cl_columns_asymmetric_5x5", (1, 8, 11, 10), (6, 8, 5, 5), 1, [1, 1], [2, 0, 1, 3], [1, 1]),
    ("cl_columns_pads_beyond_reach", (1, 4, 5, 6), (3, 4, 3, 3), 1, [1, 1], [4, 3, 5, 4], [1, 1]),
    ("cl_columns_1x3_and_stride", (1, 6, 9, 14), (5, 6, 1, 3), 1, [2, 1], [0, 1, 0, 1], [1, 1]),
    ("cl_columns_3x1_dilated", (2, 5, 12, 9), (4, 5, 3, 1), 1, [1, 1], [2, 0, 2, 0], [2, 1]),
    ("cl_columns_stem_7x7_stride_2", (1, 3, 23, 21), (5, 3, 7, 7), 1, [2, 2], [3, 2, 1, 3], [1, 1]),
    # Windows that tile the input (kernel == stride: patch embeddings, 2x2 downsampling) on
    # narrow outputs: the NCHW im2col, the columns no larger than the input.
    ("tiling_patches_16x16", (1, 3, 64, 48), (6, 3, 16, 16), 1, [16, 16], [0, 0, 0, 0], [1, 1]),
    ("tiling_2x2_cropped_two_images", (2, 12, 15, 13), (8, 12, 2, 2), 1, [2, 2], [0, 0, 0, 0], [1, 1]),
    ("padded_width_dilated_grouped", (2, 8, 10, 9), (6, 4, 3, 2), 2, [1, 1], [2, 1, 0, 3], [2, 3]),
    ("padded_width_no_pad", (1, 5, 6, 7), (3, 5, 2, 2), 1, [1, 1], [0, 0, 0, 0], [1, 1]),
    # RegNet's narrow groups (all groups in one stacked product), two images, two outputs each.
    ("padded_width_many_groups", (2, 48, 7, 10), (24, 4, 3, 3), 12, [1, 1], [1, 1, 1, 1], [1, 1]),
    # At most a quarter as many output as input channels: one GEMM over the stacked taps (nine
    # at a time), then shifted sums.
    ("tap_sum", (2, 16, 9, 8), (4, 16, 3, 3), 1, [1, 1], [1, 1, 1, 1], [1, 1]),
    ("tap_sum_7x7_in_groups_of_taps", (1, 28, 12, 11), (3, 28, 7, 7), 1, [1, 1], [3, 2, 3, 4], [1, 1]),
    ("tap_sum_dilated_asymmetric", (1, 20, 10, 9), (5, 20, 3, 2), 1, [1, 1], [2, 0, 1, 3], [2, 3]),
    ("tap_sum_unpadded_5x5", (2, 12, 8, 9), (3, 12, 5, 5), 1, [1, 1], [0, 0, 0, 0], [1, 1]),
    # Pads wider than the kernel reaches: output rows longer than a row and its zero columns,
    # output rows past the image at both ends (every tap misses some of them).
    ("tap_sum_pads_beyond_reach", (1, 16, 5, 6), (3, 16, 3, 3), 1, [1, 1], [4, 3, 5, 4], [1, 1]),
    ("tap_sum_one_row", (2, 16, 1, 7), (4, 16, 3, 3), 1, [1, 1], [1, 1, 1, 1], [1, 1]),
    # Output rows as long as the input's: X read in place, the columns a shift reads across a
    # row's end zeroed in the product (here shifts of -3 to +3 on rows of 8).
    ("tap_sum_1x7_rows_in_place", (2, 16, 5, 8), (4, 16, 1, 7), 1, [1, 1], [0, 3, 0, 3], [1, 1]),
    ("winograd_f4", (1, 128, 27, 29), (128, 128, 3, 3), 1, [1, 1], [1, 1, 1, 1], [1, 1]),
    ("winograd_f4_odd_asymmetric", (1, 128, 29, 27), (136, 128, 3, 3), 1, [1, 1], [0, 1, 2, 0], [1, 1]),
    ("winograd_f4_three_times_wider", (1, 32, 28, 28), (96, 32, 3, 3), 1, [1, 1], [1, 1, 1, 1], [1, 1]),
    ("winograd_f2", (2, 192, 10, 11), (192, 192, 3, 3), 1, [1, 1], [1, 1, 1, 1], [1, 1]),
    ("winograd_f2_unpadded_odd", (1, 400, 11, 11), (96, 400, 3, 3), 1, [1, 1], [0, 2, 1, 0], [1, 1]),
    # A narrow map: im2col (channels-last columns, at most 14 wide) rather than the padded width.
    ("im2col_narrow", (2, 6, 7, 7), (5, 6, 3, 3), 1, [1, 1], [1, 1, 1, 1], [1, 1]),
    ("conv1d", (2, 4, 17), (6, 2, 4), 2, [3], [2, 1], [2]),
    ("conv3d", (1, 4, 5, 6, 7), (4, 2, 2, 3, 2), 2, [1, 2, 1], [1, 0, 1, 0, 1, 1], [2, 1, 1]),
    ("depthwise_3d", (1, 3, 4, 5, 6), (3, 1, 2, 2, 2), 3, [1, 1, 2], [0, 1, 0, 1, 0, 1], [1, 2, 1]),
]


@pytest.mark.parametrize("name,xs,ws,group,strides,pads,dilations", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_paths_against_direct_reference(
    name: str,
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    group: int,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
) -> None:
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # hash() differs per process
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    attrs = dict(group=group, strides=strides, pads=pads, dilations=dilations)
    got = _ours("Conv", {"X": x, "W": w, "B": b}, **attrs)
    want = reference_conv(x, w, b, strides, pads, dilations, group)
    assert got.dtype == np.float32
    scale = term_scale(x, w, b, strides, pads, dilations, group)
    assert_conv_close(got, want, scale)
    got_ort, want_ort = _both("Conv", {"X": x, "W": w, "B": b}, **attrs)
    assert got_ort.dtype == want_ort.dtype
    assert_conv_close(got_ort, want_ort, scale)


@pytest.mark.parametrize(
    "xs,ws,pads,dilations,bias",
    [
        ((2, 5, 4, 6, 7), (3, 5, 3, 3, 3), [1, 1, 1, 1, 1, 1], [1, 1, 1], True),
        ((1, 4, 6, 5, 9), (6, 4, 2, 3, 2), [0, 2, 1, 1, 0, 2], [2, 1, 3], False),  # asymmetric, dilated
        ((1, 3, 3, 4, 4), (2, 3, 3, 3, 3), [3, 2, 3, 3, 4, 2], [1, 1, 1], True),  # pads past the kernel
        ((1, 6, 5, 5, 5), (4, 6, 1, 3, 3), [0, 0, 0, 0, 0, 0], [1, 1, 1], True),  # unpadded, one plane
        # (k, 1, 1) kernels (R(2+1)D's temporal layers): whole planes, no padded copy.
        ((2, 5, 6, 4, 5), (3, 5, 3, 1, 1), [1, 0, 0, 1, 0, 0], [1, 1, 1], True),
        ((1, 4, 7, 3, 3), (2, 4, 2, 1, 1), [2, 0, 0, 0, 0, 0], [3, 1, 1], False),
        ((1, 3, 4, 2, 6), (2, 3, 2, 1, 1), [3, 0, 0, 2, 0, 0], [1, 1, 1], True),  # planes reading no input
    ],
    ids=[
        "3x3x3",
        "dilated-asymmetric",
        "wide-pads",
        "unpadded-1x3x3",
        "temporal",
        "temporal-dilated",
        "temporal-wide-pads",
    ],  # fmt: skip
)
def test_3d_convolution_as_products_per_tap(
    monkeypatch: pytest.MonkeyPatch, xs: tuple, ws: tuple, pads: list[int], dilations: list[int], bias: bool
) -> None:
    """Large 3-D stride-1 convolutions add one product per tap, read from the flattened padded
    input, into one result (MC3's 64-channel 8x56x56 layers: 173 MB of im2col columns). A zero
    threshold takes that path for these small cases."""
    _check_per_tap(monkeypatch, "_TAP_ACCUMULATE_MIN_BYTES", xs, ws, pads, dilations, bias)


def _check_per_tap(
    monkeypatch: pytest.MonkeyPatch,
    threshold: str,
    xs: tuple,
    ws: tuple,
    pads: list[int],
    dilations: list[int],
    bias: bool,
) -> list[int]:
    """Runs conv_nd with the per-tap path's ``threshold`` at 0, checks the result against the
    direct reference and that the path ran; returns the list its later calls append to."""
    from onnxpy.ops import conv as conv_mod

    monkeypatch.setattr(conv_mod, threshold, 0)
    calls: list[int] = []
    original = conv_mod._conv_tap_accumulate
    monkeypatch.setattr(conv_mod, "_conv_tap_accumulate", lambda *a: calls.append(1) or original(*a))
    rng = np.random.default_rng(zlib.crc32(repr((xs, ws, pads)).encode()))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    ones = [1] * (len(xs) - 2)
    got = conv_mod.conv_nd(np, x, w, b, pads=pads, dilations=dilations)
    want = reference_conv(x, w, b, ones, pads, dilations, 1)
    assert calls and got.shape == want.shape
    assert_conv_close(got, want, term_scale(x, w, b, ones, pads, dilations, 1))
    return calls


@pytest.mark.parametrize(
    "xs,ws,pads",
    [
        ((1, 128, 27, 29), (128, 128, 3, 3), [1, 1, 1, 1]),  # F(4x4): 7 tile rows
        ((1, 192, 10, 11), (192, 192, 3, 3), [0, 1, 2, 0]),  # F(2x2), asymmetric pads
    ],
    ids=["f4", "f2"],
)
def test_winograd_in_bands_of_tile_rows(monkeypatch: pytest.MonkeyPatch, xs: tuple, ws: tuple, pads: list[int]) -> None:
    # A tiny band budget splits these layers into bands of one or two tile rows (large layers,
    # such as VGG's 64-channel 224x224 one, take bands at the real budget).
    rng = np.random.default_rng(21)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    bands: list[int] = []
    from onnxpy.ops import conv as conv_mod

    band = conv_mod._winograd_band

    def counted(*args: Any) -> None:
        bands.append(args[5].shape[2])
        band(*args)

    from onnxpy.ops import _winograd_cl

    monkeypatch.setattr(_winograd_cl, "_MIN_TILES", 10**9)  # the NCHW path (test_winograd_cl.py: the other)
    monkeypatch.setattr(conv_mod, "_WINOGRAD_BAND_BYTES", 40_000)
    monkeypatch.setattr(conv_mod, "_winograd_band", counted)
    got = conv_mod.conv_nd(np, x, w, b, pads=pads)
    assert len(bands) > 2 and sum(bands) == got.shape[2], bands
    want = reference_conv(x, w, b, [1, 1], pads, [1, 1], 1)
    assert_conv_close(got, want, term_scale(x, w, b, [1, 1], pads, [1, 1], 1))


@pytest.mark.parametrize(
    "xs,ws,strides,pads",
    [
        # Outputs more than 14 wide: narrower ones build channels-last columns instead.
        ((1, 3, 30, 40), (8, 3, 7, 7), [2, 2], [3, 3, 3, 3]),  # ResNet's stem, smaller
        ((2, 3, 31, 69), (4, 3, 11, 11), [4, 4], [0, 1, 2, 0]),  # AlexNet's, two images
        ((1, 5, 17, 50), (3, 5, 5, 6), [1, 3], [2, 0, 1, 2]),  # one axis unstrided
    ],
)
def test_strided_columns_come_from_stride_phases(
    monkeypatch: pytest.MonkeyPatch, xs: tuple, ws: tuple, strides: list[int], pads: list[int]
) -> None:
    from onnxpy.ops import conv as conv_mod

    calls: list[tuple[int, ...]] = []
    original = conv_mod._strided_columns

    def counted(dst: np.ndarray, *args: Any) -> None:
        calls.append(dst.shape)
        original(dst, *args)

    monkeypatch.setattr(conv_mod, "_strided_columns", counted)
    rng = np.random.default_rng(sum(xs))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    got = conv_mod.conv_nd(np, x, w, b, strides=strides, pads=pads)
    assert len(calls) == 1
    args = (strides, pads, [1, 1], 1)
    assert_conv_close(got, reference_conv(x, w, b, *args), term_scale(x, w, b, *args))


def test_winograd_results_survive_the_next_call() -> None:
    # Its temporaries are reused per-thread buffers (ops/_scratch.py): no result may live in one.
    from onnxpy.ops import conv as conv_mod

    rng = np.random.default_rng(22)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    from onnxpy.ops import _scratch

    x1, x2 = (rng.standard_normal((1, 64, 64, 64)).astype(np.float32) for _ in range(2))
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 64, 64, [64, 64]) == 4
    _scratch.release()
    y1 = conv_mod.conv_nd(np, x1, w, pads=[1, 1, 1, 1])
    assert _scratch.held_bytes() >= _scratch.MIN_BYTES  # the transformed tiles (2.4 MB) were scratch
    kept = y1.copy()
    y2 = conv_mod.conv_nd(np, x2, w, pads=[1, 1, 1, 1])
    assert not np.shares_memory(y1, y2)
    np.testing.assert_array_equal(y1, kept)
    want = reference_conv(x2, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1)
    assert_conv_close(y2, want, term_scale(x2, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1))


def _same_pads(size: list[int], kernel: list[int], strides: list[int], dilations: list[int], upper: bool) -> list[int]:
    begin, end = [], []
    for n, k, s, d in zip(size, kernel, strides, dilations):
        out = -(-n // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        b = total // 2 if upper else total - total // 2
        begin.append(b)
        end.append(total - b)
    return begin + end


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize(
    "kernel,strides,dilations", [([3, 2], [2, 2], [1, 1]), ([2, 3], [1, 3], [2, 1]), ([1, 1], [2, 1], [1, 1])]
)
def test_conv_auto_pad(auto_pad: str, kernel: list[int], strides: list[int], dilations: list[int]) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 7, 8)).astype(np.float32)
    w = rng.standard_normal((2, 4, *kernel)).astype(np.float32)
    attrs = dict(auto_pad=auto_pad, strides=strides, dilations=dilations)
    if auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    else:
        pads = _same_pads([7, 8], kernel, strides, dilations, auto_pad == "SAME_UPPER")
    got = _ours("Conv", {"X": x, "W": w}, **attrs)
    np.testing.assert_allclose(got, reference_conv(x, w, None, strides, pads, dilations, 1), rtol=1e-4, atol=1e-4)
    if dilations == [1, 1] or auto_pad == "VALID":  # onnxruntime refuses dilated SAME padding
        got, want = _both("Conv", {"X": x, "W": w}, **attrs)
        _close(got, want)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("name", ["1x1", "depthwise", "im2col_grouped_dilated_strided"])
def test_conv_dtypes(dtype: Any, name: str) -> None:
    _, xs, ws, group, strides, pads, dilations = next(c for c in CONV_CASES if c[0] == name)
    rng = np.random.default_rng(4)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    got = _ours("Conv", {"X": x, "W": w}, group=group, strides=strides, pads=pads, dilations=dilations)
    want = reference_conv(x, w, None, strides, pads, dilations, group)
    assert got.dtype == np.dtype(dtype)
    tol = 2e-2 if dtype == np.float16 else 1e-10
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


DEAD_TAP_CASES = [
    # (name, x shape, w shape, attrs): taps that read only padding for every output
    ("aspp_d24", (1, 8, 7, 7), (4, 8, 3, 3), dict(dilations=[24, 24], pads=[24, 24, 24, 24])),
    ("aspp_d12_rows_only", (1, 8, 14, 9), (4, 8, 3, 3), dict(dilations=[12, 12], pads=[12, 12, 12, 12])),
    ("asymmetric_pads", (1, 3, 5, 6), (2, 3, 3, 3), dict(dilations=[6, 1], pads=[7, 1, 2, 0])),
    ("strided", (2, 4, 9, 9), (3, 4, 5, 5), dict(dilations=[5, 5], pads=[10, 10, 10, 10], strides=[2, 3])),
    ("start_cropped", (1, 2, 6, 6), (2, 2, 3, 3), dict(dilations=[4, 4], pads=[6, 6, 1, 1])),
    ("grouped", (1, 6, 5, 5), (6, 2, 3, 3), dict(dilations=[8, 8], pads=[8, 8, 8, 8], group=3)),
    ("depthwise", (1, 4, 6, 6), (4, 1, 3, 3), dict(dilations=[9, 9], pads=[9, 9, 9, 9], group=4)),
    ("1d", (1, 3, 10), (2, 3, 5), dict(dilations=[7], pads=[14, 14])),
    ("3d", (1, 2, 4, 5, 3), (2, 2, 3, 3, 3), dict(dilations=[5, 1, 4], pads=[5, 1, 4, 5, 1, 4])),
    ("same_upper", (1, 3, 4, 4), (2, 3, 3, 3), dict(dilations=[6, 6], auto_pad="SAME_UPPER")),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("name,xs,ws,attrs", DEAD_TAP_CASES, ids=[c[0] for c in DEAD_TAP_CASES])
def test_taps_reading_only_padding_are_dropped(
    name: str, xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any], bias: bool
) -> None:
    """A dilation wider than the map leaves taps that read only zeros (DeepLab's ASPP): the
    convolution runs without them, with the result onnxruntime computes with them."""
    from onnxpy.ops import conv

    rng = np.random.default_rng(11)
    feeds = {"X": rng.standard_normal(xs).astype(np.float32), "W": rng.standard_normal(ws).astype(np.float32)}
    if bias:
        feeds["B"] = rng.standard_normal(ws[0]).astype(np.float32)
    if "auto_pad" in attrs:  # onnxruntime has no dilated SAME padding: the direct reference
        got = _ours("Conv", feeds, **attrs)
        pads = _same_pads(list(xs[2:]), list(ws[2:]), [1, 1], attrs["dilations"], upper=True)
        want = reference_conv(feeds["X"], feeds["W"], feeds.get("B"), [1, 1], pads, attrs["dilations"], 1)
        want = want.astype(np.float32)
    else:
        got, want = _both("Conv", feeds, **attrs)
    _close(got, want)
    # the geometry says which taps live; every case here has some that do not
    geo, _, live = conv._checked_geometry(
        feeds["X"], feeds["W"], None, attrs.get("auto_pad", "NOTSET"), attrs.get("dilations"), attrs.get("group", 1),
        None, attrs.get("pads"), attrs.get("strides"), None,
    )  # fmt: skip
    assert live is not None
    _, taps, _ = live
    assert np.prod(feeds["W"][taps].shape) < feeds["W"].size


REGION_CASES = [
    # (name, x shape, w shape, attrs): every tap reads the map, most only near its border
    ("aspp_d12", (1, 16, 14, 14), (8, 16, 3, 3), dict(dilations=[12, 12], pads=[12, 12, 12, 12])),
    ("batch_strided", (2, 6, 9, 11), (5, 6, 3, 3), dict(dilations=[7, 8], pads=[7, 8, 7, 8], strides=[2, 1])),
    ("wide_kernel", (1, 4, 6, 6), (3, 4, 5, 5), dict(dilations=[4, 4], pads=[8, 8, 8, 8])),
    ("asymmetric", (1, 3, 7, 5), (2, 3, 3, 2), dict(dilations=[6, 4], pads=[6, 0, 6, 4])),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("name,xs,ws,attrs", REGION_CASES, ids=[c[0] for c in REGION_CASES])
def test_taps_are_multiplied_only_where_they_read_the_input(
    name: str,
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    attrs: dict[str, Any],
    bias: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dilation near the map's size: each tap's product runs over the outputs it reaches
    (here at any size: the path otherwise waits for millions of multiply-adds to save)."""
    from onnxpy.ops import conv

    monkeypatch.setattr(conv, "_REGION_MIN_SAVED", 0)
    rng = np.random.default_rng(12)
    feeds = {"X": rng.standard_normal(xs).astype(np.float32), "W": rng.standard_normal(ws).astype(np.float32)}
    if bias:
        feeds["B"] = rng.standard_normal(ws[0]).astype(np.float32)
    geo, _, live = conv._checked_geometry(
        feeds["X"], feeds["W"], None, "NOTSET", attrs["dilations"], 1, None, attrs["pads"], attrs.get("strides"), None
    )
    if live is None:
        assert geo.regions is not None
    got, want = _both("Conv", feeds, **attrs)
    _close(got, want)
    # with an activation fused after it (FusedConv), at every optimization level
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = _model("Conv", feeds, 17, TensorProto.FLOAT, **attrs)
    _close(onnxpy.InferenceSession(data, so).run(None, feeds)[0], want)


def test_tap_regions_wait_for_real_savings() -> None:
    from onnxpy.ops import conv

    for m, c, expected in ((8, 16, False), (256, 960, True)):  # DeepLab's ASPP at dilation 12
        w = np.zeros((m, c, 3, 3), np.float32)
        x = np.zeros((1, c, 14, 14), np.float32)
        geo, _, _ = conv._checked_geometry(x, w, None, "NOTSET", [12, 12], 1, None, [12] * 4, None, None)
        assert (geo.regions is not None) == expected


def test_taps_reading_the_input_somewhere_are_kept() -> None:
    from onnxpy.ops import conv

    x = np.zeros((1, 2, 14, 14), np.float32)
    w = np.zeros((2, 2, 3, 3), np.float32)
    for d in (1, 6, 13):  # the outer taps reach the map from the first or last output
        _, _, live = conv._checked_geometry(x, w, None, "NOTSET", [d, d], 1, None, [d] * 4, None, None)
        assert live is None, d


def test_conv_kernel_shape_mismatch_raises() -> None:
    x = np.zeros((1, 2, 5, 5), np.float32)
    w = np.zeros((3, 2, 3, 3), np.float32)
    with pytest.raises(Exception, match="kernel_shape"):
        _ours("Conv", {"X": x, "W": w}, kernel_shape=[2, 2])


# -- ConvTranspose -------------------------------------------------------------------------------

CT_CASES = [
    ("basic", (1, 2, 4, 5), (2, 3, 3, 3), {}),
    ("strided_pads", (2, 2, 4, 4), (2, 3, 3, 2), dict(strides=[2, 3], pads=[1, 0, 0, 1])),
    ("output_padding", (1, 2, 3, 4), (2, 2, 3, 3), dict(strides=[3, 2], output_padding=[2, 1])),
    ("output_shape", (1, 2, 3, 3), (2, 2, 3, 3), dict(strides=[2, 2], output_shape=[7, 8])),
    (
        "output_shape_upper",
        (1, 2, 3, 3),
        (2, 2, 3, 3),
        dict(strides=[2, 2], output_shape=[6, 5], auto_pad="SAME_UPPER"),
    ),
    (
        "output_shape_lower",
        (1, 2, 3, 3),
        (2, 2, 3, 3),
        dict(strides=[2, 2], output_shape=[6, 5], auto_pad="SAME_LOWER"),
    ),
    ("same_upper", (1, 1, 4, 5), (1, 2, 4, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ("same_lower", (1, 1, 4, 5), (1, 2, 4, 3), dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    ("valid", (1, 2, 3, 3), (2, 1, 2, 2), dict(strides=[2, 2], auto_pad="VALID")),
    (
        "groups_dilations",
        (2, 4, 5, 4),
        (4, 3, 3, 2),
        dict(group=2, dilations=[2, 3], strides=[2, 1], pads=[1, 2, 1, 0]),
    ),
    ("grouped_output_shape", (1, 6, 3, 3), (6, 1, 3, 3), dict(group=3, strides=[2, 2], output_shape=[6, 6])),
    # 2-D at dilation 1 scatters by stride phases (conv_extra._col2im_by_phases): the kernel
    # equal to the stride (one tap a phase), larger (taps summed per phase) with the crop of
    # pads, smaller (phases no tap reaches), output_padding past the canvas, groups, batches.
    ("upsample_2x2s2", (2, 4, 5, 6), (4, 3, 2, 2), dict(strides=[2, 2])),
    ("k4s2p1", (1, 3, 6, 5), (3, 2, 4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    ("k3s2p1_op1", (2, 3, 5, 4), (3, 2, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
    ("k1s2", (1, 2, 4, 3), (2, 3, 1, 1), dict(strides=[2, 2])),
    ("k2s3_asym_pads", (1, 2, 4, 5), (2, 2, 2, 3), dict(strides=[3, 2], pads=[1, 0, 0, 2], output_padding=[2, 1])),
    ("k5s3_grouped", (2, 4, 3, 4), (4, 2, 5, 5), dict(strides=[3, 3], pads=[2, 1, 1, 2], group=2)),
    ("1d", (2, 3, 6), (3, 2, 4), dict(strides=[3], pads=[1, 2], dilations=[2])),
    (
        "3d",
        (1, 2, 3, 3, 2),
        (2, 2, 2, 3, 2),
        dict(strides=[2, 1, 2], pads=[0, 1, 0, 1, 0, 1], output_padding=[1, 0, 1]),
    ),
]


@pytest.mark.parametrize("name,xs,ws,attrs", CT_CASES, ids=[c[0] for c in CT_CASES])
def test_conv_transpose(name: str, xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(len(name))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[1] * attrs.get("group", 1)).astype(np.float32)
    got, want = _both("ConvTranspose", {"X": x, "W": w, "B": b}, **attrs)
    _close(got, want)
    got, want = _both("ConvTranspose", {"X": x, "W": w}, **attrs)
    _close(got, want)


def test_conv_transpose_is_the_adjoint_of_conv() -> None:
    # <conv(x), y> == <x, conv_transpose(y)> for the same weights, strides, pads and dilations.
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 3, 9, 8)).astype(np.float64)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float64)
    attrs = dict(strides=[2, 2], pads=[1, 0, 1, 1], dilations=[1, 2])
    y = _ours("Conv", {"X": x, "W": w}, **attrs)
    g = rng.standard_normal(y.shape)
    # output_padding makes the transposed output exactly x's shape
    ext = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], attrs["dilations"])]
    op_ = [
        x.shape[2 + i] - (attrs["strides"][i] * (y.shape[2 + i] - 1) + ext[i] - attrs["pads"][i] - attrs["pads"][2 + i])
        for i in range(2)
    ]
    xt = _ours("ConvTranspose", {"X": g, "W": w}, output_padding=op_, **attrs)
    assert xt.shape == x.shape
    np.testing.assert_allclose(np.sum(y * g), np.sum(x * xt), rtol=1e-10)


def test_conv_transpose_output_padding_must_be_less_than_the_stride() -> None:
    # The spec: each output_padding below its stride (or dilation); a larger one only grew the
    # output with zeros. onnxruntime refuses it too.
    x, w = np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 2, 2), np.float32)
    with pytest.raises(
        onnxpy.RuntimeException, match=r"output_padding \[1, 1\] must be >= 0 and less than max\(stride, dilation\)"
    ):
        _ours("ConvTranspose", {"X": x, "W": w}, output_padding=[1, 1])
    assert _ours("ConvTranspose", {"X": x, "W": w}, strides=[2, 2], output_padding=[1, 1]).shape == (1, 1, 5, 5)


def test_conv_transpose_float16() -> None:
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float16)
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float16)
    got = _ours("ConvTranspose", {"X": x, "W": w}, strides=[2, 2])
    want = _ours("ConvTranspose", {"X": x.astype(np.float32), "W": w.astype(np.float32)}, strides=[2, 2])
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


# -- DeformConv ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs,offset_group,with_mask",
    [
        (dict(), 1, False),
        (dict(pads=[1, 1, 1, 1]), 1, True),
        (dict(strides=[2, 1], dilations=[1, 2], pads=[0, 2, 1, 0]), 2, True),
        (dict(group=2), 2, False),
    ],
)
def test_deform_conv(attrs: dict[str, Any], offset_group: int, with_mask: bool) -> None:
    rng = np.random.default_rng(13)
    n, c, h, w_ = 2, 4, 6, 7
    kh, kw = 3, 2
    group = attrs.get("group", 1)
    x = rng.standard_normal((n, c, h, w_)).astype(np.float32)
    w = rng.standard_normal((6, c // group, kh, kw)).astype(np.float32)
    strides = attrs.get("strides", [1, 1])
    dil = attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    oh = (h + pads[0] + pads[2] - (kh - 1) * dil[0] - 1) // strides[0] + 1
    ow = (w_ + pads[1] + pads[3] - (kw - 1) * dil[1] - 1) // strides[1] + 1
    offset = (rng.standard_normal((n, offset_group * kh * kw * 2, oh, ow)) * 1.5).astype(np.float32)
    feeds = {"X": x, "W": w, "offset": offset, "B": rng.standard_normal(6).astype(np.float32)}
    if with_mask:
        feeds["mask"] = rng.random((n, offset_group * kh * kw, oh, ow)).astype(np.float32)
    got, want = _both("DeformConv", feeds, opset=19, offset_group=offset_group, **attrs)
    _close(got, want)


def test_deform_conv_zero_offset_is_conv() -> None:
    rng = np.random.default_rng(14)
    x = rng.standard_normal((1, 3, 7, 6)).astype(np.float32)
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    attrs = dict(strides=[2, 1], pads=[1, 1, 1, 1], dilations=[1, 2])
    conv = _ours("Conv", {"X": x, "W": w}, **attrs)
    offset = np.zeros((1, 18, *conv.shape[2:]), np.float32)
    deform = _ours("DeformConv", {"X": x, "W": w, "offset": offset}, opset=19, **attrs)
    np.testing.assert_allclose(deform, conv, rtol=1e-5, atol=1e-5)


# -- Col2Im --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "image,block,attrs",
    [
        ([5, 6], [2, 3], {}),
        ([6, 7], [3, 2], dict(strides=[2, 3], pads=[1, 0, 2, 1], dilations=[1, 2])),
        ([4, 5, 3], [2, 2, 2], dict(strides=[1, 2, 1])),
    ],
)
def test_col2im(image: list[int], block: list[int], attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(15)
    nd = len(image)
    s = attrs.get("strides", [1] * nd)
    d = attrs.get("dilations", [1] * nd)
    p = attrs.get("pads", [0] * 2 * nd)
    blocks = [(image[i] + p[i] + p[nd + i] - (block[i] - 1) * d[i] - 1) // s[i] + 1 for i in range(nd)]
    c = 2
    cols = rng.standard_normal((2, c * int(np.prod(block)), int(np.prod(blocks)))).astype(np.float32)
    feeds = {"input": cols, "image_shape": np.array(image, np.int64), "block_shape": np.array(block, np.int64)}
    if nd == 2:
        got, want = _both("Col2Im", feeds, opset=18, **attrs)
        _close(got, want)
    else:
        got = _ours("Col2Im", feeds, opset=18, **attrs)
        want = _col2im_reference(cols, image, block, s, d, p)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _col2im_reference(
    cols: np.ndarray, image: list[int], block: list[int], s: list[int], d: list[int], p: list[int]
) -> np.ndarray:
    nd = len(image)
    n = cols.shape[0]
    kk = int(np.prod(block))
    c = cols.shape[1] // kk
    padded = [image[i] + p[i] + p[nd + i] for i in range(nd)]
    blocks = [(padded[i] - (block[i] - 1) * d[i] - 1) // s[i] + 1 for i in range(nd)]
    out = np.zeros((n, c, *padded))
    col = cols.reshape(n, c, kk, -1)
    for li, bpos in enumerate(itertools.product(*(range(b) for b in blocks))):
        for ki, kpos in enumerate(itertools.product(*(range(b) for b in block))):
            idx = tuple(bpos[i] * s[i] + kpos[i] * d[i] for i in range(nd))
            out[(slice(None), slice(None), *idx)] += col[:, :, ki, li]
    return out[(slice(None), slice(None), *(slice(p[i], p[i] + image[i]) for i in range(nd)))]


def test_each_fast_path_is_chosen_where_expected() -> None:
    """The cases above only test the fast paths if the dispatcher really picks them."""
    from onnxpy.ops import conv as conv_mod

    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 64, 64, [56, 56]) == 4
    # 28x28 (49 tiles) to 112x112 (784 tiles) channels-last from 32 channels; 224x224 (3136
    # tiles, NCHW) from 64.
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 96, 96, [28, 28]) == 4
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 96, 96, [28, 28], host=False) == 0  # CuPy: NCHW rules
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 24, 48, [28, 28]) == 0
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 32, 64, [112, 112]) == 4
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 32, 64, [112, 112], host=False) == 0
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 32, 64, [224, 224]) == 0
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 64, 64, [224, 224]) == 4
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 64, 64, [112, 112]) == 4
    # 14x14 (49 tiles of 2x2, channels-last) from 32 channels; 10x10 (25 tiles, NCHW) from 192.
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 64, 96, [14, 14]) == 2
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 128, 128, [10, 10]) == 0
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 48, 192, [13, 13]) == 0  # M > 2C
    # M = 3C on a large map: channels-last F(4x4) on the host only; 4C stays direct.
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 64, 192, [56, 56]) == 4
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 64, 192, [56, 56], host=False) == 0
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 32, 128, [27, 27]) == 0
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 128, 128, [28, 28]) == 4
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 128, 32, [28, 28]) == 4
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 512, 512, [7, 7]) == 0  # cold weights: im2col
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 256, 256, [7, 7]) == 0  # small map: im2col
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 256, 256, [10, 10]) == 2
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 64, 64, [7, 9]) == 0  # small map, few channels
    assert conv_mod._winograd_tile([3, 3], [1, 1], [1, 1], 16, 64, [55, 55]) == 0  # M > 2C: direct GEMM
    assert conv_mod._winograd_tile([3, 3], [2, 2], [1, 1], 256, 256, [7, 7]) == 0
    calls: list[str] = []
    originals = {
        name: getattr(conv_mod, name)
        for name in (
            "_winograd",
            "_conv2d_padded_width",
            "_conv2d_tap_sum",
            "_im2col_gemm",
            "_im2col_channels_last",
            "_depthwise",
            "depthwise_channels_last",
        )
    }

    def spy(name: str) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return originals[name](*args, **kwargs)

        return wrapped

    rng = np.random.default_rng(3)
    cl_original = conv_mod.winograd_cl.winograd_channels_last
    originals["winograd_channels_last"] = cl_original
    try:
        for name in originals:
            if name == "winograd_channels_last":
                conv_mod.winograd_cl.winograd_channels_last = spy(name)
            else:
                setattr(conv_mod, name, spy(name))
        x = rng.standard_normal((1, 64, 6, 6)).astype(np.float32)
        big = rng.standard_normal((1, 128, 28, 28)).astype(np.float32)
        conv_mod.conv_nd(np, big, rng.standard_normal((128, 128, 3, 3)).astype(np.float32), pads=[1, 1, 1, 1])
        deep = rng.standard_normal((1, 256, 10, 10)).astype(np.float32)  # 25 tiles: the NCHW Winograd
        conv_mod.conv_nd(np, deep, rng.standard_normal((256, 256, 3, 3)).astype(np.float32), pads=[1, 1, 1, 1])
        conv_mod.conv_nd(np, x, rng.standard_normal((8, 64, 3, 3)).astype(np.float32), pads=[1, 1, 1, 1])  # 8 <= 64/4
        conv_mod.conv_nd(np, x, rng.standard_normal((24, 64, 3, 3)).astype(np.float32), pads=[1, 1, 1, 1])  # narrow
        wide = rng.standard_normal((1, 64, 6, 20)).astype(np.float32)
        conv_mod.conv_nd(np, wide, rng.standard_normal((24, 64, 3, 3)).astype(np.float32), pads=[1, 1, 1, 1])
        grouped = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)  # 4 groups of 16 -> 8
        conv_mod.conv_nd(np, wide, grouped, group=4, pads=[1, 1, 1, 1])
        conv_mod.conv_nd(np, x, rng.standard_normal((8, 64, 3, 3)).astype(np.float32), strides=[2, 2])
        patches = rng.standard_normal((1, 3, 32, 48)).astype(np.float32)  # 16x16 patches, 2x3 outputs
        conv_mod.conv_nd(np, patches, rng.standard_normal((8, 3, 16, 16)).astype(np.float32), strides=[16, 16])
        conv_mod.conv_nd(np, x, rng.standard_normal((8, 64, 2, 2)).astype(np.float32), strides=[2, 2])
        conv_mod.conv_nd(np, x, rng.standard_normal((8, 64, 2, 2)).astype(np.float32), strides=[1, 2])  # overlap
        conv_mod.conv_nd(np, x, rng.standard_normal((64, 1, 3, 3)).astype(np.float32), group=64, strides=[2, 2])
        conv_mod.conv_nd(np, x, rng.standard_normal((64, 1, 3, 3)).astype(np.float32), group=64, pads=[1, 1, 1, 1])
        dw = rng.standard_normal((64, 1, 3, 3)).astype(np.float32)
        conv_mod.conv_nd(np, x, dw, group=64, dilations=[2, 2], strides=[2, 2])  # dilated: channels-last too
        conv_mod.conv_nd(np, x, dw, group=64, dilations=[2, 2], pads=[2, 2, 2, 2])
    finally:
        conv_mod.winograd_cl.winograd_channels_last = cl_original
        for name, fn in originals.items():
            if name != "winograd_channels_last":
                setattr(conv_mod, name, fn)
    assert calls == [
        "winograd_channels_last",  # 49 tiles of 4x4
        "_winograd",
        "_conv2d_tap_sum",
        "_im2col_channels_last",  # 6 wide: channels-last columns
        "_im2col_gemm",  # 20 wide: the NCHW im2col
        "_conv2d_padded_width",  # grouped, stride 1
        "_im2col_channels_last",  # stride 2, 2 wide
        "_im2col_gemm",  # tiling windows: the NCHW columns, no larger than the input
        "_im2col_gemm",
        "_im2col_channels_last",  # 2x2 windows at strides (1, 2) overlap
        "depthwise_channels_last",
        "depthwise_channels_last",
        "depthwise_channels_last",
        "depthwise_channels_last",
    ]


@pytest.mark.parametrize("blas", [True, False], ids=["accumulated-by-blas", "added-after"])
def test_a_residual_convolution_adds_through_channels_last_columns(monkeypatch: pytest.MonkeyPatch, blas: bool) -> None:
    """FusedConv with a dying residual (the executor hands Z's buffer over) on a small map: the
    GEMM over channels-last columns adds into Z (BLAS beta = 1); without a BLAS to call, the
    plain result is added instead. Either way relu(conv(x) + b + z), in Z's buffer when added
    by BLAS."""
    from onnxpy.ops import conv as conv_mod
    from onnxpy.ops.fused import fused_conv

    built: list[tuple[int, ...]] = []
    original = conv_mod._channels_last_columns

    def counted(*args: Any) -> np.ndarray:
        columns = original(*args)
        built.append(columns.shape)
        return columns

    monkeypatch.setattr(conv_mod, "_channels_last_columns", counted)
    if not blas:
        monkeypatch.setattr(conv_mod, "gemm_accumulate", lambda *a: False)
    rng = np.random.default_rng(33)
    x = rng.standard_normal((1, 12, 9, 10)).astype(np.float32)
    w = rng.standard_normal((16, 12, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    z = rng.standard_normal((1, 16, 9, 10)).astype(np.float32)
    w.flags.writeable = b.flags.writeable = False
    buffer = z.copy()
    got = fused_conv(np, x, w, b, buffer, kernel_shape=[3, 3], pads=[1, 1, 1, 1], activation="Relu", out=buffer)
    args = ([1, 1], [1, 1, 1, 1], [1, 1], 1)
    want = np.maximum(reference_conv(x, w, b, *args) + z, 0)
    assert_conv_close(got, want, term_scale(x, w, b, *args) + np.abs(z))
    assert built and built[0] == (90, 12 * 9 + 1)  # 9x10 positions, taps x channels and the ones
    if blas:
        assert got is buffer


@pytest.mark.parametrize("reduce_limit", [0, 1 << 20], ids=["a-call-per-tap", "one-reduction"])
@pytest.mark.parametrize(
    "xs,ws,pads,dilations",
    [
        ((2, 16, 9, 8), (4, 16, 3, 3), [1, 1, 1, 1], [1, 1]),  # in place: no zero columns
        ((1, 20, 10, 9), (5, 20, 3, 2), [2, 0, 1, 3], [2, 3]),  # dilated, asymmetric, padded rows
        ((2, 16, 5, 8), (4, 16, 1, 7), [0, 3, 0, 3], [1, 1]),  # one kernel row
        ((1, 28, 12, 11), (3, 28, 7, 7), [3, 2, 3, 4], [1, 1]),  # 49 taps: groups of products, per tap
    ],
    ids=["3x3", "dilated", "1x7", "7x7"],
)
def test_tap_sum_adds_its_taps_by_one_reduction_or_per_tap_alike(
    monkeypatch: pytest.MonkeyPatch,
    xs: tuple[int, ...],
    ws: tuple[int, ...],
    pads: list[int],
    dilations: list[int],
    reduce_limit: int,
) -> None:
    """The tap sum's blocks added by one reduction over a strided view of them (small maps,
    every tap in one product) or one add per tap give the convolution."""
    from onnxpy.ops import conv as conv_mod

    monkeypatch.setattr(conv_mod, "_TAP_SUM_REDUCE_MAX_POSITIONS", reduce_limit)
    monkeypatch.setattr(conv_mod, "_tap_sum_pays", lambda *a: True)
    views: list[tuple[int, ...]] = []
    original = conv_mod.strided_view
    monkeypatch.setattr(conv_mod, "strided_view", lambda a, shape, st: views.append(shape) or original(a, shape, st))
    rng = np.random.default_rng(31)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    got = _ours("Conv", {"X": x, "W": w, "B": b}, pads=pads, dilations=dilations)
    want = reference_conv(x, w, b, [1, 1], pads, dilations, 1)
    assert_conv_close(got, want, term_scale(x, w, b, [1, 1], pads, dilations, 1))
    reduced = [v for v in views if len(v) == 4 and v[:2] == ws[2:]]
    assert bool(reduced) == (reduce_limit > 0 and ws[2] * ws[3] <= 9), views


def test_tap_sum_writes_a_channel_slice_of_a_concatenation_in_place() -> None:
    """The tap sum adds its shifted products straight into ``into`` when that holds whole rows
    (a concatenation's channel slice, as ConcatConv hands over), two images, with the bias; the
    channels around the slice stay untouched."""
    from onnxpy.ops import conv as conv_mod

    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 24, 6, 7)).astype(np.float32)
    w = rng.standard_normal((5, 24, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    buffer = np.full((2, 9, 6, 7), 7.0, dtype=np.float32)
    into = buffer[:, 2:7]
    got = conv_mod.conv_nd(np, x, w, b, pads=[1, 1, 1, 1], into=into)
    assert got is into
    want = reference_conv(x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], 1)
    assert_conv_close(buffer[:, 2:7], want, term_scale(x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], 1))
    assert np.all(buffer[:, :2] == 7.0) and np.all(buffer[:, 7:] == 7.0)


def test_bias_augmented_weights_follow_changes_to_writable_weights() -> None:
    """Only constants (read-only) have their [W | b] cached: a writable W that changes between
    calls gives the new result, never a stale one."""
    from onnxpy.ops import conv as conv_mod

    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    w = rng.standard_normal((6, 2, 1, 1)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    first = conv_mod.conv_nd(np, x, w, b)
    w *= 2
    second = conv_mod.conv_nd(np, x, w, b)
    np.testing.assert_allclose(second, reference_conv(x, w, b, [1, 1], [0, 0, 0, 0], [1, 1], 1), rtol=1e-5, atol=1e-5)
    assert not np.allclose(first, second)
    w_const, b_const = w.copy(), b.copy()
    w_const.flags.writeable = False
    b_const.flags.writeable = False
    again = [conv_mod.conv_nd(np, x, w_const, b_const) for _ in range(2)]
    np.testing.assert_array_equal(again[0], again[1])
    np.testing.assert_allclose(again[0], second, rtol=1e-6)


def test_one_session_follows_changing_input_shapes() -> None:
    """The per-node geometry memo is keyed by input shapes: alternating sizes stay right, and a
    shape that fails keeps failing (nothing about it is remembered)."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["X", "W"], ["Y"], pads=[1, 0, 1, 0], strides=[2, 1])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    ours = onnxpy.InferenceSession(data)
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for shape in [(1, 3, 9, 8), (2, 3, 5, 11), (1, 3, 9, 8), (3, 3, 4, 4), (2, 3, 5, 11)]:
        x = rng.standard_normal(shape).astype(np.float32)
        _close(ours.run(None, {"X": x})[0], theirs.run(None, {"X": x})[0])
    for _ in range(2):
        with pytest.raises(onnxpy.OnnxpyError, match="larger than the padded input"):
            ours.run(None, {"X": rng.standard_normal((1, 3, 9, 1)).astype(np.float32)})


# A convolution plus a smaller term computed in the graph, which broadcasts up to its output
# (a diffusion UNet's timestep embedding, FiLM conditioning): the optimizer fuses the Add into
# FusedConv as its residual, and the executor may hand over the term's buffer as the output,
# which is too small to hold it. (Exported by PyTorch, this failed at the default level.)
ADDEND_CASES = {
    # name: (node making the term from input E, E's shape)
    "per_image_channel": (helper.make_node("ReduceMean", ["E"], ["T"], axes=[2, 3], keepdims=1), (2, 16, 5, 5)),
    "per_position": (helper.make_node("ReduceMean", ["E"], ["T"], axes=[1], keepdims=1), (2, 7, 8, 8)),
    "scalar": (helper.make_node("ReduceMean", ["E"], ["T"], keepdims=0), (3, 4)),
}


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("case", sorted(ADDEND_CASES))
def test_conv_plus_a_computed_term_that_broadcasts(case: str, kernel: int, relu: bool) -> None:
    make_term, e_shape = ADDEND_CASES[case]
    rng = np.random.default_rng(zlib.crc32(case.encode()) + kernel)
    w = rng.standard_normal((16, 8, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["X", "W", "B"], ["C"], pads=[kernel // 2] * 4),
        make_term,
        helper.make_node("Add", ["C", "T"], ["S"]),
    ]
    nodes.append(helper.make_node("Relu", ["S"], ["Y"]) if relu else helper.make_node("Identity", ["S"], ["Y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 8, 8, 8]),
         helper.make_tensor_value_info("E", TensorProto.FLOAT, list(e_shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(b, "B")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    feeds = {
        "X": rng.standard_normal((2, 8, 8, 8)).astype(np.float32),
        "E": rng.standard_normal(e_shape).astype(np.float32),
    }
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = onnxpy.InferenceSession(data).run(None, feeds)[0]
    assert got.shape == want.shape == (2, 16, 8, 8)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "xs,ws,pads,dilations,bias",
    [
        ((2, 5, 9, 11), (4, 5, 3, 3), [1, 1, 1, 1], [1, 1], True),
        ((1, 4, 10, 9), (3, 4, 3, 2), [0, 2, 1, 1], [2, 3], False),  # asymmetric, dilated
        ((1, 3, 6, 7), (2, 3, 5, 5), [4, 3, 2, 4], [1, 1], True),  # pads past the kernel
        ((1, 6, 8, 8), (5, 6, 1, 4), [0, 0, 0, 0], [1, 1], True),  # unpadded, 1x4
    ],
    ids=["3x3", "dilated-asymmetric", "5x5-wide-pads", "unpadded-1x4"],
)
def test_2d_convolution_as_products_per_tap(
    monkeypatch: pytest.MonkeyPatch, xs: tuple, ws: tuple, pads: list[int], dilations: list[int], bias: bool
) -> None:
    """Stride-1 2-D layers with large im2col columns (Inception v3's 147x147 maps: 25 MB) add
    one product per tap instead; a zero threshold takes that path here."""
    from onnxpy.ops import conv as conv_mod

    calls = _check_per_tap(monkeypatch, "_TAP_ACCUMULATE_MIN_BYTES_2D", xs, ws, pads, dilations, bias)
    # Grouped and strided layers keep their own paths.
    rng = np.random.default_rng(35)
    x, w = rng.standard_normal((1, 4, 8, 8)).astype(np.float32), rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    conv_mod.conv_nd(np, x, w, group=2, pads=[1, 1, 1, 1])
    conv_mod.conv_nd(np, x, w[:, :1].repeat(4, axis=1), pads=[1, 1, 1, 1], strides=[2, 1])
    assert len(calls) == 1


@pytest.mark.parametrize("kernel", [(3, 3, 3), (3, 1, 1)])
def test_3d_products_per_tap_fall_back_without_blas(monkeypatch: pytest.MonkeyPatch, kernel: tuple) -> None:
    # Another numpy build (no OpenBLAS routine to call): im2col, and the same numbers.
    from onnxpy.ops import conv as conv_mod

    monkeypatch.setattr(conv_mod, "_TAP_ACCUMULATE_MIN_BYTES", 0)
    monkeypatch.setattr(conv_mod, "gemm_accumulate", lambda *a: False)
    rng = np.random.default_rng(34)
    x = rng.standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, *kernel)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    pads = [1, 0, 1, 1, 2, 1] if kernel[1] > 1 else [1, 0, 0, 1, 0, 0]
    got = conv_mod.conv_nd(np, x, w, b, pads=pads)
    want = reference_conv(x, w, b, [1, 1, 1], pads, [1, 1, 1], 1)
    assert_conv_close(got, want, term_scale(x, w, b, [1, 1, 1], pads, [1, 1, 1], 1))


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("shuffle", [0, 4])
@pytest.mark.parametrize("into", [False, True])
def test_grouped_pointwise_adds_its_bias_in_the_products(n: int, shuffle: int, into: bool) -> None:
    """A grouped 1x1 convolution on a map of >= _GROUPED_BIAS_MIN_POSITIONS positions adds its
    bias through a row of ones under each group's input (ShuffleNet's), channel-shuffled or not,
    into a given buffer or not: the direct reference's numbers, every group's own bias."""
    from onnxpy.ops import conv as conv_mod

    rng = np.random.default_rng(n + shuffle)
    x = rng.standard_normal((n, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((24, 4, 1, 1)).astype(np.float32)
    b = (10 * rng.standard_normal(24)).astype(np.float32)  # large enough to see a wrong group's
    assert conv_mod._grouped_bias_pays(x, 144)
    want = reference_conv(x, w, b, [1, 1], [0, 0, 0, 0], [1, 1], 4)
    if shuffle:  # channel a * M/g + j lands at j * g + a
        want = want.reshape(n, shuffle, 24 // shuffle, 12, 12).transpose(0, 2, 1, 3, 4).reshape(n, 24, 12, 12)
    buf = np.full((n, 24, 12, 12), np.nan, np.float32) if into and not shuffle else None
    got = conv_mod.conv_nd(np, x, w, b, group=4, shuffle_groups=shuffle, into=buf)
    if buf is not None:
        assert got is buf
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_bias_in_the_products_only_where_it_pays() -> None:
    from onnxpy.ops import conv as conv_mod

    nchw = np.zeros((1, 136, 28, 28), np.float32)
    assert conv_mod._grouped_bias_pays(nchw, 784)
    assert not conv_mod._grouped_bias_pays(nchw[:, :, :7, :7].copy(), 49)  # 7x7: the K + 1 products lose
    channels_last = np.zeros((1, 28, 28, 136), np.float32).transpose(0, 3, 1, 2)
    assert not conv_mod._grouped_bias_pays(channels_last, 784)  # one transpose per group would be needed
