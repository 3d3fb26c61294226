"""Row-split runs of a plan, session side.

The first run with a new input signature runs the plan as usual, traced: the shapes and
layouts every step saw make the schedule (``schedule.py``). Later runs with that signature
run split: this process walks the plan, computing the top half of each band step's rows and
every other step whole; the helper process (``helper.py``) computes the bottom halves. OpenBLAS
runs one thread in each process meanwhile (two processes, two cores).

Anything wrong with the helper (it died, failed, or stopped answering) turns the feature off
for the session and the run is redone in one process, so a caller sees the same results and
errors either way.
"""

from __future__ import annotations

import logging
import mmap
import os
import platform
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...planner.plan import ExecutionPlan
from .. import logs
from ..executor import _run_step, execute
from ..threads import blas_threads, other_threads_running
from . import helper
from .bands import Bands
from .schedule import Schedule, Traced, build_schedule

#: the session config key that turns row-split runs on: "1" where they measure faster than
#: plain runs (per input signature), "always" for every run
CONFIG_KEY = "session.split_processes"


#: input signatures whose schedules are kept (the helper holds a copy of each); at a new one
#: beyond these, the runner starts afresh (a new helper, schedules traced again)
MAX_SIGNATURES = 32


def supported() -> str | None:
    """Why row-split runs cannot work here, or None when they can: they need fork (Linux),
    x86-64's ordering of stores (a counter is seen after the data written before it), and a
    second core."""
    if not hasattr(os, "fork") or platform.system() != "Linux":
        return "it needs Linux's fork"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"its barriers rely on x86-64's store ordering, not {platform.machine()}'s"
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    if cores < 2:
        return "this process may use only one core"
    return None


#: "1" times the first runs of an input signature in blocks of plain and split runs, in this
#: order, and compares the medians: two rounds, so that one slow phase of the machine does not
#: decide (on a 2-core VM it can slow everything by 20% for seconds)
CALIBRATION_BLOCKS = ("plain", "split", "plain", "split")
#: runs per block; the first of each is not timed (a split block's first runs after the fork
#: also pay for copy-on-write page faults and the bands' first calls)
BLOCK_RUNS = 5
BLOCK_WARMUP = 1
#: split runs starting sooner than this after a plain run are not timed (OpenBLAS's idle
#: threads spin 50-100 ms after their last work)
SETTLE_S = 0.2
#: split runs are kept unless their median is this much above the plain runs': in steady state
#: they beat plain runs on 10 of 11 CNNs here (three benchmark runs each way; DenseNet, 20%
#: slower, is the exception), and calibration's split runs, the first after the fork, come
#: out a little slow
KEEP_BELOW = 1.05


@dataclass
class _Choice:
    """What runs with one input signature: its schedule (None: no step splits) and, once the
    calibration runs have timed both ways, whether split runs are faster."""

    schedule: Schedule | None
    split: bool | None = None
    split_s: list[float] = field(default_factory=list)
    plain_s: list[float] = field(default_factory=list)
    #: when the last plain calibration run ended (perf_counter)
    plain_end: float = 0.0
    #: the calibration block now running, and its runs so far (timed or not)
    block: int = 0
    in_block: int = 0


class SplitRunner:
    def __init__(self, plan: ExecutionPlan | None, always: bool = False, severity: int = -1) -> None:
        """``always``: every run after the traced one is split (no calibration). ``severity``:
        the session's log severity, for this runner's messages (runtime/logs.py)."""
        self.always = always
        self.severity = severity
        self.reset(plan)
        # One split run at a time: a run from a second thread meanwhile goes the plain way.
        self._busy = threading.Lock()

    def serve(self, plan: ExecutionPlan) -> None:
        """Serve ``plan`` from now on, if it is not the one served already: a split run of the old
        plan on another thread (set_providers meanwhile) finishes first, since closing its
        helper under it would turn split runs off for good."""
        if self.plan is plan:
            return
        with self._busy:
            if self.plan is not plan:
                self.close()
                self.reset(plan)

    def reset(self, plan: ExecutionPlan | None) -> None:
        """Serve ``plan`` from now on (no helper yet: it is forked at the first split run)."""
        self.plan = plan
        self.choices: dict[tuple[Any, ...], _Choice] = {}
        self._ids: dict[int, int] = {}  # id(schedule) -> number the helper knows it by
        self._bands: dict[int, Bands] = {}
        self.disabled = False
        self._pid = 0
        self._owner = 0  # the process that forked the helper
        self._fd = -1
        self._arena: mmap.mmap | None = None
        self._control: memoryview | None = None
        self._sent: set[int] = set()
        self._told_threads = False

    def run(self, feeds: dict[int, np.ndarray]) -> list[Any] | None:
        """The fetched values of a run, or None when this run is left to the plain executor."""
        if self.disabled or not self._busy.acquire(blocking=False):
            return None
        try:
            return self._run(feeds)
        finally:
            self._busy.release()

    @property
    def schedules(self) -> dict[tuple[Any, ...], Schedule | None]:
        return {k: c.schedule for k, c in self.choices.items()}

    def _run(self, feeds: dict[int, np.ndarray]) -> list[Any] | None:
        signature = tuple((i, a.shape, a.dtype.str) for i, a in feeds.items())
        choice = self.choices.get(signature)
        if choice is None:
            if len(self.choices) >= MAX_SIGNATURES:
                # Input shapes keep changing: start afresh rather than keep a schedule, its bands
                # and the helper's copy of it for every shape ever seen.
                self.close()
                self.choices.clear()
                self._ids.clear()
            out, schedule = self._traced(feeds)
            self.choices[signature] = _Choice(schedule, True if self.always and schedule else None)
            return out
        if choice.schedule is None or choice.split is False:
            return None
        if choice.split:
            return self._split(choice.schedule, feeds)
        # Calibrating, in blocks (CALIBRATION_BLOCKS). Not in turn: after a plain run OpenBLAS's
        # second thread spins for a while, and a split run beside it is twice as slow
        # (MobileNet-v2: 27 against 13 ms), which is not what later split runs see.
        assert self.plan is not None
        started = time.perf_counter()
        timed = choice.in_block >= BLOCK_WARMUP
        if CALIBRATION_BLOCKS[choice.block] == "plain":
            out: list[Any] | None = execute(self.plan, feeds)
            choice.plain_end = time.perf_counter()
            if timed:
                choice.plain_s.append(choice.plain_end - started)
            choice.in_block += 1
        else:
            out = self._split(choice.schedule, feeds)
            if out is None:
                return None
            if started - choice.plain_end > SETTLE_S:  # runs inside the settling time don't count
                if timed:
                    choice.split_s.append(time.perf_counter() - started)
                choice.in_block += 1
        if choice.in_block >= BLOCK_RUNS:
            choice.block, choice.in_block = choice.block + 1, 0
            if choice.block == len(CALIBRATION_BLOCKS):
                self._decide(choice)
        return out

    def _decide(self, choice: _Choice) -> None:
        split, plain = float(np.median(choice.split_s)), float(np.median(choice.plain_s))
        choice.split = split <= KEEP_BELOW * plain
        logs.emit(
            self.severity,
            logging.INFO,
            "split runs %.2f ms against %.2f ms plain: %s",
            split * 1e3,
            plain * 1e3,
            "split from now on" if choice.split else "plain from now on",
        )
        if not any(c.split is not False and c.schedule for c in self.choices.values()):
            self.close()  # no signature left to split: the helper and arena go

    def _split(self, schedule: Schedule, feeds: dict[int, np.ndarray]) -> list[Any] | None:
        if self._needs_fork(schedule) and other_threads_running():
            # Forking while another thread may be inside OpenBLAS deadlocks: OpenBLAS's fork
            # handler waits for its server thread, the forking thread holds the GIL (seen with
            # three threads running sessions beside a split one). Plain runs until this thread
            # is the process's only running one (run_async's parked workers aside); the split
            # is tried again at each run.
            if not self._told_threads:
                self._told_threads = True
                logs.emit(
                    self.severity,
                    logging.INFO,
                    "row-split runs wait: the helper process is forked only while no other thread runs",
                )
            return None
        try:
            self._ready(schedule)
        except Exception as e:  # noqa: BLE001 - no helper, no split: the run goes the plain way
            self._give_up(f"the helper process could not start ({type(e).__name__}: {e})")
            return None
        try:
            with blas_threads(1):
                return self._run_split(schedule, feeds)
        except helper.HelperLost as e:
            self._give_up(str(e))
            return None
        except Exception as e:  # noqa: BLE001 - the plain run reports a real error properly
            self._give_up(f"a split run failed ({type(e).__name__}: {e})")
            return None
        except BaseException:
            self.close()  # interrupted mid-run: the helper may wait at a barrier; a new one next time
            raise

    # -- tracing -------------------------------------------------------------------------------

    def _traced(self, feeds: dict[int, np.ndarray]) -> tuple[list[Any], Schedule | None]:
        values: dict[int, Traced] = {}
        steps: dict[int, tuple[list[Any], list[Any]]] = {}
        for vid, a in feeds.items():
            values[vid] = _traced(a)

        class Observer:
            def before(self, plan: ExecutionPlan, step: Any, vals: list[Any]) -> Any:
                return [getattr(vals[i], "shape", None) for i in step.inputs]

            def after(self, plan: ExecutionPlan, step: Any, token: Any, vals: list[Any]) -> None:
                outs = []
                for i in step.outputs:
                    v = vals[i]
                    if isinstance(v, np.ndarray):
                        values[i] = _traced(v)
                        outs.append(v.shape)
                    else:
                        outs.append(None)
                steps[step.index] = (token, outs)

        out = execute(self.plan, feeds, observer=Observer())
        schedule = build_schedule(self.plan, values, steps, set(feeds))
        if schedule is not None:
            logs.emit(
                self.severity,
                logging.INFO,
                "split schedule: %d of %d steps in row halves",
                schedule.banded,
                len(self.plan.steps),
            )
        return out, schedule

    # -- the helper ----------------------------------------------------------------------------

    def _needs_fork(self, schedule: Schedule) -> bool:
        """Whether ``_ready`` would fork a helper for ``schedule``."""
        need = helper.CONTROL_BYTES + schedule.size
        return not self._pid or self._owner != os.getpid() or self._arena is None or len(self._arena) < need

    def _ready(self, schedule: Schedule) -> None:
        """A live helper over an arena large enough for ``schedule``, which knows it."""
        need = helper.CONTROL_BYTES + schedule.size
        if self._pid and (self._owner != os.getpid() or self._arena is None or len(self._arena) < need):
            self.close()  # in a forked copy of the session's process: its own helper, anew
        if not self._pid:
            sizes = [helper.CONTROL_BYTES + c.schedule.size for c in self.choices.values() if c.schedule]
            size = max([need, *sizes])
            self._arena = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
            self._control = memoryview(self._arena).cast("q")
            self._bands.clear()
            self._sent.clear()
            self._pid, self._fd = helper.start(self.plan, self._arena)
            self._owner = os.getpid()
        sid = self._ids.setdefault(id(schedule), len(self._ids))
        if sid not in self._sent:
            helper.send(self._fd, ("schedule", sid, schedule))
            self._sent.add(sid)
            self._bands[sid] = Bands(self.plan, schedule, self._arena, helper.CONTROL_BYTES)

    def _check(self) -> Any:
        control, pid = self._control, self._pid
        started = [0.0]

        def check(spins: int) -> None:
            assert control is not None
            if control[helper.HELPER_FAILED]:
                raise helper.HelperLost("the helper process failed")
            if spins == 1024:
                started[0] = time.monotonic()
            elif spins & 0xFFFF == 0:
                if os.waitpid(pid, os.WNOHANG) != (0, 0):
                    self._pid = 0  # reaped
                    raise helper.HelperLost("the helper process died")
                if time.monotonic() - started[0] > helper.WAIT_LIMIT_S:
                    raise helper.HelperLost(f"the helper process did not answer for {helper.WAIT_LIMIT_S:.0f} s")

        return check

    def _give_up(self, why: str) -> None:
        logs.emit(self.severity, logging.WARNING, "onnxpy: row-split runs are off for this session: %s", why)
        self.disabled = True
        self.close()

    def close(self) -> None:
        """Stop the helper (it holds nothing but copies and the shared arena)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._pid and self._owner != os.getpid():
            # A process forked from the session's (the caller's multiprocessing, say) holds a
            # copy of this runner: the helper is its parent's, not its own to stop.
            self._pid = 0
        if self._pid:
            try:
                os.kill(self._pid, signal.SIGKILL)
                os.waitpid(self._pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self._pid = 0
        self._bands.clear()
        self._sent.clear()
        self._control = None
        self._arena = None  # the mmap goes when the last view of it does

    # -- a split run ---------------------------------------------------------------------------

    def _run_split(self, schedule: Schedule, feeds: dict[int, np.ndarray]) -> list[Any]:
        plan = self.plan
        sid = self._ids[id(schedule)]
        bands = self._bands[sid]
        views = bands.views
        assert self._control is not None
        meet = helper.Meeting(self._control, helper.MAIN_COUNT, helper.HELPER_COUNT, self._check())
        helper.send(self._fd, ("run", sid))
        values = plan.template.copy()
        for vid, a in feeds.items():
            values[vid] = a
        for vid in schedule.feeds:
            views[vid][...] = feeds[vid]
        for step, action in zip(plan.steps, schedule.actions):
            if action.barrier:
                meet()
            rule = action.band
            if rule is not None:
                bands.run(step, rule, 0)
                for vid in step.outputs:
                    values[vid] = views[vid]
            else:
                _run_step(step, values)
                for vid in action.publish:
                    views[vid][...] = values[vid]
            for i in step.release:
                values[i] = None
        if schedule.final_barrier:
            meet()
        arena = self._arena
        assert arena is not None
        return [_owned(values[i], arena) for i in plan.fetch_ids]


def _traced(a: np.ndarray) -> Traced:
    from ...ops._layout import is_channels_last

    return Traced(a.shape, a.dtype.str, a.ndim == 4 and bool(is_channels_last(a)))


def _owned(value: Any, arena: mmap.mmap) -> Any:
    """A fetched value, copied out if it lies in the arena (the next run overwrites it)."""
    if isinstance(value, np.ndarray) and value.size:
        base = value
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        if base is arena:
            return value.copy()
    return value
