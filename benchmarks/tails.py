"""How elementwise and row kernels' speed depends on their input values, onnxpy against onnxruntime.

    python benchmarks/tails.py                          # every case on 128 x 512 float32 values
    python benchmarks/tails.py --ops Gelu Softmax --rows 8 --json tails.json

numpy's transcendental loops are fast over part of their domain only: float32 ``exp2`` leaves
its vector loop where its results underflow or overflow (35 ns a value instead of 0.4),
``log1p`` outside (-1, 1), ``expm1`` past overflow. A kernel timed on friendly inputs hides such
a cliff; the twenty-ninth night's GELU through ``exp2`` did, on inputs with tails
(docs/benchmark.md, "the thirtieth night"). Here each operator runs as a one-node model on
inputs of several distributions, both runtimes in alternating settled blocks of calls (as
bench.py times them), and each median is divided by the same runtime's median on N(0, 1)
inputs. A slow-down onnxruntime does not share is a cliff in onnxpy's kernel: those rows are
flagged.

Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
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

from onnxpy.tools.benchmark import SessionConfig, compare_outputs, make_contender, time_interleaved  # noqa: E402

#: a slow-down (against N(0, 1) inputs) this many times onnxruntime's own is flagged
FLAG_FACTOR = 2.0


def is_cliff(onnxpy_slowdown: float, onnxruntime_slowdown: float) -> bool:
    """Whether onnxpy slows down on an input by more than FLAG_FACTOR times what onnxruntime
    does (a speed-up of onnxruntime's counts as none)."""
    return onnxpy_slowdown > FLAG_FACTOR * max(1.0, onnxruntime_slowdown)


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _wide(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    # Standard deviation 6: a quarter of the values beyond |7|, where GELU's exponent underflows.
    return (rng.standard_normal(shape) * 6).astype(np.float32)


def _huge(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-1e4, 1e4, shape).astype(np.float32)


def _with(value: float, fraction: float) -> Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]:
    def make(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        x = _normal(rng, shape)
        x[rng.random(shape) < fraction] = value
        return x

    return make


#: input distributions: name -> maker(rng, shape); "normal" is the reference
DISTRIBUTIONS: dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]] = {
    "normal": _normal,
    "wide": _wide,
    "huge": _huge,
    # a masked attention's scores: float32's minimum or -inf where keys are hidden
    "masked-min": _with(float(np.finfo(np.float32).min), 0.25),
    "masked-inf": _with(-np.inf, 0.25),
    "nan": _with(np.nan, 0.01),
}


@dataclass
class Case:
    op_type: str
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 20
    #: distributions that make sense for it (masked inputs only where a mask is usual)
    inputs: tuple[str, ...] = ("normal", "wide", "huge", "nan")
    #: LayerNormalization's scale and bias
    affine: bool = False

    @property
    def name(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.attrs.items() if k != "axis")
        return f"{self.op_type}({extra})" if extra else self.op_type


CASES = (
    Case("Gelu"),
    Case("Gelu", {"approximate": "tanh"}),
    Case("Erf"),
    Case("Sigmoid"),
    Case("Tanh"),
    Case("Exp"),
    Case("Softplus"),
    Case("Elu"),
    Case("Selu"),
    Case("Celu"),
    Case("Mish"),
    Case("HardSwish"),
    Case("HardSigmoid"),
    Case("Softsign"),
    Case("Relu"),
    Case("LeakyRelu"),
    Case("ThresholdedRelu"),
    Case("Reciprocal"),
    Case("Sqrt"),
    Case("Log"),
    Case("Sin"),
    Case("Cos"),
    Case("Softmax", {"axis": -1}, inputs=("normal", "wide", "huge", "masked-min", "masked-inf", "nan")),
    Case("LogSoftmax", {"axis": -1}, inputs=("normal", "wide", "huge", "masked-min", "nan")),
    Case("LayerNormalization", {"axis": -1}, opset=17, inputs=("normal", "wide", "huge", "nan"), affine=True),
)


def build(case: Case, shape: tuple[int, ...]) -> bytes:
    """A one-node model of ``case`` over a float32 input of ``shape``."""
    inputs = ["x"]
    inits = []
    if case.affine:
        width = shape[-1]
        rng = np.random.default_rng(1)
        inits = [
            numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), "scale"),
            numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), "bias"),
        ]
        inputs += ["scale", "bias"]
    node = helper.make_node(case.op_type, inputs, ["y"], **case.attrs)
    graph = helper.make_graph(
        [node],
        "tails",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = min(model.ir_version, 10)  # what onnxruntime 1.2x reads
    onnx.checker.check_model(model)
    return model.SerializeToString()


def measure(case: Case, shape: tuple[int, ...], rounds: int, block: int, seed: int) -> list[dict[str, Any]]:
    """Per distribution of ``case``: both runtimes' median ms and their slow-down against normal."""
    model = build(case, shape)
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    ref: dict[str, float] = {}
    for dist in case.inputs:
        feeds = {"x": DISTRIBUTIONS[dist](rng, shape)}
        contenders = [make_contender(name, model, feeds, SessionConfig()) for name in ("onnxpy", "onnxruntime")]
        # The same input through both: extreme values are where kernels part ways (NaN, inf, -0).
        check = compare_outputs(contenders[0].outputs, contenders[1].outputs)
        times = time_interleaved(contenders, repeat=rounds, block=block)
        med = {name: float(np.median(t)) * 1e3 for name, t in times.items()}
        if dist == "normal":
            ref = dict(med)
        slow = {name: med[name] / ref[name] for name in med}
        rows.append(
            {
                "case": case.name,
                "input": dist,
                "onnxpy_ms": med["onnxpy"],
                "onnxruntime_ms": med["onnxruntime"],
                "onnxpy_slowdown": slow["onnxpy"],
                "onnxruntime_slowdown": slow["onnxruntime"],
                "flag": is_cliff(slow["onnxpy"], slow["onnxruntime"]),
                "max_rel_diff": check.max_rel,
                "nan_mismatches": check.nan_mismatches,
                "agree": check.agree,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", nargs="+", metavar="OP", help="only cases whose operator name contains one of these")
    ap.add_argument("--rows", type=int, default=128, help="rows of the input (default 128)")
    ap.add_argument("--cols", type=int, default=512, help="values per row (default 512)")
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds per case and input (default 6)")
    ap.add_argument("--block", type=int, default=10, help="timed calls per block (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if min(args.rows, args.cols, args.rounds, args.block) < 1:
        ap.error("--rows, --cols, --rounds and --block must be at least 1")
    cases = [c for c in CASES if not args.ops or any(p.lower() in c.op_type.lower() for p in args.ops)]
    if not cases:
        ap.error(f"no case matches {args.ops}")
    shape = (args.rows, args.cols)
    print(f"{'case':<24} {'input':<11} {'onnxpy ms':>9} {'ort ms':>8} {'onnxpy x':>8} {'ort x':>6} {'rel diff':>9}")
    rows: list[dict[str, Any]] = []
    for case in cases:
        for row in measure(case, shape, args.rounds, args.block, args.seed):
            rows.append(row)
            print(
                f"{row['case']:<24} {row['input']:<11} {row['onnxpy_ms']:>9.4f} {row['onnxruntime_ms']:>8.4f} "
                f"{row['onnxpy_slowdown']:>8.2f} {row['onnxruntime_slowdown']:>6.2f} {row['max_rel_diff']:>9.1e}"
                + ("" if row["agree"] else f"  differs ({row['nan_mismatches']} NaN mismatches)")
                + ("  <- cliff" if row["flag"] else ""),
                flush=True,
            )
    flagged = [r for r in rows if r["flag"]]
    print(
        f"\nx: median time on that input / the same runtime's on N(0, 1) inputs; a cliff is a slow-down "
        f"over {FLAG_FACTOR:g}x onnxruntime's. {len(flagged)} of {len(rows)} flagged. rel diff: the outputs' "
        f"largest difference over onnxruntime's largest finite magnitude."
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": list(shape), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
