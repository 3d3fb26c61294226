"""onnxpy and onnxruntime on a machine whose cores other processes keep busy.

    python benchmarks/contention.py [MODEL ...] [--busy N] [--seconds S]

For each model, latency is measured twice: on the machine as it is, then with N processes
spinning (default: one per core). In each condition three runtimes take turns in blocks of
calls: onnxruntime, onnxpy as it is (runtime/contention.py gives its runs one BLAS thread
while they find the cores taken), and onnxpy with that watch turned off (OpenBLAS's full pool
whatever the load). Prints median and p90 per runtime and the ratios to onnxruntime. A
benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxpy  # noqa: E402
from onnxpy.runtime import contention  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "models"


def _spin(stop: Any) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


def _feeds(sess: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else (1 if k == 0 else 128) for k, d in enumerate(i.shape)]
        if "int" in i.type:
            feeds[i.name] = np.ones(shape, dtype=np.int64 if "int64" in i.type else np.int32)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _measure(runners: dict[str, Any], seconds: float) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in runners}
    for run in runners.values():
        run()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for name, run in runners.items():
            block_end = time.perf_counter() + 0.2
            while time.perf_counter() < block_end:
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
    return times


def _runners(path: str) -> dict[str, Any]:
    import onnxruntime

    ort = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    ours = onnxpy.InferenceSession(path)
    feeds = _feeds(ort)

    # Each onnxpy runner has its own watch, swapped in for its calls: the runners take turns,
    # and one's state must not reset the other's.
    watch, off = contention.BlasContention(), contention.BlasContention()
    off._active = False

    def with_watch(w: contention.BlasContention) -> Any:
        def run() -> None:
            contention.WATCH = w
            ours.run(None, feeds)

        return run

    watched, unwatched = with_watch(watch), with_watch(off)

    return {
        "onnxruntime": lambda: ort.run(None, feeds),
        "onnxpy": watched,
        "onnxpy, watch off": unwatched,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="default: the shared MobileNet-v2 and SqueezeNet 1.1")
    p.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="spinning processes (default: one per core)")
    p.add_argument("--seconds", type=float, default=6.0, help="timed seconds per model and condition")
    args = p.parse_args(argv)
    models = args.models or [str(SHARED / m) for m in ("mobilenet_v2.onnx", "squeezenet1_1.onnx")]
    print(f"{os.cpu_count()} cores; busy condition: {args.busy} spinning processes")
    print(f"{'model':24s} {'condition':9s} {'runtime':18s} {'median ms':>9s} {'p90 ms':>8s} {'x ort':>6s}")
    for path in models:
        runners = _runners(path)
        for condition in ("idle", "busy"):
            stop = multiprocessing.Event()
            spinners = []
            if condition == "busy":
                spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
                for s in spinners:
                    s.start()
                time.sleep(0.5)
            try:
                times = _measure(runners, args.seconds)
            finally:
                stop.set()
                for s in spinners:
                    s.join()
            base = float(np.median(times["onnxruntime"]))
            for name, t in times.items():
                med, p90 = float(np.median(t)), float(np.percentile(t, 90))
                print(
                    f"{Path(path).stem:24s} {condition:9s} {name:18s} {med * 1e3:9.2f} {p90 * 1e3:8.2f} {med / base:6.2f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
