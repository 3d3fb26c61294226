"""onnxpy against another onnxpy: two checkouts' latency, alternating, in fresh processes.

    python benchmarks/ab.py HEAD~1                      # HEAD~1 (A) against this checkout (B)
    python benchmarks/ab.py main HEAD --models resnet squeeze --rounds 6
    python benchmarks/ab.py /tmp/old_checkout --context sequence --json ab.json

What a process ran before moves a model's latency on the development machine by 5-10%, in
either direction, enough to flip a comparison (docs/benchmark.md, "the fourth night": one change
measured -4.5% on ShuffleNet run alone and +6% after ResNet-50). So this compares the two sides
in two contexts, each side always in fresh processes with the same inputs:

- ``alone``: one process per model;
- ``sequence``: one process running every model in turn, as the benchmark does.

A round runs both sides in both contexts, the order of the sides alternating from round to
round. Per model and context it reports each side's median over the rounds (each round's
figure is itself a median of ``--repeat`` timed calls after warm-up calls), B / A, and in how
many rounds B was the faster. A side is a directory holding an onnxpy checkout or a git
revision of this repository (checked out in a temporary worktree, removed afterwards). Only
onnxpy's own latency is timed; ``bench.py`` compares with onnxruntime. Nothing here asserts a
time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# Runs in each child process: PYTHONPATH puts the side's checkout first and the working
# directory holds no onnxpy, so `import onnxpy` is the side's.
CHILD = r"""
import json, sys, time
import numpy as np
import onnxpy
plan = json.loads(sys.argv[1])
out = {"onnxpy": onnxpy.__file__, "ms": {}}
for name, path, feeds_path in plan["models"]:
    with np.load(feeds_path) as npz:
        feeds = {k: npz[k] for k in npz.files}
    sess = onnxpy.InferenceSession(path)
    for _ in range(plan["warmup"]):
        sess.run(None, feeds)
    times = []
    for _ in range(plan["repeat"]):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    out["ms"][name] = float(np.median(times) * 1e3)
print(json.dumps(out))
"""


def _bench_module() -> ModuleType:
    """benchmarks/bench.py, for its model list and input builders."""
    spec = importlib.util.spec_from_file_location("onnxpy_bench_for_ab", HERE / "bench.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def resolve_side(spec: str, workdir: str, label: str) -> tuple[Path, bool]:
    """(checkout directory, whether it is a temporary worktree) for a directory or a revision."""
    path = Path(spec)
    if (path / "onnxpy" / "__init__.py").is_file():
        return path.resolve(), False
    target = Path(workdir) / f"side_{label}"
    if shutil.which("git") is None:
        raise SystemExit(f"{spec!r} is not an onnxpy checkout, and without git it cannot be a revision")
    done = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(target), spec],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{spec!r} is neither an onnxpy checkout nor a revision of {REPO}: {done.stderr.strip()}")
    return target, True


def prepare_models(args: argparse.Namespace, workdir: str) -> list[tuple[str, str, str]]:
    """(name, model path, feeds .npz path) for the selected models, inputs made once for both sides."""
    bench = _bench_module()
    entries, messages = bench.collect_models(args, workdir)
    for m in messages:
        print(m, file=sys.stderr)
    models = []
    for e in entries:
        header = onnx.load(e.path, load_external_data=False)
        dims = e.dims or bench.free_dims(header, args.seq)
        feeds = bench.make_feeds(header, dims=dims, batch=1, seed=args.seed)
        feeds_path = os.path.join(workdir, f"{e.name}_feeds.npz")
        np.savez(feeds_path, **feeds.arrays)
        models.append((e.name, e.path, feeds_path))
    return models


def each_model(args: argparse.Namespace, prefix: str) -> Iterator[tuple[str, str, dict[str, np.ndarray]]]:
    """(name, model path, feeds) for the selected models, in a temporary directory that lives
    while the caller iterates (pass_ab.py, knob_ab.py)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as workdir:
        for name, path, feeds_path in prepare_models(args, workdir):
            with np.load(feeds_path) as npz:
                feeds = {k: npz[k] for k in npz.files}
            yield name, path, feeds


# -- calls of two sides in alternating pairs, in one process (pass_ab.py, knob_ab.py) -------------


def add_pair_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", type=int, default=300, help="most pairs of calls per model (default 300)")
    p.add_argument("--min-pairs", type=int, default=20, help="fewest pairs per model (default 20)")
    p.add_argument("--budget", type=float, default=20.0, help="seconds of pairs to aim for per model (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls of each side first (default 3)")


def pair_options_error(args: argparse.Namespace) -> str | None:
    if args.pairs < 1 or args.min_pairs < 1 or args.warmup < 0 or args.budget <= 0:
        return "--pairs and --min-pairs must be at least 1, --warmup at least 0, --budget positive"
    return None


def time_pairs(calls: tuple[Callable[[], object], Callable[[], object]], args: argparse.Namespace) -> tuple[dict, int]:
    """Side A (calls[0]) against side B: ``--warmup`` untimed calls of each, one call of A to size
    the run to ``--budget``, then pairs of calls, one of each in turn, the order alternating from
    pair to pair, each call timed alone. Returns both medians, the median of the pairs' ratios
    B / A and the share of pairs B won, and how many calls came before the timed ones."""
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
    figures = {
        "pairs": pairs,
        "a_ms": float(np.median(a) * 1e3),
        "b_ms": float(np.median(b) * 1e3),
        "pair_ratio": float(np.median(b / a)),
        "b_faster": float(np.mean(b < a)),
    }
    return figures, 2 * args.warmup + 1


PAIR_HEADER = f"{'model':<24} {'A ms':>9} {'B ms':>9} {'pair B/A':>9} {'B faster':>9} {'pairs':>6}  max rel diff"


def pair_line(name: str, r: dict) -> str:
    return (
        f"{name:<24} {r['a_ms']:9.3f} {r['b_ms']:9.3f} {r['pair_ratio']:9.3f} {100 * r['b_faster']:8.0f}% "
        f"{r['pairs']:6d}  {r['max_rel_diff']:.1e}"
    )


def pair_ratios_line(ratios: list[float]) -> str:
    geo = float(np.exp(np.mean(np.log(ratios))))
    return f"geometric mean of the pair ratios over {len(ratios)} models: {geo:.3f}"


def outputs_status(rows: dict[str, dict], between: str) -> int:
    """The exit status of a pair comparison: 1 (the models named on stderr) where both sides'
    outputs differ by more than the optimizer's 1e-4 relative, else 0."""
    diverged = [n for n, r in rows.items() if r.get("max_rel_diff", 0.0) > 1e-4]
    if diverged:
        print(f"outputs differ by more than 1e-4 relative {between}: {', '.join(diverged)}", file=sys.stderr)
        return 1
    return 0


def run_child(side: Path, models: list[tuple[str, str, str]], args: argparse.Namespace, workdir: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(side))
    plan = json.dumps({"models": models, "warmup": args.warmup, "repeat": args.repeat})
    done = subprocess.run(
        [sys.executable, "-c", CHILD, plan], cwd=workdir, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"a run of {side} failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["onnxpy"]).resolve().is_relative_to(side):
        raise SystemExit(f"the run meant for {side} imported {result['onnxpy']}")
    return result["ms"]


def compare(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="onnxpy_ab_") as workdir:
        sides: dict[str, Path] = {}
        temporary: list[Path] = []
        try:
            for label, spec in (("A", args.base), ("B", args.new)):
                sides[label], temp = resolve_side(spec, workdir, label)
                if temp:
                    temporary.append(sides[label])
            models = prepare_models(args, workdir)
            contexts = ["alone", "sequence"] if args.context == "both" else [args.context]
            ms: dict[str, dict[str, dict[str, list[float]]]] = {
                c: {name: {"A": [], "B": []} for name, _, _ in models} for c in contexts
            }
            for r in range(args.rounds):
                for label in ("A", "B") if r % 2 == 0 else ("B", "A"):
                    for context in contexts:
                        batches = [[m] for m in models] if context == "alone" else [models]
                        for batch in batches:
                            for name, t in run_child(sides[label], batch, args, workdir).items():
                                ms[context][name][label].append(t)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for path in temporary:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)
    return {"base": args.base, "new": args.new, "rounds": args.rounds, "ms": ms}


def summarize(result: dict) -> list[dict]:
    rows = []
    for context, models in result["ms"].items():
        for name, t in models.items():
            a, b = statistics.median(t["A"]), statistics.median(t["B"])
            faster = sum(tb < ta for ta, tb in zip(t["A"], t["B"]))
            rows.append({"context": context, "model": name, "a_ms": a, "b_ms": b, "ratio": b / a, "b_faster": faster})
    return rows


def report(result: dict) -> str:
    rows = summarize(result)
    n = result["rounds"]
    lines = [f"A = {result['base']}, B = {result['new']}; {n} rounds; ratio B / A (lower: B faster)", ""]
    lines.append(f"{'context':<9} {'model':<24} {'A ms':>9} {'B ms':>9} {'B / A':>7}  B faster")
    for r in rows:
        lines.append(
            f"{r['context']:<9} {r['model']:<24} {r['a_ms']:9.3f} {r['b_ms']:9.3f} {r['ratio']:7.3f}  "
            f"{r['b_faster']}/{n} rounds"
        )
    for context in result["ms"]:
        ratios = [r["ratio"] for r in rows if r["context"] == context]
        geo = float(np.exp(np.mean(np.log(ratios))))
        lines.append(f"{context}: geometric mean of B / A over {len(ratios)} models: {geo:.3f}")
    return "\n".join(lines)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The options that choose the models and their inputs (``prepare_models``), shared by the
    scripts that build on this one (pass_ab.py, layers.py)."""
    p.add_argument("--models", nargs="+", metavar="PATTERN", help="only models whose name contains a pattern")
    p.add_argument("--no-light", action="store_true", help="skip onnx's light models")
    p.add_argument("--no-shared", action="store_true", help="skip ../shared/models")
    p.add_argument("--shared-dir", default=str(REPO.parent / "shared" / "models"))
    p.add_argument("--seq", type=int, default=128, help="value of free non-batch dimensions (default 128)")
    p.add_argument("--seed", type=int, default=0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("base", help="side A: an onnxpy checkout directory or a git revision of this repository")
    p.add_argument("new", nargs="?", default=str(REPO), help="side B (default: this checkout)")
    add_model_options(p)
    p.add_argument("--rounds", type=int, default=4, help="rounds of both sides (default 4)")
    p.add_argument("--repeat", type=int, default=20, help="timed calls per model and run (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    p.add_argument("--context", choices=["alone", "sequence", "both"], default="both")
    p.add_argument("--json", metavar="FILE", help="also write every round's figures as JSON")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.repeat < 1 or args.warmup < 0:
        p.error("--rounds and --repeat must be at least 1, --warmup at least 0")
    # bench.collect_models reads these too: the shared models as they are, nothing derived.
    args.random_weights = args.quantized = args.half = args.transformers = False
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = compare(args)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "summary": summarize(result)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
