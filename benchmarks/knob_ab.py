"""A kernel setting's worth: one session, calls alternating between two values of a module
constant, in one process.

    python benchmarks/knob_ab.py onnxpy.ops._depthwise._CHUNK_VALUES=2800 --models mobilenet
    python benchmarks/knob_ab.py onnxpy.ops.conv._GROUPED_BIAS_MIN_POSITIONS=10**9 --models shuffle --nodes 8
    python benchmarks/knob_ab.py "onnxpy.ops._erf._GELU_BLOCK=1<<14" --models bert --json knob_ab.json

Kernels read their thresholds and block sizes (``_CHUNK_VALUES``, ``_GELU_BLOCK``,
``_GROUPED_BIAS_MIN_POSITIONS``, ...) from module constants at call time, so one session can run
with either value. Side A sets the constants to the given values, side B keeps the current ones
(the default); calls alternate, one of each in turn, the order alternating from pair to pair,
each call timed alone, and the constants are restored afterwards. Per model it reports both
medians, the median of the pairs' ratios B / A and the share of pairs where B was faster,
after checking that both sides give the same outputs (1e-4 relative).

A setting measured alone in a loop misleads: there its data stay hot, and inside a model each
layer's weights and buffers were last touched a run ago (docs/benchmark.md, "Reading figures from
this machine"; the thirty-third night: a grouped 1x1 layer 86 -> 50 us alone, 6-7 us in the
model). ``--nodes N`` also lists the N nodes whose median time moved most between the sides,
from the session's profiler (which adds its own small cost to both sides alike).

It measures settings read at call time, not optimizer passes (``pass_ab.py``) or other code
changes (``ab.py``). A setting that only shapes a plan cached on first use (a key of an
``lru_cache`` it is not part of, a geometry memoized per node) does not switch between calls:
see with ``--nodes`` that the nodes it should touch are the ones that moved, and
``max rel diff`` 0 with no node moving means it did nothing here. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import onnxpy  # noqa: E402 - after making the repository importable
from onnxpy.tools.benchmark import max_difference  # noqa: E402
from onnxpy.tools.profiler import load_trace  # noqa: E402

sys.path.insert(0, str(HERE))
import ab  # noqa: E402 - benchmarks/ab.py: the model list and inputs, as it builds them


class Knob:
    """A module constant and the value side A gives it."""

    def __init__(self, module: Any, attr: str, value: Any) -> None:
        self.module, self.attr, self.value = module, attr, value
        self.default = getattr(module, attr)
        self.name = f"{module.__name__}.{attr}"

    def set(self, side_a: bool) -> None:
        setattr(self.module, self.attr, self.value if side_a else self.default)


def parse_knob(text: str) -> Knob:
    """``package.module.NAME=VALUE`` -> Knob; ValueError with the reason otherwise."""
    target, sep, literal = text.partition("=")
    module_name, dot, attr = target.strip().rpartition(".")
    if not sep or not dot or not attr:
        raise ValueError(f"{text!r}: expected module.NAME=VALUE, e.g. onnxpy.ops._depthwise._CHUNK_VALUES=2800")
    if not module_name.startswith("onnxpy."):
        raise ValueError(f"{text!r}: only onnxpy's own modules have settings to try")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{text!r}: no module {module_name} ({e})") from None
    if not hasattr(module, attr):
        raise ValueError(f"{text!r}: {module_name} has no {attr}")
    current = getattr(module, attr)
    if not isinstance(current, (bool, int, float)):
        raise ValueError(f"{text!r}: {attr} is a {type(current).__name__}, not a number a kernel reads")
    try:
        value = _number(literal.strip())
    except (ValueError, SyntaxError):
        raise ValueError(f"{text!r}: {literal.strip()!r} is not a number") from None
    if isinstance(current, bool) != isinstance(value, bool) or (isinstance(current, int) and isinstance(value, float)):
        raise ValueError(f"{text!r}: {attr} holds {type(current).__name__} {current!r}, not {type(value).__name__}")
    return Knob(module, attr, value)


# What a setting's value may be written with: numbers and + - * ** << between them.
_ARITHMETIC = (
    ast.Expression,
    ast.Constant,
    ast.BinOp,
    ast.UnaryOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Pow,
    ast.LShift,
    ast.USub,
)


def _number(literal: str) -> Any:
    """A number, written as Python writes one or as arithmetic on numbers (``10**9``, ``1 << 20``)."""
    tree = ast.parse(literal, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _ARITHMETIC) or (
            isinstance(node, ast.Constant) and not isinstance(node.value, (bool, int, float))
        ):
            raise ValueError(literal)
        # A power of constants with a small exponent only: 9**9**9 would compute for ever.
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = node.right
            if not (isinstance(exponent, ast.Constant) and abs(exponent.value) <= 64):
                raise ValueError(literal)
    return eval(compile(tree, "<setting>", "eval"), {"__builtins__": {}})  # noqa: S307 - arithmetic only


def _set_all(knobs: list[Knob], side_a: bool) -> None:
    for k in knobs:
        k.set(side_a)


def compare_model(path: str, feeds: dict[str, np.ndarray], knobs: list[Knob], args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="onnxpy_knob_ab_") as tmp:
        return _compare_in(path, feeds, knobs, args, tmp)


def _compare_in(path: str, feeds: dict[str, np.ndarray], knobs: list[Knob], args: argparse.Namespace, tmp: str) -> dict:
    """``compare_model`` with ``tmp`` for the profiler's trace."""
    so = onnxpy.SessionOptions()
    if args.nodes:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "trace")
    sess = onnxpy.InferenceSession(path, so)
    sides: list[int] = []  # the side of every call, in order (the trace's runs follow it)

    def call(side: int) -> Any:
        _set_all(knobs, side == 0)
        sides.append(side)
        return sess.run(None, feeds)

    try:
        a_out = call(0)
        diff = max_difference(call(1), a_out)
        row: dict = {"max_rel_diff": 0.0 if diff is None else diff[1]}
        figures, untimed = ab.time_pairs((lambda: call(0), lambda: call(1)), args)
    finally:
        _set_all(knobs, False)
    row.update(figures)
    if args.nodes:
        row["nodes"] = node_changes(load_trace(sess.end_profiling()), sides, 2 + untimed, args.nodes)
    return row


def node_changes(events: list[dict], sides: list[int], skip: int, top: int) -> list[dict]:
    """Per node, the median time of its calls on each side (the first ``skip`` runs left out),
    the ``top`` nodes whose medians moved most, largest first."""
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda e: e["ts"]
    )
    spans = [(int(r["ts"]), int(r["ts"]) + int(r["dur"])) for r in runs]
    per_node: dict[tuple[str, str], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    nodes = sorted((e for e in events if e.get("cat") == "Node"), key=lambda e: e["ts"])
    i = 0
    for e in nodes:
        ts = int(e["ts"])
        while i < len(spans) and spans[i][1] < ts:
            i += 1
        if i >= len(spans) or i >= len(sides) or i < skip or ts < spans[i][0]:
            continue
        name = e["name"].removesuffix("_kernel_time")
        per_node[(name, e.get("args", {}).get("op_name", ""))][sides[i]].append(float(e["dur"]))
    rows = [
        {"node": name, "op_type": op, "a_us": float(np.median(a)), "b_us": float(np.median(b))}
        for (name, op), (a, b) in per_node.items()
        if a and b
    ]
    rows.sort(key=lambda r: -abs(r["b_us"] - r["a_us"]))
    return rows[:top]


def report(knobs: list[Knob], rows: dict[str, dict]) -> str:
    settings = ", ".join(f"{k.name} = {k.value!r}" for k in knobs)
    defaults = ", ".join(f"{k.default!r}" for k in knobs)
    lines = [f"A = {settings}; B = the default ({defaults}); per model, calls alternating", ""]
    lines.append(ab.PAIR_HEADER)
    for name, r in rows.items():
        lines.append(ab.pair_line(name, r))
        for n in r.get("nodes", []):
            lines.append(
                f"    {n['b_us'] - n['a_us']:+8.1f} us  A {n['a_us']:8.1f}  B {n['b_us']:8.1f}  {n['op_type']} {n['node']}"
            )
    if rows:
        lines.append(ab.pair_ratios_line([r["pair_ratio"] for r in rows.values()]))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[Knob]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("settings", nargs="+", metavar="MODULE.NAME=VALUE", help="side A's values of onnxpy constants")
    ab.add_model_options(p)
    ab.add_pair_options(p)
    p.add_argument("--nodes", type=int, default=0, metavar="N", help="also the N nodes that moved most (profiled)")
    p.add_argument("--transformers", action="store_true", help="also GPT-2, BERT and ViT (bench.py --transformers)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    if error := ab.pair_options_error(args):
        p.error(error)
    if args.nodes < 0:
        p.error("--nodes must be at least 0")
    knobs = []
    for text in args.settings:
        try:
            knobs.append(parse_knob(text))
        except ValueError as e:
            p.error(str(e))
    if len({k.name for k in knobs}) != len(knobs):
        p.error("each setting may be given once")
    args.random_weights = args.quantized = args.half = False  # read by bench.collect_models (as --transformers)
    return args, knobs


def main(argv: list[str] | None = None) -> int:
    args, knobs = parse_args(argv)
    rows: dict[str, dict] = {}
    for name, path, feeds in ab.each_model(args, "onnxpy_knob_ab_models_"):
        rows[name] = compare_model(path, feeds, knobs, args)
        print(f"{name} done", file=sys.stderr, flush=True)
    print(report(knobs, rows))
    if args.json:
        settings = {k.name: {"a": k.value, "default": k.default} for k in knobs}
        Path(args.json).write_text(json.dumps({"settings": settings, "models": rows}, indent=1))
    return ab.outputs_status(rows, "between the settings")


if __name__ == "__main__":
    sys.exit(main())
