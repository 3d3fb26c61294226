"""Which plan steps can run as two bands of output rows, and which input rows a band reads.

A band of a step is its output rows [o0, o1) of every image. Two kinds of steps have them:

- window steps (convolutions, pools): input 0 is read through the kernel window, so a band
  reads input rows [o0 s - p, (o1 - 1) s - p + (k - 1) d + 1), clamped to the input, with the
  band's own top and bottom pads (the image's pads where the band touches its border, none
  inside). Any other input with the output's rows (a fused residual) is read at [o0, o1).
- position steps (activations, channel-wise ops, concatenation over channels): every input
  with the output's rows is read at [o0, o1); the rest (weights, broadcast operands) whole.

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
}

POSITION_OPS = {
    ("", "Relu"),
    ("", "LeakyRelu"),
    ("", "Sigmoid"),
    ("", "Tanh"),
    ("", "Clip"),
    ("", "HardSigmoid"),
    ("", "HardSwish"),
    ("", "Add"),
    ("", "Sub"),
    ("", "Mul"),
    ("", "Div"),
    ("", "LRN"),
    ("", "BatchNormalization"),
    ("", "Concat"),
    (FUSED, "ChannelAffine"),
    (FUSED, "ChannelMax"),
}

#: fewer output rows than this and a step runs whole in one process: halves of a small map
#: cost more in calls and halo rows than they save
MIN_ROWS = 8

Shape = tuple[int, ...]


@dataclass(frozen=True)
class RowRule:
    """How a step's band reads its inputs. ``window`` is None for a position step."""

    #: per input: "window" (input 0 of a window step), "rows" (read at the output's rows),
    #: "whole" (weights, broadcast operands)
    reads: tuple[str, ...]
    #: (kernel rows, stride, dilation, top pad, bottom pad) of a window step
    window: tuple[int, int, int, int, int] | None = None
    #: the step's 2-D pads [top, left, bottom, right]; a band replaces top and bottom
    pads: tuple[int, int, int, int] | None = None


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
    if not output_shapes or any(s is None or len(s) != 4 for s in output_shapes):
        return None
    rows = output_shapes[0][2]
    if rows < MIN_ROWS or any(s[2] != rows for s in output_shapes):  # type: ignore[index]
        return None
    if len(output_shapes) > 1 and op != (FUSED, "SiblingConv"):
        return None  # e.g. MaxPool's indices: positions in the whole input, not a band
    if op in WINDOW_OPS:
        return _window_rule(kernel, input_shapes, output_shapes[0], constant)
    if op in POSITION_OPS:
        if op == ("", "Concat") and not _concat_over_channels(kernel):
            return None
        reads = []
        for shape in input_shapes:
            kind = _position_read(shape, rows)
            if kind is None:
                return None
            reads.append(kind)
        return RowRule(tuple(reads))
    return None


def _concat_over_channels(kernel: Any) -> bool:
    kw = getattr(kernel, "keywords", None) or {}
    return kw.get("axis") in (1, -3)


def _position_read(shape: Shape | None, rows: int) -> str | None:
    """How a position step reads an input of this shape: by rows (rows on axis -2, as numpy
    broadcasting aligns them), whole (absent, or broadcast along the rows), or not at all."""
    if shape is None or len(shape) < 2 or shape[-2] == 1:
        return "whole"
    if shape[-2] == rows:
        return "rows"
    return None


def _window_rule(kernel: Any, input_shapes: list[Shape | None], out: Shape, constant: list[bool]) -> RowRule | None:
    rows = out[2]
    if not isinstance(kernel, functools.partial) or not input_shapes or input_shapes[0] is None:
        return None
    kw = kernel.keywords
    if kw.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or kw.get("ceil_mode", 0):
        return None
    k = kw.get("kernel_shape")
    x = input_shapes[0]
    if k is None or len(k) != 2 or len(x) != 4:
        return None
    strides = kw.get("strides") or [1, 1]
    dilations = kw.get("dilations") or [1, 1]
    pads = kw.get("pads") or [0, 0, 0, 0]
    if kw.get("auto_pad", "NOTSET") == "VALID":
        pads = [0, 0, 0, 0]
    if len(strides) != 2 or len(dilations) != 2 or len(pads) != 4:
        return None
    top, bottom = int(pads[0]), int(pads[2])
    kh, s, d = int(k[0]), int(strides[0]), int(dilations[0])
    if (x[2] + top + bottom - (kh - 1) * d - 1) // s + 1 != rows:
        return None  # not the geometry this rule assumes: leave the step whole
    reads = ["window"]
    if constant[0]:
        return None
    for shape, const in zip(input_shapes[1:], constant[1:]):
        # weights and biases whole; a fused residual (FusedConv's Z) at the output's rows
        if const or shape is None or len(shape) != 4:
            reads.append("whole")
        elif shape == out:  # the residual has the output's shape exactly
            reads.append("rows")
        else:
            return None
    return RowRule(tuple(reads), (kh, s, d, top, bottom), (top, int(pads[1]), bottom, int(pads[3])))


def window_rows(rule: RowRule, o0: int, o1: int, height: int) -> tuple[int, int, int, int]:
    """Input rows [i0, i1) that output rows [o0, o1) of a window step read from an input of
    ``height`` rows, and the band's top and bottom pads."""
    assert rule.window is not None
    kh, s, d, top, _ = rule.window
    first = o0 * s - top
    last = (o1 - 1) * s - top + (kh - 1) * d + 1
    i0, i1 = max(first, 0), min(last, height)
    return i0, i1, i0 - first, last - i1


def read_rows(rule: RowRule, position: int, o0: int, o1: int, height: int) -> tuple[int, int] | None:
    """Rows of input ``position`` that output rows [o0, o1) read; None for a whole read."""
    kind = rule.reads[position]
    if kind == "whole":
        return None
    if kind == "rows":
        return o0, o1
    i0, i1, _, _ = window_rows(rule, o0, o1, height)
    return i0, i1


def halves(rows: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Output rows of this process (the top half) and of the helper."""
    mid = rows // 2
    return (0, mid), (mid, rows)
