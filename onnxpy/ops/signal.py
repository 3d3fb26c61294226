"""Signal kernels: DFT, STFT, MelWeightMatrix, Hann/Hamming/Blackman windows, ImageDecoder.

Complex values travel as a trailing axis of 2 (real, imaginary); a trailing axis of 1 is a real
signal. Transforms run in double precision and are cast back to the input type.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..model import dtypes
from ._compat import alloc_budget, check_alloc, host_scalar
from .registry import op

# -- DFT ------------------------------------------------------------------------------------------


def _as_complex(xp: Any, x: Any, what: str) -> tuple[Any, bool]:
    """(complex128 array without the trailing axis, whether the input was real)."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise ValueError(f"{what}: the last axis must be 1 (real) or 2 (complex), got shape {list(x.shape)}")
    v = x.astype(np.float64)
    if x.shape[-1] == 1:
        return v[..., 0], True
    return v[..., 0] + 1j * v[..., 1], False


def _from_complex(xp: Any, y: Any, dtype: np.dtype) -> Any:
    return xp.stack([y.real, y.imag], axis=-1).astype(dtype)


def _dft(xp: Any, x: Any, dft_length: Any, axis: int, inverse: int, onesided: int, what: str, ctx: Any = None) -> Any:
    rank = x.ndim
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ValueError(
            f"{what}: axis {axis} is out of range for input rank {rank} (expected [-{rank}, -2] or [0, {rank - 2}])"
        )
    a = axis + rank if axis < 0 else axis
    sig, real = _as_complex(xp, x, what)
    m = int(sig.shape[a])
    if dft_length is not None and np.size(dft_length) > 0:
        n = int(host_scalar(dft_length))
    else:
        n = 2 * (m - 1) if (onesided and inverse) else m
    if n < 1:
        raise ValueError(f"{what}: dft_length must be >= 1, got {n}")
    out_shape = [int(d) for d in sig.shape]
    out_shape[a] = max(n, m)  # the padded signal, then the spectrum
    check_alloc([*out_shape, 2], np.float64, ctx, what)
    if not inverse:
        if onesided:
            y = (
                xp.fft.rfft(sig.real, n=n, axis=a)
                if real
                else _take_first(xp, xp.fft.fft(sig, n=n, axis=a), n // 2 + 1, a)
            )
        else:
            y = xp.fft.fft(sig, n=n, axis=a)
        return _from_complex(xp, y, x.dtype)
    if onesided:
        # IRFFT: a one-sided spectrum in, the full real signal out.
        return xp.fft.irfft(sig, n=n, axis=a)[..., None].astype(x.dtype)
    return _from_complex(xp, xp.fft.ifft(sig, n=n, axis=a), x.dtype)


def _take_first(xp: Any, y: Any, count: int, axis: int) -> Any:
    index = [slice(None)] * y.ndim
    index[axis] = slice(0, count)
    return y[tuple(index)]


@op("DFT", 17, host_inputs=(1,))
def dft_17(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    dft_length: Any = None,
    *,
    axis: int = 1,
    inverse: int = 0,
    onesided: int = 0,
    ctx: Any = None,
) -> Any:
    return _dft(xp, input, dft_length, axis, inverse, onesided, "DFT", ctx)


@op("DFT", 20, host_inputs=(1, 2))
def dft_20(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    dft_length: Any = None,
    axis: Any = None,
    *,
    inverse: int = 0,
    onesided: int = 0,
    ctx: Any = None,
) -> Any:
    ax = int(host_scalar(axis)) if axis is not None and np.size(axis) > 0 else -2
    return _dft(xp, input, dft_length, ax, inverse, onesided, "DFT", ctx)


# -- STFT -----------------------------------------------------------------------------------------


@op("STFT", 17, host_inputs=(1, 3))
def stft(
    xp: Any,
    signal: Any,
    frame_step: Any,
    window: Any = None,
    frame_length: Any = None,
    *,
    onesided: int = 1,
    ctx: Any = None,
) -> Any:
    if signal.ndim != 3:
        raise ValueError(f"STFT: signal must have shape (batch, length, 1 or 2), got {list(signal.shape)}")
    sig, real = _as_complex(xp, signal, "STFT")
    length = int(sig.shape[1])
    step = int(host_scalar(frame_step))
    if step < 1:
        raise ValueError(f"STFT: frame_step must be >= 1, got {step}")
    if frame_length is not None and np.size(frame_length) > 0:
        fl = int(host_scalar(frame_length))
        if window is not None and int(window.shape[0]) != fl:
            raise ValueError(f"STFT: window has length {window.shape[0]} but frame_length is {fl}")
    elif window is not None:
        fl = int(window.shape[0])
    else:
        fl = length
    if window is not None and window.ndim != 1:
        raise ValueError(f"STFT: window must be 1-D, got shape {list(window.shape)}")
    if not 1 <= fl <= length:
        raise ValueError(f"STFT: frame_length {fl} must be in [1, signal length {length}]")
    frames = (length - fl) // step + 1
    bins = fl // 2 + 1 if onesided else fl
    check_alloc([sig.shape[0], frames, bins, 2], signal.dtype, ctx, "STFT")
    starts = np.arange(frames)[:, None] * step + np.arange(fl)[None, :]
    seg = sig[:, xp.asarray(starts)]  # (batch, frames, frame_length)
    if window is not None:
        seg = seg * window.astype(np.float64)
    if onesided:
        y = xp.fft.rfft(seg.real, axis=-1) if real else xp.fft.fft(seg, axis=-1)[..., :bins]
    else:
        y = xp.fft.fft(seg, axis=-1)
    return _from_complex(xp, y, signal.dtype)


# -- MelWeightMatrix ------------------------------------------------------------------------------


def _hz_to_mel(f: Any) -> Any:
    return 2595.0 * np.log10(1.0 + f / 700.0)


def _mel_to_hz(m: Any) -> Any:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


@op("MelWeightMatrix", 17, host_inputs=(0, 1, 2, 3, 4))
def mel_weight_matrix(
    xp: Any,
    num_mel_bins: Any,
    dft_length: Any,
    sample_rate: Any,
    lower_edge_hertz: Any,
    upper_edge_hertz: Any,
    *,
    output_datatype: int = 1,
    ctx: Any = None,
) -> Any:
    n_mel = int(host_scalar(num_mel_bins))
    n_dft = int(host_scalar(dft_length))
    rate = int(host_scalar(sample_rate))
    low = float(host_scalar(lower_edge_hertz))
    high = float(host_scalar(upper_edge_hertz))
    # No mel bins is an empty (n_bins, 0) matrix, as onnxruntime and the reference give.
    if n_mel < 0 or n_dft < 1 or rate < 1:
        raise ValueError(
            f"MelWeightMatrix: num_mel_bins ({n_mel}) must not be negative, dft_length ({n_dft}) and "
            f"sample_rate ({rate}) must be positive"
        )
    if not 0 <= low < high:
        raise ValueError(f"MelWeightMatrix: need 0 <= lower_edge_hertz < upper_edge_hertz, got {low} and {high}")
    n_bins = n_dft // 2 + 1
    out_dtype = dtypes.np_dtype(output_datatype)
    check_alloc([n_bins, n_mel], out_dtype, ctx, "MelWeightMatrix")
    # num_mel_bins + 2 band edges spaced on the mel scale by (high - low) / (num_mel_bins + 2), as
    # onnx's reference data and onnxruntime do, snapped down to spectrogram bins.
    low_mel, high_mel = _hz_to_mel(low), _hz_to_mel(high)
    mels = low_mel + np.arange(n_mel + 2) * (high_mel - low_mel) / (n_mel + 2)
    edges = np.floor((n_dft + 1) * _mel_to_hz(mels) / rate).astype(np.int64)
    if edges[-1] >= n_bins:
        # The top triangle would end past the spectrum's last bin and be cut off silently
        # (onnxruntime refuses it too: the edge is above the Nyquist frequency, sample_rate / 2).
        raise ValueError(
            f"MelWeightMatrix: upper_edge_hertz {high} lands in bin {int(edges[-1])}, past the {n_bins} bins of "
            f"a {n_dft}-point spectrum at sample_rate {rate} (keep it at most sample_rate / 2)"
        )
    k = np.arange(n_bins)[:, None]
    lo, mid, hi = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    up = np.where(mid > lo, (k - lo) / np.where(mid > lo, mid - lo, 1), 1.0)
    down = np.where(hi > mid, (hi - k) / np.where(hi > mid, hi - mid, 1), 0.0)
    w = np.where((k >= lo) & (k <= mid), up, 0.0)
    w = np.where((k > mid) & (k < hi), down, w)
    return xp.asarray(w.astype(out_dtype))


# -- windows --------------------------------------------------------------------------------------


def _cosine_window(
    xp: Any, size: Any, coeffs: tuple[float, ...], periodic: int, output_datatype: int, ctx: Any, what: str
) -> Any:
    n = int(host_scalar(size))
    if n < 0:
        raise ValueError(f"{what}: size must not be negative, got {n}")
    out_dtype = dtypes.np_dtype(output_datatype)
    check_alloc([n], out_dtype, ctx, what)
    denom = n if periodic else n - 1
    # Computed in float64 and rounded once. An integer output passes through float32 first, the
    # spec's computing type: its truncating cast then sees Blackman's centre (0.42 + 0.5 + 0.08)
    # as 1, as onnxruntime does, not float64's 0.9999999999999999. A symmetric window of size 1
    # divides by zero in the spec's function body: NaN, as onnxruntime gives.
    with np.errstate(divide="ignore", invalid="ignore"):
        phase = 2.0 * np.pi * np.arange(n) / np.float64(denom)
        w = np.asarray(sum(((-1) ** i) * c * np.cos(i * phase) for i, c in enumerate(coeffs)), dtype=np.float64)
        if out_dtype.kind not in "fV":
            w = w.astype(np.float32)
        return xp.asarray(w.astype(out_dtype))


@op("HannWindow", 17, host_inputs=(0,))
def hann_window(xp: Any, size: Any, *, output_datatype: int = 1, periodic: int = 1, ctx: Any = None) -> Any:
    return _cosine_window(xp, size, (0.5, 0.5), periodic, output_datatype, ctx, "HannWindow")


@op("HammingWindow", 17, host_inputs=(0,))
def hamming_window(xp: Any, size: Any, *, output_datatype: int = 1, periodic: int = 1, ctx: Any = None) -> Any:
    return _cosine_window(xp, size, (25.0 / 46.0, 21.0 / 46.0), periodic, output_datatype, ctx, "HammingWindow")


@op("BlackmanWindow", 17, host_inputs=(0,))
def blackman_window(xp: Any, size: Any, *, output_datatype: int = 1, periodic: int = 1, ctx: Any = None) -> Any:
    return _cosine_window(xp, size, (0.42, 0.5, 0.08), periodic, output_datatype, ctx, "BlackmanWindow")


# -- ImageDecoder ---------------------------------------------------------------------------------


@op("ImageDecoder", 20, host_inputs=(0,))
def image_decoder(xp: Any, encoded_stream: Any, *, pixel_format: str = "RGB", ctx: Any = None) -> Any:
    from ._image import decode_image, to_gray

    if pixel_format not in ("RGB", "BGR", "Grayscale"):
        raise ValueError(f"ImageDecoder: unknown pixel_format {pixel_format!r} (expected RGB, BGR or Grayscale)")
    raw = (
        encoded_stream.get()
        if hasattr(encoded_stream, "get") and not isinstance(encoded_stream, np.ndarray)
        else encoded_stream
    )
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError(f"ImageDecoder: encoded_stream must be a 1-D uint8 tensor, got {raw.dtype}{list(raw.shape)}")
    try:
        img = decode_image(raw.tobytes(), alloc_budget(ctx))
    except ValueError as e:
        raise ValueError(f"ImageDecoder: {e}") from e
    if pixel_format == "Grayscale":
        out = img if img.shape[2] == 1 else to_gray(img)
    else:
        rgb = np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img
        out = rgb[:, :, ::-1] if pixel_format == "BGR" else rgb
    return xp.asarray(np.ascontiguousarray(out))
