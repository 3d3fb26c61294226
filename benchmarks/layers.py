"""Each convolution and pool of a model alone, onnxpy against onnxruntime, in one process.

    python benchmarks/layers.py --models resnet50               # light ResNet-50's layers
    python benchmarks/layers.py --model path/to/model.onnx --flush-mb 0 --top 10
    python benchmarks/layers.py --models squeeze --json layers.json

A whole-model profile says which nodes take onnxpy's time, not which of them onnxruntime does
faster: its node times come from another graph (its NCHWc layouts, its own fusions). Here every
distinct Conv, MaxPool and AveragePool geometry of a model (input shape, weights, attributes, a
ReLU after it) becomes a one-layer model with random weights, and both runtimes run it in one
process, in alternating blocks of calls, each block after settling as bench.py does. By default
a 32 MB pass over another buffer comes before each timed call, because inside a model a layer's
weights and input were last touched a whole run ago (on the development machine data leaves
every cache within milliseconds: docs/benchmark.md, "Reading figures from this machine");
``--flush-mb 0`` times them hot. Layers are listed by the time
onnxpy spends beyond onnxruntime, times how often the geometry occurs. The first use was finding
that 3x3 layers on 7x7 and 14x14 maps spent most of their im2col in numpy's per-run cost.

Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import onnxpy  # noqa: E402 - after making the repository importable
from onnxpy.tools.benchmark import SETTLE_S  # noqa: E402

sys.path.insert(0, str(HERE))
import ab  # noqa: E402 - benchmarks/ab.py: the model list and inputs, as it builds them

OPS = ("Conv", "MaxPool", "AveragePool")


def layers_of(path: str, feeds: dict[str, np.ndarray]) -> Counter:
    """Counter of layer geometries: (op, input shape, weight shape or None, bias, attributes as
    sorted (name, value) pairs, ReLU after it). Shapes come from one profiled run at the basic
    level (constant folding only, so each layer is still its own node)."""
    with tempfile.TemporaryDirectory(prefix="onnxpy_layers_") as tmp:
        so = onnxpy.SessionOptions()
        so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "profile")
        so.optimized_model_filepath = str(Path(tmp) / "basic.onnx")
        sess = onnxpy.InferenceSession(path, so)
        sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
        graph = onnx.load(so.optimized_model_filepath).graph
    nodes = {n.name: n for n in graph.node}
    readers: dict[str, list[str]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    found: Counter = Counter()
    for e in events:
        if e.get("cat") != "Node" or e["args"].get("op_name") not in OPS:
            continue
        node = nodes.get(e["name"].removesuffix("_kernel_time"))
        if node is None:
            continue
        shapes = [tuple(next(iter(s.values()))) for s in e["args"].get("input_type_shape", [])]
        attrs = tuple(sorted((a.name, _hashable(helper.get_attribute_value(a))) for a in node.attribute))
        relu = readers.get(node.output[0], []) == ["Relu"]
        w = shapes[1] if node.op_type == "Conv" else None
        found[(node.op_type, shapes[0], w, node.op_type == "Conv" and len(shapes) > 2, attrs, relu)] += 1
    return found


def _hashable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    return tuple(v) if isinstance(v, list) else v


def layer_model(layer: tuple, seed: int) -> bytes:
    """The layer alone: its op on an input of its shape, random weights, a ReLU if one followed."""
    op, x_shape, w_shape, bias, attrs, relu = layer
    rng = np.random.default_rng(seed)
    inits, inputs = [], ["x"]
    if w_shape is not None:
        inits.append(numpy_helper.from_array((rng.standard_normal(w_shape) * 0.1).astype(np.float32), "w"))
        inputs.append("w")
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b"))
            inputs.append("b")
    nodes = [helper.make_node(op, inputs, ["y0"], **{k: list(v) if isinstance(v, tuple) else v for k, v in attrs})]
    nodes.append(helper.make_node("Relu" if relu else "Identity", ["y0"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def time_layer(layer: tuple, args: argparse.Namespace, flush: np.ndarray | None) -> dict:
    model = layer_model(layer, args.seed)
    import onnxruntime as ort  # a benchmark dependency only, as in bench.py

    ours = onnxpy.InferenceSession(model)
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = {"x": np.random.default_rng(args.seed + 1).standard_normal(layer[1]).astype(np.float32)}
    want, got = theirs.run(None, x)[0], ours.run(None, x)[0]
    rel = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))
    calls = (lambda: ours.run(None, x), lambda: theirs.run(None, x))
    for _ in range(args.warmup):
        for call in calls:
            call()
    # As bench.py times whole models (onnxpy/tools/benchmark.py, time_interleaved): per round,
    # each runtime first makes untimed calls for SETTLE_S so that the other's thread pool has
    # stopped spinning, then a block of timed calls. Timed right after the other runtime's call,
    # either ran 5-40x slower now and then (a 1x1 convolution: 0.6 ms, or 20 ms).
    times: tuple[list[float], list[float]] = ([], [])
    clock = time.perf_counter
    rounds = -(-args.pairs // args.block)
    for r in range(rounds):
        for side in (0, 1) if r % 2 else (1, 0):
            settle_end = clock() + SETTLE_S
            calls[side]()
            while clock() < settle_end:
                calls[side]()
            for _ in range(min(args.block, args.pairs - len(times[side]))):
                if flush is not None:
                    np.add(flush, 1.0, out=flush)
                t = clock()
                calls[side]()
                times[side].append(clock() - t)
    a, b = np.array(times[0]), np.array(times[1])
    return {
        "onnxpy_us": float(np.median(a) * 1e6),
        "onnxruntime_us": float(np.median(b) * 1e6),
        "pair_ratio": float(np.median(a / b)),  # calls of the same place in their blocks
        "max_rel_diff": rel,
    }


def describe(layer: tuple) -> str:
    op, x_shape, w_shape, bias, attrs, relu = layer
    a = dict(attrs)
    parts = [op, "x".join(map(str, x_shape[1:]))]
    if w_shape is not None:
        parts.append(f"-> {w_shape[0]}, {w_shape[2]}x{w_shape[3]}" if len(w_shape) == 4 else f"-> {w_shape[0]}")
        if a.get("group", 1) != 1:
            parts.append(f"group {a['group']}")
    elif "kernel_shape" in a:
        parts.append("x".join(map(str, a["kernel_shape"])))
    if any(s != 1 for s in a.get("strides", ())):
        parts.append("/" + "x".join(map(str, a["strides"])))
    if any(d != 1 for d in a.get("dilations", ())):
        parts.append("dil " + "x".join(map(str, a["dilations"])))
    if relu:
        parts.append("+relu")
    return " ".join(parts)


def report(name: str, rows: list[dict], top: int) -> str:
    lines = [f"{name}: {len(rows)} layer geometries, worst first by count x (onnxpy - onnxruntime)"]
    lines.append(f"  {'layer':<44} {'n':>3} {'onnxpy us':>10} {'ort us':>9} {'pair':>6} {'excess us':>10}  rel diff")
    for r in sorted(rows, key=lambda r: -r["excess_us"])[:top]:
        lines.append(
            f"  {r['layer']:<44} {r['count']:3d} {r['onnxpy_us']:10.0f} {r['onnxruntime_us']:9.0f} "
            f"{r['pair_ratio']:6.2f} {r['excess_us']:10.0f}  {r['max_rel_diff']:.1e}"
        )
    a = sum(r["count"] * r["onnxpy_us"] for r in rows)
    b = sum(r["count"] * r["onnxruntime_us"] for r in rows)
    if b > 0:
        lines.append(f"  all layers, each as often as the model has it: onnxpy {a / 1e3:.2f} ms, onnxruntime "
                     f"{b / 1e3:.2f} ms, ratio {a / b:.2f}")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ab.add_model_options(p)
    p.add_argument("--model", action="append", default=[], metavar="PATH", help="a model file (repeatable)")
    p.add_argument("--pairs", type=int, default=30, help="timed calls of each runtime per layer (default 30)")
    p.add_argument("--block", type=int, default=5, help="timed calls per block, after settling (default 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls of each first (default 3)")
    p.add_argument("--flush-mb", type=float, default=32.0, help="MB passed over before each call (0: hot)")
    p.add_argument("--top", type=int, default=15, help="layers listed per model (default 15)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    if args.pairs < 1 or args.block < 1 or args.warmup < 0 or args.flush_mb < 0 or args.top < 1:
        p.error("--pairs, --block and --top must be at least 1, --warmup and --flush-mb at least 0")
    args.transformers = args.random_weights = args.quantized = args.half = False  # read by bench.collect_models
    return args


def _models(args: argparse.Namespace, workdir: str) -> list[tuple[str, str, dict[str, np.ndarray]]]:
    models = []
    if not args.model or args.models:
        for name, path, feeds_path in ab.prepare_models(args, workdir):
            with np.load(feeds_path) as npz:
                models.append((name, path, {k: npz[k] for k in npz.files}))
    bench = ab._bench_module()
    for path in args.model:
        header = onnx.load(path, load_external_data=False)
        feeds = bench.make_feeds(header, dims=bench.free_dims(header, args.seq), batch=1, seed=args.seed)
        models.append((Path(path).stem, path, dict(feeds.arrays)))
    return models


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    flush = np.ones(int(args.flush_mb * (1 << 20)) // 4, dtype=np.float32) if args.flush_mb else None
    result: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="onnxpy_layers_models_") as workdir:
        for name, path, feeds in _models(args, workdir):
            found = layers_of(path, feeds)
            rows = []
            for layer, count in found.items():
                row = {"layer": describe(layer), "count": count, **time_layer(layer, args, flush)}
                row["excess_us"] = count * (row["onnxpy_us"] - row["onnxruntime_us"])
                rows.append(row)
            result[name] = rows
            print(report(name, rows, args.top) if rows else f"{name}: no Conv, MaxPool or AveragePool", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"flush_mb": args.flush_mb, "models": result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
