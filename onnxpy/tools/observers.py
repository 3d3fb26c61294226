"""Executor observers: profiling, per-node debug printing, NaN/Inf detection.

The executor calls ``before(step, values)`` and ``after(step, token, values)`` around each step
only when an observer is installed, so none of this costs anything on the normal path.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from ..api.errors import RuntimeException


def _host(v: Any) -> np.ndarray | None:
    if v is None or isinstance(v, list):
        return None
    if isinstance(v, np.ndarray):
        return v
    get = getattr(v, "get", None)  # CuPy
    return get() if callable(get) else np.asarray(v)


def _stats(v: Any) -> str:
    if v is None:
        return "absent"
    if isinstance(v, list):
        return f"sequence of {len(v)}"
    a = _host(v)
    assert a is not None
    head = f"{a.dtype}{list(a.shape)}"
    if a.size == 0 or a.dtype.kind not in "biuf":
        return head
    f = a.astype(np.float64, copy=False)
    return f"{head} min={f.min():.6g} max={f.max():.6g} mean={f.mean():.6g}"


class StepObserver:
    def __init__(
        self, profiler: Any, debug_level: int, check_nan_inf: bool, provider: str = "CPUExecutionProvider"
    ) -> None:
        self.profiler = profiler
        self.debug_level = debug_level
        self.check_nan_inf = check_nan_inf
        self.provider = provider
        self.out = sys.stderr

    def before(self, plan: Any, step: Any, values: list[Any]) -> float:
        if self.debug_level >= 1:
            print(f"[onnxpy] step {step.index}: {step.describe}", file=self.out)
            if self.debug_level >= 2:
                for i in step.inputs:
                    print(f"[onnxpy]   in  {plan.value_names[i]}: {_stats(values[i])}", file=self.out)
        return time.perf_counter()

    def after(self, plan: Any, step: Any, token: float, values: list[Any]) -> None:
        end = time.perf_counter()
        outputs = [values[i] for i in step.outputs]
        if self.profiler is not None:
            inputs = [values[i] for i in step.inputs]
            self.profiler.node_event(step, token, end, inputs, outputs, self.provider)
        if self.debug_level >= 2:
            for i in step.outputs:
                print(f"[onnxpy]   out {plan.value_names[i]}: {_stats(values[i])}", file=self.out)
        if self.check_nan_inf:
            for v in outputs:
                a = _host(v)
                if a is not None and a.dtype.kind in "fc" and a.size and not np.isfinite(a).all():
                    bad = "NaN" if np.isnan(a).any() else "Inf"
                    raise RuntimeException(f"{step.describe} produced {bad} (output {_stats(v)})")


def make_observer(profiler: Any, debug_level: int, check_nan_inf: bool) -> StepObserver:
    return StepObserver(profiler, debug_level, check_nan_inf)
