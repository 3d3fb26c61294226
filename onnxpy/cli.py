"""The ``onnxpy`` command. With no arguments it runs the embedded demo model.

Verbs (``onnxpy VERB --help``): info, run, bench, profile (onnxpy.tools.commands) and demo.
Exit status: 0 success, 1 the model failed to load or run, 2 a command-line mistake.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np


def demo_model_path() -> Path:
    return Path(str(resources.files("onnxpy") / "data" / "demo.onnx"))


def run_demo(repeat: int = 20) -> int:
    import onnxpy as ort

    path = demo_model_path()
    sess = ort.InferenceSession(str(path))
    meta = sess.get_modelmeta()
    print(f"onnxpy {ort.__version__} - demo model {path.name} ({meta.graph_name}, producer {meta.producer_name})")
    print(f"providers: {sess.get_providers()}")
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
        print(f"input  {arg.name}: {arg.type} declared {arg.shape}, fed {shape}")
    outputs = sess.run(None, feeds)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    for arg, out in zip(sess.get_outputs(), outputs):
        top = int(np.argmax(out[0]))
        print(
            f"output {arg.name}: {arg.type} shape {list(out.shape)}; class {top} with p={out[0, top]:.4f}, sum={out[0].sum():.4f}"
        )
    print(f"latency: median {np.median(times) * 1e3:.3f} ms, min {np.min(times) * 1e3:.3f} ms over {repeat} runs")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return run_demo()
    parser = argparse.ArgumentParser(
        prog="onnxpy", description="Run, inspect, benchmark and profile ONNX models with onnxpy."
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    demo = sub.add_parser("demo", help="run the embedded demo model (the default)")
    demo.add_argument("--repeat", type=int, default=20)
    from .api.errors import OnnxpyError
    from .tools import commands

    commands.add_verbs(sub)
    ns = parser.parse_args(args)
    if ns.verb == "demo":
        return run_demo(ns.repeat)
    try:
        return int(ns.func(ns) or 0)
    except commands.UsageError as e:
        parser.exit(2, f"onnxpy {ns.verb}: error: {commands.format_error(e)}\n")
    except (OnnxpyError, ValueError) as e:
        # Session creation and kernel errors already name the node and the problem; with
        # ONNXPY_DEBUG set the traceback is shown too.
        if os.environ.get("ONNXPY_DEBUG"):
            raise
        print(f"onnxpy {ns.verb}: {commands.format_error(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"onnxpy {ns.verb}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
