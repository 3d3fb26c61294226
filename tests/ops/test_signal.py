"""Signal kernels against onnxruntime and numpy.fft: DFT (17 and 20, forward / inverse,
one-sided, dft_length, axis), STFT, MelWeightMatrix and the cosine windows; ImageDecoder on
PNG, BMP, PNM, TIFF and JPEG streams written by the encoders below (no files, no downloads)."""

from __future__ import annotations

import heapq
import struct
import zlib
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.model.dtypes import elem_type
from tests.helpers import skip_before_onnxruntime

RNG = np.random.default_rng(99)


def node_model(op: str, inputs: dict[str, np.ndarray | None], opset: int, **attrs: Any) -> bytes:
    names = [n if v is not None else "" for n, v in inputs.items()]
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, ["y"], **attrs)
    vis = [helper.make_tensor_value_info(n, elem_type(v.dtype), v.shape) for n, v in inputs.items() if v is not None]
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", 0, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 21 else 10
    inferred = onnx.shape_inference.infer_shapes(model)
    model.graph.output[0].type.CopyFrom(inferred.graph.output[0].type)
    if not model.graph.output[0].type.tensor_type.elem_type:
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    return model.SerializeToString()


def feeds_of(inputs: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    return {n: v for n, v in inputs.items() if v is not None}


def ours(op: str, inputs: dict[str, np.ndarray | None], opset: int, **attrs: Any) -> np.ndarray:
    return onnxpy.InferenceSession(node_model(op, inputs, opset, **attrs)).run(None, feeds_of(inputs))[0]


def theirs(op: str, inputs: dict[str, np.ndarray | None], opset: int, **attrs: Any) -> np.ndarray:
    sess = ort.InferenceSession(node_model(op, inputs, opset, **attrs), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds_of(inputs))[0]


def complex_of(x: np.ndarray) -> np.ndarray:
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0].astype(np.complex128)


# -- DFT ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("inverse", [0, 1])
@pytest.mark.parametrize("complex_in", [False, True])
@pytest.mark.parametrize("axis", [1, 2, -2, -3])
@pytest.mark.parametrize("length", [None, 5, 12])
def test_dft_20_against_onnxruntime(inverse: int, complex_in: bool, axis: int, length: int | None) -> None:
    x = RNG.standard_normal((2, 8, 6, 2 if complex_in else 1)).astype(np.float32)
    inputs = {
        "input": x,
        "dft_length": None if length is None else np.array(length, np.int64),
        "axis": np.array(axis, np.int64),
    }
    got = ours("DFT", inputs, 20, inverse=inverse)
    want = theirs("DFT", inputs, 20, inverse=inverse)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # And against numpy.fft.
    a = axis if axis >= 0 else axis + x.ndim
    f = np.fft.ifft if inverse else np.fft.fft
    ref = f(complex_of(x.astype(np.float64)), n=length, axis=a)
    np.testing.assert_allclose(complex_of(got), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("length", [None, 7, 10])
@pytest.mark.parametrize("axis", [1, 2])
def test_dft_one_sided(length: int | None, axis: int) -> None:
    x = RNG.standard_normal((3, 8, 6, 1))
    n = np.array(length, np.int64) if length is not None else None
    got = ours("DFT", {"input": x, "dft_length": n, "axis": np.array(axis, np.int64)}, 20, onesided=1)
    ref = np.fft.rfft(x[..., 0], n=length, axis=axis)
    assert got.dtype == np.float64
    np.testing.assert_allclose(complex_of(got), ref, rtol=1e-10, atol=1e-10)
    # IRFFT of that spectrum: back to the (padded / cut) signal.
    inv = ours("DFT", {"input": got, "dft_length": n, "axis": np.array(axis, np.int64)}, 20, onesided=1, inverse=1)
    want = np.fft.irfft(ref, n=length, axis=axis)
    np.testing.assert_allclose(inv[..., 0], want, rtol=1e-10, atol=1e-10)
    if length is None:
        assert inv.shape[axis] == 2 * (got.shape[axis] - 1)


def test_dft_one_sided_against_onnxruntime() -> None:
    x = RNG.standard_normal((2, 10, 1)).astype(np.float32)
    got = ours("DFT", {"input": x}, 20, onesided=1)
    np.testing.assert_allclose(got, theirs("DFT", {"input": x}, 20, onesided=1), rtol=1e-4, atol=1e-4)
    spec = np.asarray(got)
    skip_before_onnxruntime((1, 24), "refuses a one-sided inverse DFT")
    got = ours("DFT", {"input": spec}, 20, onesided=1, inverse=1)
    np.testing.assert_allclose(got, theirs("DFT", {"input": spec}, 20, onesided=1, inverse=1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axis", [1, 2])
@pytest.mark.parametrize("inverse", [0, 1])
def test_dft_17_axis_attribute(axis: int, inverse: int) -> None:
    x = RNG.standard_normal((2, 4, 6, 2)).astype(np.float32)
    n = np.array(8, np.int64)
    got = ours("DFT", {"input": x, "dft_length": n}, 17, axis=axis, inverse=inverse)
    want = theirs("DFT", {"input": x, "dft_length": n}, 17, axis=axis, inverse=inverse)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_dft_float_types(dtype: Any) -> None:
    x = RNG.standard_normal((2, 16, 2)).astype(dtype)
    got = ours("DFT", {"input": x}, 20)
    assert got.dtype == np.dtype(dtype)
    ref = np.fft.fft(complex_of(x.astype(np.float64)), axis=1)
    tol = 2e-2 if dtype == np.float16 else 1e-10
    np.testing.assert_allclose(complex_of(got.astype(np.float64)), ref, rtol=tol, atol=tol * 4)


def test_dft_rejects_the_complex_axis() -> None:
    x = np.zeros((2, 4, 1), np.float32)
    with pytest.raises(Exception, match="axis"):
        ours("DFT", {"input": x, "dft_length": None, "axis": np.array(2, np.int64)}, 20)


# -- STFT -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("onesided", [0, 1])
# (Neither window nor frame_length: the frame is the whole signal, tested below.)
@pytest.mark.parametrize(("with_window", "with_length"), [(True, False), (False, True), (True, True)])
def test_stft(onesided: int, with_window: bool, with_length: bool) -> None:
    sig = RNG.standard_normal((2, 100, 1)).astype(np.float32)
    window = np.hanning(16).astype(np.float32) if with_window else None
    inputs = {
        "signal": sig,
        "frame_step": np.array(6, np.int64),
        "window": window,
        "frame_length": np.array(16, np.int64) if with_length else None,
    }
    got = ours("STFT", inputs, 17, onesided=onesided)
    want = theirs("STFT", inputs, 17, onesided=onesided)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    frames = (100 - 16) // 6 + 1
    assert got.shape == (2, frames, 9 if onesided else 16, 2)
    # numpy: frame, window, transform.
    idx = np.arange(frames)[:, None] * 6 + np.arange(16)
    seg = sig[:, idx, 0].astype(np.float64) * (window if window is not None else 1.0)
    ref = np.fft.rfft(seg, axis=-1) if onesided else np.fft.fft(seg, axis=-1)
    np.testing.assert_allclose(complex_of(got), ref, rtol=1e-4, atol=1e-4)


def test_stft_complex_signal_and_default_frame_length() -> None:
    sig = RNG.standard_normal((1, 32, 2))
    got = ours("STFT", {"signal": sig, "frame_step": np.array(4, np.int64)}, 17, onesided=0)
    assert got.shape == (1, 1, 32, 2)
    np.testing.assert_allclose(complex_of(got)[0, 0], np.fft.fft(complex_of(sig)[0]), rtol=1e-10, atol=1e-10)


def test_stft_window_length_mismatch() -> None:
    sig = np.zeros((1, 32, 1), np.float32)
    inputs = {
        "signal": sig,
        "frame_step": np.array(4, np.int64),
        "window": np.ones(8, np.float32),
        "frame_length": np.array(16, np.int64),
    }
    with pytest.raises(Exception, match="window has length 8"):
        ours("STFT", inputs, 17)


# -- MelWeightMatrix and windows ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bins", "dft", "rate", "low", "high"),
    [(8, 64, 16000, 20.0, 8000.0), (10, 512, 22050, 0.0, 11025.0), (4, 33, 8000, 100.0, 3000.0)],
)
@pytest.mark.parametrize("out_type", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_mel_weight_matrix(bins: int, dft: int, rate: int, low: float, high: float, out_type: int) -> None:
    inputs = {
        "num_mel_bins": np.array(bins, np.int64),
        "dft_length": np.array(dft, np.int64),
        "sample_rate": np.array(rate, np.int64),
        "lower_edge_hertz": np.array(low, np.float32),
        "upper_edge_hertz": np.array(high, np.float32),
    }
    got = ours("MelWeightMatrix", inputs, 17, output_datatype=out_type)
    want = theirs("MelWeightMatrix", inputs, 17, output_datatype=out_type)
    assert got.shape == (dft // 2 + 1, bins)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mel_weight_matrix_without_bins_is_empty() -> None:
    inputs = {
        "num_mel_bins": np.array(0, np.int64),
        "dft_length": np.array(16, np.int64),
        "sample_rate": np.array(16000, np.int64),
        "lower_edge_hertz": np.array(0.0, np.float32),
        "upper_edge_hertz": np.array(8000.0, np.float32),
    }
    got = ours("MelWeightMatrix", inputs, 17)
    want = theirs("MelWeightMatrix", inputs, 17)
    assert got.shape == want.shape == (9, 0) and got.dtype == want.dtype


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [1, 2, 10, 33])
def test_windows(op: str, periodic: int, size: int) -> None:
    inputs = {"size": np.array(size, np.int64)}
    got = ours(op, inputs, 17, periodic=periodic)
    n = size if periodic else size - 1
    if n > 0:
        k = 2 * np.pi * np.arange(size) / n
        want = {
            "HannWindow": 0.5 - 0.5 * np.cos(k),
            "HammingWindow": 25 / 46 - 21 / 46 * np.cos(k),
            "BlackmanWindow": 0.42 - 0.5 * np.cos(k) + 0.08 * np.cos(2 * k),
        }[op]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, theirs(op, inputs, 17, periodic=periodic), rtol=1e-5, atol=1e-6)
    else:
        # A symmetric window of size 1 divides by size - 1 = 0 in the spec's function body: NaN,
        # as onnxruntime gives (onnxpy gave 1.0).
        assert np.isnan(got).all() and np.isnan(theirs(op, inputs, 17, periodic=periodic)).all()
    assert got.shape == (size,)
    assert got.dtype == np.float32


@pytest.mark.parametrize("size", [7, 8, 10])
@pytest.mark.parametrize("out_type", [TensorProto.INT8, TensorProto.UINT8, TensorProto.INT32, TensorProto.INT64])
def test_blackman_window_to_integers_keeps_its_centre_one(size: int, out_type: int) -> None:
    # The spec computes in float32, where 0.42 + 0.5 + 0.08 is 1.0 and truncates to 1; from
    # float64's 0.9999999999999999 it truncated to 0.
    inputs = {"size": np.array(size, np.int64)}
    periodic = int(size % 2 == 0)
    got = ours("BlackmanWindow", inputs, 17, periodic=periodic, output_datatype=out_type)
    assert got.tolist() == theirs("BlackmanWindow", inputs, 17, periodic=periodic, output_datatype=out_type).tolist()
    assert got.sum() == 1


def test_mel_weight_matrix_refuses_an_upper_edge_past_the_spectrum() -> None:
    # The top triangle would have been cut off silently; onnxruntime refuses it too.
    inputs = {
        "num_mel_bins": np.array(8, np.int64),
        "dft_length": np.array(64, np.int64),
        "sample_rate": np.array(8000, np.int64),
        "lower_edge_hertz": np.array(800.0, np.float32),
        "upper_edge_hertz": np.array(5200.0, np.float32),
    }
    with pytest.raises(onnxpy.RuntimeException, match="upper_edge_hertz 5200.0 lands in bin 36, past the 33 bins"):
        ours("MelWeightMatrix", inputs, 17)
    with pytest.raises(Exception):  # noqa: B017, PT011 - onnxruntime's own error class
        theirs("MelWeightMatrix", inputs, 17)
    inputs["upper_edge_hertz"] = np.array(4000.0, np.float32)  # the Nyquist frequency itself is fine
    np.testing.assert_allclose(ours("MelWeightMatrix", inputs, 17), theirs("MelWeightMatrix", inputs, 17), atol=1e-6)


def test_window_output_datatype() -> None:
    inputs = {"size": np.array(8, np.int32)}
    got = ours("HannWindow", inputs, 17, output_datatype=TensorProto.DOUBLE)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, theirs("HannWindow", inputs, 17, output_datatype=TensorProto.DOUBLE), rtol=1e-12)


# -- ImageDecoder: encoders ----------------------------------------------------------------------


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _pack_samples(v: np.ndarray, bits: int) -> np.ndarray:
    """(H, N) sample values -> (H, row_bytes) MSB-first packed bytes."""
    if bits == 8:
        return v.astype(np.uint8)
    if bits == 16:
        return v.astype(">u2").view(np.uint8).reshape(v.shape[0], -1)
    b = ((v[:, :, None] >> np.arange(bits - 1, -1, -1)) & 1).astype(np.uint8).reshape(v.shape[0], -1)
    return np.packbits(b, axis=1)


def _png_filter(rows: np.ndarray, bpp: int, ftypes: list[int]) -> bytes:
    out = bytearray()
    prev = np.zeros(rows.shape[1], dtype=np.int32)
    for r, row in enumerate(rows.astype(np.int32)):
        f = ftypes[r % len(ftypes)]
        left = np.concatenate([np.zeros(bpp, np.int32), row[:-bpp]])
        upleft = np.concatenate([np.zeros(bpp, np.int32), prev[:-bpp]])
        if f == 0:
            pred = np.zeros_like(row)
        elif f == 1:
            pred = left
        elif f == 2:
            pred = prev
        elif f == 3:
            pred = (left + prev) // 2
        else:
            p = left + prev - upleft
            pa, pb, pc = abs(p - left), abs(p - prev), abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, upleft))
        out.append(f)
        out += ((row - pred) & 255).astype(np.uint8).tobytes()
        prev = row
    return bytes(out)


def make_png(
    img: np.ndarray,
    color: int,
    bits: int,
    filters: list[int],
    interlace: bool = False,
    palette: np.ndarray | None = None,
) -> bytes:
    h, w, c = img.shape
    bpp = max(1, c * bits // 8)

    def encode(sub: np.ndarray) -> bytes:
        rows = _pack_samples(sub.reshape(sub.shape[0], -1), bits)
        return _png_filter(rows, bpp, filters)

    if not interlace:
        raw = encode(img)
    else:
        passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
        raw = b"".join(encode(img[y0::dy, x0::dx]) for x0, y0, dx, dy in passes if img[y0::dy, x0::dx].size)
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bits, color, 0, 0, int(interlace)))
    if palette is not None:
        out += _chunk(b"PLTE", palette.astype(np.uint8).tobytes())
    idat = zlib.compress(raw)
    out += _chunk(b"IDAT", idat[: len(idat) // 2]) + _chunk(b"IDAT", idat[len(idat) // 2 :])
    return out + _chunk(b"IEND", b"")


def decode(data: bytes, pixel_format: str = "RGB") -> np.ndarray:
    stream = np.frombuffer(data, dtype=np.uint8)
    return ours("ImageDecoder", {"encoded_stream": stream}, 20, pixel_format=pixel_format)


def luma(rgb: np.ndarray) -> np.ndarray:
    v = rgb.astype(np.int64)
    return ((v[..., 0] * 19595 + v[..., 1] * 38470 + v[..., 2] * 7471 + 32768) >> 16).astype(np.uint8)[..., None]


IMG = RNG.integers(0, 256, (13, 21, 3), dtype=np.uint8)


# -- ImageDecoder: PNG ---------------------------------------------------------------------------


@pytest.mark.parametrize("filters", [[0], [1], [2], [3], [4], [0, 1, 2, 3, 4]])
@pytest.mark.parametrize("interlace", [False, True])
def test_png_rgb_filters_and_interlace(filters: list[int], interlace: bool) -> None:
    data = make_png(IMG, 2, 8, filters, interlace)
    np.testing.assert_array_equal(decode(data), IMG)
    np.testing.assert_array_equal(decode(data, "BGR"), IMG[:, :, ::-1])
    np.testing.assert_array_equal(decode(data, "Grayscale"), luma(IMG))


@pytest.mark.parametrize("bits", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("interlace", [False, True])
def test_png_gray_bit_depths(bits: int, interlace: bool) -> None:
    g = RNG.integers(0, 1 << bits, (9, 11, 1))
    data = make_png(g, 0, bits, [4, 1, 3], interlace)
    want = (g >> 8) if bits == 16 else g * 255 // ((1 << bits) - 1)
    got = decode(data, "Grayscale")
    np.testing.assert_array_equal(got, want.astype(np.uint8))
    np.testing.assert_array_equal(decode(data), np.repeat(want, 3, axis=2).astype(np.uint8))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_png_palette(bits: int) -> None:
    pal = RNG.integers(0, 256, (1 << bits, 3))
    idx = RNG.integers(0, 1 << bits, (7, 10, 1))
    data = make_png(idx, 3, bits, [0, 2, 4], palette=pal)
    np.testing.assert_array_equal(decode(data), pal[idx[:, :, 0]].astype(np.uint8))


@pytest.mark.parametrize(("color", "channels"), [(4, 2), (6, 4), (2, 3)])
@pytest.mark.parametrize("bits", [8, 16])
def test_png_alpha_dropped_and_16_bit(color: int, channels: int, bits: int) -> None:
    img = RNG.integers(0, 1 << bits, (6, 5, channels))
    data = make_png(img, color, bits, [1, 4], interlace=bits == 16)
    want = (img >> 8) if bits == 16 else img
    gray = color == 4
    got = decode(data, "Grayscale" if gray else "RGB")
    np.testing.assert_array_equal(got, want[:, :, : 1 if gray else 3].astype(np.uint8))


# -- ImageDecoder: BMP ---------------------------------------------------------------------------


def make_bmp(
    img: np.ndarray, bits: int, top_down: bool = False, palette: np.ndarray | None = None, rle: bool = False
) -> bytes:
    h, w = img.shape[:2]
    compression = 0
    extra = b""
    if bits == 24:
        rows = img[:, :, ::-1].reshape(h, -1)
    elif bits == 32:
        rows = np.concatenate([img[:, :, ::-1], np.full((h, w, 1), 255, np.uint8)], axis=2).reshape(h, -1)
    elif bits == 16:  # BI_BITFIELDS 5-6-5
        v = (
            ((img[:, :, 0].astype(np.uint16) >> 3) << 11)
            | ((img[:, :, 1].astype(np.uint16) >> 2) << 5)
            | (img[:, :, 2] >> 3)
        )
        rows = v.astype("<u2").view(np.uint8).reshape(h, -1)
        compression = 3
        extra = struct.pack("<III", 0xF800, 0x07E0, 0x001F)
    else:
        rows = _pack_samples(img[:, :, 0].astype(np.int64), bits)
    stride = (rows.shape[1] + 3) // 4 * 4
    padded = np.zeros((h, stride), np.uint8)
    padded[:, : rows.shape[1]] = rows
    order = padded if top_down else padded[::-1]
    pixels = order.tobytes()
    if rle:
        compression = 1 if bits == 8 else 2
        out = bytearray()
        for row in img[:, :, 0] if top_down else img[::-1, :, 0]:
            i = 0
            while i < w:
                j = i
                while j < w and row[j] == row[i] and j - i < 255:
                    j += 1
                if j - i == 1 and w - i >= 3:
                    # Absolute mode: literal values, padded to a 16-bit boundary.
                    m = 3
                    lit = [int(v) for v in row[i : i + m]]
                    packed = bytes(lit) if bits == 8 else bytes([lit[0] << 4 | lit[1], lit[2] << 4])
                    out += bytes([0, m]) + packed + b"\x00" * (len(packed) & 1)
                    i += m
                    continue
                out += bytes([j - i, row[i] if bits == 8 else row[i] << 4 | row[i]])
                i = j
            out += b"\x00\x00"
        pixels = bytes(out) + b"\x00\x01"
    pal = b""
    if palette is not None:
        pal = (
            np.concatenate([palette[:, ::-1], np.zeros((len(palette), 1), np.int64)], axis=1).astype(np.uint8).tobytes()
        )
    offset = 14 + 40 + len(extra) + len(pal)
    info = struct.pack(
        "<IiiHHIIiiII",
        40,
        w,
        -h if top_down else h,
        1,
        bits,
        compression,
        len(pixels),
        2835,
        2835,
        len(palette) if palette is not None else 0,
        0,
    )
    head = b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset)
    return head + info + extra + pal + pixels


@pytest.mark.parametrize("bits", [24, 32])
@pytest.mark.parametrize("top_down", [False, True])
def test_bmp_true_color(bits: int, top_down: bool) -> None:
    np.testing.assert_array_equal(decode(make_bmp(IMG, bits, top_down)), IMG)


def test_bmp_16_bit_bitfields() -> None:
    got = decode(make_bmp(IMG, 16))
    r5, g6, b5 = IMG[:, :, 0] >> 3, IMG[:, :, 1] >> 2, IMG[:, :, 2] >> 3
    want = np.stack([r5.astype(int) * 255 // 31, g6.astype(int) * 255 // 63, b5.astype(int) * 255 // 31], axis=-1)
    np.testing.assert_array_equal(got, want.astype(np.uint8))


@pytest.mark.parametrize(("bits", "rle"), [(1, False), (4, False), (8, False), (8, True), (4, True)])
def test_bmp_palette_and_rle(bits: int, rle: bool) -> None:
    pal = RNG.integers(0, 256, (1 << bits, 3))
    idx = RNG.integers(0, 1 << bits, (9, 14, 1))
    idx[2, 3:12] = 1  # a run
    np.testing.assert_array_equal(decode(make_bmp(idx, bits, palette=pal, rle=rle)), pal[idx[:, :, 0]].astype(np.uint8))


# -- ImageDecoder: PNM ---------------------------------------------------------------------------


def test_pnm_all_kinds() -> None:
    h, w = 5, 11
    bw = RNG.integers(0, 2, (h, w))
    gray = RNG.integers(0, 256, (h, w))
    rgb = IMG[:h, :w]
    white_is_zero = np.where(bw > 0, 0, 255).astype(np.uint8)[..., None]
    p1 = b"P1\n# comment\n%d %d\n" % (w, h) + "\n".join("".join(str(v) for v in r) for r in bw).encode()
    p4 = b"P4 %d %d\n" % (w, h) + np.packbits(bw.astype(np.uint8), axis=1).tobytes()
    p2 = b"P2 %d %d 255\n" % (w, h) + " ".join(str(v) for v in gray.ravel()).encode()
    p5 = b"P5\n%d %d\n255\n" % (w, h) + gray.astype(np.uint8).tobytes()
    p3 = b"P3\n%d %d\n255\n" % (w, h) + " ".join(str(v) for v in rgb.ravel()).encode()
    p6 = b"P6\n%d %d\n255\n" % (w, h) + rgb.tobytes()
    np.testing.assert_array_equal(decode(p1, "Grayscale"), white_is_zero)
    np.testing.assert_array_equal(decode(p4, "Grayscale"), white_is_zero)
    np.testing.assert_array_equal(decode(p2, "Grayscale"), gray.astype(np.uint8)[..., None])
    np.testing.assert_array_equal(decode(p5, "Grayscale"), gray.astype(np.uint8)[..., None])
    np.testing.assert_array_equal(decode(p3), rgb)
    np.testing.assert_array_equal(decode(p6, "BGR"), rgb[:, :, ::-1])


def test_pnm_wide_maxval_and_pam() -> None:
    v = RNG.integers(0, 1001, (4, 6, 3))
    p6 = b"P6\n6 4\n1000\n" + v.astype(">u2").tobytes()
    np.testing.assert_array_equal(decode(p6), ((v * 255 + 500) // 1000).astype(np.uint8))
    rgba = RNG.integers(0, 256, (4, 6, 4))
    pam = b"P7\nWIDTH 6\nHEIGHT 4\nDEPTH 4\nMAXVAL 255\nTUPLTYPE RGB_ALPHA\nENDHDR\n" + rgba.astype(np.uint8).tobytes()
    np.testing.assert_array_equal(decode(pam), rgba[:, :, :3].astype(np.uint8))


# -- ImageDecoder: TIFF --------------------------------------------------------------------------


def _lzw_encode(data: bytes) -> bytes:
    """TIFF LZW: 9..12-bit MSB-first codes ("early change" widths)."""
    bits: list[str] = []
    width = 9

    def emit(code: int) -> None:
        bits.append(format(code, f"0{width}b"))

    table = {bytes([i]): i for i in range(256)}
    nxt = 258
    emit(256)
    w = b""
    for ch in data:
        wc = w + bytes([ch])
        if wc in table:
            w = wc
            continue
        emit(table[w])
        table[wc] = nxt
        nxt += 1
        # The reader's table lags one entry behind and widens at 2**width - 1 entries.
        if nxt == (1 << width) and width < 12:
            width += 1
        if nxt >= 4093:
            emit(256)
            table = {bytes([i]): i for i in range(256)}
            nxt, width = 258, 9
        w = bytes([ch])
    if w:
        emit(table[w])
    emit(257)
    s = "".join(bits)
    s += "0" * (-len(s) % 8)
    return int(s, 2).to_bytes(len(s) // 8, "big") if s else b""


def _packbits_encode(data: bytes) -> bytes:
    out = bytearray()
    i = 0
    while i < len(data):
        j = i
        while j < len(data) and data[j] == data[i] and j - i < 128:
            j += 1
        if j - i >= 2:
            out += bytes([257 - (j - i), data[i]])
            i = j
        else:
            k = i
            while k < len(data) and k - i < 128 and not (k + 1 < len(data) and data[k + 1] == data[k]):
                k += 1
            k = max(k, i + 1)
            out += bytes([k - i - 1]) + data[i:k]
            i = k
    return bytes(out)


def make_tiff(
    img: np.ndarray,
    bits: int = 8,
    photometric: int = 2,
    compression: int = 1,
    order: str = "<",
    planar: int = 1,
    predictor: int = 1,
    rows_per_strip: int = 4,
    tile: int | None = None,
    colormap: np.ndarray | None = None,
) -> bytes:
    h, w, c = img.shape
    planes = [img[:, :, k : k + 1] for k in range(c)] if planar == 2 else [img]

    def encode(block: np.ndarray) -> bytes:
        b = block.astype(np.int64)
        if predictor == 2:
            b = np.concatenate([b[:, :1], np.diff(b, axis=1)], axis=1) % (1 << bits)
        flat = b.reshape(b.shape[0], -1)
        if bits == 16:
            raw = flat.astype(order + "u2").tobytes()
        else:
            raw = _pack_samples(flat, bits).tobytes()
        if compression == 5:
            return _lzw_encode(raw)
        if compression == 8:
            return zlib.compress(raw)
        if compression == 32773:
            rb = len(raw) // b.shape[0]
            return b"".join(_packbits_encode(raw[r * rb : (r + 1) * rb]) for r in range(b.shape[0]))
        return raw

    chunks = []
    for p in planes:
        if tile:
            th = tw = tile
            padded = np.zeros((-(-h // th) * th, -(-w // tw) * tw, p.shape[2]), p.dtype)
            padded[:h, :w] = p
            for ty in range(0, padded.shape[0], th):
                for tx in range(0, padded.shape[1], tw):
                    chunks.append(encode(padded[ty : ty + th, tx : tx + tw]))
        else:
            for y in range(0, h, rows_per_strip):
                chunks.append(encode(p[y : y + rows_per_strip]))
    body = bytearray(b"II*\x00" if order == "<" else b"MM\x00*") + b"\0\0\0\0"
    offsets = []
    for ch in chunks:
        offsets.append(len(body))
        body += ch
    extra = bytearray()
    tags: list[tuple[int, int, list[int]]] = [
        (256, 4, [w]),
        (257, 4, [h]),
        (258, 3, [bits] * c),
        (259, 3, [compression]),
        (262, 3, [photometric]),
        (277, 3, [c]),
        (284, 3, [planar]),
        (317, 3, [predictor]),
    ]
    if tile:
        tags += [(322, 4, [tile]), (323, 4, [tile]), (324, 4, offsets), (325, 4, [len(ch) for ch in chunks])]
    else:
        tags += [(273, 4, offsets), (278, 4, [rows_per_strip]), (279, 4, [len(ch) for ch in chunks])]
    if colormap is not None:
        tags.append((320, 3, colormap.T.reshape(-1).tolist()))
    tags.sort()
    ifd = len(body)
    ifd_size = 2 + 12 * len(tags) + 4
    entries = bytearray(struct.pack(order + "H", len(tags)))
    for tag, typ, vals in tags:
        fmt = "H" if typ == 3 else "I"
        packed = struct.pack(order + fmt * len(vals), *vals)
        if len(packed) <= 4:
            entries += struct.pack(order + "HHI", tag, typ, len(vals)) + packed.ljust(4, b"\0")
        else:
            entries += struct.pack(order + "HHII", tag, typ, len(vals), ifd + ifd_size + len(extra))
            extra += packed
    entries += b"\0\0\0\0"
    body[4:8] = struct.pack(order + "I", ifd)
    return bytes(body + entries + extra)


@pytest.mark.parametrize("compression", [1, 5, 8, 32773])
@pytest.mark.parametrize("order", ["<", ">"])
def test_tiff_rgb_compressions(compression: int, order: str) -> None:
    data = make_tiff(IMG, compression=compression, order=order, predictor=2 if compression in (5, 8) else 1)
    np.testing.assert_array_equal(decode(data), IMG)


def test_tiff_lzw_long_stream_grows_code_width() -> None:
    big = RNG.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    big[:, 30:] = 7  # long runs too
    np.testing.assert_array_equal(decode(make_tiff(big, compression=5, rows_per_strip=40)), big)


def test_tiff_gray_16_bit_planar_tiled_palette_and_white_is_zero() -> None:
    g16 = RNG.integers(0, 65536, (10, 7, 1))
    np.testing.assert_array_equal(
        decode(make_tiff(g16, bits=16, photometric=1, order=">"), "Grayscale"), (g16 >> 8).astype(np.uint8)
    )
    np.testing.assert_array_equal(decode(make_tiff(IMG, planar=2, compression=8)), IMG)
    np.testing.assert_array_equal(decode(make_tiff(IMG, tile=16, compression=32773)), IMG)
    g = RNG.integers(0, 256, (6, 9, 1))
    np.testing.assert_array_equal(decode(make_tiff(g, photometric=0), "Grayscale"), (255 - g).astype(np.uint8))
    cmap = RNG.integers(0, 65536, (16, 3))
    idx = RNG.integers(0, 16, (5, 8, 1))
    got = decode(make_tiff(idx, bits=4, photometric=3, colormap=cmap))
    np.testing.assert_array_equal(got, (cmap[idx[:, :, 0]] >> 8).astype(np.uint8))


# -- ImageDecoder: JPEG --------------------------------------------------------------------------

ZIGZAG = np.array(
    [0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21, 28,
     35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63]
)  # fmt: skip
_K = np.arange(8)
DCT = np.sqrt(np.where(_K[:, None] == 0, 1 / 8, 2 / 8)) * np.cos((2 * _K[None, :] + 1) * _K[:, None] * np.pi / 16)


def _category(v: int) -> int:
    return abs(v).bit_length()


def _value_bits(v: int) -> str:
    s = _category(v)
    return format(v if v >= 0 else v + (1 << s) - 1, f"0{s}b") if s else ""


def _huffman_lengths(freq: dict[int, int]) -> dict[int, int]:
    """Code lengths from symbol counts; a reserved dummy keeps the all-ones code unused."""
    items = [(f, i, [s]) for i, (s, f) in enumerate(sorted(freq.items()))] + [(1, -1, [-1])]
    heapq.heapify(items)
    depth = dict.fromkeys(freq, 0)
    depth[-1] = 0
    tie = len(items)
    while len(items) > 1:
        f1, _, s1 = heapq.heappop(items)
        f2, _, s2 = heapq.heappop(items)
        for s in s1 + s2:
            depth[s] += 1
        heapq.heappush(items, (f1 + f2, tie, s1 + s2))
        tie += 1
    assert max(depth.values()) <= 16
    depth.pop(-1)
    return {s: max(d, 1) for s, d in depth.items()}


class _Table:
    def __init__(self, freq: dict[int, int]) -> None:
        lengths = _huffman_lengths(freq)
        self.codes: dict[int, str] = {}
        code = 0
        prev_len = 0
        self.counts = [0] * 16
        self.symbols = []
        for s, ln in sorted(lengths.items(), key=lambda kv: (kv[1], kv[0])):
            code <<= ln - prev_len
            prev_len = ln
            self.codes[s] = format(code, f"0{ln}b")
            self.counts[ln - 1] += 1
            self.symbols.append(s)
            code += 1

    def dht(self, cls: int, ident: int) -> bytes:
        body = bytes([cls << 4 | ident]) + bytes(self.counts) + bytes(self.symbols)
        return b"\xff\xc4" + struct.pack(">H", len(body) + 2) + body


def _bits_to_bytes(bits: str) -> bytes:
    bits += "1" * (-len(bits) % 8)
    raw = int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b""
    return raw.replace(b"\xff", b"\xff\x00")


def _encode_scan(
    units: list[tuple[int, np.ndarray]], kind: str, ss: int, se: int, al: int
) -> tuple[bytes, list[_Table]]:
    """Entropy-code one scan. units: (component index, zigzag coefficients) in scan order.
    Two passes: gather symbols to build tables, then write. Tables: one per component, and for
    a baseline scan ("dc") the AC tables follow the DC ones."""
    n_comp = max(u[0] for u in units) + 1
    n_tables = 2 * n_comp if kind == "dc" else n_comp

    def run(tables: list[_Table] | None, freqs: list[dict[int, int]]) -> str:
        out: list[str] = []
        pred = [0] * n_comp

        def sym(c: int, s: int) -> None:
            if tables is None:
                freqs[c][s] = freqs[c].get(s, 0) + 1
            else:
                out.append(tables[c].codes[s])

        for comp, z in units:
            c = comp
            if kind in ("dc", "dc_first"):
                v = int(z[0]) >> al
                diff = v - pred[c]
                pred[c] = v
                sym(c, _category(diff))
                out.append(_value_bits(diff))
            if kind == "dc_refine":
                out.append(str((int(z[0]) >> al) & 1))
            if kind == "dc":
                c = n_comp + comp  # the component's AC table
            if kind in ("dc", "ac_first"):
                start = 1 if kind == "dc" else ss
                end = 63 if kind == "dc" else se
                vals = [int(np.sign(v)) * (abs(int(v)) >> al) for v in z[start : end + 1]]
                r = 0
                for v in vals:
                    if v == 0:
                        r += 1
                        continue
                    while r > 15:
                        sym(c, 0xF0)
                        r -= 16
                    sym(c, r << 4 | _category(v))
                    out.append(_value_bits(v))
                    r = 0
                if r:
                    sym(c, 0x00)
            if kind == "ac_refine":
                absv = [abs(int(v)) >> al for v in z[ss : se + 1]]
                last_new = max((k for k, t in enumerate(absv) if t == 1), default=-1)
                r = 0
                corrections: list[str] = []
                for k, t in enumerate(absv):
                    if t == 0:
                        r += 1
                        continue
                    while r > 15 and k <= last_new:
                        sym(c, 0xF0)
                        out.extend(corrections)
                        corrections = []
                        r -= 16
                    if t > 1:
                        corrections.append(str(t & 1))
                        continue
                    sym(c, r << 4 | 1)
                    out.append("1" if z[ss + k] > 0 else "0")
                    out.extend(corrections)
                    corrections = []
                    r = 0
                if r or corrections:
                    sym(c, 0x00)
                    out.extend(corrections)
        return "".join(out)

    freqs: list[dict[int, int]] = [{} for _ in range(n_tables)]
    run(None, freqs)
    tables = [_Table(f or {0: 1}) for f in freqs]
    return _bits_to_bytes(run(tables, freqs)), tables


def make_jpeg(planes: list[np.ndarray], factors: list[tuple[int, int]], q: int, progressive: bool) -> bytes:
    """Planes are already subsampled; quantization table all ``q``. Returns the stream."""
    hmax = max(f[0] for f in factors)
    vmax = max(f[1] for f in factors)
    height, width = planes[0].shape[0] * vmax // factors[0][1], planes[0].shape[1] * hmax // factors[0][0]
    mcux, mcuy = -(-width // (8 * hmax)), -(-height // (8 * vmax))
    coefs = []
    for p, (h, v) in zip(planes, factors):
        bh, bw = mcuy * v, mcux * h
        full = np.pad(p.astype(np.float64), ((0, bh * 8 - p.shape[0]), (0, bw * 8 - p.shape[1])), mode="edge") - 128
        blocks = full.reshape(bh, 8, bw, 8).transpose(0, 2, 1, 3)
        d = np.einsum("ij,abjk,lk->abil", DCT, blocks, DCT)
        coefs.append(np.round(d / q).astype(np.int64).reshape(bh, bw, 64)[:, :, ZIGZAG])
    ncomp = len(planes)
    sof = struct.pack(">BHHB", 8, height, width, ncomp) + b"".join(
        bytes([k + 1, h << 4 | v, 0]) for k, (h, v) in enumerate(factors)
    )
    out = bytearray(b"\xff\xd8")
    out += b"\xff\xdb" + struct.pack(">H", 67) + b"\x00" + bytes([q] * 64)
    out += (b"\xff\xc2" if progressive else b"\xff\xc0") + struct.pack(">H", len(sof) + 2) + sof

    def interleaved() -> list[tuple[int, np.ndarray]]:
        units = []
        for my in range(mcuy):
            for mx in range(mcux):
                for k, (h, v) in enumerate(factors):
                    for y in range(v):
                        for x in range(h):
                            units.append((k, coefs[k][my * v + y, mx * h + x]))
        return units

    def single(k: int) -> list[tuple[int, np.ndarray]]:
        h, v = factors[k]
        rows = (-(-height * v // vmax) + 7) // 8
        cols = (-(-width * h // hmax) + 7) // 8
        return [(0, coefs[k][y, x]) for y in range(rows) for x in range(cols)]

    def scan(
        units: list[tuple[int, np.ndarray]], comps: list[int], kind: str, ss: int, se: int, ah: int, al: int
    ) -> None:
        nonlocal out
        data, tables = _encode_scan(units, kind, ss, se, al)
        for i, t in enumerate(tables):
            if kind != "dc_refine":
                out += t.dht(0 if kind.startswith("dc") else 1, i)
        body = bytes([len(comps)]) + b"".join(bytes([c + 1, i << 4 | i]) for i, c in enumerate(comps))
        body += bytes([ss, se, ah << 4 | al])
        out += b"\xff\xda" + struct.pack(">H", len(body) + 2) + body + data

    if not progressive:
        # Sequential: DC and AC tables per component, one interleaved scan.
        data, tables = _encode_scan(interleaved(), "dc", 0, 63, 0)
        for i, t in enumerate(tables):
            out += t.dht(0 if i < ncomp else 1, i % ncomp)
        body = bytes([ncomp]) + b"".join(bytes([k + 1, k << 4 | k]) for k in range(ncomp)) + b"\x00\x3f\x00"
        out += b"\xff\xda" + struct.pack(">H", len(body) + 2) + body + data
    else:
        all_comps = list(range(ncomp))
        scan(interleaved(), all_comps, "dc_first", 0, 0, 0, 1)
        for k in range(ncomp):
            scan(single(k), [k], "ac_first", 1, 5, 0, 0)
            scan(single(k), [k], "ac_first", 6, 63, 0, 1)
        scan(interleaved(), all_comps, "dc_refine", 0, 0, 1, 0)
        for k in range(ncomp):
            scan(single(k), [k], "ac_refine", 6, 63, 1, 0)
    return bytes(out + b"\xff\xd9")


def _smooth(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([128 + 90 * np.sin(x / 6.0 + y / 9.0), 100 + 60 * np.cos(y / 5.0), 40 + 3 * x + y], axis=-1).clip(
        0, 255
    )


def _to_ycc(rgb: np.ndarray) -> list[np.ndarray]:
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b
    return [y, 128 - 0.168736 * r - 0.331264 * g + 0.5 * b, 128 + 0.5 * r - 0.418688 * g - 0.081312 * b]


def test_jpeg_grayscale_baseline_and_progressive() -> None:
    gray = _smooth(19, 27)[..., 0]
    base = make_jpeg([gray], [(1, 1)], 2, progressive=False)
    got = decode(base, "Grayscale")[..., 0].astype(np.float64)
    assert got.shape == gray.shape
    assert np.abs(got - gray).max() <= 4  # quantization step 2 on a smooth image
    prog = make_jpeg([gray], [(1, 1)], 2, progressive=True)
    np.testing.assert_array_equal(decode(prog, "Grayscale"), decode(base, "Grayscale"))


@pytest.mark.parametrize("factors", [[(1, 1)] * 3, [(2, 2), (1, 1), (1, 1)], [(2, 1), (1, 1), (1, 1)]])
def test_jpeg_color_subsampling(factors: list[tuple[int, int]]) -> None:
    rgb = _smooth(20, 30)
    ycc = _to_ycc(rgb)
    h0, v0 = factors[0]
    planes = [ycc[0]] + [c.reshape(20 // v0, v0, 30 // h0, h0).mean(axis=(1, 3)) for c in ycc[1:]]
    base = make_jpeg(planes, factors, 2, progressive=False)
    got = decode(base).astype(np.float64)
    assert got.shape == rgb.shape
    assert np.abs(got - rgb).mean() < 3
    prog = make_jpeg(planes, factors, 2, progressive=True)
    np.testing.assert_array_equal(decode(prog), decode(base))
    np.testing.assert_array_equal(decode(base, "BGR"), decode(base)[:, :, ::-1])
    np.testing.assert_array_equal(decode(base, "Grayscale"), luma(decode(base)))


# -- ImageDecoder: errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "name"),
    [
        (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "WebP"),
        (b"\x00\x00\x00\x0cjP  \r\n\x87\n\x00\x00", "JPEG 2000"),
        (b"GIF89a\x01\x00\x01\x00", "GIF"),
        (b"\xff\xd8\xff\xc9\x00\x0b\x08\x00\x01\x00\x01\x01\x01\x11\x00", "arithmetic-coded JPEG"),
    ],
)
def test_unsupported_formats_name_themselves(head: bytes, name: str) -> None:
    with pytest.raises(Exception, match=name):
        decode(head + b"\x00" * 32)


def test_corrupt_stream_is_an_error() -> None:
    with pytest.raises(Exception, match="PNG"):
        decode(make_png(IMG, 2, 8, [0])[:60])
    with pytest.raises(Exception, match="unrecognized image format"):
        decode(b"not an image at all")
