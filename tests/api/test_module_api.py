"""onnxruntime's API beyond run(): run_async, the global seed and logger severity, external
initializers given in memory, and the options onnxpy accepts or refuses by name. onnxruntime
is the oracle where it runs the same call."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ops import randomness
from onnxpy.runtime import logs
from tests.helpers import make_model, vinfo

F = TensorProto.FLOAT
DEMO = Path(onnxpy.__file__).parent / "data" / "demo.onnx"


def _add_model() -> bytes:
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"]), helper.make_node("Neg", ["y"], ["z"])],
        [vinfo("x", F, [2, 3])],
        [vinfo("y", F, [2, 3]), vinfo("z", F, [2, 3])],
        {"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
    )
    return m.SerializeToString()


class _Callback:
    """Collects what run_async's callback received, and on which thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.calls: list[tuple[list, object, str, str]] = []

    def __call__(self, results: list, user_data: object, err: str) -> None:
        self.calls.append((results, user_data, err, threading.current_thread().name))
        self.done.set()

    def wait(self) -> tuple[list, object, str, str]:
        assert self.done.wait(30), "run_async never called back"
        self.done.clear()
        return self.calls[-1]


# -- run_async -----------------------------------------------------------------------------------
def test_run_async_calls_back_with_the_results_of_run() -> None:
    sess = onnxpy.InferenceSession(_add_model())
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    cb = _Callback()
    marker = object()
    assert sess.run_async(None, {"x": x}, cb, marker) is None
    results, user_data, err, thread = cb.wait()
    assert err == "" and user_data is marker
    assert thread != threading.main_thread().name
    expected = onnxruntime.InferenceSession(_add_model(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert len(results) == 2
    for ours, theirs in zip(results, expected):
        np.testing.assert_array_equal(ours, theirs)

    sess.run_async(["z"], {"x": x}, cb, None)
    results, _, err, _ = cb.wait()
    assert err == "" and len(results) == 1
    np.testing.assert_array_equal(results[0], expected[1])


def test_run_async_reports_a_failed_run_to_the_callback() -> None:
    sess = onnxpy.InferenceSession(_add_model())
    cb = _Callback()
    sess.run_async(None, {"x": np.zeros((2, 4), np.float32)}, cb, "data")
    results, user_data, err, _ = cb.wait()
    assert results == [] and user_data == "data"
    assert "invalid dimensions" in err and "index: 1" in err

    sess.run_async(["nope"], {"x": np.zeros((2, 3), np.float32)}, cb, None)
    results, _, err, _ = cb.wait()
    assert results == [] and "nope" in err


def test_run_async_checks_its_arguments_before_returning() -> None:
    sess = onnxpy.InferenceSession(_add_model())
    cb = _Callback()
    with pytest.raises(onnxpy.InvalidArgument, match=r"Required inputs \(\['x'\]\) are missing"):
        sess.run_async(None, {"other": np.zeros((2, 3), np.float32)}, cb, None)
    with pytest.raises(onnxpy.InvalidArgument, match="callback must be callable"):
        sess.run_async(None, {"x": np.zeros((2, 3), np.float32)}, None, None)
    with pytest.raises(onnxpy.InvalidArgument, match="input_feed must be a dict"):
        sess.run_async(None, [np.zeros((2, 3), np.float32)], cb, None)  # type: ignore[arg-type]
    assert cb.calls == []


def test_a_callback_that_raises_reaches_threading_excepthook(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[BaseException | None] = []
    reported = threading.Event()

    def hook(args: threading.ExceptHookArgs) -> None:
        seen.append(args.exc_value)
        reported.set()

    monkeypatch.setattr(threading, "excepthook", hook)

    def failing(results: list, user_data: object, err: str) -> None:
        raise ValueError("callback failed")

    sess = onnxpy.InferenceSession(_add_model())
    sess.run_async(None, {"x": np.zeros((2, 3), np.float32)}, failing, None)
    assert reported.wait(30)
    assert isinstance(seen[0], ValueError) and str(seen[0]) == "callback failed"
    # The pool's thread survived: the next call still answers.
    cb = _Callback()
    sess.run_async(None, {"x": np.zeros((2, 3), np.float32)}, cb, None)
    assert cb.wait()[2] == ""


# -- set_seed ------------------------------------------------------------------------------------
def _random_model(seed: float | None) -> bytes:
    attrs = {"shape": [4, 5]} if seed is None else {"shape": [4, 5], "seed": seed}
    m = make_model([helper.make_node("RandomNormal", [], ["r"], **attrs)], [], [vinfo("r", F, [4, 5])])
    return m.SerializeToString()


def test_set_seed_makes_unseeded_random_nodes_repeatable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(randomness, "_DEFAULT_SEED", None)
    unseeded = _random_model(None)
    onnxpy.set_seed(1234)
    first = onnxpy.InferenceSession(unseeded).run(None, {})[0]
    second = onnxpy.InferenceSession(unseeded).run(None, {})[0]
    np.testing.assert_array_equal(first, second)
    onnxpy.set_seed(1235)
    other = onnxpy.InferenceSession(unseeded).run(None, {})[0]
    assert not np.array_equal(first, other)
    # A node's own seed attribute still decides.
    seeded = _random_model(7.0)
    onnxpy.set_seed(1)
    a = onnxpy.InferenceSession(seeded).run(None, {})[0]
    onnxpy.set_seed(2)
    b = onnxpy.InferenceSession(seeded).run(None, {})[0]
    np.testing.assert_array_equal(a, b)
    onnxpy.set_seed(-1)  # onnxruntime takes any int
    with pytest.raises(TypeError, match="must be an int"):
        onnxpy.set_seed("1")  # type: ignore[arg-type]


# -- logging -------------------------------------------------------------------------------------
@pytest.fixture
def fresh_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_default", None)


def _creation_records(caplog: pytest.LogCaptureFixture, options: onnxpy.SessionOptions | None = None) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="onnxpy"):
        onnxpy.InferenceSession(str(DEMO), options)
    return [r.levelname for r in caplog.records if r.name == "onnxpy"]


def test_session_log_severity_selects_its_records(caplog: pytest.LogCaptureFixture, fresh_logs: None) -> None:
    verbose = onnxpy.SessionOptions()
    verbose.log_severity_level = 0
    levels = _creation_records(caplog, verbose)
    assert "INFO" in levels and "DEBUG" in levels
    info = onnxpy.SessionOptions()
    info.log_severity_level = 1
    levels = _creation_records(caplog, info)
    assert "INFO" in levels and "DEBUG" not in levels
    quiet = onnxpy.SessionOptions()
    quiet.log_severity_level = 3
    assert _creation_records(caplog, quiet) == []
    # Unset everywhere: the application's logging configuration alone decides.
    assert {"INFO", "DEBUG"} <= set(_creation_records(caplog))


def test_default_logger_severity_applies_to_sessions_without_their_own(
    caplog: pytest.LogCaptureFixture, fresh_logs: None
) -> None:
    onnxpy.set_default_logger_severity(3)
    assert _creation_records(caplog) == []
    own = onnxpy.SessionOptions()
    own.log_severity_level = 1
    assert "INFO" in _creation_records(caplog, own)
    onnxpy.set_default_logger_severity(1)
    assert "INFO" in _creation_records(caplog) and "DEBUG" not in _creation_records(caplog)
    for bad in (5, -1):
        with pytest.raises(onnxpy.InvalidArgument, match="severity must be 0 to 4"):
            onnxpy.set_default_logger_severity(bad)
    with pytest.raises(TypeError):
        onnxpy.set_default_logger_severity("2")  # type: ignore[arg-type]
    onnxpy.set_default_logger_verbosity(2)
    with pytest.raises(onnxpy.InvalidArgument):
        onnxpy.set_default_logger_verbosity(-1)


def test_records_show_on_stderr_without_logging_configured(
    capsys: pytest.CaptureFixture[str], fresh_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # an application that configured no logging
    opts = onnxpy.SessionOptions()
    opts.log_severity_level = 1
    onnxpy.InferenceSession(str(DEMO), opts)
    err = capsys.readouterr().err
    assert "onnxpy INFO: graph 'onnxpy_demo_tinynet'" in err and "session created in" in err
    opts.log_severity_level = 2
    onnxpy.InferenceSession(str(DEMO), opts)
    assert "onnxpy INFO" not in capsys.readouterr().err


def test_a_log_callback_receives_what_passes_the_severity(
    capsys: pytest.CaptureFixture[str], fresh_logs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(root := logging.getLogger(), "handlers", [])  # no logging configured
    got: list[tuple] = []
    try:
        onnxpy.set_default_logger_callback(lambda *args: got.append(args), 1)  # onnxruntime's signature
        opts = onnxpy.SessionOptions()
        opts.logid = "my-session"
        onnxpy.InferenceSession(str(DEMO), opts)
        assert got and all(len(a) == 5 for a in got)
        severity, category, logid, where, message = got[0]
        assert (severity, category, logid) == (1, "onnxpy", "my-session")
        assert "session.py" in where and "graph 'onnxpy_demo_tinynet'" in message
        assert {a[0] for a in got} == {1}  # no verbose records at severity 1
        assert "onnxpy INFO" not in capsys.readouterr().err  # the callback replaces stderr

        def raising(*args: object) -> None:
            raise RuntimeError("callback failed")

        onnxpy.set_default_logger_callback(raising, 1)
        reported: list[object] = []
        monkeypatch.setattr(sys, "unraisablehook", reported.append)  # as onnxruntime reports it
        onnxpy.InferenceSession(str(DEMO))  # the session is still created
        assert reported and all(isinstance(r.exc_value, RuntimeError) for r in reported)  # type: ignore[attr-defined]
        monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
        onnxpy.InferenceSession(str(DEMO))
        assert "RuntimeError: callback failed" in capsys.readouterr().err
        with pytest.raises(TypeError, match="callable"):
            onnxpy.set_default_logger_callback(42)  # type: ignore[arg-type]
        with pytest.raises(onnxpy.InvalidArgument, match="severity must be 0 to 4"):
            onnxpy.set_default_logger_callback(print, 7)
    finally:
        onnxpy.set_default_logger_callback(None)
    got.clear()
    onnxpy.InferenceSession(str(DEMO))
    assert not got and "onnxpy INFO: graph" in capsys.readouterr().err  # back on stderr
    assert root.handlers == []


def test_global_thread_pool_sizes_serve_sessions_without_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxpy.runtime import facts

    monkeypatch.setitem(facts.GLOBAL_POOL, "intra_op_num_threads", 0)
    onnxpy.set_global_thread_pool_sizes(intra_op_num_threads=1, inter_op_num_threads=2)
    shared = onnxpy.SessionOptions()
    shared.use_per_session_threads = False
    assert facts.SessionFacts.from_options(shared).intra_op_threads == 1
    own = onnxpy.SessionOptions()  # per-session threads: the global pool does not apply
    assert facts.SessionFacts.from_options(own).intra_op_threads == 0
    shared.intra_op_num_threads = 2  # a session's own count wins
    assert facts.SessionFacts.from_options(shared).intra_op_threads == 2
    for bad in (-1, 1.5, True):
        with pytest.raises(onnxpy.InvalidArgument, match="intra_op_num_threads must be an int >= 0"):
            onnxpy.set_global_thread_pool_sizes(bad)  # type: ignore[arg-type]
    onnxpy.disable_telemetry_events()
    onnxpy.enable_telemetry_events()


# -- external initializers -----------------------------------------------------------------------
def _external_model(folder: Path) -> Path:
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])], [vinfo("x", F, [2, 3])], [vinfo("y", F, [2, 3])], {"w": w}
    )
    path = folder / "model.onnx"
    onnx.save_model(
        m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0
    )
    return path


def test_external_initializers_given_in_memory_replace_the_file(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    (tmp_path / "w.bin").unlink()  # only the values given below can be used
    w = np.full((2, 3), 5, np.float32)
    x = np.ones((2, 3), np.float32)
    ours = onnxpy.SessionOptions()
    ours.add_external_initializers(["w"], [onnxpy.OrtValue.ortvalue_from_numpy(w)])
    got = onnxpy.InferenceSession(str(path), ours).run(None, {"x": x})[0]
    theirs = onnxruntime.SessionOptions()
    theirs.add_external_initializers(["w"], [onnxruntime.OrtValue.ortvalue_from_numpy(w)])
    want = onnxruntime.InferenceSession(str(path), theirs, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, x + w)
    # Without them the missing file is named.
    with pytest.raises(onnxpy.NoSuchFile, match="w.bin"):
        onnxpy.InferenceSession(str(path))


def test_external_initializers_are_checked(tmp_path: Path) -> None:
    path = _external_model(tmp_path)

    def create(names: list[str], values: list[np.ndarray]) -> None:
        opts = onnxpy.SessionOptions()
        opts.add_external_initializers(names, values)
        onnxpy.InferenceSession(str(path), opts)

    with pytest.raises(onnxpy.InvalidArgument, match="no initializer named 'nope'"):
        create(["nope"], [np.zeros((2, 3), np.float32)])
    with pytest.raises(
        onnxpy.InvalidArgument,
        match=r"got tensor\(float\) \[3, 2\], the model.s initializer is tensor\(float\) \[2, 3\]",
    ):
        create(["w"], [np.zeros((3, 2), np.float32)])
    with pytest.raises(onnxpy.InvalidArgument, match="2 names but 1 values"):
        onnxpy.SessionOptions().add_external_initializers(["w", "v"], [np.zeros((2, 3), np.float32)])
    inline = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [vinfo("x", F, [2, 3])],
        [vinfo("y", F, [2, 3])],
        {"w": np.zeros((2, 3), np.float32)},
    ).SerializeToString()
    opts = onnxpy.SessionOptions()
    opts.add_external_initializers(["w"], [np.ones((2, 3), np.float32)])
    with pytest.raises(onnxpy.InvalidArgument, match="stored in the model, not in external data"):
        onnxpy.InferenceSession(inline, opts)


# -- options accepted or refused by name ---------------------------------------------------------
def test_options_onnxpy_accepts_or_refuses_by_name() -> None:
    opts = onnxpy.SessionOptions()
    assert opts.use_per_session_threads is True
    opts.use_per_session_threads = False
    assert opts.use_per_session_threads is False
    with pytest.raises(onnxpy.InvalidArgument, match="use_per_session_threads"):
        opts.use_per_session_threads = "no"  # type: ignore[assignment]
    with pytest.raises(onnxpy.NotImplemented, match="cannot load native onnxruntime custom-op libraries"):
        opts.register_custom_ops_library("libcustom_ops.so")


def test_build_info_names_what_onnxpy_runs_on() -> None:
    info = onnxpy.get_build_info()
    assert info.startswith(f"onnxpy {onnxpy.__version__}")
    assert f"numpy {np.__version__}" in info and f"onnx {onnx.__version__}" in info


def test_a_level_the_application_sets_later_decides_for_sessions_without_severity(
    caplog: pytest.LogCaptureFixture, fresh_logs: None
) -> None:
    """After a verbose session made onnxpy lower its logger's level, an application that sets
    that logger to DEBUG itself gets the records of sessions that set no severity (they were
    filtered at the root's WARNING whenever the verbose session came first)."""
    logger = logging.getLogger("onnxpy")
    saved = logger.level
    logger.setLevel(logging.NOTSET)  # as in a fresh process
    try:
        verbose = onnxpy.SessionOptions()
        verbose.log_severity_level = 0
        onnxpy.InferenceSession(str(DEMO), verbose)  # installs onnxpy's filter, lowers the level
        assert {"INFO", "DEBUG"} <= set(_creation_records(caplog))  # caplog sets DEBUG, as an app
    finally:
        logger.setLevel(saved)
