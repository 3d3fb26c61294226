"""Profiling: a Chrome trace in onnxruntime's event format, one Node event per executed node."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxpy
from onnxpy.tools.profiler import load_trace, slowest_nodes, time_by_op, without_first_runs
from tests.helpers import DEMO_MODEL

X = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
NODE_ARGS = {"op_name", "provider", "node_index", "input_type_shape", "output_type_shape"}


def profile(tmp_path: Path, level: onnxpy.GraphOptimizationLevel, runs: int = 2) -> tuple[str, list[dict]]:
    so = onnxpy.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    so.graph_optimization_level = level
    sess = onnxpy.InferenceSession(str(DEMO_MODEL), so)
    for _ in range(runs):
        sess.run(None, {"input": X})
    path = sess.end_profiling()
    with open(path, encoding="utf-8") as f:
        return path, json.load(f)


@pytest.fixture(scope="module")
def ort_trace(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path_factory.mktemp("ort") / "prof")
    sess = ort.InferenceSession(str(DEMO_MODEL), so, providers=["CPUExecutionProvider"])
    sess.run(None, {"input": X})
    return load_trace(sess.end_profiling())


def test_one_node_event_per_executed_node(tmp_path: Path) -> None:
    path, events = profile(tmp_path, onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL, runs=2)
    assert re.fullmatch(r"prof_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{3}\.json", os.path.basename(path))
    model = onnx.load(str(DEMO_MODEL))
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == 2 * len(model.graph.node)
    want = sorted(f"{n.name}_kernel_time" for n in model.graph.node)
    assert sorted(e["name"] for e in nodes[: len(nodes) // 2]) == want
    ops = {n.name: n.op_type for n in model.graph.node}
    for e in nodes:
        assert e["args"]["op_name"] == ops[e["name"].removesuffix("_kernel_time")]
        assert e["args"]["provider"] == "CPUExecutionProvider"


def test_event_fields_and_session_events(tmp_path: Path) -> None:
    _, events = profile(tmp_path, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, runs=3)
    assert isinstance(events, list)
    for e in events:
        assert e["ph"] == "X"
        assert e["cat"] in ("Session", "Node")
        assert isinstance(e["name"], str) and e["name"]
        for k in ("ts", "dur", "pid", "tid"):
            assert isinstance(e[k], int) and e[k] >= 0, (k, e)
        assert e["pid"] == os.getpid()
    session = [e["name"] for e in events if e["cat"] == "Session"]
    assert session.count("model_loading_uri") == 1
    assert session.count("session_initialization") == 1
    assert session.count("model_run") == 3
    load = next(e for e in events if e["name"] == "model_loading_uri")
    init = next(e for e in events if e["name"] == "session_initialization")
    assert load["ts"] + load["dur"] <= init["ts"] + 1
    runs = sorted((e for e in events if e["name"] == "model_run"), key=lambda e: e["ts"])
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) % 3 == 0
    # every node event lies inside one model_run event, and each run holds the same number
    per_run = [0, 0, 0]
    for e in nodes:
        assert NODE_ARGS <= set(e["args"])
        inside = [i for i, r in enumerate(runs) if r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"] + 1]
        assert len(inside) == 1, e
        per_run[inside[0]] += 1
    assert per_run[0] == per_run[1] == per_run[2] == len(nodes) // 3


def test_type_shapes_are_the_real_ones(tmp_path: Path) -> None:
    """Each node's output_type_shape matches the value fetched by name from the same session."""
    _, events = profile(tmp_path, onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL, runs=1)
    model = onnx.load(str(DEMO_MODEL))
    outs = {n.name: n.output[0] for n in model.graph.node}
    names = list(outs.values())
    sess = onnxpy.InferenceSession(str(DEMO_MODEL))
    values = dict(zip(names, sess.run(names, {"input": X})))
    for e in (e for e in events if e["cat"] == "Node"):
        v = values[outs[e["name"].removesuffix("_kernel_time")]]
        assert e["args"]["output_type_shape"] == [{"float": list(v.shape)}]
        assert int(e["args"]["output_size"]) == v.nbytes
    first = next(e for e in events if e["name"] == "stem.conv_kernel_time")
    assert first["args"]["input_type_shape"] == [{"float": [2, 3, 32, 32]}, {"float": [16, 3, 3, 3]}, {"float": [16]}]
    assert first["args"]["parameter_size"] == str((16 * 3 * 3 * 3 + 16) * 4)


def test_layout_matches_onnxruntime(tmp_path: Path, ort_trace: list[dict]) -> None:
    """Same event keys and node-argument names (and value types) as onnxruntime's trace."""
    _, events = profile(tmp_path, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, runs=1)
    ort_node = next(e for e in ort_trace if e["cat"] == "Node")
    ours = next(e for e in events if e["cat"] == "Node")
    assert set(ours) == set(ort_node)
    for k in NODE_ARGS | {"output_size", "activation_size", "parameter_size", "thread_scheduling_stats"}:
        assert type(ours["args"][k]) is type(ort_node["args"][k]), k
    stats = ort_node["args"]["thread_scheduling_stats"]
    assert set(ours["args"]["thread_scheduling_stats"]) == set(stats)
    assert set(ours["args"]["thread_scheduling_stats"]["main_thread"]) == set(stats["main_thread"])
    ort_session = {e["name"] for e in ort_trace if e["cat"] == "Session"}
    our_session = {e["name"] for e in events if e["cat"] == "Session"}
    expected = {"model_loading_uri", "session_initialization", "model_run", "SequentialExecutor::Execute"}
    assert expected <= ort_session & our_session
    # The executor's part of each run lies inside it.
    run = next(e for e in events if e["name"] == "model_run")
    execute = next(e for e in events if e["name"] == "SequentialExecutor::Execute")
    assert run["ts"] <= execute["ts"] and execute["ts"] + execute["dur"] <= run["ts"] + run["dur"] + 1


def test_trace_text_is_a_json_array_one_event_per_line(tmp_path: Path) -> None:
    path, events = profile(tmp_path, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, runs=1)
    lines = Path(path).read_text().splitlines()
    assert lines[0] == "[" and lines[-1] == "]"
    assert len(lines) == len(events) + 2
    assert [json.loads(line.rstrip(",")) for line in lines[1:-1]] == events


def test_time_by_op_sums_node_durations(tmp_path: Path) -> None:
    _, events = profile(tmp_path, onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL, runs=2)
    table = {t.op_type: t for t in time_by_op(events)}
    for op in {e["args"]["op_name"] for e in events if e["cat"] == "Node"}:
        mine = [e for e in events if e["cat"] == "Node" and e["args"]["op_name"] == op]
        assert table[op].calls == len(mine)
        assert table[op].total_us == sum(e["dur"] for e in mine)


def test_without_first_runs_drops_the_warm_up_runs_and_their_nodes(tmp_path: Path) -> None:
    _, events = profile(tmp_path, onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL, runs=3)
    runs = sorted((e for e in events if e["name"] == "model_run"), key=lambda e: e["ts"])
    kept = without_first_runs(events, 2)
    assert [e for e in kept if e["name"] == "model_run"] == runs[2:]
    nodes = [e for e in events if e["cat"] == "Node"]
    kept_nodes = [e for e in kept if e["cat"] == "Node"]
    assert len(kept_nodes) == len(nodes) // 3
    assert all(e["ts"] >= runs[2]["ts"] for e in kept_nodes)
    # The session's own events (loading, initialization) stay.
    assert {e["name"] for e in events if e["name"] != "model_run" and e["cat"] == "Session"} == {
        e["name"] for e in kept if e["name"] != "model_run" and e["cat"] == "Session"
    }
    assert without_first_runs(events, 0) == events


def test_end_profiling_without_profiling_is_empty() -> None:
    sess = onnxpy.InferenceSession(str(DEMO_MODEL))
    assert sess.end_profiling() == ""
    assert sess.get_profiling_start_time_ns() == 0


def test_profiling_start_time_is_the_wall_clock_and_outlives_end_profiling(tmp_path: Path) -> None:
    # Nanoseconds since the epoch, as onnxruntime 1.32 returns them (its docstring says the
    # monotonic clock; its value is time.time_ns()'s), and kept after end_profiling.
    import time

    so = onnxpy.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "start")
    before = time.time_ns()
    sess = onnxpy.InferenceSession(str(DEMO_MODEL), so)
    start = sess.get_profiling_start_time_ns()
    assert before - 1_000_000 <= start <= time.time_ns()
    sess.end_profiling()
    assert sess.get_profiling_start_time_ns() == start
    oso = ort.SessionOptions()
    oso.enable_profiling = True
    oso.profile_file_prefix = str(tmp_path / "ort_start")
    ort_sess = ort.InferenceSession(str(DEMO_MODEL), oso, providers=["CPUExecutionProvider"])
    assert abs(ort_sess.get_profiling_start_time_ns() - start) < 60 * 10**9  # the same clock
    ort_sess.end_profiling()


def test_sequences_are_left_out_of_type_shapes_and_sizes() -> None:
    """onnxruntime lists tensors only in input_type_shape / output_type_shape and the byte counts."""
    from onnxpy.tools.profiler import nbytes, type_shape

    seq = [np.zeros(3, np.float32), np.zeros(2, np.float32)]
    x = np.zeros((2, 2), np.int64)
    assert type_shape([seq, x, None]) == [{"int64": [2, 2]}]
    assert nbytes([seq, x]) == 32


def test_trace_readers_count_kernel_events_only() -> None:
    """Older onnxruntime traces also hold _fence_before / _fence_after Node events."""
    events = [
        {"cat": "Node", "name": f"conv{suffix}", "dur": dur, "args": {"op_name": "Conv"}}
        for suffix, dur in (("_fence_before", 1), ("_kernel_time", 10), ("_fence_after", 1))
    ]
    (row,) = time_by_op(events)
    assert (row.calls, row.total_us) == (1, 10)
    assert slowest_nodes(events) == [("conv", "Conv", 1, 10)]


def test_model_given_as_bytes_records_array_loading(tmp_path: Path) -> None:
    so = onnxpy.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "bytes")
    sess = onnxpy.InferenceSession(DEMO_MODEL.read_bytes(), so)
    events = load_trace(sess.end_profiling())
    assert [e["name"] for e in events][:2] == ["model_loading_array", "session_initialization"]


def test_events_stop_at_the_cap_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A session profiled for a long time keeps at most max_events events (onnxruntime's
    profiler stops at its own maximum too), and says so once."""
    so = onnxpy.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = onnxpy.InferenceSession(str(DEMO_MODEL), so)
    profiler = sess._profiler
    assert profiler is not None and profiler.max_events == 1_000_000
    profiler.max_events = 25  # the two session events and a run and a half of nodes
    with caplog.at_level(logging.WARNING, logger="onnxpy"):
        for _ in range(4):
            sess.run(None, {"input": X})
    warned = [r for r in caplog.records if "maximum of 25 events" in r.getMessage()]
    assert len(warned) == 1
    assert profiler.dropped > 0
    events = load_trace(sess.end_profiling())
    assert len(events) == 25
    assert events[0]["name"].startswith("model_loading")


def test_profiled_runs_leave_nothing_for_the_garbage_collector(tmp_path: Path) -> None:
    """A profiled run records numbers and references, not a dict per node: objects the cyclic
    garbage collector tracks stay as many however many runs are recorded, so no collection
    (whose pause a node's time would absorb) is set off by profiling. Recording a dict per node
    added about a dozen tracked objects a node."""
    import gc

    so = onnxpy.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = onnxpy.InferenceSession(str(DEMO_MODEL), so)
    feeds = {"input": X}
    for _ in range(3):  # the first runs describe each node once
        sess.run(None, feeds)
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(100):
        sess.run(None, feeds)
    gc.collect()
    grew = len(gc.get_objects()) - before
    assert grew < 20, f"{grew} more tracked objects after 100 profiled runs"
    profiler = sess._profiler
    assert profiler is not None
    recorded = profiler.events
    nodes = [e for e in recorded if e["cat"] == "Node"]
    assert nodes and len(nodes) % 103 == 0
    assert [e["name"] for e in recorded].count("model_run") == 103
    # Each event is a dict of its own: changing one leaves the others (and the trace) alone.
    first, last = nodes[0], nodes[-len(nodes) // 103]
    assert first["name"] == last["name"] and first["args"] == last["args"]
    first["args"]["input_type_shape"].clear()
    assert last["args"]["input_type_shape"]
    written = [e for e in load_trace(sess.end_profiling()) if e["cat"] == "Node"]
    assert written[0]["name"] == first["name"] and written[0]["args"]["input_type_shape"]
