"""Which plan steps can run as two bands of output rows, and which input rows a band reads.

A band of a step is its output rows [o0, o1) of every image. Two kinds of steps have them:

- window steps (convolutions, pools): input 0 is read through the kernel window, so a band
  reads input rows [o0 s - p, (o1 - 1) s - p + (k - 1) d + 1), clamped to the input, with the
  band's own top and bottom pads (the image's pads where the band touches its border, none
  inside). Any other input with the output's rows (a fused residual) is read at [o0, o1).
- position steps (activations, channel-wise ops, concatenation over channels): every input
  with the output's rows is read at [o0, o1); the rest (weights, broadcast operands) whole.
- token steps of a transformer, whose rows are the tokens of (batch, tokens, features) values
  (axis -2, as for NCHW maps): products with shared weights, LayerNormalization over the
  features, elementwise ops, and attention, whose band of queries reads every key and value.

Everything here is pure data: the same rule computes the same rows in both processes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

#: the fused domain's ops (onnxpy/ops/fused.py)
FUSED = "onnxpy.fused"

WINDOW_OPS = {
    ("", "Conv"),
    ("", "MaxPool"),
    ("", "AveragePool"),
    (FUSED, "FusedConv"),
    (FUSED, "FusedMaxPool"),
    # its 1x1 convolution is per position; the window is its depthwise convolution's
    (FUSED, "PointwiseDepthwiseConv"),
    # one convolution returned as channel slices: several outputs with the same rows
    (FUSED, "SiblingConv"),
    # convolutions of (usually) one input concatenated: a window per member
    (FUSED, "ConcatConv"),
}

MAX_POOLS = {("", "MaxPool"), (FUSED, "FusedMaxPool")}

#: per-element ops: a band of rows reads the same rows of every input that has them, on maps
#: (NCHW, rows on axis 2) and on token sequences (rows on axis -2) alike
ELEMENTWISE_OPS = {
    ("", "Relu"),
    ("", "LeakyRelu"),
    ("", "Sigmoid"),
    ("", "Tanh"),
    ("", "Clip"),
    ("", "HardSigmoid"),
    ("", "HardSwish"),
    ("", "Swish"),
    (FUSED, "Swish"),
    ("", "Add"),
    ("", "Sub"),
    ("", "Mul"),
    ("", "Div"),
    ("", "Erf"),
    ("", "Gelu"),
    (FUSED, "Gelu"),
}

#: per-position ops of NCHW maps: the elementwise ones, and those that read whole channels of
#: one position (which a token sequence's rows axis is not)
POSITION_OPS = ELEMENTWISE_OPS | {
    ("", "LRN"),
    ("", "BatchNormalization"),
    ("", "Concat"),
    (FUSED, "ChannelAffine"),
    (FUSED, "ChannelMax"),
}

#: steps of token sequences (batch, tokens, features) whose rows are tokens: a band of tokens
#: reads its own tokens of the activations and the weights whole; attention reads its band of
#: queries and every key and value
TOKEN_OPS = {
    ("", "MatMul"),
    (FUSED, "FusedMatMul"),
    (FUSED, "PackedMatMul"),
    (FUSED, "GatedMatMul"),
    ("", "LayerNormalization"),
    (FUSED, "LayerNormalization"),
    (FUSED, "Attention"),
}

#: fewer output rows than this and a step runs whole in one process: halves of a small map
#: cost more in calls and halo rows than they save
MIN_ROWS = 8

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Window:
    """Input ``position`` read through a kernel window (an image's rows)."""

    position: int
    kernel: int
    stride: int
    dilation: int
    #: the window's top pad, at ``pad_index`` of the kernel's flat ``pads`` (bottom: +2)
    top: int
    pad_index: int


@dataclass(frozen=True)
class RowRule:
    """How a step's band of output rows reads its inputs."""

    #: per input: "window" (through a kernel window), "rows" (at the output's rows), "whole"
    #: (weights, broadcast operands)
    reads: tuple[str, ...]
    windows: tuple[Window, ...] = ()
    #: the kernel's flat ``pads`` keyword; a band replaces each window's top and bottom pads
    pads: tuple[int, ...] = ()


def row_rule(
    op: tuple[str, str],
    kernel: Any,
    input_shapes: list[Shape | None],
    output_shapes: list[Shape | None],
    constant: list[bool] | None = None,
) -> RowRule | None:
    """The rule for a step of ``op`` (domain, type) bound as ``kernel``, whose inputs and outputs
    had these shapes in a traced run (``constant``: which inputs are initializers); None where
    it must run whole."""
    constant = constant or [False] * len(input_shapes)
    if not output_shapes or any(s is None for s in output_shapes):
        return None
    if op in TOKEN_OPS or (op in ELEMENTWISE_OPS and len(output_shapes[0]) in (2, 3)):  # type: ignore[arg-type]
        return token_rule(op, kernel, input_shapes, output_shapes, constant)
    if any(len(s) != 4 for s in output_shapes):  # type: ignore[arg-type]
        return None
    out = output_shapes[0]
    assert out is not None
    rows = out[2]
    if rows < MIN_ROWS or any(s[2] != rows for s in output_shapes):  # type: ignore[index]
        return None
    if len(output_shapes) > 1 and op != (FUSED, "SiblingConv"):
        return None  # e.g. MaxPool's indices: positions in the whole input, not a band
    if op == (FUSED, "ConcatConv"):
        return _concat_conv_rule(kernel, input_shapes, out, constant)
    if op in WINDOW_OPS:
        return _window_rule(kernel, input_shapes, out, constant, op in MAX_POOLS)
    if op in POSITION_OPS:
        if op == ("", "Concat") and not _concat_over_channels(kernel):
            return None
        reads = _position_reads(input_shapes, rows)
        return None if reads is None else RowRule(tuple(reads))
    return None


def _concat_over_channels(kernel: Any) -> bool:
    kw = getattr(kernel, "keywords", None) or {}
    return kw.get("axis") in (1, -3)


def _position_reads(shapes: list[Shape | None], rows: int) -> list[str] | None:
    """``_position_read`` of each input, or None where one cannot be read by rows or whole."""
    reads = []
    for shape in shapes:
        kind = _position_read(shape, rows)
        if kind is None:
            return None
        reads.append(kind)
    return reads


def _position_read(shape: Shape | None, rows: int) -> str | None:
    """How a position step reads an input of this shape: by rows (rows on axis -2, as numpy
    broadcasting aligns them), whole (absent, or broadcast along the rows), or not at all."""
    if shape is None or len(shape) < 2 or shape[-2] == 1:
        return "whole"
    if shape[-2] == rows:
        return "rows"
    return None


def token_rule(
    op: tuple[str, str],
    kernel: Any,
    input_shapes: list[Shape | None],
    output_shapes: list[Shape | None],
    constant: list[bool],
) -> RowRule | None:
    """The rule of a step over token sequences (rows on axis -2 of every output), or None."""
    out = output_shapes[0]
    assert out is not None
    if len(out) < 2:
        return None
    rows = out[-2]
    if rows < MIN_ROWS or any(s is None or len(s) != len(out) or s[-2] != rows for s in output_shapes):
        return None
    if len(output_shapes) > 1 and op != (FUSED, "PackedMatMul"):
        return None  # LayerNormalization's mean and inverse deviation: left whole
    kw = getattr(kernel, "keywords", None) or {}
    if op in (("", "LayerNormalization"), (FUSED, "LayerNormalization")):
        if kw.get("axis", -1) not in (-1, len(out) - 1):
            return None  # normalizing over the tokens too
    if op == (FUSED, "Attention"):
        # (query, key, value, their three head shapes, mask): the band's queries against every
        # key; a mask by query rows where it has them
        q = input_shapes[0]
        if len(input_shapes) < 6 or constant[0] or q is None or len(q) != 3 or q[-2] != rows or len(out) != 4:
            return None
        if kw.get("kv_repeat") or len(input_shapes) > 7:
            return None  # inputs 7-10 are shapes, 11 a Where condition: not split
        mask = _position_reads(input_shapes[6:], rows)
        return None if mask is None else RowRule(("rows", "whole", "whole", "whole", "whole", "whole", *mask))
    if op in (("", "MatMul"), (FUSED, "FusedMatMul"), (FUSED, "PackedMatMul"), (FUSED, "GatedMatMul")):
        a, b = input_shapes[0], input_shapes[1] if len(input_shapes) > 1 else None
        # the band's rows of A times weights shared by every row (not a batch of matrices)
        if constant[0] or a is None or len(a) != len(out) or a[-2] != rows or b is None or len(b) != 2:
            return None
        rest = _position_reads(input_shapes[2:], rows)
        return None if rest is None else RowRule(("rows", "whole", *rest))
    reads = _position_reads(input_shapes, rows)
    return None if reads is None else RowRule(tuple(reads))


def _window(
    position: int,
    x: Shape | None,
    rows: int,
    k: list[int],
    strides: list[int],
    dilations: list[int],
    pads: list[int],
    at: int,
    ceil: bool = False,
) -> Window | None:
    """Input ``position`` of shape ``x`` through a 2-D window giving ``rows`` output rows
    (``ceil``: a max pool's ceil_mode, whose last window may reach past the bottom pad)."""
    if x is None or len(x) != 4 or len(k) != 2 or len(strides) != 2 or len(dilations) != 2 or len(pads) != 4:
        return None
    top, bottom = int(pads[0]), int(pads[2])
    kh, s, d = int(k[0]), int(strides[0]), int(dilations[0])
    span = x[2] + top + bottom - (kh - 1) * d - 1
    if s < 1 or d < 1 or span < 0:
        return None
    expected = -(-span // s) + 1 if ceil else span // s + 1
    if ceil and (expected - 1) * s >= x[2] + top:
        expected -= 1  # a last window starting in the bottom pad is dropped
    if expected != rows:
        return None  # not the geometry this rule assumes: leave the step whole
    return Window(position, kh, s, d, top, at)


def _window_rule(
    kernel: Any, input_shapes: list[Shape | None], out: Shape, constant: list[bool], max_pool: bool
) -> RowRule | None:
    if not isinstance(kernel, functools.partial) or not input_shapes or constant[0]:
        return None
    kw = kernel.keywords
    ceil = bool(kw.get("ceil_mode", 0))
    # ceil_mode's partial last window is a max over the rows it covers, as with extra bottom
    # pad rows of -inf: a band passes them as pads. An average's count differs: left whole.
    if kw.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or (ceil and not max_pool):
        return None
    k = kw.get("kernel_shape")
    pads = list(kw.get("pads") or [0, 0, 0, 0])
    if kw.get("auto_pad", "NOTSET") == "VALID":
        pads = [0, 0, 0, 0]
    if k is None:
        return None
    window = _window(
        0, input_shapes[0], out[2], list(k), kw.get("strides") or [1, 1], kw.get("dilations") or [1, 1], pads, 0, ceil
    )
    if window is None:
        return None
    reads = ["window"]
    for shape, const in zip(input_shapes[1:], constant[1:]):
        # weights and biases whole; a fused residual (FusedConv's Z) at the output's rows
        if const or shape is None or len(shape) != 4:
            reads.append("whole")
        elif shape == out:  # the residual has the output's shape exactly
            reads.append("rows")
        else:
            return None
    return RowRule(tuple(reads), (window,), tuple(int(p) for p in pads))


def _concat_conv_rule(
    kernel: Any, input_shapes: list[Shape | None], out: Shape, constant: list[bool]
) -> RowRule | None:
    """ConcatConv: (X, W, B) per member, each X through its member's window."""
    if not isinstance(kernel, functools.partial) or len(input_shapes) % 3:
        return None
    kw = kernel.keywords
    ks, pads, strides, dilations = kw["kernel_shapes"], kw["pads"], kw["strides"], kw["dilations"]
    windows, reads = [], []
    for i in range(len(input_shapes) // 3):
        if constant[3 * i]:
            return None
        window = _window(
            3 * i, input_shapes[3 * i], out[2], ks[2 * i : 2 * i + 2], strides[2 * i : 2 * i + 2],
            dilations[2 * i : 2 * i + 2], pads[4 * i : 4 * i + 4], 4 * i,
        )  # fmt: skip
        if window is None or not constant[3 * i + 1]:
            return None
        windows.append(window)
        reads += ["window", "whole", "whole"]
    return RowRule(tuple(reads), tuple(windows), tuple(int(p) for p in pads))


def window_rows(window: Window, o0: int, o1: int, height: int) -> tuple[int, int, int, int]:
    """Input rows [i0, i1) that output rows [o0, o1) read through ``window`` from an input of
    ``height`` rows, and the band's top and bottom pads."""
    first = o0 * window.stride - window.top
    last = (o1 - 1) * window.stride - window.top + (window.kernel - 1) * window.dilation + 1
    i0, i1 = max(first, 0), min(last, height)
    return i0, i1, i0 - first, last - i1


def window_at(rule: RowRule, position: int) -> Window:
    return next(w for w in rule.windows if w.position == position)


def read_rows(rule: RowRule, position: int, o0: int, o1: int, height: int) -> tuple[int, int] | None:
    """Rows of input ``position`` that output rows [o0, o1) read; None for a whole read."""
    kind = rule.reads[position]
    if kind == "whole":
        return None
    if kind == "rows":
        return o0, o1
    i0, i1, _, _ = window_rows(window_at(rule, position), o0, o1, height)
    return i0, i1


#: fewer output channels than this and a step on a small map runs whole
MIN_CHANNELS = 32
#: maps of fewer rows than this split by channels where a convolution can (its weights are
#: most of what it reads there): ResNet-50's 14x14 3x3 layers lost 1.2x as row halves (the
#: Winograd tiles of 7-row halves waste work); as channel halves the model ran 8.4% faster,
#: Inception v2 6.3%
CHANNELS_BELOW = 15


@dataclass(frozen=True)
class ChannelRule:
    """How a step's band of output channels [m0, m1) reads its inputs: maps too small for
    row bands (7x7) where the weights, not the activations, are most of what is read."""

    #: per input: "whole" (the data, read entirely), "split" (a weight or bias: its rows
    #: [m0, m1)), "channels" (a fused residual: its channels [m0, m1)), "in_channels" (a grouped
    #: convolution's input: the channels of the band's groups)
    reads: tuple[str, ...]
    #: a keyword that becomes the band's share of the groups (a depthwise convolution's group)
    group_keyword: str = ""
    #: (input channels, output channels) of a grouped convolution, and its group count
    ratio: tuple[int, int] = (1, 1)
    groups: int = 0
    #: the convolution shuffles its output channels over its ``groups`` (FusedConv's
    #: shuffle_groups): a band computes its groups unshuffled and writes them where the shuffle
    #: puts them, output channel a * M/g + j at j * g + a
    shuffle: int = 0


Rule = RowRule | ChannelRule


def channel_rule(
    op: tuple[str, str],
    kernel: Any,
    input_shapes: list[Shape | None],
    output_shapes: list[Shape | None],
    constant: list[bool],
) -> ChannelRule | None:
    """The channel rule of a convolution with constant weights (plain, or a 1x1 followed by a
    depthwise one), or None."""
    if len(output_shapes) != 1 or output_shapes[0] is None or len(output_shapes[0]) not in (2, 4):
        return None
    out = output_shapes[0]
    m = out[1]
    if m < MIN_CHANNELS or not isinstance(kernel, functools.partial) or not input_shapes or constant[0]:
        return None
    kw = kernel.keywords
    if op in (("", "Gemm"), (FUSED, "FusedGemm")):
        return _gemm_rule(kw, input_shapes, out, constant)
    if len(out) != 4:
        return None

    def weights(position: int, rows: int) -> bool:
        """A constant weight or bias with ``rows`` on axis 0, or an absent bias."""
        if position >= len(input_shapes) or input_shapes[position] is None:
            return position != 1
        shape = input_shapes[position]
        return constant[position] and shape is not None and len(shape) >= 1 and shape[0] == rows

    if op in (("", "Conv"), (FUSED, "FusedConv")):
        group = kw.get("group", 1)
        shuffle = kw.get("shuffle_groups", 0)
        if not (weights(1, m) and weights(2, m)):
            return None
        if shuffle and (shuffle != group or len(input_shapes) > 3):
            # ShuffleNet's grouped 1x1 convolutions shuffle over their own groups: half the
            # groups fill every other channel block of the output (below). Other shuffles (and
            # a residual in shuffled order) stay whole.
            return None
        x = input_shapes[0]
        reads = ["whole", "split", "split"][: len(input_shapes)]
        keyword = ""
        if group != 1:
            # Grouped (depthwise included): each half of the groups reads its half of the
            # input's channels, so the halves must fall on a group boundary.
            if group % 2 or x is None or len(x) != 4 or x[1] % group or m % group:
                return None
            reads[0], keyword = "in_channels", "group"
        if len(input_shapes) > 3:  # FusedConv's residual
            if len(input_shapes) > 4 or input_shapes[3] != out:
                return None
            reads.append("channels")
        if keyword:
            assert x is not None
            return ChannelRule(tuple(reads), keyword, (x[1], m), group, shuffle)
        return ChannelRule(tuple(reads))
    if op == (FUSED, "PointwiseDepthwiseConv"):
        if len(input_shapes) != 5 or kw.get("group1", 1) != 1 or kw.get("shuffle_groups1", 0) or kw.get("group") != m:
            return None
        dw = input_shapes[3]
        if dw is None or len(dw) != 4 or dw[1] != 1 or not all(weights(i, m) for i in (1, 2, 3, 4)):
            return None
        return ChannelRule(("whole", "split", "split", "split", "split"), "group", (m, m), m)
    return None


def _gemm_rule(
    kw: dict[str, Any], input_shapes: list[Shape | None], out: Shape, constant: list[bool]
) -> ChannelRule | None:
    """A fully connected layer (the heads of AlexNet, VGG, MobileNet): halves of its output
    columns, each from its half of the constant weights (row or column halves by transB) and
    of the bias."""
    if kw.get("transA", 0) or len(input_shapes) < 2 or not constant[1] or input_shapes[1] is None:
        return None
    n = out[1]
    b = input_shapes[1]
    if len(b) != 2 or b[0 if kw.get("transB", 0) else 1] != n:
        return None
    reads = ["whole", "split" if kw.get("transB", 0) else "channels"]
    if len(input_shapes) > 2 and input_shapes[2] is not None:
        c = input_shapes[2]
        if c[-1:] != (n,) or (len(c) == 2 and c[0] != 1) or len(c) > 2:
            return None  # a bias per row too, or a scalar: left whole
        reads.append("split" if len(c) == 1 else "channels")
    return ChannelRule(tuple(reads))


def extent(rule: Rule, shape: Shape) -> int:
    """What a rule halves in an output of ``shape``: its rows (axis -2: an image's rows, a
    sequence's tokens) or its channels."""
    return shape[-2] if isinstance(rule, RowRule) else shape[1]


def halves(size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Output rows (or channels) of this process (the first half) and of the helper."""
    mid = size // 2
    return (0, mid), (mid, size)
