"""Running one band of a step: the same code in this process and in the helper."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ...ops._compat import reshaped_view
from ...planner.plan import ExecutionPlan, Step
from .geometry import FUSED, ChannelRule, RowRule, Rule, extent, halves, window_at, window_rows
from .schedule import Schedule, slot_view


class Bands:
    """One process's view of a schedule: the arena arrays of the shared values (constants for
    the rest) and the kernels bound with each band's pads, made once."""

    def __init__(self, plan: ExecutionPlan, schedule: Schedule, buf: Any, base: int) -> None:
        self.plan = plan
        self.schedule = schedule
        self.views: list[Any] = list(plan.template)
        for vid, slot in schedule.slots.items():
            self.views[vid] = slot_view(buf, base, slot)
        self._kernels: dict[tuple[int, int], tuple[Callable[..., Any], list[Any], list[Any]]] = {}
        # per (step, part): the input band the output is written into (an in-place step)
        self._in_place: dict[tuple[int, int], Any] = {}

    def run(self, step: Step, rule: Rule, part: int) -> None:
        """Compute ``part`` (0: this process's, 1: the helper's) of ``step`` into the outputs'
        slots."""
        key = (step.index, part)
        bound = self._kernels.get(key)
        if bound is None:
            bound = self._kernels[key] = self._bind(step, rule, part)
        fn, args, outs = bound
        if outs[0] is self._in_place.get(key):
            result = fn(*args, out=outs[0])
            if result is not outs[0]:
                outs[0][...] = result
            return
        result = fn(*args)
        if result.__class__ is tuple:
            for out, r in zip(outs, result):
                out[...] = r
        elif result is not outs[0]:  # not written into the slot by the kernel itself
            outs[0][...] = result

    def _bind(self, step: Step, rule: Rule, part: int) -> tuple[Callable[..., Any], list[Any], list[Any]]:
        """The kernel with the band's keywords, the band's input arrays and the band's part of
        each output (views of the arena, valid from run to run: only their contents change)."""
        first = self.views[step.outputs[0]]
        a, b = halves(extent(rule, first.shape))[part]
        if isinstance(rule, ChannelRule):
            return self._bind_channels(step, rule, a, b)
        fn = step.fn
        args: list[Any] = []
        pads = list(rule.pads)
        for pos, vid in enumerate(step.inputs):
            value = self.views[vid]
            kind = rule.reads[pos]
            if kind == "whole" or value is None:
                args.append(value)
            elif kind == "rows":
                args.append(value[..., a:b, :])
            else:
                window = window_at(rule, pos)
                i0, i1, top, bottom = window_rows(window, a, b, value.shape[2])
                args.append(value[:, :, i0:i1])
                pads[window.pad_index] = top
                pads[window.pad_index + 2] = bottom
        if rule.windows:
            fn = _with_keywords(fn, pads=pads, auto_pad="NOTSET")
        if (step.domain, step.op_type) == (FUSED, "Attention"):
            fn = _band_of_queries(fn, first.shape[-2], b - a)
        action = self.schedule.actions[step.index]
        outs = [self.views[vid][..., a:b, :] for vid in step.outputs]
        if action.inplace < 0 and _writes_into(step, rule, outs):
            # the kernel's GEMM writes the band straight into its slot (no copy afterwards)
            return _with_keywords(fn, into=outs[0]), args, outs
        if action.inplace >= 0:
            # the output's slot is this input's: its band is the output band, the same object
            # (kernels check ``out is Z`` before adding into it)
            self._in_place[(step.index, part)] = args[action.inplace]
            return fn, args, [args[action.inplace]]
        return fn, args, outs

    def _bind_channels(
        self, step: Step, rule: ChannelRule, m0: int, m1: int
    ) -> tuple[Callable[..., Any], list[Any], list[Any]]:
        args: list[Any] = []
        for pos, vid in enumerate(step.inputs):
            value = self.views[vid]
            kind = rule.reads[pos]
            if kind == "whole" or value is None:
                args.append(value)
            elif kind == "split":
                args.append(value[m0:m1])
            elif kind == "in_channels":
                c, m = rule.ratio
                args.append(value[:, m0 * c // m : m1 * c // m])
            else:
                args.append(value[:, m0:m1])
        fn = step.fn
        if rule.group_keyword:
            fn = _with_keywords(fn, **{rule.group_keyword: rule.groups * (m1 - m0) // rule.ratio[1]})
        out = self.views[step.outputs[0]]
        if rule.shuffle:
            g = rule.shuffle
            per = out.shape[1] // g  # output channels per group
            # the band's unshuffled channel a * per + j (its groups a) goes to j * g + a
            where = np.array([j * g + a for a in range(m0 // per, m1 // per) for j in range(per)])
            kernel = _with_keywords(fn, shuffle_groups=0)

            def shuffled(*inputs: Any) -> Any:
                out[:, where] = kernel(*inputs)
                return out  # written: run() copies nothing more

            return shuffled, args, [out]
        return fn, args, [out[:, m0:m1]]


#: kernels that take conv_nd's ``into`` (ops/conv.py, ops/fused.py)
_INTO_KERNELS = {("", "Conv"), (FUSED, "FusedConv")}


def _writes_into(step: Step, rule: RowRule, outs: list[Any]) -> bool:
    """Whether ``step``'s kernel can write its band into ``outs[0]``: a plain or fused
    convolution without a residual, whose band of an NCHW slot flattens to (N, M, rows x W)
    without a copy, as conv_nd's GEMMs need."""
    if (step.domain, step.op_type) not in _INTO_KERNELS or len(outs) != 1 or "rows" in rule.reads[1:]:
        return False
    band = outs[0]
    n, m, h, w = band.shape
    # None where the band's rows and columns do not merge
    return reshaped_view(band, (n, m, h * w)) is not None and band.strides[3] == band.itemsize


def _band_of_queries(fn: Callable[..., Any], rows: int, band: int) -> Callable[..., Any]:
    """Attention over a band of ``band`` of its ``rows`` queries: the query's head shape (its
    Reshape target, by the exporter's rules) names the token count where it does not leave it
    to 0 or -1; the band's count goes there instead."""

    def attention(query: Any, key: Any, value: Any, query_shape: Any, *rest: Any) -> Any:
        dims = np.array(query_shape, dtype=np.int64)  # a copy: the value may be key_shape too
        if dims.ndim == 1 and len(dims) == 4 and dims[1] == rows:
            dims[1] = band
        return fn(query, key, value, dims, *rest)

    return attention


def _with_keywords(fn: Any, **changes: Any) -> Any:
    """``fn`` (a bound kernel: a functools.partial) with some keywords changed; ``auto_pad``
    only where the kernel had it."""
    assert isinstance(fn, functools.partial)
    keywords = dict(fn.keywords)
    for key, value in changes.items():
        if key != "auto_pad" or key in keywords:
            keywords[key] = value
    return functools.partial(fn.func, *fn.args, **keywords)
