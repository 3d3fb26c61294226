"""Single operators against onnxruntime: each as a one-node model, both runtimes in one process.

    python benchmarks/ops.py                        # every case at its working size
    python benchmarks/ops.py --ops Cast Softmax --json ops.json
    python benchmarks/ops.py --tiny --rounds 1      # every case on small inputs (a smoke run)
    python benchmarks/ops.py --against ops.json     # beside an earlier run's ratios

The model benchmark (bench.py) says how far a whole network is from onnxruntime; this says
which operators are, one at a time, on the shapes they usually meet (a 128 x 512 activation
matrix, a 64 x 56 x 56 feature map, a 32-step sequence). Both runtimes alternate in settled
blocks of calls (as bench.py times them); each row gives both medians, their ratio and whether
the outputs agree. The summary lists the operators above OUTLIER times onnxruntime's: where a
later night can look first. A one-node model also times the run's fixed costs (feeding,
fetching, the output's allocation), which onnxruntime pays too.

Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from onnxpy.tools.benchmark import (  # noqa: E402
    SessionConfig,
    compare_outputs,
    machine_summary,
    make_contender,
    time_interleaved,
)

#: ratios (onnxpy / onnxruntime) above this are listed as outliers
OUTLIER = 3.0

Maker = Callable[[np.random.Generator, "Sizes"], np.ndarray]


@dataclass(frozen=True)
class Sizes:
    """The working shapes; --tiny shrinks them for a smoke run."""

    rows: int = 128
    cols: int = 512
    channels: int = 64
    side: int = 56
    steps: int = 32

    @property
    def mat(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def img(self) -> tuple[int, int, int, int]:
        return (1, self.channels, self.side, self.side)


FULL = Sizes()
TINY = Sizes(rows=4, cols=16, channels=8, side=6, steps=3)


def _normal(scale: float = 1.0, shift: float = 0.0, shape: str = "mat") -> Maker:
    def make(rng: np.random.Generator, s: Sizes) -> np.ndarray:
        return (rng.standard_normal(getattr(s, shape)) * scale + shift).astype(np.float32)

    return make


def _positive(shape: str = "mat") -> Maker:
    def make(rng: np.random.Generator, s: Sizes) -> np.ndarray:
        return (np.abs(rng.standard_normal(getattr(s, shape))) + 0.5).astype(np.float32)

    return make


def _as(dtype: Any, scale: float = 1.0) -> Maker:
    def make(rng: np.random.Generator, s: Sizes) -> np.ndarray:
        return (rng.standard_normal(s.mat) * scale).astype(dtype)

    return make


def _bytes(rng: np.random.Generator, s: Sizes) -> np.ndarray:
    return rng.integers(0, 256, s.mat).astype(np.uint8)


def _row_ints(high: Callable[[Sizes], int], cols: Callable[[Sizes], int]) -> Maker:
    def make(rng: np.random.Generator, s: Sizes) -> np.ndarray:
        return rng.integers(0, high(s), (s.rows, cols(s))).astype(np.int64)

    return make


@dataclass
class Case:
    name: str
    op_type: str
    #: graph inputs: name -> maker (fed each call)
    inputs: dict[str, Maker]
    #: attributes; a callable one is a function of the sizes
    attrs: dict[str, Any] = field(default_factory=dict)
    #: constant inputs: name -> maker (initializers, after the graph inputs); "" an omitted one
    constants: dict[str, Maker] = field(default_factory=dict)
    #: the node's input order where it is not graph inputs, then constants
    order: tuple[str, ...] | None = None
    outputs: int = 1
    opset: int = 20


def _const(value: Any, dtype: Any = np.int64) -> Maker:
    return lambda rng, s: np.asarray(value(s) if callable(value) else value, dtype=dtype)


def _weights(shape: Callable[[Sizes], tuple[int, ...]], scale: float = 0.1) -> Maker:
    return lambda rng, s: (rng.standard_normal(shape(s)) * scale).astype(np.float32)


def _positive_vector(rng: np.random.Generator, s: Sizes) -> np.ndarray:
    return (np.abs(rng.standard_normal(s.channels)) + 0.5).astype(np.float32)


X = {"x": _normal()}
IMG = {"x": _normal(shape="img")}


def _unary(op: str, make: Maker | None = None, **attrs: Any) -> Case:
    return Case(op, op, {"x": make or _normal()}, attrs)


CASES: tuple[Case, ...] = (
    # elementwise
    *(_unary(op) for op in ("Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Gelu", "Softplus", "Mish", "HardSwish")),
    _unary("Log", _positive()),
    _unary("Sqrt", _positive()),
    _unary("Round"),
    Case("Gelu(tanh)", "Gelu", X, {"approximate": "tanh"}, opset=20),
    Case("Add", "Add", {"x": _normal(), "y": _normal()}),
    Case("Add row vector", "Add", {"x": _normal()}, constants={"b": lambda r, s: r.standard_normal(s.cols).astype(np.float32)}),
    Case("Mul", "Mul", {"x": _normal(), "y": _normal()}),
    Case("Div", "Div", {"x": _normal(), "y": _positive()}),
    Case("Pow^2", "Pow", X, constants={"e": _const(2.0, np.float32)}),
    Case("Clip", "Clip", X, constants={"lo": _const(-1.0, np.float32), "hi": _const(1.0, np.float32)}),
    Case("Where", "Where", {"c": lambda r, s: r.random(s.mat) > 0.5, "x": _normal(), "y": _normal()}),
    # casts
    Case("Cast to float16", "Cast", X, {"to": TensorProto.FLOAT16}),
    Case("Cast from float16", "Cast", {"x": _as(np.float16)}, {"to": TensorProto.FLOAT}),
    Case("Cast to int64", "Cast", {"x": _normal(100.0)}, {"to": TensorProto.INT64}),
    Case("QuantizeLinear", "QuantizeLinear", X, constants={"s": _const(0.02, np.float32), "z": _const(128, np.uint8)}),
    Case(
        "DequantizeLinear",
        "DequantizeLinear",
        {"x": _bytes},
        constants={"s": _const(0.02, np.float32), "z": _const(128, np.uint8)},
    ),
    # rows
    Case("Softmax", "Softmax", X, {"axis": -1}),
    Case("Softmax axis 0", "Softmax", X, {"axis": 0}),
    Case("LogSoftmax", "LogSoftmax", X, {"axis": -1}),
    Case(
        "LayerNormalization",
        "LayerNormalization",
        X,
        {"axis": -1},
        constants={"scale": _weights(lambda s: (s.cols,)), "bias": _weights(lambda s: (s.cols,))},
        opset=17,
    ),
    Case("ReduceSum rows", "ReduceSum", X, constants={"a": _const([1])}),
    Case("ReduceMax rows", "ReduceMax", X, constants={"a": _const([1])}),
    Case("ReduceMean columns", "ReduceMean", X, constants={"a": _const([0])}),
    Case("ArgMax rows", "ArgMax", X, {"axis": 1}),
    Case("ArgMax columns", "ArgMax", X, {"axis": 0}),
    Case("CumSum rows", "CumSum", X, constants={"a": _const(1)}),
    Case("CumSum columns", "CumSum", X, constants={"a": _const(0)}),
    Case("TopK 5", "TopK", X, {"axis": 1}, constants={"k": _const([5])}, outputs=2),
    Case("Hardmax", "Hardmax", X),
    Case("Trilu", "Trilu", X),
    # data movement
    Case("Transpose", "Transpose", X, {"perm": [1, 0]}),
    Case("Transpose NCHW->NHWC", "Transpose", IMG, {"perm": [0, 2, 3, 1]}),
    Case("Concat", "Concat", {"x": _normal(), "y": _normal()}, {"axis": 1}),
    Case("Split", "Split", X, {"axis": 1, "num_outputs": 4}, outputs=4),
    Case("Slice", "Slice", X, constants={"b": _const([1]), "e": _const([-1]), "a": _const([1])}),
    Case("Pad", "Pad", IMG, constants={"p": _const([0, 0, 1, 1, 0, 0, 1, 1])}),
    Case("Gather rows", "Gather", X, constants={"i": lambda r, s: r.integers(0, s.rows, s.rows // 2)}),
    Case(
        "GatherElements",
        "GatherElements",
        {"x": _normal(), "i": _row_ints(lambda s: s.cols, lambda s: s.cols // 8)},
        {"axis": 1},
    ),
    Case("Expand", "Expand", {"x": lambda r, s: r.standard_normal((1, s.cols)).astype(np.float32)}, constants={"shape": _const(lambda s: [s.rows, s.cols])}),
    Case("Tile", "Tile", {"x": _normal()}, constants={"r": _const([2, 1])}),
    Case("DepthToSpace", "DepthToSpace", IMG, {"blocksize": 2}),
    Case("Resize nearest 2x", "Resize", IMG, {"mode": "nearest"}, constants={"": _const([]), "sc": _const([1, 1, 2, 2], np.float32)}, order=("x", "", "sc")),
    Case("Resize linear 2x", "Resize", IMG, {"mode": "linear"}, constants={"": _const([]), "sc": _const([1, 1, 2, 2], np.float32)}, order=("x", "", "sc")),
    # spatial
    Case("Conv 3x3", "Conv", IMG, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, constants={"w": _weights(lambda s: (s.channels, s.channels, 3, 3))}),
    Case("Conv 1x1", "Conv", IMG, {"kernel_shape": [1, 1]}, constants={"w": _weights(lambda s: (2 * s.channels, s.channels, 1, 1))}),
    Case("Conv depthwise 3x3", "Conv", IMG, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": lambda s: s.channels}, constants={"w": _weights(lambda s: (s.channels, 1, 3, 3))}),
    Case("ConvTranspose 2x", "ConvTranspose", IMG, {"kernel_shape": [2, 2], "strides": [2, 2]}, constants={"w": _weights(lambda s: (s.channels, s.channels // 2, 2, 2))}),
    Case("MaxPool 3x3/2", "MaxPool", IMG, {"kernel_shape": [3, 3], "strides": [2, 2]}),
    Case("AveragePool 3x3", "AveragePool", IMG, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    Case("GlobalAveragePool", "GlobalAveragePool", IMG),
    Case("BatchNormalization", "BatchNormalization", IMG, constants={n: _positive_vector for n in ("s", "b", "m", "v")}),
    Case("InstanceNormalization", "InstanceNormalization", IMG, constants={"s": _positive_vector, "b": _positive_vector}),
    Case("LRN", "LRN", IMG, {"size": 5}),
    # products and sequences
    Case("MatMul", "MatMul", X, constants={"w": _weights(lambda s: (s.cols, s.cols))}),
    Case("Gemm", "Gemm", X, {"transB": 1}, constants={"w": _weights(lambda s: (s.cols, s.cols)), "b": _weights(lambda s: (s.cols,))}),
    Case("Einsum batched", "Einsum", {"a": lambda r, s: r.standard_normal((8, s.rows // 2, s.cols // 4)).astype(np.float32), "b": lambda r, s: r.standard_normal((8, s.cols // 4, s.rows // 2)).astype(np.float32)}, {"equation": "bij,bjk->bik"}),
    Case("LSTM", "LSTM", {"x": lambda r, s: r.standard_normal((s.steps, 1, 64)).astype(np.float32)}, {"hidden_size": 128}, constants={"w": _weights(lambda s: (1, 512, 64)), "r": _weights(lambda s: (1, 512, 128))}),
    Case("GRU", "GRU", {"x": lambda r, s: r.standard_normal((s.steps, 1, 64)).astype(np.float32)}, {"hidden_size": 128}, constants={"w": _weights(lambda s: (1, 384, 64)), "r": _weights(lambda s: (1, 384, 128))}),
)  # fmt: skip


def build(case: Case, sizes: Sizes, seed: int = 0) -> tuple[bytes, dict[str, np.ndarray]]:
    """``case`` as a one-node model on ``sizes``, and its feeds."""
    rng = np.random.default_rng(seed)
    feeds = {name: make(rng, sizes) for name, make in case.inputs.items()}
    inits = [numpy_helper.from_array(make(rng, sizes), name) for name, make in case.constants.items() if name]
    names = list(case.order) if case.order else [*case.inputs, *case.constants]
    outs = [f"y{i}" for i in range(case.outputs)]
    attrs = {k: v(sizes) if callable(v) else v for k, v in case.attrs.items()}
    node = helper.make_node(case.op_type, names, outs, **attrs)
    graph = helper.make_graph(
        [node],
        "ops",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = min(model.ir_version, 10)  # what onnxruntime 1.2x reads
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return model.SerializeToString(), feeds


def measure(case: Case, sizes: Sizes, rounds: int, block: int, seed: int) -> dict[str, Any]:
    """Both runtimes' median ms on ``case``, their ratio and whether the outputs agree."""
    model, feeds = build(case, sizes, seed)
    contenders = [make_contender(name, model, feeds, SessionConfig()) for name in ("onnxpy", "onnxruntime")]
    check = compare_outputs(contenders[0].outputs, contenders[1].outputs)
    times = time_interleaved(contenders, repeat=rounds, block=block)
    med = {name: float(np.median(t)) * 1e3 for name, t in times.items()}
    return {
        "case": case.name,
        "op_type": case.op_type,
        "onnxpy_ms": med["onnxpy"],
        "onnxruntime_ms": med["onnxruntime"],
        "ratio": med["onnxpy"] / med["onnxruntime"],
        "agree": check.agree,
        "max_rel_diff": check.max_rel,
    }


def earlier_ratios(path: str) -> dict[str, float]:
    """The ratio of each case in an earlier run's JSON (--json), by case name."""
    rows = json.loads(Path(path).read_text())["rows"]
    return {r["case"]: float(r["ratio"]) for r in rows}


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", nargs="+", metavar="NAME", help="only cases whose name contains one of these")
    ap.add_argument("--tiny", action="store_true", help="small inputs (a smoke run, not a measurement)")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds per case (default 4)")
    ap.add_argument("--block", type=int, default=8, help="timed calls per block (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--against", metavar="FILE", help="an earlier run's JSON: its ratios beside these")
    args = ap.parse_args(argv)
    if min(args.rounds, args.block) < 1:
        ap.error("--rounds and --block must be at least 1")
    try:
        before = earlier_ratios(args.against) if args.against else {}
    except (OSError, ValueError, KeyError, TypeError) as e:
        ap.error(f"--against {args.against}: not a JSON file this script wrote ({e})")
    cases = [c for c in CASES if not args.ops or any(p.lower() in c.name.lower() for p in args.ops)]
    if not cases:
        ap.error(f"no case matches {args.ops}; cases: {', '.join(c.name for c in CASES)}")
    sizes = TINY if args.tiny else FULL
    earlier = f" {'before':>7}" if before else ""
    print(f"{'case':<26} {'onnxpy ms':>10} {'ort ms':>9} {'ratio':>6}{earlier}  outputs")
    rows = []
    for case in cases:
        row = measure(case, sizes, args.rounds, args.block, args.seed)
        rows.append(row)
        agree = "agree" if row["agree"] else f"DIFFER (max rel {row['max_rel_diff']:.1e})"
        was = ""
        if before:
            was = f" {before[case.name]:6.2f}x" if case.name in before else f" {'-':>7}"
        print(
            f"{row['case']:<26} {row['onnxpy_ms']:10.4f} {row['onnxruntime_ms']:9.4f} {row['ratio']:5.2f}x{was}  {agree}"
        )
        sys.stdout.flush()
    ratios = [r["ratio"] for r in rows]
    outliers = sorted((r for r in rows if r["ratio"] > OUTLIER), key=lambda r: -r["ratio"])
    print(f"\n{len(rows)} cases: geometric mean of ratios {geometric_mean(ratios):.2f}x, worst {max(ratios):.2f}x")
    listed = ", ".join(f"{r['case']} {r['ratio']:.1f}x" for r in outliers) or "none"
    print(f"over {OUTLIER:g}x onnxruntime's time: {listed}")
    shared = [r for r in rows if r["case"] in before]
    if shared:
        then = geometric_mean([before[r["case"]] for r in shared])
        now = geometric_mean([r["ratio"] for r in shared])
        both = f"{len(shared)} case{'s' if len(shared) != 1 else ''} in both"
        print(f"against {args.against} ({both}): geometric mean {then:.2f}x then, {now:.2f}x now")
    machine = machine_summary()
    print(f"machine: {machine}")
    if args.json:
        Path(args.json).write_text(json.dumps({"tiny": args.tiny, "machine": machine, "rows": rows}, indent=1))
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
