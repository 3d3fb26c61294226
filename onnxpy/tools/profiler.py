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


def _thread_stats(thread: int) -> dict[str, Any]:
    """onnxruntime's thread_scheduling_stats for a node run on one thread (``threading.get_ident()``) alone."""
    main = {"thread_pool_name": "", "thread_id": str(thread), "block_size": [], "core": -1}
    main.update(Distribution=0, DistributionEnqueue=0, Run=0, Wait=0, WaitRevoke=0)
    return {"main_thread": main, "sub_threads": {}}


def _signature(values: list[Any]) -> tuple[Any, ...]:
    """What a node's profile entry says about ``values``: each one's dtype and shape (numpy's
    shape tuples compare by value)."""
    return tuple((getattr(v, "dtype", None), getattr(v, "shape", None)) if v is not None else None for v in values)


class _NodeArgs:
    """One node's event name and the inputs and outputs an event's ``args`` describe, kept as
    numbers and names; ``build`` makes the args dict."""

    __slots__ = (
        "name",
        "op_type",
        "index",
        "provider",
        "thread",
        "parameter_bytes",
        "ins",
        "outs",
        "in_bytes",
        "out_bytes",
    )

    def __init__(
        self,
        name: str,
        op_type: str,
        index: int,
        provider: str,
        thread: int,
        parameter_bytes: int,
        inputs: list[Any],
        outputs: list[Any],
    ) -> None:
        self.name = name
        self.op_type = op_type
        self.index = index
        self.provider = provider
        self.thread = thread
        self.parameter_bytes = parameter_bytes
        self.ins = type_shape(inputs)
        self.outs = type_shape(outputs)
        self.in_bytes = nbytes(inputs)
        self.out_bytes = nbytes(outputs)

    def build(self) -> dict[str, Any]:
        return {
            "op_name": self.op_type,
            "node_index": str(self.index),
            "provider": self.provider,
            "input_type_shape": [{k: list(v) for k, v in d.items()} for d in self.ins],
            "output_type_shape": [{k: list(v) for k, v in d.items()} for d in self.outs],
            "output_size": str(self.out_bytes),
            "activation_size": str(self.in_bytes - self.parameter_bytes),
            "parameter_size": str(self.parameter_bytes),
            "thread_scheduling_stats": _thread_stats(self.thread),
        }


#: events one profiling session keeps, as onnxruntime's profiler (later ones are dropped with
#: one warning): a session profiled for hours otherwise grows without bound (~19 KB a run of a
#: 10-node model)
MAX_EVENTS = 1_000_000


class Profiler:
    """Collects events for one session; ``write()`` saves them and returns the file's path.

    A run records into flat lists: names, clock readings (floats) and, per node, a reference to
    a shared description of its inputs and outputs, made once per distinct (node, thread, types
    and shapes). The event dicts are built only when the trace is read or written. Recording a
    dict per node (with its type and shape lists) kept a dozen new containers alive per node,
    so Python's cyclic garbage collector ran inside profiled runs and each full collection
    traversed every event recorded so far: ShuffleNet's profile showed one grouped 1x1
    convolution at 671 us instead of its 112 (28 collections in 20 runs, one of 15 ms)."""

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
        # One entry per event in each list.
        self._names: list[str] = []
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._tids: list[int] = []
        # A Session event's args (a dict, or None for none) or a node's _NodeArgs.
        self._args: list[Any] = []
        self._node_args: dict[tuple[Any, ...], _NodeArgs] = {}
        self._lock = threading.Lock()
        self.max_events = MAX_EVENTS
        self.dropped = 0
        self.pid = os.getpid()

    def _us(self, t: float) -> int:
        return int(round((t - self.start_s) * 1e6))

    def session_event(self, name: str, start: float, end: float, args: dict[str, Any] | None = None) -> None:
        self._add(name, start, end, args or None)

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
        thread = threading.get_ident()
        key = (step.index, thread, provider, parameter_bytes, _signature(inputs), _signature(outputs))
        args = self._node_args.get(key)
        if args is None:
            name = f"{step.node_name or step.op_type + '_' + str(step.index)}_kernel_time"
            args = _NodeArgs(name, step.op_type, step.index, provider, thread, parameter_bytes, inputs, outputs)
            with self._lock:
                args = self._node_args.setdefault(key, args)
        self._add(args.name, start, end, args)

    def _add(self, name: str, start: float, end: float, args: Any) -> None:
        tid = threading.get_native_id()
        with self._lock:
            if len(self._names) < self.max_events:
                self._names.append(name)
                self._starts.append(start)
                self._ends.append(end)
                self._tids.append(tid)
                self._args.append(args)
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
        """The events recorded so far, as fresh dicts in onnxruntime's format."""
        with self._lock:
            rows = list(zip(self._names, self._starts, self._ends, self._tids, self._args, strict=True))
        events = []
        for name, start, end, tid, args in rows:
            ts = self._us(start)
            node = isinstance(args, _NodeArgs)
            events.append(
                {
                    "cat": "Node" if node else "Session",
                    "pid": self.pid,
                    "tid": tid,
                    "dur": max(0, self._us(end) - ts),
                    "ts": ts,
                    "ph": "X",
                    "name": name,
                    "args": args.build() if node else dict(args or {}),
                }
            )
        return events

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
