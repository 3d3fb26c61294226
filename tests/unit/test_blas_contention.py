"""The watch that gives runs one BLAS thread while other work holds the cores
(onnxpy/runtime/contention.py), driven by scripted clocks: no test here depends on the machine's
load or speed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ops.registry import op
from onnxpy.runtime import contention, threads
from tests.helpers import make_model, vinfo


class Clocks:
    """A wall clock and a thread CPU clock that runs advance by a scripted amount."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 10.0
        self.cpu_reads = 0

    def now(self) -> float:
        return self.wall

    def thread_cpu(self) -> float:
        self.cpu_reads += 1
        return self.cpu


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """A stand-in for numpy's OpenBLAS setter with two threads, on any BLAS."""
    state = {"threads": 2}
    monkeypatch.setattr(threads, "_find", lambda: (lambda n: state.update(threads=n), lambda: state["threads"]))
    return state


@pytest.fixture
def watch(pool: dict[str, int]) -> tuple[contention.BlasContention, Clocks]:
    clocks = Clocks()
    return contention.BlasContention(clock=clocks.now, cpu_clock=clocks.thread_cpu), clocks


def _run(watch: contention.BlasContention, clocks: Clocks, pool: dict[str, int], wall: float, share: float) -> int:
    """One run taking ``wall`` seconds of which the thread spent ``share`` on a CPU; returns the
    BLAS pool size the run saw."""
    seen = []

    def body() -> str:
        seen.append(pool["threads"])
        clocks.wall += wall
        clocks.cpu += wall * share
        return "result"

    assert watch.call(contention.RunTimes(), body) == "result"
    return seen[0]


def test_unhindered_runs_keep_the_whole_pool(watch: Any, pool: dict[str, int]) -> None:
    w, clocks = watch
    assert [_run(w, clocks, pool, 0.02, 0.97) for _ in range(20)] == [2] * 20
    assert not w.capped and w.switches == 0
    # one slow run is not enough: two in a row are needed
    _run(w, clocks, pool, 0.02, 0.4)
    _run(w, clocks, pool, 0.02, 0.95)
    _run(w, clocks, pool, 0.02, 0.4)
    assert not w.capped


def _stall(w: contention.BlasContention, clocks: Clocks, pool: dict[str, int], runs: int = 3) -> list[int]:
    """``runs`` runs of 0.1 s each at half share (3: 0.3 s, past MIN_STALL_S)."""
    return [_run(w, clocks, pool, 0.1, 0.5) for _ in range(runs)]


def test_a_short_burst_of_slow_runs_is_not_a_busy_machine(watch: Any, pool: dict[str, int]) -> None:
    """Another pool spinning down after its work (onnxruntime's, OpenBLAS's) slows a few runs
    for less than MIN_STALL_S: the pool stays whole. The same share sustained caps it."""
    w, clocks = watch
    assert contention.MIN_STALL_S == 0.25
    burst = [_run(w, clocks, pool, 0.02, 0.3) for _ in range(12)]  # 0.24 s
    assert burst == [2] * 12 and not w.capped
    _run(w, clocks, pool, 0.02, 0.95)  # a healthy run: the count starts again
    assert [_run(w, clocks, pool, 0.02, 0.3) for _ in range(12)] == [2] * 12 and not w.capped
    _run(w, clocks, pool, 0.02, 0.3)  # 13 in a row: 0.26 s
    assert w.capped and _run(w, clocks, pool, 0.02, 0.3) == 1


def test_stalled_runs_fall_back_to_one_thread_and_probes_bring_the_pool_back(watch: Any, pool: dict[str, int]) -> None:
    w, clocks = watch
    assert _stall(w, clocks, pool) == [2, 2, 2]
    assert w.capped
    # until the first probe (PROBE_FIRST after the fall back) every run gets one thread
    assert [_run(w, clocks, pool, 0.02, 1.0) for _ in range(5)] == [1] * 5
    assert pool["threads"] == 2  # restored after each run
    clocks.wall = w.probe_at
    assert _run(w, clocks, pool, 0.1, 0.5) == 2  # the probe runs with the pool: still stalled
    assert w.capped and w.interval == 2 * contention.PROBE_FIRST
    assert _run(w, clocks, pool, 0.02, 1.0) == 1
    for _ in range(10):  # probes keep finding the machine busy: they come at most PROBE_MAX apart
        clocks.wall = w.probe_at
        _run(w, clocks, pool, 0.1, 0.5)
    assert w.interval == contention.PROBE_MAX
    clocks.wall = w.probe_at
    assert _run(w, clocks, pool, 0.02, 0.95) == 2  # the machine is free again
    assert not w.capped and w.switches == 2
    assert _run(w, clocks, pool, 0.02, 0.95) == 2


def test_a_pool_that_stalls_again_soon_waits_longer_for_its_probes(watch: Any, pool: dict[str, int]) -> None:
    w, clocks = watch
    _stall(w, clocks, pool)
    clocks.wall = w.probe_at
    _run(w, clocks, pool, 0.1, 0.95)  # freed
    assert not w.capped
    _stall(w, clocks, pool)  # stalled again right away
    assert w.capped and w.probe_at - clocks.wall == 2 * contention.PROBE_FIRST
    clocks.wall = w.probe_at
    _run(w, clocks, pool, 0.1, 0.95)
    clocks.wall += 2 * contention.PROBE_MAX  # a long quiet spell: the next stall starts afresh
    _stall(w, clocks, pool)
    assert w.capped and w.probe_at - clocks.wall == contention.PROBE_FIRST


def test_short_runs_are_timed_but_not_measured(watch: Any, pool: dict[str, int]) -> None:
    w, clocks = watch
    times = contention.RunTimes()

    def short() -> None:
        clocks.wall += contention.MIN_WALL / 10
        clocks.cpu += 0.0  # would look fully stalled if it were measured

    for _ in range(10):
        w.call(times, short)
    assert not w.capped
    assert clocks.cpu_reads == 1  # at the start of the first run only: later runs are known to be short
    assert times.last_wall < contention.MIN_WALL


def test_a_single_thread_pool_is_left_alone(pool: dict[str, int]) -> None:
    pool["threads"] = 1
    clocks = Clocks()
    w = contention.BlasContention(clock=clocks.now, cpu_clock=clocks.thread_cpu)
    for _ in range(5):
        _run(w, clocks, pool, 0.1, 0.2)
    assert not w.capped and clocks.cpu_reads == 0


# -- in sessions --------------------------------------------------------------------------------

_SEEN: list[int] = []


@op("BlasPoolProbe", 1, domain="test.contention")
def _blas_pool_probe(xp: Any, x: Any) -> Any:
    _SEEN.append(threads.get_blas_threads())
    return x + 1


def _probe_model() -> bytes:
    node = helper.make_node("BlasPoolProbe", ["x"], ["y"], domain="test.contention")
    model = make_model(
        [node],
        [vinfo("x", TensorProto.FLOAT, [2])],
        [vinfo("y", TensorProto.FLOAT, [2])],
        extra_opsets={"test.contention": 1},
    )
    return model.SerializeToString()


@pytest.mark.parametrize("path", ["run", "run_with_iobinding"])
def test_sessions_run_capped_while_the_machine_is_busy_unless_threads_are_set(
    pool: dict[str, int], monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    clocks = Clocks()
    busy = contention.BlasContention(clock=clocks.now, cpu_clock=clocks.thread_cpu)
    busy.capped, busy.probe_at = True, float("inf")
    monkeypatch.setattr(contention, "WATCH", busy)
    model = _probe_model()
    x = np.zeros(2, np.float32)

    def run(sess: onnxpy.InferenceSession) -> int:
        _SEEN.clear()
        if path == "run":
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [1, 1])
        else:
            io = sess.io_binding()
            io.bind_cpu_input("x", x)
            io.bind_output("y")
            sess.run_with_iobinding(io)
            np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], [1, 1])
        return _SEEN[0]

    assert run(onnxpy.InferenceSession(model)) == 1
    assert pool["threads"] == 2
    so = onnxpy.SessionOptions()
    so.intra_op_num_threads = 2  # the user's choice stands
    assert run(onnxpy.InferenceSession(model, so)) == 2
    busy.capped = False
    assert run(onnxpy.InferenceSession(model)) == 2
