"""onnxpy's own fused operators (domain onnxpy.fused), created only by the graph optimizer.

Each does in one kernel what the original graph did in several: a convolution with its bias,
residual add and activation; a per-channel affine (folded BatchNormalization) with activation;
Gemm / MatMul + bias with activation. Activations are applied in place on the fresh result.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ._blas import stacked_matmul
from ._clamp import clamp, floor_at, np_clip
from ._compat import broadcasts_into, check_alloc, host_ints
from ._depthwise import pointwise_depthwise_channels_last
from ._derived import derived
from ._erf import gelu32
from ._layout import is_channels_last
from ._spatial import geometry
from ._unbuffered import per_row_passes
from .conv import compute_dtype, conv_nd
from .elementwise import gelu, gelu_tanh, leaky_relu_into, logistic, swish
from .nn import _einsum, gemm
from .pool import _max_pool
from .registry import memoized, op
from .tensor import _reshape_target, _split

DOMAIN = "onnxpy.fused"

# numpy's clip ufunc itself (see _clamp.py): fused epilogues clip every block of a
# convolution's output (MobileNet: ~130 calls a run).


def _clip(xp: Any) -> Any:
    return np_clip if xp is np else xp.clip


def apply_activation(xp: Any, y: Any, activation: str, params: list[float]) -> Any:
    """Apply ``activation`` to ``y`` in place where possible; returns the result."""
    if not activation:
        return y
    if y.ndim == 0:  # a 1-D @ 1-D product: numpy's ufuncs return scalars for 0-d arrays
        return apply_activation(xp, y.reshape(1), activation, params).reshape(())
    if activation == "Relu":
        return floor_at(xp, y, 0, out=y)
    t = y.dtype.type
    if activation == "LeakyRelu":
        if xp is np and 0 < params[0] <= 1 and y.dtype.kind == "f":
            # max(y, alpha y) in place: two passes instead of three (1.6 M values 1.2 -> 0.6 ms,
            # blocked), and -0 stays -0 as onnxruntime keeps it.
            return leaky_relu_into(y, params[0], y)
        neg = clamp(xp, y, None, t(0))
        neg *= t(1 - params[0])
        y -= neg
        return y
    if activation == "Clip":
        return _clip(xp)(y, t(params[0]), t(params[1]), out=y)
    if activation == "Tanh":
        return xp.tanh(y, out=y)
    if activation == "Sigmoid":
        return logistic(xp, y, out=y)
    if activation == "HardSigmoid":
        y *= t(params[0])
        y += t(params[1])
        return _clip(xp)(y, t(0), t(1), out=y)
    if activation == "Swish":
        return swish(xp, y, params[0] if params else 1.0, out=y)
    if activation == "Gelu":
        if y.dtype == np.float32:
            return gelu32(xp, y, out=y)
        y[...] = gelu(xp, y)
        return y
    if activation == "GeluTanh":
        return gelu_tanh(xp, y, params[0], params[1], out=y)
    if activation == "HardSwish":
        gate = xp.multiply(y, t(1 / 6))  # one temporary, the clip ufunc in place
        gate += t(0.5)
        _clip(xp)(gate, t(0), t(1), out=gate)
        y *= gate
        return y
    if activation == "FakeQuant":
        return fake_quantize(xp, y, params)
    raise ValueError(f"unknown fused activation '{activation}'")


# Activations apply_activation computes in place on any array (and so on any block of one).
IN_PLACE_ACTIVATIONS = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "Clip",
        "Tanh",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Swish",
        "Gelu",
        "GeluTanh",
        "FakeQuant",
    }
)


def fake_quantize(xp: Any, y: Any, params: list[float], source: Any = None) -> Any:
    """DequantizeLinear(QuantizeLinear(source)) into ``y`` (``source`` defaults to ``y``: in
    place), for params [scale, qmin - z, qmax - z]: clip(rint(source / scale), qmin - z,
    qmax - z) * scale, bit for bit what the two nodes give in float32
    (optimizer/passes/fuse_fake_quant.py)."""
    t = y.dtype.type
    scale = t(params[0])
    xp.divide(y if source is None else source, scale, out=y)
    xp.rint(y, out=y)
    # rint(-0.3) is -0.0, the integer path's (q - z) is +0: adding +0 turns -0 into +0.
    y += t(0)
    _clip(xp)(y, t(params[1]), t(params[2]), out=y)
    y *= scale
    return y


@op("FakeQuant", 1, domain=DOMAIN, may_inplace={0: 0})
def fake_quant(xp: Any, X: Any, *, activation_params: list[float], out: Any = None) -> Any:  # noqa: N803
    """A QuantizeLinear -> DequantizeLinear pair on a float32 value (see ``fake_quantize``)."""
    if out is None or out.shape != X.shape or out.dtype != X.dtype:
        out = xp.empty(X.shape, dtype=X.dtype)
    return fake_quantize(xp, out, activation_params, source=X)


@op("FusedConv", 1, domain=DOMAIN, may_inplace={3: 0}, out_checked=True)
def fused_conv(
    xp: Any,
    X: Any,  # noqa: N803 - ONNX names
    W: Any,  # noqa: N803
    B: Any = None,  # noqa: N803
    Z: Any = None,  # noqa: N803
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    activation: str = "",
    activation_params: list[float] | None = None,
    shuffle_groups: int = 0,
    channels_last: int = 0,
    ctx: Any = None,
    out: Any = None,
    into: Any = None,
) -> Any:
    """``out`` is Z's buffer, handed over by the executor (the addend dies here). ``into`` (no
    Z): an output buffer of the compute dtype, as conv_nd's, for a split run's band
    (runtime/split/bands.py)."""
    params = activation_params or []
    if out is not None and out is Z and xp is np and group == 1 and not shuffle_groups and not is_channels_last(X):
        # The residual addend dies here (the executor hands its buffer over): the convolution
        # adds into it, in the GEMM where it can (ops/_blas.py), instead of a pass over both.
        y = conv_nd(
            xp, X, W, B, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
            pads=pads, strides=strides, ctx=ctx, shuffle_groups=shuffle_groups, into=Z, accumulate=True,
        )  # fmt: skip
        if y is not None:
            return apply_activation(xp, y, activation, params)
    epilogue: Callable[[Any], None] | None = None
    if Z is None and activation in IN_PLACE_ACTIVATIONS:
        # Applied by the kernel, on blocks of the output while they are in cache where it can.
        def activate(block: Any) -> None:
            apply_activation(xp, block, activation, params)

        epilogue = activate

    y = conv_nd(
        xp,
        X,
        W,
        B,
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
        ctx=ctx,
        epilogue=epilogue,
        shuffle_groups=shuffle_groups,
        channels_last=bool(channels_last),
        into=into if Z is None else None,
    )
    if epilogue is not None:
        return y
    if Z is not None:
        if broadcasts_into(tuple(Z.shape), tuple(y.shape)):
            y += Z  # in place, also for an addend that broadcasts into y (per channel, say)
        else:
            y = y + Z  # the residual broadcasts to a larger shape: a new array
    return apply_activation(xp, y, activation, params)


@op("PointwiseDepthwiseConv", 1, domain=DOMAIN)
def pointwise_depthwise_conv(
    xp: Any,
    X: Any,  # noqa: N803 - ONNX names
    W1: Any,  # noqa: N803
    B1: Any,  # noqa: N803
    W: Any,  # noqa: N803
    B: Any = None,  # noqa: N803
    *,
    activation1: str = "",
    activation1_params: list[float] | None = None,
    group1: int = 1,
    shuffle_groups1: int = 0,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    activation: str = "",
    activation_params: list[float] | None = None,
    ctx: Any = None,
) -> Any:
    """FusedConv(FusedConv(X, W1, B1, activation1), W, B, activation): a 1x1 convolution and
    the depthwise convolution that alone reads it (optimizer/passes/fuse_pointwise_depthwise.py).
    On numpy the 1x1 GEMM writes the depthwise layer's zero-bordered input directly (see
    ``pointwise_depthwise_channels_last``); elsewhere the two run one after the other.

    ``group1`` and ``shuffle_groups1`` are the 1x1 convolution's group count and channel
    shuffle (FusedConv's ``shuffle_groups``). On the fast path a grouped 1x1 convolution runs as
    one dense GEMM with block-diagonal weights, its columns in shuffled order: g times the
    multiply-adds of the grouped form, but one BLAS call instead of g narrow ones, writing the
    depthwise layer's channels-last input directly (ShuffleNet's units)."""
    key = (
        xp is np and X.__class__ is np.ndarray,
        X.shape,
        X.dtype,
        W1.shape,
        W.shape,
        None if B1 is None else B1.shape,
        None if B is None else B.shape,
        group1,
        shuffle_groups1,
        auto_pad,
        None if dilations is None else tuple(dilations),
        group,
        None if kernel_shape is None else tuple(kernel_shape),
        None if pads is None else tuple(pads),
        None if strides is None else tuple(strides),
    )
    # Shapes and attributes only, so once per node and input shapes; the plan carries the two
    # activations' closures, so calls build none.
    plan = memoized(
        ctx,
        None if ctx is None else key,
        lambda: _pointwise_depthwise_plan(
            key[0],
            X,
            W1,
            B1,
            W,
            B,
            group1,
            shuffle_groups1,
            auto_pad,
            dilations,
            group,
            kernel_shape,
            pads,
            strides,
            lambda: (_epilogue(xp, activation1, activation1_params), _epilogue(xp, activation, activation_params)),
            ctx,
        ),
    )
    if plan is None:
        y = fused_conv(
            xp,
            X,
            W1,
            B1,
            group=group1,
            shuffle_groups=shuffle_groups1,
            activation=activation1,
            activation_params=activation1_params,
            ctx=ctx,
        )
        depthwise = {
            "auto_pad": auto_pad,
            "dilations": dilations,
            "group": group,
            "kernel_shape": kernel_shape,
            "pads": pads,
            "strides": strides,
        }
        return fused_conv(xp, y, W, B, **depthwise, activation=activation, activation_params=activation_params, ctx=ctx)
    begin, out, st, first, second = plan
    dt = X.dtype
    w1b1 = derived(
        (W1,) if B1 is None else (W1, B1),
        ("pointwise-augmented-T", np.dtype(dt).str, group1, shuffle_groups1),
        lambda: _augmented_t(W1, B1, dt, group1, shuffle_groups1),
    )
    return pointwise_depthwise_channels_last(
        X,
        w1b1,
        first,
        W.astype(dt, copy=False),
        None if B is None else B.astype(dt, copy=False),
        begin,
        out,
        st,
        second,
    )


def _pointwise_depthwise_plan(
    numpy_arrays: bool,
    X: Any,  # noqa: N803
    W1: Any,  # noqa: N803
    B1: Any,  # noqa: N803
    W: Any,  # noqa: N803
    B: Any,  # noqa: N803
    group1: int,
    shuffle_groups1: int,
    auto_pad: str,
    dilations: list[int] | None,
    group: int,
    kernel_shape: list[int] | None,
    pads: list[int] | None,
    strides: list[int] | None,
    epilogues: Callable[[], tuple[Any, Any]],
    ctx: Any,
) -> tuple[list[int], list[int], list[int], Any, Any] | None:
    """(begin, out, strides, the 1x1's and the depthwise layer's in-place activations) of
    PointwiseDepthwiseConv's fast path, checked (allocation budget included), or None where it
    does not apply: shapes and attributes only, so once per node and input shapes."""
    fast = (
        numpy_arrays
        and X.ndim == 4
        and X.dtype in (np.float32, np.float64)
        and W1.ndim == 4
        and W1.shape[2:] == (1, 1)
        and group1 >= 1
        and W1.shape[1] * group1 == X.shape[1]
        and W1.shape[0] % group1 == 0
        and (shuffle_groups1 == 0 or (shuffle_groups1 > 0 and W1.shape[0] % shuffle_groups1 == 0))
        and W.ndim == 4
        and W.shape[1] == 1
        and group == W.shape[0] == W1.shape[0]
        and (B1 is None or B1.shape == (W1.shape[0],))
        and (B is None or B.shape == (W.shape[0],))
        and (kernel_shape is None or list(kernel_shape) == list(W.shape[2:]))
        and all(d == 1 for d in dilations or [1, 1])
        and X.shape[0] * X.shape[2] * X.shape[3] > 0
    )
    if not fast:
        return None
    begin, _, out = geometry(X.shape[2:], W.shape[2:], strides, dilations, pads, auto_pad)
    if out[0] <= 0 or out[1] <= 0:
        return None
    st = list(strides or [1, 1])
    kh, kw = W.shape[2:]
    m = W.shape[0]
    check_alloc(
        [st[0] * (out[0] - 1) + kh, st[1] * (out[1] - 1) + kw, m], X.dtype, ctx, "PointwiseDepthwiseConv (padded)"
    )
    check_alloc([X.shape[0], m, *out], X.dtype, ctx, "PointwiseDepthwiseConv (output)")
    return begin, out, st, *epilogues()


def _augmented_t(w1: np.ndarray, b1: np.ndarray | None, dt: np.dtype, group: int, shuffle: int) -> np.ndarray:
    """[W1^T ; b1] as a contiguous (C + 1, M) matrix (b1 = 0 when absent); for a grouped W1
    block-diagonal, and with ``shuffle`` its columns in channel-shuffled order."""
    m, cg = w1.shape[:2]
    mg = m // group
    wb = np.zeros((cg * group + 1, m), dtype=dt)
    for g in range(group):
        wb[g * cg : (g + 1) * cg, g * mg : (g + 1) * mg] = w1[g * mg : (g + 1) * mg].reshape(mg, cg).T
    if b1 is not None:
        wb[-1] = b1
    if shuffle:
        # Output channel a * M/s + j goes to j * s + a (FusedConv's shuffle_groups).
        source = np.arange(m).reshape(shuffle, m // shuffle).T.reshape(-1)
        wb = np.ascontiguousarray(wb[:, source])
    return wb


def _epilogue(xp: Any, activation: str, params: list[float] | None) -> Callable[[Any], None] | None:
    if not activation:
        return None
    if activation not in IN_PLACE_ACTIVATIONS:
        raise ValueError(f"activation '{activation}' cannot be applied in place by PointwiseDepthwiseConv")
    values = params or []

    def activate(block: Any) -> None:
        apply_activation(xp, block, activation, values)

    return activate


@op("ConcatConv", 1, domain=DOMAIN)
def concat_conv(
    xp: Any,
    *inputs: Any,
    kernel_shapes: list[int],
    pads: list[int],
    strides: list[int],
    dilations: list[int],
    groups: list[int],
    activations: list[str],
    activation_params: list[float],
    ctx: Any = None,
) -> Any:
    """Concat(axis=1) of 2-D convolutions (optimizer/passes/fuse_concat_conv.py): ``inputs`` are
    (X, W, B) per member (B None when absent), the attributes list each member's kernel (2),
    pads (4), strides (2), dilations (2), group (1), activation (1, "" for none) and activation
    parameters (3; 2 in models onnxpy saved before FakeQuant). Each member writes its channels of the result directly (conv_nd's
    ``into``, contiguous for one image), so the concatenation copies nothing."""
    count = len(groups)
    per = len(activation_params) // max(count, 1)
    if len(inputs) != 3 * count:
        raise ValueError(f"ConcatConv has {count} members but {len(inputs)} inputs (expected X, W, B for each)")
    key = None if ctx is None else tuple((inputs[3 * i].shape, inputs[3 * i + 1].shape) for i in range(count))
    shape, members = memoized(ctx, key, lambda: _concat_layout(inputs, count, pads, strides, dilations))
    dt = np.result_type(*(inputs[3 * i].dtype for i in range(count)))
    y = xp.empty((shape[0], sum(members), *shape[1:]), dtype=dt)
    start = 0
    for i, m in enumerate(members):
        x, w, b = inputs[3 * i : 3 * i + 3]
        part = y[:, start : start + m]
        act = activations[i]
        r = conv_nd(
            xp,
            x,
            w,
            b,
            pads=pads[4 * i : 4 * i + 4],
            strides=strides[2 * i : 2 * i + 2],
            dilations=dilations[2 * i : 2 * i + 2],
            group=groups[i],
            kernel_shape=kernel_shapes[2 * i : 2 * i + 2],
            epilogue=_epilogue(xp, act, activation_params[per * i : per * (i + 1)]),
            into=part if shape[0] == 1 and part.dtype == compute_dtype(x.dtype) else None,
            ctx=ctx,
        )
        if r is not part:
            part[...] = r
        start += m
    return y


def _concat_layout(
    inputs: tuple[Any, ...], count: int, pads: list[int], strides: list[int], dilations: list[int]
) -> tuple[tuple[int, ...], list[int]]:
    """ConcatConv's (batch, *spatial) and per-member channel counts; raises when members
    cannot be concatenated. Shapes only, so once per node and input shapes."""
    members = []
    shape: tuple[int, ...] | None = None
    for i in range(count):
        x, w = inputs[3 * i], inputs[3 * i + 1]
        if x.ndim != 4 or w.ndim != 4:
            raise ValueError(f"ConcatConv member {i}: X and W must be 4-D, got {list(x.shape)} and {list(w.shape)}")
        _, _, out = geometry(
            x.shape[2:],
            w.shape[2:],
            strides[2 * i : 2 * i + 2],
            dilations[2 * i : 2 * i + 2],
            pads[4 * i : 4 * i + 4],
            "NOTSET",
        )
        here = (x.shape[0], *out)
        if shape is not None and here != shape:
            raise ValueError(
                f"ConcatConv member {i} gives batch and spatial size {list(here)}, member 0 gives {list(shape)}: "
                "they cannot be concatenated on the channel axis"
            )
        shape = here
        members.append(w.shape[0])
    assert shape is not None
    return shape, members


@op("ChannelAffine", 1, domain=DOMAIN)
def channel_affine(
    xp: Any, X: Any, scale: Any, shift: Any, *, activation: str = "", activation_params: list[float] | None = None
) -> Any:  # noqa: N803
    shape = (1, -1) + (1,) * max(X.ndim - 2, 0)
    plane = math.prod(X.shape[2:])
    with per_row_passes(plane if xp is np else 0, X.size):  # a pass per channel plane each
        y = X * scale.reshape(shape)
        y += shift.reshape(shape)
    return apply_activation(xp, y, activation, activation_params or [])


@op("ChannelMax", 1, domain=DOMAIN)
def channel_max(xp: Any, X: Any, floor: Any) -> Any:  # noqa: N803
    """max(X, floor) per channel (axis 1): what remains of ReLU(X * k + s) once k and s were
    folded into the 1x1 convolution that reads it (optimizer/passes/fold_relu_floor.py)."""
    f = floor.reshape((1, -1) + (1,) * max(X.ndim - 2, 0))
    if xp is np and X.ndim > 2 and X.dtype == f.dtype and X.dtype.kind == "f":
        if math.prod(X.shape[2:]) >= _CHANNEL_MAX_CLIP_MIN_PLANE and X.flags.c_contiguous:
            return np.clip(X, f, np.full(f.shape, np.inf, dtype=X.dtype))  # see the limit's note
        # numpy's maximum against a broadcast (stride-0) operand runs its slow loop; the floor
        # broadcast into the result first (a fast copy) and an elementwise maximum of two
        # arrays: DenseNet's 512x28x28 84 -> 68 us, 58 calls a run.
        out = np.empty_like(X)
        if X.nbytes > _CHANNEL_MAX_BLOCKED_BYTES and X.flags.c_contiguous:
            _channel_max_blocked(X, f, out)
            return out
        np.copyto(out, f)
        return np.maximum(X, out, out=out)
    return xp.maximum(X, f)


# Planes of at least this many values take one clip against per-channel bounds (the floor and
# +inf), a single pass. numpy 2.4 runs such a clip vectorized only on inner runs longer than
# about 2,700 values (0.27 ns a value on rows of 3,000 and more, 0.88 on rows of 2,500 and
# fewer, where the fill-and-maximum takes 0.3); on 56x56 maps 110 against 146 us (128
# channels), 247 against 350 (256).
_CHANNEL_MAX_CLIP_MIN_PLANE = 3000

# ChannelMax over more than this many bytes runs a block of channels at a time, so the floor
# written into the result is still in L2 when the maximum reads it back. In DenseNet-121's run
# (benchmarks/knob_ab.py, 300 pairs; Xeon, 2 MB L2) its maps of 2.0-3.2 MB took 22-60 us less
# each (256x56x56 348 -> 288 us), those of 1.4-1.6 MB the same, those of 1.1-1.3 MB 9-25 us
# more: there the whole-map passes still run from L2.
_CHANNEL_MAX_BLOCKED_BYTES = 1792 << 10
_CHANNEL_MAX_BLOCK_BYTES = 512 << 10


def _channel_max_blocked(x: np.ndarray, floor: np.ndarray, out: np.ndarray) -> None:
    """``out = max(x, floor)`` for C-contiguous ``x`` (N, C, ...), a block of channels of one
    image at a time; ``floor`` broadcasts as (1, C, 1, ...)."""
    n, c = x.shape[:2]
    plane = math.prod(x.shape[2:])
    per = max(1, _CHANNEL_MAX_BLOCK_BYTES // max(1, plane * x.itemsize))
    xs, outs = x.reshape(n, c, plane), out.reshape(n, c, plane)
    fs = np.broadcast_to(floor.reshape(-1, 1), (c, 1))
    for i in range(n):
        for c0 in range(0, c, per):
            block = outs[i, c0 : c0 + per]
            np.copyto(block, fs[c0 : c0 + per])
            np.maximum(xs[i, c0 : c0 + per], block, out=block)


@op("FusedMaxPool", 1, domain=DOMAIN)
def fused_max_pool(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    activation: str = "Relu",
    ctx: Any = None,
) -> Any:
    """Relu(MaxPool(X)) in one kernel: the ReLU of the convolution before a strided max pool,
    moved after the pool (optimizer/passes/relu_after_pool.py), runs on each block of the pooled
    result while it is in cache instead of as a pass of its own."""
    if activation != "Relu":
        raise ValueError(f"FusedMaxPool supports activation 'Relu' only, got '{activation}'")
    return _max_pool(xp, X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, 0, False, ctx=ctx, floor=0.0)


@op("FusedGemm", 1, domain=DOMAIN)
def fused_gemm(
    xp: Any,
    A: Any,  # noqa: N803
    B: Any,  # noqa: N803
    C: Any = None,  # noqa: N803
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,  # noqa: N803
    transB: int = 0,  # noqa: N803
    activation: str = "",
    activation_params: list[float] | None = None,
) -> Any:
    y = gemm(xp, A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB)
    return apply_activation(xp, y, activation, activation_params or [])


@op("FusedMatMul", 1, domain=DOMAIN)
def fused_matmul(
    xp: Any,
    A: Any,  # noqa: N803 - ONNX names
    B: Any,  # noqa: N803
    bias: Any = None,
    Z: Any = None,  # noqa: N803
    *,
    activation: str = "",
    activation_params: list[float] | None = None,
) -> Any:
    """activation(A @ B + bias + Z): MatMul with its bias, residual addend ``Z`` (a transformer's
    skip connection) and activation (optimizer/passes/fuse_activation.py), each optional."""
    y = stacked_matmul(xp, A, B)
    if bias is not None:
        # As a row of y's rank: operands of equal shapes take numpy's direct loop, where a
        # 1x128 product plus its 128-vector bias costs 0.88 -> 0.54 us (a batch-1 head).
        y += bias[None] if y.ndim == 2 and bias.ndim == 1 else bias
    if Z is not None:
        if broadcasts_into(tuple(Z.shape), tuple(y.shape)):
            y += Z
        else:
            y = y + Z  # the addend broadcasts to a larger shape: a new array
    if not activation:
        return y
    return apply_activation(xp, y, activation, activation_params or [])


@op("GatedMatMul", 1, domain=DOMAIN)
def gated_matmul(
    xp: Any,
    A: Any,  # noqa: N803 - ONNX names
    B: Any,  # noqa: N803
    bias: Any = None,
    *,
    activation: str = "",
    activation_params: list[float] | None = None,
) -> Any:
    """activation(A @ B1 + b1) * (A @ B2 + b2), B = [B1 | B2] and bias = [b1 | b2] packed side by
    side with equal halves (a gated MLP: Llama's silu(gate) * up,
    optimizer/passes/pack_gated_mlp.py): one product for both, the gate's activation and the
    product into a fresh array. (In place on the gate's columns, numpy would copy the up half
    first: two views of one buffer may overlap for all its quick check knows, 64x1376 41 us
    against 10.)"""
    width = B.shape[-1]
    if width % 2:
        raise ValueError(f"GatedMatMul: B has {width} columns, expected two equal halves")
    y = stacked_matmul(xp, A, B)
    if bias is not None:
        y += bias
    gate, up = y[..., : width // 2], y[..., width // 2 :]
    params = activation_params or []
    if activation == "Swish":
        out = swish(xp, gate, params[0] if params else 1.0, out=xp.empty(gate.shape, dtype=gate.dtype))
    else:
        out = apply_activation(xp, gate.copy(), activation, params)
    out *= up
    return out


@op("PackedMatMul", 1, domain=DOMAIN)
def packed_matmul(xp: Any, A: Any, B: Any, bias: Any = None, *, splits: list[int]) -> tuple[Any, ...]:  # noqa: N803
    """A @ B (+ bias) once, returned as column slices of ``splits`` widths: the products of A
    with each of the weights packed side by side in B (optimizer/passes/pack_matmuls.py)."""
    if sum(splits) != B.shape[-1] or any(s <= 0 for s in splits):
        raise ValueError(f"splits {list(splits)} must be positive and add up to B's {B.shape[-1]} columns")
    y = stacked_matmul(xp, A, B)
    if bias is not None:
        y += bias
    return _split(xp, y, -1, list(splits))


@op("SiblingConv", 1, domain=DOMAIN)
def sibling_conv(
    xp: Any,
    X: Any,  # noqa: N803 - ONNX names
    W: Any,  # noqa: N803
    B: Any = None,  # noqa: N803
    *,
    splits: list[int],
    relu_channels: int = 0,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> tuple[Any, ...]:
    """Convolutions of one input stacked into one (optimizer/passes/merge_sibling_pointwise.py):
    Conv(X, W, B) once, Relu on its first ``relu_channels`` channels, returned as channel slices
    of ``splits`` sizes (views: no copy)."""
    if sum(splits) != W.shape[0] or any(s <= 0 for s in splits):
        raise ValueError(f"splits {list(splits)} must be positive and add up to W's {W.shape[0]} output channels")
    if not 0 <= relu_channels <= W.shape[0]:
        raise ValueError(f"relu_channels {relu_channels} must be within W's {W.shape[0]} output channels")

    def rectify(y: Any) -> None:
        apply_activation(xp, y, "Relu", [])

    y = conv_nd(
        xp,
        X,
        W,
        B,
        auto_pad=auto_pad,
        dilations=dilations,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
        ctx=ctx,
        epilogue=rectify if relu_channels == W.shape[0] else None,
    ).astype(X.dtype, copy=False)
    if 0 < relu_channels < W.shape[0]:
        rectify(y[:, :relu_channels])
    return _split(xp, y, 1, list(splits))


@op("Gelu", 1, domain=DOMAIN)
def fused_gelu(xp: Any, X: Any, *, scale: float = 1.0) -> Any:  # noqa: N803
    """x * 0.5 * (1 + erf(x * scale / sqrt(2))), from an exporter's decomposed pattern: GELU at
    scale 1, else gelu(x * scale) / scale (its divisor was not sqrt(2), as in a float16 model)."""
    if scale == 1.0:
        return gelu(xp, X)
    s = X.dtype.type(scale) if X.dtype.kind == "f" else scale
    y = gelu(xp, X * s)
    y /= s
    return y


@op("GeluTanh", 1, domain=DOMAIN)
def fused_gelu_tanh(xp: Any, X: Any, *, beta: float, kappa: float) -> Any:  # noqa: N803
    """0.5 x (1 + tanh(beta (x + kappa x^3))), from an exporter's decomposed tanh GELU (GPT-2's
    NewGELU: beta sqrt(2 / pi), kappa 0.044715) with the model's own constants: one kernel of
    seven passes instead of eight steps (optimizer/passes/fuse_patterns.py)."""
    return gelu_tanh(xp, X, beta, kappa)


@op("Swish", 1, domain=DOMAIN)
def fused_swish(xp: Any, X: Any, *, alpha: float = 1.0) -> Any:  # noqa: N803
    """x * sigmoid(alpha * x), from an exporter's Sigmoid and Mul (SiLU at alpha 1; CLIP's
    QuickGelu at 1.702): one kernel of four passes instead of two steps of five."""
    return swish(xp, X, alpha)


@op("LayerNormalization", 1, domain=DOMAIN)
def fused_layer_norm(xp: Any, X: Any, scale: Any, B: Any = None, *, axis: int = -1, epsilon: float = 1e-5) -> Any:  # noqa: N803
    """LayerNormalization recognised in a decomposed pattern (any opset; ONNX's op needs 17)."""
    from .nn import layer_norm

    return layer_norm(xp, X, scale, B, axis=axis, epsilon=epsilon)


@op("RMSNormalization", 1, domain=DOMAIN)
def fused_rms_norm(xp: Any, X: Any, scale: Any, *, epsilon: float) -> Any:  # noqa: N803
    """x / sqrt(mean(x^2) + epsilon) * scale over the last axis, from an exporter's decomposed
    RMS norm (optimizer/passes/fuse_patterns.py): the row sums of squares in one einsum pass,
    then two passes, where the decomposed form made six."""
    if xp is not np or X.size == 0:
        ms = (X * X).mean(axis=-1, keepdims=True)
        return X / xp.sqrt(ms + X.dtype.type(epsilon)) * scale
    if X.size == X.shape[-1] and X.dtype in (np.float32, np.float64):
        # One row (a decoder step's token): its statistic as a scalar, four numpy calls
        # (1x512 13.4 -> 3.7 us; the multi-row form below 35.7 -> 22.6 us on 64x512 since it
        # calls einsum without its Python wrapper).
        row = X.reshape(-1)
        t = X.dtype.type
        y = row * (t(1) / np.sqrt(t(row.dot(row) / t(row.size)) + t(epsilon)))
        y *= scale
        return y.reshape(X.shape)
    rows = X.reshape(-1, X.shape[-1])
    ms = _einsum("ij,ij->i", rows, rows)
    ms /= X.dtype.type(X.shape[-1])
    ms += X.dtype.type(epsilon)
    np.sqrt(ms, out=ms)
    y = np.divide(rows, ms[:, None])
    y *= scale
    return y.reshape(X.shape)


@op("RotaryHalf", 1, domain=DOMAIN)
def rotary_half(xp: Any, X: Any, cos: Any, sin: Any, *, half: int) -> Any:  # noqa: N803
    """X * cos + cat(-X[..., half:], X[..., :half]) * sin over the last axis: Llama's rotary
    embedding (optimizer/passes/fuse_rotary.py), cos and sin broadcasting as in the graph."""
    width = X.shape[-1]
    if not 0 < half < width:
        raise ValueError(f"RotaryHalf: half {half} must lie inside the last axis of {list(X.shape)}")
    rotated = xp.empty_like(X)
    xp.negative(X[..., half:], out=rotated[..., : width - half])
    rotated[..., width - half :] = X[..., :half]
    y = X * cos
    rotated = rotated * sin
    if rotated.shape == y.shape:
        y += rotated
        return y
    return y + rotated  # sin broadcasts X to more than cos does


@op("ReshapeShape", 1, domain=DOMAIN, host_inputs=(0, 1))
def reshape_shape(xp: Any, input_shape: Any, shape: Any, *, allowzero: int = 0) -> Any:
    """The shape Reshape(x, ``shape``) gives an x of shape ``input_shape``, by Reshape's own rules
    and errors (optimizer/passes/shape_of_views.py: a Shape read through a Reshape)."""
    dims = tuple(host_ints(input_shape))
    return np.array(_reshape_target(dims, host_ints(shape), allowzero), dtype=np.int64)


@op("ExpandShape", 1, domain=DOMAIN, host_inputs=(0, 1))
def expand_shape(xp: Any, input_shape: Any, shape: Any) -> Any:
    """The shape Expand(x, ``shape``) gives an x of shape ``input_shape``: the two broadcast, with
    Expand's error when they cannot (optimizer/passes/shape_of_views.py: repeat_kv's Expand,
    whose copy the fused Attention no longer needs, keeps only its Shape readers)."""
    dims, target = host_ints(input_shape), host_ints(shape)
    try:
        out = np.broadcast_shapes(tuple(dims), tuple(target))
    except ValueError:
        raise ValueError(f"cannot expand shape {dims} to {target}") from None
    return np.array(out, dtype=np.int64)


@op("UnsqueezeShape", 1, domain=DOMAIN, host_inputs=(0, 1))
def unsqueeze_shape(xp: Any, input_shape: Any, axes: Any) -> Any:
    """The shape Unsqueeze(x, ``axes``) gives an x of shape ``input_shape``, by Unsqueeze's rules
    and errors (axes in range of the output's rank, none repeated)."""
    from ._compat import normalize_axes

    dims, ax = host_ints(input_shape), host_ints(axes)
    for a in sorted(normalize_axes(ax, len(dims) + len(ax))):
        dims.insert(a, 1)
    return np.array(dims, dtype=np.int64)


@op("SqueezeShape", 1, domain=DOMAIN, host_inputs=(0, 1))
def squeeze_shape(xp: Any, input_shape: Any, axes: Any = None) -> Any:
    """The shape Squeeze(x, ``axes``) gives an x of shape ``input_shape``, by Squeeze's rules and
    errors (no axes: every axis of size 1; a named axis must have size 1)."""
    from ._compat import normalize_axes

    dims = host_ints(input_shape)
    ax = normalize_axes(host_ints(axes), len(dims))
    if not ax:
        return np.array([d for d in dims if d != 1], dtype=np.int64)
    for a in ax:
        if dims[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of shape {dims}: its size is {dims[a]}, not 1")
    return np.array([d for i, d in enumerate(dims) if i not in ax], dtype=np.int64)


# Distinct input-shape sets remembered per ShapeMemo node (oldest forgotten first).
SHAPE_MEMO_ENTRIES = 32
_MEMO_LOCK = threading.Lock()


@op("ShapeMemo", 1, domain=DOMAIN)
def shape_memo(xp: Any, *args: Any, body: Any, keyed: int, ctx: Any = None) -> Any:
    """A group of shape computations (see optimizer/passes/memoize_shapes.py): ``body`` runs
    once per distinct shape of the first ``keyed`` inputs, and its outputs are reused, read-only,
    by later runs with the same shapes."""
    n = ctx.n_inputs if ctx is not None else len(args)
    explicit, implicit = args[:n], args[n:]
    key = tuple(tuple(a.shape) for a in explicit[:keyed])
    memo: dict[Any, tuple[Any, ...]] | None = body.__dict__.get("shape_memo")
    if memo is None:
        with _MEMO_LOCK:
            memo = body.__dict__.setdefault("shape_memo", {})
    hit = memo.get(key)
    if hit is not None:
        return hit
    names = ctx.implicit_inputs if ctx is not None else ()
    # A 0-d result can come back as a numpy scalar (np.float32): as an array it can be frozen and
    # cached like the rest (Swin-T's memos, its windows' attention masks among them, ran on
    # every call because one output of each was a scalar: 12 ms of a 122 ms run).
    outs = tuple(
        np.asarray(o) if isinstance(o, np.generic) else o for o in body.run(list(explicit), dict(zip(names, implicit)))
    )
    if all(isinstance(o, np.ndarray) for o in outs):
        for o in outs:
            o.flags.writeable = False  # shared by every later run: nobody may write into it
        with _MEMO_LOCK:  # concurrent runs may fill the same memo
            while len(memo) >= SHAPE_MEMO_ENTRIES:
                memo.pop(next(iter(memo)))
            memo[key] = outs
    return outs
