"""session.split_processes: spatial steps in two halves of rows, here and in a forked helper.

The results must equal a plain session's on every run, and nothing about the helper (its
death, a failure, the session's end) may hang a run, change a result or leave a process.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.runtime.split import runner as split_runner
from onnxpy.runtime.split.geometry import ChannelRule
from tests.helpers import LIGHT_DIR, make_model, randomize_weights, shared_models, vinfo

pytestmark = pytest.mark.skipif(
    split_runner.supported() is not None, reason=f"row-split runs need this machine to have: {split_runner.supported()}"
)

KEY = "session.split_processes"


def _cnn() -> onnx.ModelProto:
    """Every kind of band step: a padded 3x3 convolution, a strided one, pools (one with
    ceil_mode), a 1x1 convolution with a residual, channel concatenation, and a head that
    runs whole."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    inits = {
        "w1": w(8, 3, 3, 3), "b1": w(8), "w2": w(16, 8, 3, 3), "b2": w(16),
        "w3": w(16, 16, 1, 1), "b3": w(16), "wd": w(16, 1, 3, 3), "wf": w(10, 32), "bf": w(10),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("MaxPool", ["c2"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p2", "w3", "b3"], ["c3"], kernel_shape=[1, 1]),
        helper.make_node("Add", ["c3", "p2"], ["a3"]),
        helper.make_node("Conv", ["a3", "wd"], ["d3"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=16),
        helper.make_node("Sigmoid", ["d3"], ["s3"]),
        helper.make_node("Concat", ["s3", "a3"], ["cat"], axis=1),
        helper.make_node("MaxPool", ["cat"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        helper.make_node("AveragePool", ["mp"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["ap"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    return make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [vinfo("y", TensorProto.FLOAT, None), vinfo("cat", TensorProto.FLOAT, None)],
        inits,
        opset=17,
    )


def _sessions(
    model: onnx.ModelProto | str, mode: str = "always"
) -> tuple[onnxpy.InferenceSession, onnxpy.InferenceSession]:
    data = model if isinstance(model, str) else model.SerializeToString()
    opts = onnxpy.SessionOptions()
    opts.add_session_config_entry(KEY, mode)
    return onnxpy.InferenceSession(data, opts), onnxpy.InferenceSession(data)


def _assert_same(split: list[np.ndarray], plain: list[np.ndarray]) -> None:
    assert len(split) == len(plain)
    for a, b in zip(split, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _split_running(seed: int) -> tuple[onnxpy.InferenceSession, np.ndarray, list[np.ndarray], Any]:
    """A split session of the test CNN after its traced run and a split one (its helper
    running), an input, the plain session's outputs for it, and the session's runner."""
    split, plain = _sessions(_cnn())
    x = np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = plain.run(None, {"x": x})
    split.run(None, {"x": x})
    split.run(None, {"x": x})
    runner = split._split
    assert runner is not None and runner._pid > 0
    return split, x, want, runner


def _matching_runs(split: onnxpy.InferenceSession, plain: onnxpy.InferenceSession, x: np.ndarray) -> tuple[Any, Any]:
    """Three runs of both sessions on ``x``, equal; then the split session's runner (still on)
    and its one schedule."""
    for _ in range(3):
        _assert_same(split.run(None, {"x": x}), plain.run(None, {"x": x}))
    runner = split._split
    assert runner is not None and not runner.disabled
    (schedule,) = runner.schedules.values()
    assert schedule is not None
    return runner, schedule


def test_split_runs_match_a_plain_session_run_after_run() -> None:
    split, plain = _sessions(_cnn())
    rng = np.random.default_rng(1)
    for _ in range(4):
        x = rng.standard_normal((1, 3, 32, 30)).astype(np.float32)
        _assert_same(split.run(None, {"x": x}), plain.run(None, {"x": x}))
    runner = split._split
    assert runner is not None and not runner.disabled and runner._pid > 0
    (schedule,) = runner.schedules.values()
    assert schedule is not None
    ops = [s.op_type for s, a in zip(runner.plan.steps, schedule.actions) if a.band is not None]
    # the convolutions, pools and position steps of 8+ row maps run in halves; the head whole
    assert "MaxPool" in ops or "FusedMaxPool" in ops
    assert all(op not in ("Gemm", "GlobalAveragePool", "Flatten", "FusedGemm") for op in ops)


def test_fetched_values_are_the_callers_own() -> None:
    """A fetched band output lives in the shared arena during the run: the caller gets a copy,
    which the next run does not overwrite."""
    split, plain = _sessions(_cnn())
    x1 = np.random.default_rng(2).standard_normal((1, 3, 24, 24)).astype(np.float32)
    x2 = np.random.default_rng(3).standard_normal((1, 3, 24, 24)).astype(np.float32)
    split.run(None, {"x": x1})  # traced
    first = split.run(None, {"x": x1})
    kept = [a.copy() for a in first]
    split.run(None, {"x": x2})
    _assert_same(first, kept)
    assert all(a.flags.writeable for a in first)


def test_each_input_shape_gets_its_own_schedule() -> None:
    split, plain = _sessions(_cnn())
    rng = np.random.default_rng(4)
    shapes = [(1, 3, 32, 32), (2, 3, 20, 26), (1, 3, 66, 16), (1, 3, 32, 32), (2, 3, 20, 26), (1, 3, 9, 9)]
    for shape in shapes * 2:
        x = rng.standard_normal(shape).astype(np.float32)
        _assert_same(split.run(None, {"x": x}), plain.run(None, {"x": x}))
    assert split._split is not None and len(split._split.schedules) == 4 and not split._split.disabled


def test_schedules_are_kept_for_a_bounded_number_of_input_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Input shapes that keep changing do not pile up schedules (and the helper's copies of
    them): past the limit the runner starts afresh, and runs stay right."""
    monkeypatch.setattr(split_runner, "MAX_SIGNATURES", 3)
    split, plain = _sessions(_cnn())
    rng = np.random.default_rng(5)
    for width in range(12, 21):
        x = rng.standard_normal((1, 3, 16, width)).astype(np.float32)
        for _ in range(2):
            _assert_same(split.run(None, {"x": x}), plain.run(None, {"x": x}))
        assert split._split is not None and len(split._split.schedules) <= 3 and not split._split.disabled


def test_a_dead_helper_turns_the_feature_off_and_the_run_is_still_right(caplog: pytest.LogCaptureFixture) -> None:
    split, x, want, runner = _split_running(seed=5)
    os.kill(runner._pid, signal.SIGKILL)
    time.sleep(0.05)
    with caplog.at_level(logging.WARNING, logger="onnxpy"):
        got = split.run(None, {"x": x})
    _assert_same(got, want)
    assert runner.disabled and runner._pid == 0
    assert any("row-split runs are off" in r.getMessage() for r in caplog.records)
    _assert_same(split.run(None, {"x": x}), want)


def test_a_failing_helper_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception in the helper's half (here injected into the forked copy's kernel calls)
    reaches the session as a failed helper, not as a hang or a wrong result."""
    from onnxpy.runtime.split import bands

    real = bands.Bands.run
    main_pid = os.getpid()

    def failing_in_helper(self: bands.Bands, step, rule, o0, o1) -> None:  # type: ignore[no-untyped-def]
        if os.getpid() != main_pid:
            raise MemoryError("injected")
        real(self, step, rule, o0, o1)

    monkeypatch.setattr(bands.Bands, "run", failing_in_helper)
    split, plain = _sessions(_cnn())
    x = np.random.default_rng(6).standard_normal((1, 3, 32, 32)).astype(np.float32)
    split.run(None, {"x": x})
    _assert_same(split.run(None, {"x": x}), plain.run(None, {"x": x}))
    assert split._split is not None and split._split.disabled


def test_a_fork_warning_made_an_error_stops_the_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.12+ warns after forking a process with several threads; under -W error that
    warning is an exception. The helper it belongs to is then stopped (not left behind), the
    split given up, and the run still answers, the plain way."""
    from onnxpy.runtime.split import helper as split_helper

    forked: list[int] = []
    real_fork = os.fork

    def fork_then_warn() -> int:
        pid = real_fork()
        if pid:
            forked.append(pid)
            message = "This process is multi-threaded, use of fork() may lead to deadlocks"
            warnings.warn(message, DeprecationWarning, stacklevel=2)
        return pid

    monkeypatch.setattr(split_helper.os, "fork", fork_then_warn)
    split, plain = _sessions(_cnn())
    x = np.random.default_rng(9).standard_normal((1, 3, 32, 32)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for _ in range(3):
            _assert_same(split.run(None, {"x": x}), plain.run(None, {"x": x}))
    assert len(forked) == 1 and not _alive(forked[0])
    with pytest.raises(ChildProcessError):  # reaped
        os.waitpid(forked[0], os.WNOHANG)
    assert split._split is not None and split._split.disabled and split._split._pid == 0


def test_the_helper_ends_with_the_session() -> None:
    split, _, _, runner = _split_running(seed=7)
    pid = runner._pid
    del split, runner
    import gc

    gc.collect()
    with pytest.raises(ChildProcessError):  # reaped: no zombie left behind
        os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("faster", [True, False])
def test_calibration_keeps_split_runs_only_where_they_measured_faster(
    monkeypatch: pytest.MonkeyPatch, faster: bool
) -> None:
    """With "1" the runs after the traced one are timed in blocks, plain and split in turn;
    then the faster kind stays. The threshold is forced here, as timing is not for tests to
    assert."""
    monkeypatch.setattr(split_runner, "KEEP_BELOW", 1e9 if faster else 0.0)
    monkeypatch.setattr(split_runner, "SETTLE_S", 0.0)
    split, plain = _sessions(_cnn(), mode="1")
    x = np.random.default_rng(9).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = plain.run(None, {"x": x})
    runner = split._split
    assert runner is not None
    blocks = split_runner.CALIBRATION_BLOCKS
    for _ in range(1 + len(blocks) * split_runner.BLOCK_RUNS):
        _assert_same(split.run(None, {"x": x}), want)
    (choice,) = runner.choices.values()
    timed = blocks.count("split") * (split_runner.BLOCK_RUNS - split_runner.BLOCK_WARMUP)
    assert len(choice.split_s) == len(choice.plain_s) == timed
    assert choice.split is faster
    # a kept choice leaves the helper running; a dropped one ends it with the arena
    assert (runner._pid > 0) is faster and (runner._arena is not None) is faster
    for _ in range(2):
        _assert_same(split.run(None, {"x": x}), want)
    assert len(choice.split_s) == timed


def test_a_bad_value_of_the_key_is_refused() -> None:
    opts = onnxpy.SessionOptions()
    opts.add_session_config_entry(KEY, "yes")
    with pytest.raises(onnxpy.OnnxpyError, match="'0', '1' or 'always'"):
        onnxpy.InferenceSession(_cnn().SerializeToString(), opts)


def test_a_session_without_the_key_forks_nothing() -> None:
    _, plain = _sessions(_cnn())
    assert plain._split is None


def test_where_it_cannot_work_the_key_is_ignored_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split_runner, "supported", lambda: "this process may use only one core")
    opts = onnxpy.SessionOptions()
    opts.add_session_config_entry(KEY, "1")
    with pytest.warns(RuntimeWarning, match="only one core"):
        s = onnxpy.InferenceSession(_cnn().SerializeToString(), opts)
    assert s._split is None
    x = np.ones((1, 3, 16, 16), np.float32)
    assert s.run(None, {"x": x})[0].shape == (1, 10)


def _real_models() -> list:
    light = [LIGHT_DIR / f"light_{m}.onnx" for m in ("squeezenet", "shufflenet")]
    shared = [p for p in shared_models() if p.stem == "mobilenet_v2"]
    return [pytest.param(p, id=p.stem) for p in light + shared if p.exists()]


@pytest.mark.parametrize("path", _real_models())
def test_real_models_with_random_weights(path) -> None:  # type: ignore[no-untyped-def]
    model = randomize_weights(onnx.load(str(path)), seed=3)
    split, plain = _sessions(model)
    (inp,) = split.get_inputs()
    x = np.random.default_rng(8).random([d if isinstance(d, int) else 1 for d in inp.shape], dtype=np.float32)
    want = plain.run(None, {inp.name: x})
    for _ in range(3):
        got = split.run(None, {inp.name: x})
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max()))
    assert split._split is not None and not split._split.disabled
    (schedule,) = split._split.schedules.values()
    assert schedule is not None and schedule.banded >= 10


def _residual_model(flatten: bool) -> onnx.ModelProto:
    """r = conv3x3(x); y = conv1x1(conv3x3(r)) + r (and flat = Flatten(r), fetched)."""
    rng = np.random.default_rng(10)
    inits = {
        "w1": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
        "w2": (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32),
        "w3": (rng.standard_normal((8, 8, 1, 1)) * 0.3).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["r"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["r", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c2", "w3"], ["c3"], kernel_shape=[1, 1]),
        helper.make_node("Add", ["c3", "r"], ["y"]),
    ]
    outputs = [vinfo("y", TensorProto.FLOAT, None)]
    if flatten:
        nodes.insert(1, helper.make_node("Flatten", ["r"], ["flat"], axis=1))
        outputs.append(vinfo("flat", TensorProto.FLOAT, None))
    return make_model(nodes, [vinfo("x", TensorProto.FLOAT, [1, 3, 24, 24])], outputs, inits)


def test_an_input_overwritten_in_place_waits_for_the_other_process_reading_it() -> None:
    """r = conv3x3(x); y = conv1x1(conv3x3(r)) + r. The residual add writes into r's slot (r
    dies there), but the second 3x3 convolution read r's rows on both sides of the halves'
    border: each process must wait for the other before overwriting its rows of r."""
    split, plain = _sessions(_residual_model(flatten=False))
    x = np.random.default_rng(10).standard_normal((1, 3, 24, 24)).astype(np.float32)
    runner, schedule = _matching_runs(split, plain, x)
    in_place = [a for a in schedule.actions if a.inplace >= 0]
    assert len(in_place) == 1 and in_place[0].barrier
    # the output shares the residual's slot: one slot fewer than values
    steps = runner.plan.steps
    (step,) = [s for s, a in zip(steps, schedule.actions) if a.inplace >= 0]
    assert schedule.slots[step.outputs[0]] == schedule.slots[step.inputs[in_place[0].inplace]]


def test_a_forked_copy_of_the_session_starts_its_own_helper() -> None:
    """A caller's child process (multiprocessing with fork) inherits the session and its
    runner: it must neither drive nor kill its parent's helper."""
    split, x, want, runner = _split_running(seed=11)
    parent_helper = runner._pid
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # the caller's child: runs the inherited session, then ends it
        ok = 0
        try:
            got = split.run(None, {"x": x})
            ok = int(all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, want)))
            ok += 2 * int(runner._pid not in (0, parent_helper))
            runner.close()
        finally:
            os.write(write_fd, bytes([ok]))
            os._exit(0)
    os.close(write_fd)
    result = os.read(read_fd, 1)
    os.close(read_fd)
    os.waitpid(child, 0)
    assert result == bytes([3])  # right results, from a helper of its own
    os.kill(parent_helper, 0)  # the parent's helper lives on
    _assert_same(split.run(None, {"x": x}), want)
    assert runner._pid == parent_helper and not runner.disabled


def test_a_view_of_a_value_keeps_its_slot_from_being_written_over() -> None:
    """r is read by a Flatten, run whole, whose result is a view of r's memory, and later by a
    residual add that could write into r's slot: it must not, or the flattened value changes."""
    split, plain = _sessions(_residual_model(flatten=True))
    x = np.random.default_rng(12).standard_normal((1, 3, 24, 24)).astype(np.float32)
    for _ in range(3):
        _assert_same(split.run(None, {"x": x}), plain.run(None, {"x": x}))
    assert split._split is not None
    (schedule,) = split._split.schedules.values()
    assert schedule is not None and all(a.inplace < 0 for a in schedule.actions)


def test_runs_from_several_threads_at_once() -> None:
    """One split run at a time; runs from other threads meanwhile go the plain way."""
    from tests.helpers import run_in_threads

    split, plain = _sessions(_cnn())
    rng = np.random.default_rng(13)
    xs = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(4)]
    wants = [plain.run(None, {"x": x}) for x in xs]
    split.run(None, {"x": xs[0]})  # traced

    def worker(k: int) -> None:
        for _ in range(5):
            _assert_same(split.run(None, {"x": xs[k]}), wants[k])

    run_in_threads(worker, 4)
    assert split._split is not None and not split._split.disabled


def test_no_helper_is_forked_while_another_thread_runs() -> None:
    """A fork while another thread is inside OpenBLAS deadlocks the process (OpenBLAS's fork
    handler waits for its server thread while the forking thread holds the GIL), so the
    helper waits until the session's thread is the only one; runs meanwhile are plain."""
    import threading

    split, plain = _sessions(_cnn())
    x = np.random.default_rng(29).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = plain.run(None, {"x": x})
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, args=(30,))
    other.start()
    try:
        for _ in range(3):
            _assert_same(split.run(None, {"x": x}), want)
        runner = split._split
        assert runner is not None and not runner.disabled and runner._pid == 0
    finally:
        stop.set()
        other.join(30)
    for _ in range(2):
        _assert_same(split.run(None, {"x": x}), want)
    assert runner._pid > 0  # alone again: the helper runs


def test_run_asyncs_idle_workers_do_not_hold_the_helper_back() -> None:
    """run_async's pool threads stay alive between calls, waiting for work: they are not
    running numpy, so the helper is forked beside them."""
    import threading

    split, plain = _sessions(_cnn())
    x = np.random.default_rng(31).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = plain.run(None, {"x": x})
    done = threading.Event()
    got: list = []
    plain.run_async(None, {"x": x}, lambda r, u, e: (got.append((r, e)), done.set()), None)
    assert done.wait(30) and got[0][1] == ""
    time.sleep(0.05)  # the worker is back waiting for its next task
    assert threading.active_count() > 1  # the pool's thread lives on
    for _ in range(3):
        _assert_same(split.run(None, {"x": x}), want)
    assert split._split is not None and split._split._pid > 0


def test_the_helper_exits_when_the_sessions_process_is_killed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    model = tmp_path / "cnn.onnx"
    onnx.save(_cnn(), str(model))
    code = f"""
import sys, time, numpy as np, onnxpy
o = onnxpy.SessionOptions()
o.add_session_config_entry({KEY!r}, "always")
s = onnxpy.InferenceSession({str(model)!r}, o)
x = np.ones((1, 3, 32, 32), np.float32)
s.run(None, {{"x": x}}); s.run(None, {{"x": x}})
print(s._split._pid, flush=True)
time.sleep(60)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        import select

        ready, _, _ = select.select([proc.stdout], [], [], 120)  # never wait forever
        assert ready, "the session's process printed no helper pid within 120 s"
        pid = int(proc.stdout.readline())
        assert _alive(pid)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the helper outlived the session's process"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it counts as gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


def test_iobinding_and_run_options_runs_split_too() -> None:
    """run_with_iobinding and run with output names or RunOptions take the general path; it
    splits as run() does, and bound output buffers receive the results."""
    split, plain = _sessions(_cnn())
    x = np.random.default_rng(14).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = plain.run(None, {"x": x})
    binding = split.io_binding()
    binding.bind_cpu_input("x", x)
    y = np.empty_like(want[0])
    binding.bind_output("y", "cpu", 0, np.float32, list(y.shape), y.ctypes.data)
    binding.bind_output("cat")
    for _ in range(3):
        split.run_with_iobinding(binding)
        got = binding.copy_outputs_to_cpu()
        _assert_same(got, want)
        np.testing.assert_allclose(y, want[0], rtol=1e-5, atol=1e-5)
    _assert_same(split.run(["y", "cat"], {"x": x}, onnxpy.RunOptions()), want)
    runner = split._split
    assert runner is not None and not runner.disabled and runner._pid > 0
    (schedule,) = runner.schedules.values()
    assert schedule is not None and schedule.banded > 0


@pytest.mark.parametrize("trans_b", [0, 1])
def test_fully_connected_layers_split_their_columns(trans_b: int) -> None:
    """A head's Gemm computes half its output columns in each process, from its half of the
    weights (rows or columns by transB) and of the bias (here [1, N])."""
    rng = np.random.default_rng(15 + trans_b)
    k, n = 8 * 16 * 16, 64
    weights = (rng.standard_normal((n, k) if trans_b else (k, n)) * 0.05).astype(np.float32)
    inits = {
        "w1": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
        "wf": weights,
        "bf": rng.standard_normal((1, n)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Flatten", ["c1"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["g"], transB=trans_b),
        helper.make_node("Relu", ["g"], ["y"]),
    ]
    model = make_model(
        nodes, [vinfo("x", TensorProto.FLOAT, [1, 3, 16, 16])], [vinfo("y", TensorProto.FLOAT, None)], inits
    )
    split, plain = _sessions(model)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    runner, schedule = _matching_runs(split, plain, x)
    gemms = [a for s, a in zip(runner.plan.steps, schedule.actions) if "Gemm" in s.op_type]
    assert len(gemms) == 1 and isinstance(gemms[0].band, ChannelRule)


def _encoder_block() -> onnx.ModelProto:
    """A transformer's feed-forward block on (batch, tokens, features): MatMul + bias, GELU,
    MatMul + bias + residual, LayerNormalization, and a per-token scale."""
    rng = np.random.default_rng(21)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    inits = {"w1": w(32, 64), "b1": w(64), "w2": w(64, 32), "b2": w(32), "g": w(32) + 1, "be": w(32)}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["h1"]),
        helper.make_node("Gelu", ["h1"], ["a1"]),
        helper.make_node("MatMul", ["a1", "w2"], ["m2"]),
        helper.make_node("Add", ["m2", "b2"], ["h2"]),
        helper.make_node("Add", ["h2", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "g", "be"], ["ln"], axis=-1),
        helper.make_node("Mul", ["ln", "scale"], ["y"]),
    ]
    return make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, ["N", "S", 32]), vinfo("scale", TensorProto.FLOAT, ["N", "S", 1])],
        [vinfo("y", TensorProto.FLOAT, None)],
        inits,
        opset=20,
    )


def test_token_steps_split_their_tokens() -> None:
    split, plain = _sessions(_encoder_block())
    rng = np.random.default_rng(22)
    for n, s in ((1, 40), (2, 17), (1, 40)):
        feeds = {
            "x": rng.standard_normal((n, s, 32)).astype(np.float32),
            "scale": rng.random((n, s, 1)).astype(np.float32),
        }
        for _ in range(2):
            _assert_same(split.run(None, feeds), plain.run(None, feeds))
    runner = split._split
    assert runner is not None and not runner.disabled and runner._pid > 0
    assert len(runner.schedules) == 2
    for schedule in runner.schedules.values():
        assert schedule is not None
        banded = {s.op_type for s, a in zip(runner.plan.steps, schedule.actions) if a.band is not None}
        assert {"LayerNormalization", "Mul"} <= banded
        assert banded & {"MatMul", "FusedMatMul"}


_BERT = next((p for p in shared_models() if p.stem == "bert_l2_h128"), None)


@pytest.mark.skipif(
    _BERT is None, reason="../shared/models/bert_l2_h128.onnx is not here (a fresh clone has no ../shared)"
)
def test_bert_splits_its_tokens_and_attention_its_queries() -> None:
    """The shared BERT (random weights) with a padding mask: results equal, attention and the
    dense layers run in halves of tokens, and reading a value's shape (the memoized shape
    computations) never waits for the other process."""
    split, plain = _sessions(str(_BERT))
    rng = np.random.default_rng(23)
    mask = np.ones((1, 48), np.int64)
    mask[0, 36:] = 0
    feeds = {"input_ids": rng.integers(0, 1000, (1, 48)).astype(np.int64), "attention_mask": mask}
    want = plain.run(None, feeds)
    for _ in range(3):
        for a, b in zip(split.run(None, feeds), want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    runner = split._split
    assert runner is not None and not runner.disabled
    (schedule,) = runner.schedules.values()
    assert schedule is not None
    steps = list(zip(runner.plan.steps, schedule.actions))
    banded = [s.op_type for s, a in steps if a.band is not None]
    assert banded.count("Attention") == 2 and banded.count("LayerNormalization") == 5
    assert not [s for s, a in steps if s.op_type in ("ShapeMemo", "Shape") and a.barrier]
