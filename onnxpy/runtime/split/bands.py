"""Running one band of a step: the same code in this process and in the helper."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ...planner.plan import ExecutionPlan, Step
from .geometry import RowRule, window_at, window_rows
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
        self._kernels: dict[tuple[int, int, int], tuple[Callable[..., Any], list[Any]]] = {}

    def run(self, step: Step, rule: RowRule, o0: int, o1: int) -> None:
        """Compute output rows [o0, o1) of ``step`` into the outputs' slots."""
        key = (step.index, o0, o1)
        bound = self._kernels.get(key)
        if bound is None:
            bound = self._kernels[key] = self._bind(step, rule, o0, o1)
        fn, args = bound
        result = fn(*args)
        if result.__class__ is tuple:
            for vid, r in zip(step.outputs, result):
                self.views[vid][:, :, o0:o1] = r
        else:
            self.views[step.outputs[0]][:, :, o0:o1] = result

    def _bind(self, step: Step, rule: RowRule, o0: int, o1: int) -> tuple[Callable[..., Any], list[Any]]:
        """The kernel with the band's pads and the band's input arrays (views of the arena,
        which stay valid from run to run: only their contents change)."""
        fn = step.fn
        args: list[Any] = []
        pads = list(rule.pads)
        for pos, vid in enumerate(step.inputs):
            value = self.views[vid]
            kind = rule.reads[pos]
            if kind == "whole" or value is None:
                args.append(value)
            elif kind == "rows":
                args.append(value[..., o0:o1, :])
            else:
                window = window_at(rule, pos)
                i0, i1, top, bottom = window_rows(window, o0, o1, value.shape[2])
                args.append(value[:, :, i0:i1])
                pads[window.pad_index] = top
                pads[window.pad_index + 2] = bottom
        if rule.windows:
            assert isinstance(fn, functools.partial)
            keywords = dict(fn.keywords)
            keywords["pads"] = pads
            if "auto_pad" in keywords:
                keywords["auto_pad"] = "NOTSET"
            fn = functools.partial(fn.func, *fn.args, **keywords)
        return fn, args
