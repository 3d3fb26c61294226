"""The ``onnxpy`` command. With no arguments it runs the embedded demo model.

Verbs (``onnxpy VERB --help``): info, run, bench, profile (onnxpy.tools.commands) and demo.
Exit status: 0 success, 1 the model failed to load or run, 2 a command-line mistake, 141 the
reader of the output went away (``onnxpy info m.onnx | head``).
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

#: the status a shell reports for a writer killed by SIGPIPE (128 + 13)
EXIT_BROKEN_PIPE = 141


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
    try:
        status = _main(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # a closed pipe shows here rather than at interpreter exit
        return status
    except BrokenPipeError:
        # The reader (``| head``) has all it wanted. Point stdout at devnull so that Python's
        # final flush does not fail a second time, and leave without a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(args: list[str]) -> int:
    if not args:
        return run_demo()
    from . import __version__
    from .api.errors import OnnxpyError
    from .tools import commands

    parser = argparse.ArgumentParser(
        prog="onnxpy", description="Run, inspect, benchmark and profile ONNX models with onnxpy."
    )
    parser.add_argument("--version", action="version", version=f"onnxpy {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True)
    demo = sub.add_parser("demo", help="run the embedded demo model (the default)")
    demo.add_argument(
        "--repeat", type=commands.int_at_least(1), default=20, metavar="N", help="timed runs (default 20)"
    )
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
