"""Executor observers: profiling, per-node debug printing, NaN/Inf detection.

The executor calls ``before(plan, step, values)`` and ``after(plan, step, token, values)``
around each step only when an observer is installed, so none of this costs anything on the
normal path.

Debug levels (``ONNXPY_DEBUG`` or the session config entry ``session.debug_level``):

- 1: one line per node as it starts: ``[onnxpy] 3/22 Conv 'conv1'``;
- 2: also each input before the node runs and each output after it, with dtype, shape and
  min / max / mean, and the node's time.

``session.check_nan_inf`` = ``'1'``: after each node, its floating-point outputs are checked and
the run stops with a RuntimeException naming the first node that produced a NaN or an Inf.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

import numpy as np

from ..api.errors import RuntimeException


def _host(v: Any) -> np.ndarray | None:
    if v is None or isinstance(v, list):
        return None
    if isinstance(v, np.ndarray):
        return v
    get = getattr(v, "get", None)  # CuPy arrays copy to the host with .get()
    return get() if callable(get) else np.asarray(v)


def _floats(a: np.ndarray) -> np.ndarray | None:
    """``a`` as a float array when it is numeric (ml_dtypes floats are kind 'V'), else None."""
    kind = a.dtype.kind
    if kind in "biuf":
        return a
    if kind == "c":
        return np.abs(a)
    if kind == "V":
        try:
            return a.astype(np.float32)
        except (TypeError, ValueError):
            return None
    return None


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc" or (a.dtype.kind == "V" and _floats(a) is not None)


def stats(v: Any) -> str:
    """``float32[1, 16] min=-1 max=2 mean=0.3`` (NaN-aware: counts NaN and Inf when present)."""
    if v is None:
        return "absent"
    if isinstance(v, list):
        return f"sequence of {len(v)}" + (f" (first: {stats(v[0])})" if v else "")
    a = _host(v)
    assert a is not None
    head = f"{a.dtype}{list(a.shape)}"
    if a.size == 0:
        return head + " empty"
    f = _floats(a)
    if f is None:
        return head
    if f.dtype.kind in "fc":
        finite = np.isfinite(f)
        if not finite.all():
            n_nan = int(np.isnan(f).sum())
            n_inf = int(f.size - finite.sum()) - n_nan
            ok = f[finite]
            rest = (
                f" min={ok.min():.6g} max={ok.max():.6g} mean={ok.astype(np.float64).mean():.6g} (finite values)"
                if ok.size
                else ""
            )
            return f"{head} NaN={n_nan} Inf={n_inf}{rest}"
    return f"{head} min={f.min():.6g} max={f.max():.6g} mean={f.astype(np.float64).mean():.6g}"


def _label(step: Any, total: int) -> str:
    name = f" '{step.node_name}'" if step.node_name else ""
    dom = f"{step.domain}." if step.domain else ""
    return f"{step.index + 1}/{total} {dom}{step.op_type}{name}"


class StepObserver:
    def __init__(
        self,
        profiler: Any,
        debug_level: int,
        check_nan_inf: bool,
        provider: str = "CPUExecutionProvider",
        out: TextIO | None = None,
    ) -> None:
        self.profiler = profiler
        self.debug_level = debug_level
        self.check_nan_inf = check_nan_inf
        self.provider = provider
        # Resolved at construction (once per run), so a redirected sys.stderr is honoured.
        self.out = out if out is not None else sys.stderr

    def _print(self, text: str) -> None:
        print(f"[onnxpy] {text}", file=self.out, flush=True)

    def before(self, plan: Any, step: Any, values: list[Any]) -> float:
        if self.debug_level >= 1:
            self._print(_label(step, len(plan.steps)))
            if self.debug_level >= 2:
                for i in step.inputs:
                    if i > 1:  # ids 0 and 1 are the absent-input / discarded-output slots
                        self._print(f"    in  {plan.value_names[i]}: {stats(values[i])}")
        return time.perf_counter()

    def after(self, plan: Any, step: Any, token: float, values: list[Any]) -> None:
        end = time.perf_counter()
        outputs = [values[i] for i in step.outputs if i > 1]
        if self.profiler is not None:
            inputs = [values[i] for i in step.inputs if i > 1]
            params = sum(
                int(getattr(values[i], "nbytes", 0) or 0) for i in step.inputs if i > 1 and i in plan.constants
            )
            self.profiler.node_event(step, token, end, inputs, outputs, self.provider, params)
        if self.debug_level >= 2:
            for i in step.outputs:
                if i > 1:
                    self._print(f"    out {plan.value_names[i]}: {stats(values[i])}")
            self._print(f"    {(end - token) * 1e3:.3f} ms")
        if self.check_nan_inf:
            for i in step.outputs:
                self._check(plan, step, i, values[i])

    def _check(self, plan: Any, step: Any, vid: int, v: Any) -> None:
        items = v if isinstance(v, list) else [v]
        for item in items:
            a = _host(item)
            if a is None or a.size == 0 or not _is_float(a):
                continue
            f = _floats(a)
            if f is None or np.isfinite(f).all():
                continue
            bad = "NaN" if np.isnan(f).any() else "Inf"
            raise RuntimeException(
                f"{step.describe} produced {bad} in output '{plan.value_names[vid]}' "
                f"({stats(item)}); session.check_nan_inf stopped the run at this node"
            )


def make_observer(profiler: Any, debug_level: int, check_nan_inf: bool) -> StepObserver:
    return StepObserver(profiler, debug_level, check_nan_inf)
