"""Chrome-trace profiling in onnxruntime's event format (opens in Perfetto / chrome://tracing).

The trace is a JSON array of complete events (``"ph": "X"``), one per line, as onnxruntime
writes them:

- ``cat: "Session"``: ``model_loading_uri`` (or ``model_loading_array``),
  ``session_initialization``, and per run ``SequentialExecutor::Execute`` (the executor's part)
  inside ``model_run``;
- ``cat: "Node"``: one ``<node name>_kernel_time`` per executed node, with ``args`` holding
  ``op_name``, ``provider``, ``node_index``, ``input_type_shape``, ``output_type_shape`` (tensors
  only, as onnxruntime lists them), the byte counts ``output_size``, ``activation_size``,
  ``parameter_size`` (strings, as in onnxruntime) and ``thread_scheduling_stats`` in
  onnxruntime's layout: the running thread, with zero counts (onnxpy has no thread pool to
  report on).

``ts`` and ``dur`` are integer microseconds; ``ts`` counts from the start of profiling, which is
the start of session creation.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..model import dtypes


def _type_name(dt: Any) -> str:
    try:
        return dtypes.ELEM_TO_NAME[dtypes.elem_type(dt)]
    except (ValueError, TypeError, KeyError):
        return str(dt)


def type_shape(values: Iterable[Any]) -> list[dict[str, Any]]:
    """onnxruntime's input_type_shape / output_type_shape entries: ``[{"float": [1, 3]}, ...]``."""
    out: list[dict[str, Any]] = []
    for v in values:
        if v is None or isinstance(v, list):
            continue  # onnxruntime lists tensors only (a sequence has no one type and shape)
        out.append({_type_name(getattr(v, "dtype", None)): [int(d) for d in getattr(v, "shape", ())]})
    return out


def nbytes(values: Iterable[Any]) -> int:
    """Bytes of the tensors among ``values`` (onnxruntime counts no sequence)."""
    return sum(int(getattr(v, "nbytes", 0) or 0) for v in values if v is not None and not isinstance(v, list))


def _thread_stats() -> dict[str, Any]:
    """onnxruntime's thread_scheduling_stats for a node run on the calling thread alone."""
    main = {"thread_pool_name": "", "thread_id": str(threading.get_ident()), "block_size": [], "core": -1}
    main.update(Distribution=0, DistributionEnqueue=0, Run=0, Wait=0, WaitRevoke=0)
    return {"main_thread": main, "sub_threads": {}}


#: events one profiling session keeps, as onnxruntime's profiler (later ones are dropped with
#: one warning): a session profiled for hours otherwise grows without bound (~19 KB a run of a
#: 10-node model)
MAX_EVENTS = 1_000_000


class Profiler:
    """Collects events for one session; ``write()`` saves them and returns the file's path."""

    def __init__(self, prefix: str, start: float | None = None) -> None:
        """``start``: a ``time.perf_counter()`` reading taken when profiling began (default: now)."""
        self.prefix = prefix or "onnxruntime_profile_"  # SessionOptions.profile_file_prefix default
        if start is None:
            start = time.perf_counter()
        self.start_s = start
        # Wall-clock nanoseconds since the epoch (time.time_ns()), as onnxruntime's
        # get_profiling_start_time_ns() returns them.
        self.start_ns = time.time_ns() - int((time.perf_counter() - start) * 1e9)
        now = datetime.datetime.now() - datetime.timedelta(seconds=max(0.0, time.perf_counter() - start))
        self._stamp = now.strftime("%Y-%m-%d_%H-%M-%S") + f"_{now.microsecond // 1000:03d}"
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.max_events = MAX_EVENTS
        self.dropped = 0
        self.pid = os.getpid()

    def _us(self, t: float) -> int:
        return int(round((t - self.start_s) * 1e6))

    def session_event(self, name: str, start: float, end: float, args: dict[str, Any] | None = None) -> None:
        self._add("Session", name, start, end, args or {})

    def node_event(
        self,
        step: Any,
        start: float,
        end: float,
        inputs: list[Any],
        outputs: list[Any],
        provider: str,
        parameter_bytes: int = 0,
    ) -> None:
        """One executed node. ``parameter_bytes``: the part of the inputs that are constants."""
        in_bytes = nbytes(inputs)
        self._add(
            "Node",
            f"{step.node_name or step.op_type + '_' + str(step.index)}_kernel_time",
            start,
            end,
            {
                "op_name": step.op_type,
                "node_index": str(step.index),
                "provider": provider,
                "input_type_shape": type_shape(inputs),
                "output_type_shape": type_shape(outputs),
                "output_size": str(nbytes(outputs)),
                "activation_size": str(in_bytes - parameter_bytes),
                "parameter_size": str(parameter_bytes),
                "thread_scheduling_stats": _thread_stats(),
            },
        )

    def _add(self, cat: str, name: str, start: float, end: float, args: dict[str, Any]) -> None:
        ts = self._us(start)
        event = {
            "cat": cat,
            "pid": self.pid,
            "tid": threading.get_native_id(),
            "dur": max(0, self._us(end) - ts),
            "ts": ts,
            "ph": "X",
            "name": name,
            "args": args,
        }
        with self._lock:
            if len(self._events) < self.max_events:
                self._events.append(event)
                return
            self.dropped += 1
            first = self.dropped == 1
        if first:
            logging.getLogger("onnxpy").warning(
                "profiling: the maximum of %d events is reached; later events are not recorded "
                "(call end_profiling to write the trace)",
                self.max_events,
            )

    @property
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def write(self) -> str:
        """Write ``<prefix>_<date>_<time>.json`` (onnxruntime's naming) and return its path."""
        base = f"{self.prefix}_{self._stamp}"
        path = f"{base}.json"
        n = 1
        while os.path.exists(path):
            path = f"{base}_{n}.json"
            n += 1
        write_trace(path, self.events)
        return path


def write_trace(path: str, events: list[dict[str, Any]]) -> None:
    """A JSON array with one event per line: valid JSON, and diff- and grep-friendly."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(e, separators=(",", ":")) for e in events))
        f.write("\n]\n")


# -- reading traces ------------------------------------------------------------------------------


@dataclass
class OpTime:
    op_type: str
    calls: int
    total_us: int


def load_trace(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    # Both the array form (onnxruntime, onnxpy) and the {"traceEvents": [...]} object form exist.
    return data["traceEvents"] if isinstance(data, dict) else data


def without_first_runs(events: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``events`` less the first ``count`` runs: their ``model_run`` events and every event that
    starts inside one. A first run builds cached forms of the weights (Winograd transforms, say:
    127 ms for one ResNet-50 layer), which would otherwise swamp the per-node averages."""
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda e: e["ts"]
    )
    windows = [(int(e["ts"]), int(e["ts"]) + int(e.get("dur", 0))) for e in runs[: max(0, count)]]
    if not windows:
        return list(events)
    return [e for e in events if not any(lo <= int(e.get("ts", -1)) <= hi for lo, hi in windows)]


def _kernel_event(e: dict[str, Any]) -> bool:
    """A node's run (older onnxruntime versions also wrote _fence_before / _fence_after events)."""
    return e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")


def time_by_op(events: Iterable[dict[str, Any]]) -> list[OpTime]:
    """Node time summed per operator type, slowest first."""
    acc: dict[str, OpTime] = {}
    for e in events:
        if not _kernel_event(e):
            continue
        op = e.get("args", {}).get("op_name", "?")
        t = acc.setdefault(op, OpTime(op, 0, 0))
        t.calls += 1
        t.total_us += int(e.get("dur", 0))
    return sorted(acc.values(), key=lambda t: (-t.total_us, t.op_type))


def slowest_nodes(events: Iterable[dict[str, Any]], top: int = 10) -> list[tuple[str, str, int, int]]:
    """(node event name, op type, calls, total µs) of the nodes that took longest, summed over runs."""
    acc: dict[str, list[Any]] = {}
    for e in events:
        if not _kernel_event(e):
            continue
        name = str(e.get("name", "")).removesuffix("_kernel_time")
        row = acc.setdefault(name, [name, e.get("args", {}).get("op_name", "?"), 0, 0])
        row[2] += 1
        row[3] += int(e.get("dur", 0))
    rows = sorted(acc.values(), key=lambda r: -r[3])
    return [tuple(r) for r in rows[:top]]  # type: ignore[misc]
