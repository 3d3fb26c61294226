"""One BLAS thread for runs while other work holds the machine's cores.

OpenBLAS splits each product between its threads in fixed shares and waits for all of them.
When another process holds the core a worker needs, that worker starts its share only at its
next time slice, and every product in the run waits milliseconds for it. On the 2-core
development machine, loaded by two other busy processes, MobileNet-v2 ran in 100-120 ms (p90
670 ms) with OpenBLAS's two threads against 22-27 ms with one (onnxruntime: 17-29 ms, its
pool hands unstarted work to the threads that are running); a 3x3 convolution of 128x15x15
took 20 ms a call against 0.15.

The sign of it is cheap to read: the share of a run's wall time that the calling thread spent
on a CPU. It computes or spins through the whole of an unhindered run (it takes a share of
each product and spins while waiting for the rest), so the share stays near 1; in those
loaded runs it was 0.49. Runs of sessions without ``intra_op_num_threads`` are watched:
after ``STRIKES`` measured runs in a row below ``LOW_SHARE``, together at least ``MIN_STALL_S``
long, they run with one BLAS thread,
and from time to time one run goes with the full pool again as a probe; when its share is
``HEALTHY_SHARE`` or more, the full pool is back. A probe that finds the machine still busy
waits twice as long for the next, up to ``PROBE_MAX`` seconds, and so does the first probe
after a pool stalls again soon after a probe freed it (a machine busy on and off).

Runs shorter than ``MIN_WALL`` are not measured (reading a thread's CPU time costs about
0.65 us): their products are too small to be split, and a run that the stall makes long is
measured at the next call.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .threads import blas_threads, blas_threads_supported, get_blas_threads

T = TypeVar("T")

MIN_WALL = 1e-3  # seconds
LOW_SHARE = 0.7
HEALTHY_SHARE = 0.85
STRIKES = 2
# Low-share runs in a row must span this long: another thread pool spinning down after its own
# work (OpenBLAS's for 50-100 ms, onnxruntime's within its benchmark settle time of 0.15 s) is
# not a busy machine. Counting runs alone, in benchmarks/bench.py's alternating blocks the first
# two onnxpy runs after onnxruntime's block capped the pool, and probes landing in such moments
# kept it capped: in one run 142,151 of 142,258 onnxpy calls went with one BLAS thread.
MIN_STALL_S = 0.25
PROBE_FIRST = 0.5  # seconds after falling back
PROBE_MAX = 8.0


class RunTimes:
    """Per session: how long its last timed run took (whether the next one is worth measuring)."""

    __slots__ = ("last_wall",)

    def __init__(self) -> None:
        self.last_wall = MIN_WALL  # the first run is measured


class BlasContention:
    """The process's watch over its BLAS pool (the pool is one per process, like the cores)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.clock = clock
        self.cpu_clock = cpu_clock
        self._active: bool | None = None  # decided at the first run (finding OpenBLAS loads it)
        self.capped = False
        self.strikes = 0
        self.stalled_s = 0.0  # wall time of the low-share runs in a row so far
        self.probe_at = 0.0
        self.interval = PROBE_FIRST
        self.uncapped_at = -math.inf
        self.switches = 0  # how often the pool changed hands, for tests and diagnostics
        self._probing = threading.Lock()  # one probe at a time when several threads run

    def active(self) -> bool:
        if self._active is None:
            self._active = blas_threads_supported() and get_blas_threads() > 1
        return self._active

    def call(self, times: RunTimes, run: Callable[..., T], *args: Any) -> T:
        """``run(*args)`` under the watch."""
        if self.capped:
            return self._capped_call(times, run, args)
        if times.last_wall < MIN_WALL:
            start = self.clock()
            result = run(*args)
            times.last_wall = self.clock() - start
            return result
        if not self.active():
            times.last_wall = -math.inf  # nothing to watch: only timed from now on
            return run(*args)
        share, result = self._measured(times, run, args)
        if share is not None:
            self._after_watched(share, times.last_wall)
        return result

    def _capped_call(self, times: RunTimes, run: Callable[..., T], args: tuple[Any, ...]) -> T:
        if self.clock() < self.probe_at or not self._probing.acquire(blocking=False):
            with blas_threads(1):
                return run(*args)
        try:
            share, result = self._measured(times, run, args)
            self._after_probe(share)
            return result
        finally:
            self._probing.release()

    def _measured(self, times: RunTimes, run: Callable[..., T], args: tuple[Any, ...]) -> tuple[float | None, T]:
        start, cpu = self.clock(), self.cpu_clock()
        result = run(*args)
        wall = self.clock() - start
        times.last_wall = wall
        share = (self.cpu_clock() - cpu) / wall if wall >= MIN_WALL else None
        return share, result

    def _after_watched(self, share: float, wall: float) -> None:
        if share >= LOW_SHARE:
            self.strikes = 0
            self.stalled_s = 0.0
            return
        self.strikes += 1
        self.stalled_s += wall
        if self.strikes >= STRIKES and self.stalled_s >= MIN_STALL_S:
            now = self.clock()
            self.capped = True
            self.switches += 1
            # A pool that stalls again soon after a probe freed it (a machine busy on and off)
            # keeps the longer wait: each round trip costs a few slow runs.
            if now - self.uncapped_at > PROBE_MAX:
                self.interval = PROBE_FIRST
            self.probe_at = now + self.interval

    def _after_probe(self, share: float | None) -> None:
        if share is None:  # too short to tell: ask again at the next run
            return
        if share >= HEALTHY_SHARE:
            self.capped = False
            self.strikes = 0
            self.stalled_s = 0.0
            self.switches += 1
            self.uncapped_at = self.clock()
            self.interval = min(self.interval * 2, PROBE_MAX)
            return
        self.interval = min(self.interval * 2, PROBE_MAX)
        self.probe_at = self.clock() + self.interval


WATCH = BlasContention()
