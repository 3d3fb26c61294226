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
import time
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
    calls = (lambda: without.run(None, feeds), lambda: with_.run(None, feeds))
    for _ in range(args.warmup):
        calls[0]()
        calls[1]()
    t = time.perf_counter()
    calls[0]()
    per_call = time.perf_counter() - t
    pairs = max(args.min_pairs, min(args.pairs, int(args.budget / max(2 * per_call, 1e-6))))
    times: tuple[list[float], list[float]] = ([], [])
    for p in range(pairs):
        for side in (0, 1) if p % 2 else (1, 0):
            t = time.perf_counter()
            calls[side]()
            times[side].append(time.perf_counter() - t)
    a, b = np.array(times[0]), np.array(times[1])
    row.update(
        pairs=pairs,
        a_ms=float(np.median(a) * 1e3),
        b_ms=float(np.median(b) * 1e3),
        pair_ratio=float(np.median(b / a)),
        b_faster=float(np.mean(b < a)),
    )
    return row


def report(passes: list[str], rows: dict[str, dict]) -> str:
    lines = [f"A = without {', '.join(passes)}, B = with (the default); per model, calls alternating", ""]
    lines.append(f"{'model':<24} {'A ms':>9} {'B ms':>9} {'pair B/A':>9} {'B faster':>9} {'pairs':>6}  max rel diff")
    timed = []
    for name, r in rows.items():
        if not r["changed"]:
            lines.append(f"{name:<24} (the passes change nothing here)")
            continue
        timed.append(r["pair_ratio"])
        lines.append(
            f"{name:<24} {r['a_ms']:9.3f} {r['b_ms']:9.3f} {r['pair_ratio']:9.3f} {100 * r['b_faster']:8.0f}% "
            f"{r['pairs']:6d}  {r['max_rel_diff']:.1e}"
        )
    if timed:
        geo = float(np.exp(np.mean(np.log(timed))))
        lines.append(f"geometric mean of the pair ratios over {len(timed)} models: {geo:.3f}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("passes", nargs="+", metavar="PASS", help="onnxpy optimizer pass names (side A runs without them)")
    ab.add_model_options(p)
    p.add_argument("--pairs", type=int, default=300, help="most pairs of calls per model (default 300)")
    p.add_argument("--min-pairs", type=int, default=20, help="fewest pairs per model (default 20)")
    p.add_argument("--budget", type=float, default=20.0, help="seconds of pairs to aim for per model (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls of each side first (default 3)")
    p.add_argument("--transformers", action="store_true", help="also GPT-2, BERT and ViT (bench.py --transformers)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    unknown = [n for n in args.passes if n not in pass_names()]
    if unknown:
        p.error(f"not onnxpy pass names: {', '.join(unknown)} (the passes: {', '.join(pass_names())})")
    if args.pairs < 1 or args.min_pairs < 1 or args.warmup < 0 or args.budget <= 0:
        p.error("--pairs and --min-pairs must be at least 1, --warmup at least 0, --budget positive")
    args.random_weights = args.quantized = args.half = False  # read by bench.collect_models (as --transformers)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="onnxpy_pass_ab_models_") as workdir:
        for name, path, feeds_path in ab.prepare_models(args, workdir):
            with np.load(feeds_path) as npz:
                feeds = {k: npz[k] for k in npz.files}
            rows[name] = compare_model(path, feeds, args.passes, args)
            print(f"{name} done", file=sys.stderr, flush=True)
    print(report(args.passes, rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"passes": args.passes, "models": rows}, indent=1))
    diverged = [n for n, r in rows.items() if r.get("max_rel_diff", 0.0) > 1e-4]
    if diverged:
        print(f"outputs differ by more than 1e-4 relative with the passes: {', '.join(diverged)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
