"""Geometry shared by convolution and pooling: padding, output sizes, strided window views."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def geometry(
    in_sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int] | None,
    dilations: Sequence[int] | None,
    pads: Sequence[int] | None,
    auto_pad: str,
    ceil_mode: int = 0,
) -> tuple[list[int], list[int], list[int]]:
    """(pads_begin, pads_end, out_sizes) per spatial axis, following the ONNX rules."""
    nd = len(in_sizes)
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    if len(kernel) != nd or len(strides) != nd or len(dilations) != nd:
        raise ValueError(
            f"kernel {list(kernel)}, strides {strides} and dilations {dilations} must each have {nd} entries (spatial rank)"
        )
    if any(s <= 0 for s in strides) or any(d <= 0 for d in dilations):
        raise ValueError(f"strides {strides} and dilations {dilations} must be positive")
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-n // s) for n, s in zip(in_sizes, strides)]
        total = [max((o - 1) * s + e - n, 0) for o, s, e, n in zip(out, strides, eff, in_sizes)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
        return begin, end, out
    if auto_pad == "VALID":
        begin = [0] * nd
        end = [0] * nd
    elif auto_pad in ("NOTSET", ""):
        p = list(pads) if pads else [0] * (2 * nd)
        if len(p) != 2 * nd:
            raise ValueError(f"pads {p} must have {2 * nd} entries (begin and end per spatial axis)")
        if any(v < 0 for v in p):
            raise ValueError(f"pads {p} must not be negative")
        begin, end = p[:nd], p[nd:]
    else:
        raise ValueError(f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '{auto_pad}'")
    out = []
    for n, b, e, k, s in zip(in_sizes, begin, end, eff, strides):
        span = n + b + e - k
        if span < 0 and not ceil_mode:
            raise ValueError(f"the kernel (extent {k}) is larger than the padded input ({n + b + e})")
        if ceil_mode:
            # A kernel wider than the padded input still has its first window when that window
            # starts inside (ceil((2 - 3) / 2) + 1 = 1 on a 2-wide map), as onnxruntime and
            # PyTorch give: a partial window, like ceil mode's last one.
            o = math.ceil(span / s) + 1
            if o < 0:  # onnxruntime refuses these too ("Calculated output dimension is negative")
                raise ValueError(
                    f"the kernel (extent {k}) is larger than the padded input ({n + b + e}) by more than a stride"
                )
            if o and (o - 1) * s >= n + b:  # the last window must start inside the input or left pad
                o -= 1
        else:
            o = span // s + 1
        out.append(o)
    return begin, end, out


def pad_input(
    xp: Any,
    x: Any,
    begin: Sequence[int],
    end: Sequence[int],
    out_sizes: Sequence[int],
    kernel_ext: Sequence[int],
    strides: Sequence[int],
    value: Any,
) -> Any:
    """Pad spatial axes; extra end padding covers windows that ceil_mode lets run past the end."""
    width = [(0, 0), (0, 0)]
    for n, b, e, o, k, s in zip(x.shape[2:], begin, end, out_sizes, kernel_ext, strides):
        need = (o - 1) * s + k - (n + b)
        width.append((b, max(e, need, 0)))
    if all(w == (0, 0) for w in width):
        return x
    # An empty buffer whose border slabs are filled, then the input copied in: each byte is
    # written once, and without np.pad's Python-level set-up (~40 us a call, more than the copy
    # itself for a 7x7 map).
    padded = xp.empty([s + b + e for s, (b, e) in zip(x.shape, width)], dtype=x.dtype)
    inner: list[slice] = [slice(None)] * x.ndim
    for axis in range(2, x.ndim):
        b, e = width[axis]
        size = padded.shape[axis]
        lead = (slice(None),) * axis
        if b:
            padded[(*lead, slice(0, b))] = value
        if e:
            padded[(*lead, slice(size - e, size))] = value
        inner[axis] = slice(b, b + x.shape[axis])
    padded[tuple(inner)] = x
    return padded


def window_slices(
    offsets: Sequence[int], dilations: Sequence[int], strides: Sequence[int], out_sizes: Sequence[int]
) -> tuple[slice, ...]:
    """Slices (after batch and channel) selecting, for one kernel offset, the element under it in every window."""
    sl: list[slice] = [slice(None), slice(None)]
    for i, d, s, o in zip(offsets, dilations, strides, out_sizes):
        start = i * d
        sl.append(slice(start, start + (o - 1) * s + 1, s))
    return tuple(sl)


def windows_view(
    xp: Any, x: Any, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], out_sizes: Sequence[int]
) -> Any:
    """A strided view of shape (N, C, *out, *kernel) over padded ``x``; no copy."""
    nd = len(kernel)
    st = x.strides
    shape = (*x.shape[:2], *out_sizes, *kernel)
    strides_ = (*st[:2], *(st[2 + i] * strides[i] for i in range(nd)), *(st[2 + i] * dilations[i] for i in range(nd)))
    if xp is np:
        return strided_view(x, shape, strides_)
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides_)


def strided_view(x: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A read-only view of host array ``x`` with the given shape and strides (in bytes), which
    must stay inside ``x``. For a C-contiguous ``x`` it is built by the ndarray constructor
    (0.3 us) rather than np.lib.stride_tricks.as_strided (3 us, through __array_interface__)."""
    if x.size and x.flags.c_contiguous:
        view = np.ndarray(shape, x.dtype, x, 0, strides)
        view.flags.writeable = False
        return view
    return np.lib.stride_tricks.as_strided(x, shape=shape, strides=strides, writeable=False)


def col2im_add(
    xp: Any,
    cols: Any,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    canvas: Sequence[int],
) -> Any:
    """Scatter-add column blocks back onto an image: the transpose of ``windows_view``.

    ``cols`` has shape (N, C, prod(kernel), *blocks); block b at kernel offset k lands on canvas
    position b * stride + k * dilation (per axis). One vectorized add per kernel offset."""
    n, c = cols.shape[:2]
    blocks = cols.shape[3:]
    out = xp.zeros((n, c, *canvas), dtype=cols.dtype)
    for kidx, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
        sl: list[slice] = [slice(None), slice(None)]
        for i, d, s, b in zip(offsets, dilations, strides, blocks):
            start = i * d
            sl.append(slice(start, start + (b - 1) * s + 1, s))
        out[tuple(sl)] += cols[:, :, kidx]
    return out
