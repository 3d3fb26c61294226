"""An optimizer pass's worth: sessions with and without it, calls alternating, in one process.

    python benchmarks/pass_ab.py relu_after_pool                       # every model
    python benchmarks/pass_ab.py fuse_concat_conv --models squeeze --budget 30
    python benchmarks/pass_ab.py fuse_activation relu_after_pool --json pass_ab.json

Side A is a session created with ``disabled_optimizers`` naming the passes (onnxpy's pass
names, ``onnxpy.optimizer.manager.pass_names()``), side B the default session. Both live in this
process and run the same inputs, one call of each in turn, the order alternating from pair to
pair, each call timed alone. On a machine whose speed drifts by 20-50% over seconds (other
tenants; docs/benchmark.md, "the twentieth night"), two calls a few milliseconds apart see the
same machine, where medians of separate processes do not. Per model it reports both medians,
the median of the pairs' ratios B / A and the share of pairs where B was faster, after checking
that both sides give the same outputs (1e-4 relative, the optimizer's contract).

It measures passes, not other code changes: for those, ``ab.py`` compares two checkouts. A pass
that changes nothing on a model is reported as such and not timed. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import onnxpy  # noqa: E402 - after making the repository importable
from onnxpy.optimizer.manager import pass_names  # noqa: E402
from onnxpy.tools.benchmark import max_difference  # noqa: E402

sys.path.insert(0, str(HERE))
import ab  # noqa: E402 - benchmarks/ab.py: the model list and inputs, as it builds them


def _sessions(path: str, passes: list[str]) -> tuple[onnxpy.InferenceSession, onnxpy.InferenceSession, bool]:
    """(without the passes, with them, whether the passes changed the graph)."""
    with tempfile.TemporaryDirectory(prefix="onnxpy_pass_ab_") as tmp:
        saved = []
        sessions = []
        for disabled in (passes, []):
            so = onnxpy.SessionOptions()
            so.optimized_model_filepath = str(Path(tmp) / f"optimized_{len(saved)}.onnx")
            sessions.append(onnxpy.InferenceSession(path, so, disabled_optimizers=disabled))
            saved.append(onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)
    # Whole nodes, attributes included: a pass may only mark a node (channels_last_output).
    changed = [n.SerializeToString() for n in saved[0]] != [n.SerializeToString() for n in saved[1]]
    return sessions[0], sessions[1], changed


def compare_model(path: str, feeds: dict[str, np.ndarray], passes: list[str], args: argparse.Namespace) -> dict:
    without, with_, changed = _sessions(path, passes)
    row: dict = {"changed": changed}
    if not changed:
        return row
    diff = max_difference(with_.run(None, feeds), without.run(None, feeds))
    row["max_rel_diff"] = 0.0 if diff is None else diff[1]
    row.update(ab.time_pairs((lambda: without.run(None, feeds), lambda: with_.run(None, feeds)), args)[0])
    return row


def report(passes: list[str], rows: dict[str, dict]) -> str:
    lines = [f"A = without {', '.join(passes)}, B = with (the default); per model, calls alternating", ""]
    lines.append(ab.PAIR_HEADER)
    timed = []
    for name, r in rows.items():
        if not r["changed"]:
            lines.append(f"{name:<24} (the passes change nothing here)")
            continue
        timed.append(r["pair_ratio"])
        lines.append(ab.pair_line(name, r))
    if timed:
        lines.append(ab.pair_ratios_line(timed))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("passes", nargs="+", metavar="PASS", help="onnxpy optimizer pass names (side A runs without them)")
    ab.add_model_options(p)
    ab.add_pair_options(p)
    p.add_argument("--transformers", action="store_true", help="also GPT-2, BERT and ViT (bench.py --transformers)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    unknown = [n for n in args.passes if n not in pass_names()]
    if unknown:
        p.error(f"not onnxpy pass names: {', '.join(unknown)} (the passes: {', '.join(pass_names())})")
    if error := ab.pair_options_error(args):
        p.error(error)
    args.random_weights = args.quantized = args.half = False  # read by bench.collect_models (as --transformers)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: dict[str, dict] = {}
    for name, path, feeds in ab.each_model(args, "onnxpy_pass_ab_models_"):
        rows[name] = compare_model(path, feeds, args.passes, args)
        print(f"{name} done", file=sys.stderr, flush=True)
    print(report(args.passes, rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"passes": args.passes, "models": rows}, indent=1))
    return ab.outputs_status(rows, "with the passes")


if __name__ == "__main__":
    sys.exit(main())
