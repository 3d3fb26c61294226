"""ConvTranspose (GEMM + col2im scatter-add), DeformConv (bilinear sampling + GEMM) and Col2Im."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ._compat import check_alloc, host_ints
from ._spatial import col2im_add, geometry
from .conv import compute_dtype
from .registry import op


def _trunc_half(v: int) -> int:
    """v / 2 rounded toward zero, as the spec's integer equations mean it."""
    return -((-v) // 2) if v < 0 else v // 2


# -- ConvTranspose -------------------------------------------------------------------------------


def conv_transpose_geometry(
    in_sizes: list[int],
    kernel: list[int],
    strides: list[int],
    dilations: list[int],
    pads: list[int] | None,
    output_padding: list[int],
    output_shape: list[int] | None,
    auto_pad: str,
) -> tuple[list[int], list[int]]:
    """(pads_begin, output spatial sizes) following the ConvTranspose equations."""
    nd = len(in_sizes)
    ext = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    natural = [s * (n - 1) + op_ + e for s, n, op_, e in zip(strides, in_sizes, output_padding, ext)]
    if auto_pad not in ("NOTSET", "", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise ValueError(f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '{auto_pad}'")
    target: list[int] | None = None
    if output_shape:
        target = list(output_shape)
        if len(target) == nd + 2:  # some exporters include N and C
            target = target[2:]
        if len(target) != nd:
            raise ValueError(f"output_shape {list(output_shape)} must have {nd} entries (spatial rank)")
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [n * s for n, s in zip(in_sizes, strides)]
    if target is not None:
        begin = []
        for total in (nat - t for nat, t in zip(natural, target)):
            if total < 0:
                # A larger output than the natural size grows at the end, as output_padding does.
                begin.append(0)
            elif auto_pad == "SAME_UPPER":
                begin.append(_trunc_half(total))
            else:
                begin.append(total - _trunc_half(total))
        return begin, target
    if auto_pad == "VALID":
        return [0] * nd, natural
    p = list(pads) if pads else [0] * (2 * nd)
    if len(p) != 2 * nd:
        raise ValueError(f"pads {p} must have {2 * nd} entries (begin and end per spatial axis)")
    if any(v < 0 for v in p):
        raise ValueError(f"pads {p} must not be negative")
    out = [nat - b - e for nat, b, e in zip(natural, p[:nd], p[nd:])]
    if any(o <= 0 for o in out):
        raise ValueError(f"ConvTranspose output spatial shape {out} is not positive (pads {p} too large)")
    return p[:nd], out


def _crop_or_extend(xp: Any, canvas: Any, begin: list[int], out: list[int]) -> Any:
    """out[o] = canvas[o + begin] where that lies on the canvas, else 0 (negative pads, output_padding)."""
    nd = len(out)
    sizes = canvas.shape[2:]
    if all(b == 0 for b in begin) and list(sizes) == list(out):
        return canvas
    if all(b >= 0 and b + o <= s for b, o, s in zip(begin, out, sizes)):
        sl = (slice(None), slice(None), *(slice(b, b + o) for b, o in zip(begin, out)))
        return canvas[sl]
    y = xp.zeros((*canvas.shape[:2], *out), dtype=canvas.dtype)
    dst, src = [slice(None)] * 2, [slice(None)] * 2
    for i in range(nd):
        lo = max(0, -begin[i])
        hi = min(out[i], sizes[i] - begin[i])
        if hi <= lo:
            return y
        dst.append(slice(lo, hi))
        src.append(slice(lo + begin[i], hi + begin[i]))
    y[tuple(dst)] = canvas[tuple(src)]
    return y


def _conv_transpose(
    xp: Any,
    x: Any,
    w: Any,
    b: Any,
    auto_pad: str,
    dilations: list[int] | None,
    group: int,
    kernel_shape: list[int] | None,
    output_padding: list[int] | None,
    output_shape: list[int] | None,
    pads: list[int] | None,
    strides: list[int] | None,
) -> Any:
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(
            f"ConvTranspose needs X of rank >= 3 and W of the same rank, got X {list(x.shape)} and W {list(w.shape)}"
        )
    nd = x.ndim - 2
    n, c = x.shape[:2]
    k = list(w.shape[2:])
    if kernel_shape is not None and list(kernel_shape) != k:
        raise ValueError(f"kernel_shape {kernel_shape} does not match W's spatial shape {k}")
    if group <= 0 or c % group:
        raise ValueError(f"group {group} must divide the input channels ({c})")
    if w.shape[0] != c:
        raise ValueError(f"W's first dimension {w.shape[0]} must equal X's channels {c}")
    cg = c // group
    mg = w.shape[1]
    m = mg * group
    if b is not None and tuple(b.shape) != (m,):
        raise ValueError(f"ConvTranspose bias B must have shape [{m}] (output channels), got {list(b.shape)}")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    output_padding = list(output_padding) if output_padding else [0] * nd
    if len(strides) != nd or len(dilations) != nd or len(output_padding) != nd:
        raise ValueError(
            f"strides {strides}, dilations {dilations} and output_padding {output_padding} need {nd} entries each"
        )
    if any(s <= 0 for s in strides) or any(d <= 0 for d in dilations):
        raise ValueError(f"strides {strides} and dilations {dilations} must be positive")
    if any(p < 0 or p >= max(s, d) for p, s, d in zip(output_padding, strides, dilations)):
        # The spec: each value less than the stride / dilation (onnxruntime refuses others too).
        raise ValueError(
            f"output_padding {output_padding} must be >= 0 and less than max(stride, dilation) on each axis "
            f"(strides {strides}, dilations {dilations})"
        )
    in_sizes = list(x.shape[2:])
    begin, out = conv_transpose_geometry(in_sizes, k, strides, dilations, pads, output_padding, output_shape, auto_pad)
    cdt = compute_dtype(x.dtype)
    kk = math.prod(k)
    i_all = math.prod(in_sizes)
    # GEMM: per group, columns (Mg * K, I) = W_g^T (Mg * K, Cg) @ X_g (Cg, I).
    wt = w.astype(cdt, copy=False).reshape(group, cg, mg * kk).transpose(0, 2, 1)
    xs = x.astype(cdt, copy=False).reshape(n, group, cg, i_all)
    cols = xp.matmul(wt, xs)  # (N, group, Mg * K, I)
    cols = cols.reshape(n, m, kk, *in_sizes)
    ext = [(kd - 1) * d + 1 for kd, d in zip(k, dilations)]
    canvas = [s * (i - 1) + e for s, i, e in zip(strides, in_sizes, ext)]
    if n == 0 or i_all == 0:
        y = xp.zeros((n, m, *out), dtype=cdt)
    elif xp is np and nd == 2 and dilations == [1, 1]:
        y = _col2im_by_phases(cols, k, strides, canvas, begin, out, None if b is None else b.astype(cdt, copy=False))
        return y.astype(x.dtype, copy=False)
    else:
        y = _crop_or_extend(xp, col2im_add(xp, cols, k, strides, dilations, canvas), begin, out)
    if b is not None:
        y = y + b.astype(cdt, copy=False).reshape((1, m) + (1,) * nd)
    return xp.ascontiguousarray(y.astype(x.dtype, copy=False))


def _col2im_by_phases(
    cols: np.ndarray,
    k: list[int],
    strides: list[int],
    canvas: list[int],
    begin: list[int],
    out: list[int],
    bias: np.ndarray | None,
) -> np.ndarray:
    """ConvTranspose's scatter-add of 2-D columns (N, M, kh * kw, H, W) at dilation 1, cropped
    (or zero-extended) to ``out`` from ``begin`` on the canvas, plus the bias: a new C-contiguous
    array.

    Canvas row P = i * s + a receives tap a of input row i. Split by the phase P mod s, every
    tap of a phase lands on the phase's rows at a plain shift, so its taps sum in a small dense
    plane (whole rows) instead of k * k strided adds over a zeroed canvas, and each phase plane
    goes to the output once, through a strided view, with the bias. Where the kernel is the
    stride (U-Net's 2x2/2 upsampling) a phase is one tap and nothing is summed. Against the
    strided adds, crop and bias pass (alone, hot): 2x2/2 on 32x56x56 552 -> 379 us, 64x64x64
    1816 -> 1122; 4x4/2 pad 1 on 64x28x28 1030 -> 907; 3x3/2 with output_padding on
    128x28x28 1406 -> 1119."""
    n, m, _, h, w = cols.shape
    (kh, kw), (sh, sw) = k, strides
    taps = cols.reshape(n, m, kh, kw, h, w)
    # Output positions off the canvas (negative pads, output_padding) and phases no tap reaches
    # (a kernel smaller than the stride) are 0 plus the bias: the output starts as that.
    fill = kh < sh or kw < sw or any(b < 0 or b + o > c for b, o, c in zip(begin, out, canvas))
    y = (np.zeros if fill else np.empty)((n, m, *out), cols.dtype)
    if fill and bias is not None:
        y += bias.reshape(1, m, 1, 1)
    for pa in range(min(sh, kh)):
        rows = _phase_span(pa, sh, canvas[0], begin[0], out[0])
        for pb in range(min(sw, kw)):
            spans = _phase_span(pb, sw, canvas[1], begin[1], out[1])
            if rows is None or spans is None:
                continue
            tas, tbs = range(pa, kh, sh), range(pb, kw, sw)
            if len(tas) == 1 and len(tbs) == 1:
                plane = taps[:, :, pa, pb]
            else:
                plane = np.zeros((n, m, h + len(tas) - 1, w + len(tbs) - 1), cols.dtype)
                for ta, a in enumerate(tas):
                    for tb, b in enumerate(tbs):
                        plane[:, :, ta : ta + h, tb : tb + w] += taps[:, :, a, b]
            (q0, q1, o0), (r0, r1, c0) = rows, spans
            dst = y[:, :, o0::sh, c0::sw][:, :, : q1 - q0, : r1 - r0]
            part = plane[:, :, q0:q1, r0:r1]
            if fill:
                dst += part
            elif bias is None:
                np.copyto(dst, part)
            else:
                np.add(part, bias.reshape(1, m, 1, 1), out=dst)
    return y


def _phase_span(p: int, s: int, canvas: int, begin: int, out: int) -> tuple[int, int, int] | None:
    """Along one axis, the canvas positions P = q * s + p of phase p that land on the output
    (o = P - begin in [0, out)): (q0, q1, o0), plane rows q0..q1 going to o0, o0 + s, ...; None
    where none does."""
    plane = len(range(p, canvas, s))
    q0 = max(0, -((p - begin) // s))  # the first q with q * s + p - begin >= 0
    q1 = min(plane, (out - 1 - p + begin) // s + 1)  # past the last q with o < out
    if q1 <= q0:
        return None
    return q0, q1, q0 * s + p - begin


@op("ConvTranspose", 1)
def conv_transpose(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    output_padding: list[int] | None = None,
    output_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    return _conv_transpose(
        xp, X, W, B, auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads, strides
    )


# -- DeformConv ----------------------------------------------------------------------------------


def _deform_sample(
    xp: Any,
    x: Any,
    offset: Any,
    mask: Any,
    kernel: list[int],
    strides: list[int],
    dilations: list[int],
    begin: list[int],
    out: list[int],
    offset_group: int,
) -> Any:
    """Sampled columns (N, C, K, O): x at kernel tap + learned offset, multilinear, zero outside."""
    n, c = x.shape[:2]
    nd = len(kernel)
    spatial = list(x.shape[2:])
    kk = math.prod(kernel)
    o = math.prod(out)
    cog = c // offset_group
    dt = x.dtype
    # Base sampling position per axis: window start + tap * dilation - pad, shape (K, O).
    taps = np.array(list(itertools.product(*(range(kd) for kd in kernel))), dtype=np.int64).reshape(kk, nd)
    grids = np.meshgrid(*(np.arange(v) for v in out), indexing="ij")
    base = [
        xp.asarray((taps[:, a : a + 1] * dilations[a] + grids[a].reshape(1, o) * strides[a] - begin[a]).astype(dt))
        for a in range(nd)
    ]
    off = offset.astype(dt, copy=False).reshape(n, offset_group, kk, nd, o)
    pos = [base[a] + off[:, :, :, a, :] for a in range(nd)]  # each (N, og, K, O)
    lo = [xp.floor(p) for p in pos]
    frac = [p - f for p, f in zip(pos, lo)]
    lo_i = [f.astype(np.int64) for f in lo]
    flat_x = x.reshape(n, offset_group, cog, math.prod(spatial))
    acc = xp.zeros((n, offset_group, cog, kk * o), dtype=dt)
    for corner in itertools.product((0, 1), repeat=nd):
        weight = None
        index = None
        valid = None
        for a, bit in enumerate(corner):
            ia = lo_i[a] + bit
            wa = frac[a] if bit else 1 - frac[a]
            va = (ia >= 0) & (ia < spatial[a])
            weight = wa if weight is None else weight * wa
            valid = va if valid is None else valid & va
            ia = xp.clip(ia, 0, spatial[a] - 1)
            index = ia if index is None else index * spatial[a] + ia
        weight = xp.where(valid, weight, 0).astype(dt, copy=False).reshape(n, offset_group, 1, kk * o)
        index = index.reshape(n, offset_group, 1, kk * o)
        vals = xp.take_along_axis(flat_x, xp.broadcast_to(index, (n, offset_group, cog, kk * o)), axis=3)
        acc += vals * weight
    if mask is not None:
        acc *= mask.astype(dt, copy=False).reshape(n, offset_group, 1, kk * o)
    return acc.reshape(n, c, kk, o)


def _deform_conv(
    xp: Any,
    x: Any,
    w: Any,
    offset: Any,
    b: Any,
    mask: Any,
    dilations: list[int] | None,
    group: int,
    kernel_shape: list[int] | None,
    offset_group: int,
    pads: list[int] | None,
    strides: list[int] | None,
) -> Any:
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(
            f"DeformConv needs X of rank >= 3 and W of the same rank, got X {list(x.shape)} and W {list(w.shape)}"
        )
    nd = x.ndim - 2
    n, c = x.shape[:2]
    m = w.shape[0]
    k = list(w.shape[2:])
    if kernel_shape is not None and list(kernel_shape) != k:
        raise ValueError(f"kernel_shape {kernel_shape} does not match W's spatial shape {k}")
    if group <= 0 or c % group or m % group:
        raise ValueError(f"group {group} must divide the input channels ({c}) and the output channels ({m})")
    if offset_group <= 0 or c % offset_group:
        raise ValueError(f"offset_group {offset_group} must divide the input channels ({c})")
    cg, mg = c // group, m // group
    if w.shape[1] != cg:
        raise ValueError(f"W has {w.shape[1]} input channels per group, X has {c} channels / group {group} = {cg}")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    begin, _end, out = geometry(x.shape[2:], k, strides, dilations, pads, "NOTSET")
    kk = math.prod(k)
    want_off = (n, offset_group * kk * nd, *out)
    if tuple(offset.shape) != want_off:
        raise ValueError(f"DeformConv offset must have shape {list(want_off)}, got {list(offset.shape)}")
    if mask is not None and tuple(mask.shape) != (n, offset_group * kk, *out):
        raise ValueError(f"DeformConv mask must have shape {[n, offset_group * kk, *out]}, got {list(mask.shape)}")
    cdt = compute_dtype(x.dtype)
    cols = _deform_sample(xp, x.astype(cdt, copy=False), offset, mask, k, strides, dilations, begin, out, offset_group)
    o = math.prod(out)
    cols = cols.reshape(n, group, cg * kk, o)
    y = xp.matmul(w.astype(cdt, copy=False).reshape(group, mg, cg * kk), cols).reshape(n, m, *out)
    if b is not None:
        y = y + b.astype(cdt, copy=False).reshape((1, m) + (1,) * nd)
    return y.astype(x.dtype, copy=False)


@op("DeformConv", 19)
def deform_conv(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    offset: Any,
    B: Any = None,  # noqa: N803 - spec name
    mask: Any = None,
    *,
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    offset_group: int = 1,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    return _deform_conv(xp, X, W, offset, B, mask, dilations, group, kernel_shape, offset_group, pads, strides)


# -- Col2Im --------------------------------------------------------------------------------------


@op("Col2Im", 18, host_inputs=(1, 2))
def col2im(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    image_shape: Any,
    block_shape: Any,
    *,
    dilations: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    image = host_ints(image_shape)
    block = host_ints(block_shape)
    nd = len(image)
    if nd < 1 or len(block) != nd:
        raise ValueError(f"Col2Im image_shape {image} and block_shape {block} must have the same length >= 1")
    if input.ndim != 3:
        raise ValueError(f"Col2Im input must be 3-D (N, C * prod(block_shape), L), got {list(input.shape)}")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    p = list(pads) if pads else [0] * (2 * nd)
    if len(strides) != nd or len(dilations) != nd or len(p) != 2 * nd:
        raise ValueError(f"Col2Im strides {strides}, dilations {dilations}, pads {p} do not fit {nd} spatial axes")
    if any(v <= 0 for v in block) or any(v < 0 for v in image):
        raise ValueError(f"Col2Im block_shape {block} must be positive and image_shape {image} non-negative")
    kk = math.prod(block)
    n, ck, length = input.shape
    if ck % kk:
        raise ValueError(f"Col2Im input dimension 1 ({ck}) is not a multiple of prod(block_shape) = {kk}")
    c = ck // kk
    ext = [(b - 1) * d + 1 for b, d in zip(block, dilations)]
    canvas = [i + p[a] + p[nd + a] for a, i in enumerate(image)]
    blocks = [(cv - e) // s + 1 if cv >= e else 0 for cv, e, s in zip(canvas, ext, strides)]
    if math.prod(blocks) != length:
        raise ValueError(
            f"Col2Im input has {length} blocks, but image_shape {image}, block_shape {block}, pads {p}, "
            f"strides {strides} and dilations {dilations} give {blocks} = {math.prod(blocks)}"
        )
    check_alloc([n, c, *canvas], input.dtype, ctx, "Col2Im")
    if length == 0:
        return xp.zeros((n, c, *image), dtype=input.dtype)
    cols = input.reshape(n, c, kk, *blocks)
    full = col2im_add(xp, cols, block, strides, dilations, canvas)
    sl = (slice(None), slice(None), *(slice(p[a], p[a] + image[a]) for a in range(nd)))
    return xp.ascontiguousarray(full[sl])
