"""Chrome-trace profiling in onnxruntime's event format (opens in Perfetto / chrome://tracing)."""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
from typing import Any

from ..model import dtypes


def type_shape(values: list[Any]) -> list[dict[str, Any]]:
    """onnxruntime's input_type_shape / output_type_shape entries: [{"float": [1, 3]}, ...]."""
    out: list[dict[str, Any]] = []
    for v in values:
        if v is None:
            continue
        if isinstance(v, list):
            out.append({"sequence": len(v)})
            continue
        dt = getattr(v, "dtype", None)
        try:
            name = dtypes.ELEM_TO_NAME[dtypes.elem_type(dt)]
        except (ValueError, TypeError):
            name = str(dt)
        out.append({name: [int(d) for d in getattr(v, "shape", ())]})
    return out


class Profiler:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix or "onnxpy_profile_"
        self.start_ns = time.perf_counter_ns()
        self._wall_start = datetime.datetime.now()
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.pid = os.getpid()

    def _us(self, t: float) -> int:
        return int((t * 1e9 - self.start_ns) / 1000)

    def session_event(self, name: str, start: float, end: float) -> None:
        self._add(
            {"cat": "Session", "name": name, "ts": self._us(start), "dur": max(0, int((end - start) * 1e6)), "args": {}}
        )

    def node_event(
        self, step: Any, start: float, end: float, inputs: list[Any], outputs: list[Any], provider: str
    ) -> None:
        self._add(
            {
                "cat": "Node",
                "name": f"{step.node_name or step.op_type + '_' + str(step.index)}_kernel_time",
                "ts": self._us(start),
                "dur": max(0, int((end - start) * 1e6)),
                "args": {
                    "op_name": step.op_type,
                    "node_index": str(step.index),
                    "provider": provider,
                    "input_type_shape": type_shape(inputs),
                    "output_type_shape": type_shape(outputs),
                },
            }
        )

    def _add(self, event: dict[str, Any]) -> None:
        event.update({"ph": "X", "pid": self.pid, "tid": threading.get_ident() % (1 << 31)})
        with self._lock:
            self._events.append(event)

    @property
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def write(self) -> str:
        stamp = self._wall_start.strftime("%Y-%m-%d_%H-%M-%S")
        path = f"{self.prefix}{stamp}.json"
        n = 1
        while os.path.exists(path):
            path = f"{self.prefix}{stamp}_{n}.json"
            n += 1
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.events, f, indent=0)
        return path
