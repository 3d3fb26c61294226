"""The executor: interprets an ExecutionPlan. No per-run state lives anywhere but here."""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..api.errors import EngineError, Fail, OnnxpyError, RuntimeException
from ..ops._compat import broadcasts_into
from ..planner.plan import ExecutionPlan, Step

# An observer sees each step: before(plan, step, values) -> token, after(plan, step, token, values).
Observer = Any


class RunTerminated(Fail, EngineError):
    """RunOptions.terminate seen between steps: onnxruntime's class for it is Fail, whether
    the flag was set before the run or during it."""


#: the terminate check of the run in progress on this thread, for the subgraphs its control-flow
#: steps run (a Loop body polls it between its own steps, as the outer graph does)
_TERMINATE: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("onnxpy_terminate", default=None)


def current_terminate() -> Callable[[], bool] | None:
    """The terminate check of the run this thread is executing (None outside one or without)."""
    return _TERMINATE.get()


def execute(
    plan: ExecutionPlan,
    feeds: dict[int, Any],
    fetch_ids: list[int] | None = None,
    terminate: Callable[[], bool] | None = None,
    observer: Observer | None = None,
) -> list[Any]:
    """Run every step of ``plan`` and return the fetched values.

    ``feeds`` maps value ids to arrays already on the provider's device. ``terminate`` is
    polled between steps (RunOptions.terminate). ``observer`` (profiling, debugging) wraps
    each step; without one the loop does nothing but call kernels.
    """
    values = plan.template.copy()
    for i, v in feeds.items():
        values[i] = v
    if terminate is None and observer is None:
        # The hot loop: the common case of a single-output step is inlined.
        for step in plan.steps:
            if step.single_output and step.inplace_input < 0:
                args = [values[i] for i in step.inputs]
                try:
                    result = step.fn(*args)
                except Exception as e:  # noqa: BLE001 - reported naming the node
                    _raise_for(step, args, e, values)
                values[step.outputs[0]] = result[0] if result.__class__ is tuple else result
            else:
                # Drop this loop's references to the previous step's arrays: an in-place step
                # checks that nothing but the run holds its target buffer.
                args = result = None
                _run_step(step, values)
            for i in step.release:
                values[i] = None
    else:
        scope = _TERMINATE.set(terminate) if terminate is not None else None
        try:
            for step in plan.steps:
                if terminate is not None and terminate():
                    raise RunTerminated(f"Exiting due to terminate flag being set to true (before {step.describe})")
                token = observer.before(plan, step, values) if observer is not None else None
                _run_step(step, values)
                if observer is not None:
                    observer.after(plan, step, token, values)
                for i in step.release:
                    values[i] = None
        finally:
            if scope is not None:
                _TERMINATE.reset(scope)
    ids = plan.fetch_ids if fetch_ids is None else fetch_ids
    return [values[i] for i in ids]


def _raise_for(step: Step, args: list[Any], e: Exception, values: list[Any] | None = None) -> None:
    """Re-raise a kernel's exception as an onnxpy error naming the node and its input shapes.

    The run is over: ``values`` (every live intermediate) and the step's ``args`` are emptied
    first, since the raised exception's traceback keeps the run's frames, and with them those
    lists, alive for as long as the caller keeps the exception (a retry list, a REPL's last
    error). The kernel's own frames stay, for post-mortem debugging: they hold one step's
    temporaries."""
    message = f"{step.describe}: {e}"
    if not isinstance(e, OnnxpyError):
        message = (
            f"Non-zero status code returned while running {step.op_type} node. Name:'{step.node_name}' "
            f"Status Message: {step.describe} failed: {type(e).__name__}: {e} (input shapes: {_shapes(args)})"
        )
    if values is not None:
        values.clear()
        args.clear()
    if isinstance(e, OnnxpyError):
        if step.describe in str(e):
            raise e
        raise type(e)(message) from e
    raise RuntimeException(message) from e


def _refs(args: list[Any], pos: int) -> int:
    arr = args[pos]
    return sys.getrefcount(arr)


def _baseline_refs() -> int:
    """What ``_refs`` reports for an array referenced only by a value slot and an argument
    list, as in a run; measured rather than assumed, since interpreters count differently."""
    values: list[Any] = [np.empty(1)]
    args = [values[0]]
    return _refs(args, 0)


_SOLE_OWNER_REFS = _baseline_refs()


def _base_refs() -> int:
    """What sys.getrefcount reports for the buffer under a reshaped result that nothing else
    holds: referenced only by the view's ``base``."""
    view = np.empty(4).reshape(2, 2)
    base = view.base  # a local name, as in _owns_memory
    return sys.getrefcount(base)


_PRIVATE_BASE_REFS = _base_refs()


def _owns_memory(arr: np.ndarray) -> bool:
    """``arr`` owns its memory, or is the only view of a private buffer of its own size (a
    kernel's result reshaped, as GEMM results are): writing it touches nothing else."""
    if arr.flags.owndata:
        return True
    base = arr.base
    return (
        base.__class__ is np.ndarray
        and base.flags.owndata
        and base.nbytes == arr.nbytes
        and arr.flags.c_contiguous
        and sys.getrefcount(base) <= _PRIVATE_BASE_REFS
    )


def _inplace_target(step: Step, args: list[Any]) -> Any:
    """The input buffer the step may write its output into, or None: a host array that owns
    its memory (or is the sole view of a private buffer), is writable, is referenced by nothing
    else (a view made by an earlier kernel would hold a reference to it), and has the output's
    shape and dtype (every other input broadcasts to it and shares its dtype; kernels that check
    the buffer themselves, ``inplace_any_shape``, skip that test)."""
    pos = step.inplace_input
    if _refs(args, pos) > _SOLE_OWNER_REFS:  # before binding a local name, as when calibrated
        return None
    arr = args[pos]
    if arr.__class__ is not np.ndarray or not arr.flags.writeable or not _owns_memory(arr):
        return None
    if step.inplace_any_shape:
        return arr
    shape, dtype = arr.shape, arr.dtype
    for a in args:
        if a is arr:
            continue
        if a.__class__ is not np.ndarray or a.dtype != dtype:
            return None
        if a.shape != shape and not broadcasts_into(a.shape, shape):
            return None
    return arr


def _run_step(step: Step, values: list[Any]) -> None:
    args = [values[i] for i in step.inputs]
    if step.inplace_input >= 0:
        target = _inplace_target(step, args)
        if target is not None:
            try:
                result = step.fn(*args, out=target)
            except Exception as e:  # noqa: BLE001 - reported naming the node
                _raise_for(step, args, e, values)
            values[step.outputs[0]] = result
            return
    try:
        result = step.fn(*args)
    except Exception as e:  # noqa: BLE001 - a kernel failure is reported naming the node
        _raise_for(step, args, e, values)
    # Kernels of ops with optional outputs return a tuple; a tuple is never a value itself.
    if step.single_output:
        values[step.outputs[0]] = result[0] if result.__class__ is tuple else result
    else:
        if result.__class__ is not tuple or len(result) < len(step.outputs):
            got = f"{len(result)} outputs" if isinstance(result, tuple) else type(result).__name__
            raise RuntimeException(f"{step.describe}: kernel returned {got}, expected {len(step.outputs)} outputs")
        for i, r in zip(step.outputs, result):
            values[i] = r


def _shapes(args: list[Any]) -> str:
    out = []
    for a in args:
        if a is None:
            out.append("absent")
        elif hasattr(a, "shape"):
            out.append(f"{getattr(a, 'dtype', '?')}{list(a.shape)}")
        elif isinstance(a, list):
            out.append(f"sequence[{len(a)}]")
        else:
            out.append(type(a).__name__)
    return ", ".join(out)
