"""The helper process: forked from the session's process, so it holds the same plan, weights
and derived weights without loading anything (copy-on-write pages, not a second copy). It
computes the helper's band of each band step of a run; a pipe brings it schedules and runs.

Both processes meet at barriers: counters in the shared control block, spun on. A barrier
never hangs: the session's process checks that the helper lives (and has not failed) while it
waits, and gives up after ``WAIT_LIMIT_S``; the helper exits when the session's process is gone
(its pipe closes, or its parent changes).
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import time
import warnings
from typing import Any

from ...planner.plan import ExecutionPlan
from ..threads import _find as _blas_setters
from .bands import Bands
from .schedule import Schedule

#: control block words (int64): barrier counts of the two processes, the helper's failure flag
MAIN_COUNT, HELPER_COUNT, HELPER_FAILED = 0, 1, 2
CONTROL_BYTES = 4096
#: the longest the session's process waits at one barrier before it gives the helper up
WAIT_LIMIT_S = 60.0
#: spins before a waiting helper starts sleeping between looks (a few milliseconds)
HELPER_SPINS = 10000
#: spins (about 0.1 us each) before a waiting process yields its core at every look
YIELD_AFTER = 500


class HelperLost(Exception):
    """The helper died, failed or stopped answering; the run is redone in one process."""


class Meeting:
    """Barriers between the two processes: each counts its arrivals in its own word and waits
    for the other's count to catch up."""

    def __init__(self, control: memoryview, me: int, other: int, check: Any) -> None:
        self.control = control
        self.me = me
        self.other = other
        self.check = check
        self.count = int(control[me])

    def __call__(self) -> None:
        self.count += 1
        control, other, count = self.control, self.other, self.count
        control[self.me] = count
        spins = 0
        while control[other] < count:
            spins += 1
            if spins > YIELD_AFTER:
                # Long enough that the other process may be waiting for this core (more
                # runnable threads than cores: another program, OpenBLAS's spinning workers):
                # give it up rather than burn the time slice.
                os.sched_yield()
            if spins & 1023 == 0:
                self.check(spins)


def send(fd: int, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = struct.pack("<Q", len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def receive(fd: int) -> Any:
    """The next message; None at end of file (the session's process closed the pipe)."""
    head = _read(fd, 8)
    if head is None:
        return None
    body = _read(fd, struct.unpack("<Q", head)[0])
    return None if body is None else pickle.loads(body)


def _read(fd: int, n: int) -> bytes | None:
    parts = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def start(plan: ExecutionPlan, arena: Any) -> tuple[int, int]:
    """Fork the helper over ``arena`` (a shared mmap: control block, then slots). Returns its
    pid and the pipe's writing end."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    # Python 3.12+ warns (DeprecationWarning) when a process with several threads forks, after
    # the fork. Held back until the helper's pid is known, so that a warning made an error
    # (-W error) stops the helper instead of leaving it behind.
    with warnings.catch_warnings(record=True) as held:
        warnings.simplefilter("always")
        pid = os.fork()
    if pid == 0:  # the helper: never returns into the caller's code
        code = 0
        try:
            os.close(write_fd)
            _serve(plan, arena, read_fd, parent)
        except BaseException:  # noqa: BLE001 - reported through the control block, then exit
            code = 1
            try:
                memoryview(arena).cast("q")[HELPER_FAILED] = 1
            except BaseException:  # noqa: BLE001, S110 - nothing more can be done
                pass
        finally:
            os._exit(code)
    os.close(read_fd)
    try:
        for w in held:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, module=__name__, source=w.source)
    except BaseException:
        os.close(write_fd)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return pid, write_fd


def _serve(plan: ExecutionPlan, arena: Any, fd: int, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the session process's to handle
    # Not PR_SET_PDEATHSIG: it fires when the forking *thread* ends, and a session may first run
    # split on a short-lived thread. A dead parent closes the pipe (EOF here) or changes
    # getppid (checked while waiting at a barrier).
    setters = _blas_setters()
    if setters:
        setters[0](1)  # two processes, one core each: OpenBLAS must not add threads to them
    control = memoryview(arena).cast("q")

    def check(spins: int) -> None:
        if os.getppid() != parent:
            os._exit(0)
        if spins > HELPER_SPINS:
            time.sleep(0.0001)  # a long wait (a step the session's process runs whole)

    meet = Meeting(control, HELPER_COUNT, MAIN_COUNT, check)
    bands: dict[int, Bands] = {}
    while True:
        message = receive(fd)
        if message is None:
            return
        kind, sid = message[0], message[1]
        if kind == "schedule":
            bands[sid] = Bands(plan, message[2], arena, CONTROL_BYTES)
        elif kind == "run":
            _run_half(plan, bands[sid], meet)


def _run_half(plan: ExecutionPlan, bands: Bands, meet: Meeting) -> None:
    schedule: Schedule = bands.schedule
    for step, action in zip(plan.steps, schedule.actions):
        if action.barrier:
            meet()
        rule = action.band
        if rule is not None:
            bands.run(step, rule, 1)
    if schedule.final_barrier:
        meet()
