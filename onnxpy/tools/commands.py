"""CLI verbs. Each verb registers its parser and a ``func(namespace) -> int``.

- ``onnxpy info MODEL``: opsets, IR version, producer, inputs and outputs, operator histogram,
  operators onnxpy cannot run, parameter count and size.
- ``onnxpy run MODEL``: runs once on given (``--input NAME=FILE.npy``) or random inputs, prints a
  summary of each output, saves them with ``--output DIR``; ``--fetch NAME`` returns any
  intermediate value of the graph instead of the outputs.
- ``onnxpy bench MODEL``: latency min / median / p90 / p99 and throughput; ``--compare
  onnxruntime`` measures onnxruntime interleaved in the same process and prints the ratio.
- ``onnxpy profile MODEL -o trace.json``: a Chrome trace (Perfetto) and the time per operator.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

from .feeds import UsageError, load_model_header, make_feeds, parse_assignments, parse_dims
from .table import Progress, format_table, status


def add_verbs(sub: Any) -> None:
    """Register the verbs (run, info, bench, profile) on the argparse subparsers."""
    p = sub.add_parser("info", help="describe a model: inputs, outputs, operators, parameters")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("run", help="run a model once and summarize (or save) its outputs")
    _model_args(p)
    p.add_argument("--random", action="store_true", help="random data for inputs not given with --input")
    p.add_argument("--output", metavar="DIR", help="save each output as DIR/NAME.npy")
    p.add_argument(
        "--fetch",
        action="append",
        metavar="NAME",
        help="return this graph value (any intermediate, by name) instead of the outputs; repeatable",
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", help="measure latency and throughput, optionally against onnxruntime")
    _model_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--repeat", type=int, metavar="N", help="timed runs (default: up to 100 runs or 10 s)")
    g.add_argument("--duration", type=float, metavar="S", help="run for S seconds")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed runs first (default 1)")
    p.add_argument("--iobinding", action="store_true", help="bind inputs and preallocated outputs once")
    p.add_argument(
        "--compare",
        choices=["onnxruntime"],
        help="also run onnxruntime, alternating settled blocks of calls with onnxpy, and print ratios",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("profile", help="write a Chrome trace (Perfetto) and print time per operator type")
    _model_args(p)
    p.add_argument("-o", "--output", metavar="TRACE.json", help="trace file (default: <model>_profile.json)")
    p.add_argument("--repeat", type=int, default=10, metavar="N", help="profiled runs (default 10)")
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        metavar="N",
        help="runs first, left out of the trace and the tables (default 1: the first run builds cached weights)",
    )
    p.add_argument("--top", type=int, default=10, metavar="N", help="slowest nodes to list (default 10)")
    p.set_defaults(func=cmd_profile)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--input", action="append", metavar="NAME=FILE", help="input from a .npy (or TensorProto .pb) file")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE", help="value of a named free dimension")
    p.add_argument("--batch", type=int, metavar="N", help="size of the first axis of inputs whose first axis is free")
    p.add_argument("--opt-level", choices=["disable", "basic", "extended", "all"], default="all")
    p.add_argument("--threads", type=int, default=0, metavar="N", help="intra-op threads (0: library default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")


# -- shared helpers ------------------------------------------------------------------------------


def _prepare(ns: argparse.Namespace, random: bool) -> tuple[Any, Any]:
    """(model header, Feeds); free-dimension notes go to stderr."""
    if ns.batch is not None and ns.batch < 1:
        raise UsageError(f"--batch must be >= 1, got {ns.batch}")
    header = load_model_header(ns.model)
    feeds = make_feeds(
        header,
        files=parse_assignments(ns.input, "--input"),
        dims=parse_dims(ns.dim),
        batch=ns.batch,
        random=random,
        seed=ns.seed,
    )
    for note in feeds.notes:
        print(f"note: {note}", file=sys.stderr)
    return header, feeds


def _session_config(ns: argparse.Namespace, feeds: Any, iobinding: bool = False) -> Any:
    from .benchmark import SessionConfig

    return SessionConfig(ns.opt_level, ns.threads, dict(feeds.overrides), iobinding)


def _describe_array(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype}{list(a.shape)}"
    if isinstance(a, list):
        return f"sequence[{len(a)}]"
    return "none" if a is None else type(a).__name__


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _summary_row(name: str, v: Any) -> list[Any]:
    if isinstance(v, list):
        return [name, "sequence", f"{len(v)} items", "", "", "", ""]
    if v is None:
        return [name, "optional", "empty", "", "", "", ""]
    a = np.asarray(v)
    shape = "x".join(str(d) for d in a.shape) or "scalar"
    if a.size == 0:
        return [name, str(a.dtype), shape, "", "", "", "(empty)"]
    if a.dtype.kind in "biuf":
        f = a.astype(np.float64)
        finite = np.isfinite(f)
        ok = f[finite]
        if ok.size:
            lo, hi, mean = _fmt(ok.min()), _fmt(ok.max()), _fmt(ok.mean())
        else:
            lo = hi = mean = "nan"
        head = ", ".join(_fmt(x) for x in f.ravel()[:4]) + (", ..." if a.size > 4 else "")
        if not finite.all():
            head = f"{int((~finite).sum())} non-finite; " + head
        return [name, str(a.dtype), shape, lo, hi, mean, head]
    flat = [str(x) for x in a.ravel()[:3]]
    return [name, str(a.dtype), shape, "", "", "", ", ".join(flat) + (", ..." if a.size > 3 else "")]


def _safe_filename(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output"


# -- info ----------------------------------------------------------------------------------------


def cmd_info(ns: argparse.Namespace) -> int:
    from .modelinfo import format_info, inspect_model

    load_model_header(ns.model)  # a readable message for a missing or broken file
    info = inspect_model(ns.model)
    if ns.json:
        print(json.dumps(info.as_dict(), indent=2))
    else:
        print(format_info(info))
    return 0


# -- run -----------------------------------------------------------------------------------------


def cmd_run(ns: argparse.Namespace) -> int:
    import onnxpy

    from .benchmark import session_options

    _header, feeds = _prepare(ns, random=ns.random)
    so = session_options(onnxpy, "onnxpy", _session_config(ns, feeds))
    status("creating session...")
    t0 = time.perf_counter()
    sess = onnxpy.InferenceSession(ns.model, so)
    created = time.perf_counter() - t0
    names = list(ns.fetch) if ns.fetch else [o.name for o in sess.get_outputs()]
    status("running...")
    t0 = time.perf_counter()
    values = sess.run(names, feeds.arrays)
    ran = time.perf_counter() - t0
    status("")

    rows_in = [[n, str(a.dtype), "x".join(str(d) for d in a.shape) or "scalar"] for n, a in feeds.arrays.items()]
    if rows_in:
        print(format_table(["input", "type", "shape"], rows_in))
        print()
    rows = [_summary_row(n, v) for n, v in zip(names, values)]
    print(format_table(["output", "type", "shape", "min", "max", "mean", "values"], rows))
    print()
    print(f"session created in {created * 1e3:.1f} ms, run in {ran * 1e3:.1f} ms")
    if ns.output:
        os.makedirs(ns.output, exist_ok=True)
        saved = []
        for n, v in zip(names, values):
            base = os.path.join(ns.output, _safe_filename(n))
            if isinstance(v, np.ndarray):
                np.save(base + ".npy", v)
                saved.append(base + ".npy")
            elif isinstance(v, list):
                for i, item in enumerate(v):
                    np.save(f"{base}.{i}.npy", np.asarray(item))
                    saved.append(f"{base}.{i}.npy")
        print(f"saved {len(saved)} file(s) to {ns.output}: {', '.join(os.path.basename(s) for s in saved)}")
    return 0


# -- bench ---------------------------------------------------------------------------------------

DEFAULT_MAX_RUNS = 100
DEFAULT_MAX_SECONDS = 10.0


def cmd_bench(ns: argparse.Namespace) -> int:
    from .benchmark import latency_stats, make_contender, max_difference, time_interleaved

    if ns.repeat is not None and ns.repeat < 1:
        raise UsageError(f"--repeat must be >= 1, got {ns.repeat}")
    if ns.duration is not None and ns.duration <= 0:
        raise UsageError(f"--duration must be > 0, got {ns.duration}")
    _header, feeds = _prepare(ns, random=True)
    cfg = _session_config(ns, feeds, ns.iobinding)
    names = ["onnxpy"] + ([ns.compare] if ns.compare else [])
    contenders = []
    for name in names:
        status(f"creating {name} session and running it once...")
        contenders.append(make_contender(name, ns.model, feeds.arrays, cfg))
    status("")

    if ns.repeat is not None:
        repeat, duration = ns.repeat, None
    elif ns.duration is not None:
        repeat, duration = None, ns.duration
    else:
        repeat, duration = DEFAULT_MAX_RUNS, DEFAULT_MAX_SECONDS
    block = 1
    if len(contenders) > 1:
        # Compared runtimes are timed in blocks of about 0.1 s each (see time_interleaved).
        per_call = 0.0
        for c in contenders:
            t0 = time.perf_counter()
            c.call()
            per_call = max(per_call, time.perf_counter() - t0)
        block = max(1, min(10, repeat or 10, int(0.1 / max(per_call, 1e-9))))
    rounds = None if repeat is None else -(-repeat // block)
    bar = Progress("bench", rounds if rounds is not None else float(duration or 1))
    times = time_interleaved(
        contenders,
        repeat=rounds,
        duration=duration,
        warmup=ns.warmup,
        progress=lambda r, e: bar.update(r if rounds is not None else e),
        block=block,
        max_calls=repeat,
    )
    bar.close()

    stats = {c.name: latency_stats(times[c.name], feeds.batch) for c in contenders}
    diff = max_difference(contenders[0].outputs, contenders[1].outputs) if len(contenders) > 1 else None
    ratio = None
    if len(contenders) > 1:
        a, b = stats["onnxpy"], stats[names[1]]
        ratio = {
            "median": a.median_ms / b.median_ms,
            "min": a.min_ms / b.min_ms,
            "p90": a.p90_ms / b.p90_ms,
            "create": contenders[0].create_s / max(contenders[1].create_s, 1e-9),
        }
    settings = {
        "opt_level": ns.opt_level,
        "threads": ns.threads or "default",
        "iobinding": bool(ns.iobinding),
        "warmup": ns.warmup,
        "batch": feeds.batch,
        "interleaved": len(contenders) > 1,
    }
    if ns.json:
        out: dict[str, Any] = {
            "model": ns.model,
            "inputs": {n: {"dtype": str(a.dtype), "shape": list(a.shape)} for n, a in feeds.arrays.items()},
            "settings": settings,
            "runtimes": {
                c.name: {"create_ms": round(c.create_s * 1e3, 3), **stats[c.name].as_dict()} for c in contenders
            },
        }
        if ratio is not None:
            out["ratio_onnxpy_over_" + names[1]] = {k: round(v, 4) for k, v in ratio.items()}
        if diff is not None:
            out["outputs_max_abs_diff"], out["outputs_max_rel_diff"] = diff
        print(json.dumps(out, indent=2))
        return 0

    print(f"model     {ns.model}")
    print("inputs    " + ", ".join(f"{n} {_describe_array(a)}" for n, a in feeds.arrays.items()))
    runs = stats["onnxpy"].runs
    print(
        f"settings  opt-level {ns.opt_level}, threads {settings['threads']}, iobinding "
        f"{'on' if ns.iobinding else 'off'}, {runs} timed runs"
        + (" interleaved" if len(contenders) > 1 else "")
        + f" after {ns.warmup} warm-up"
    )
    print()
    rows = []
    for c in contenders:
        s = stats[c.name]
        rows.append(
            [
                c.name,
                f"{c.create_s * 1e3:.1f}",
                f"{s.min_ms:.3f}",
                f"{s.median_ms:.3f}",
                f"{s.mean_ms:.3f}",
                f"{s.p90_ms:.3f}",
                f"{s.p99_ms:.3f}",
                f"{s.throughput:.1f}",
            ]
        )
    print(
        format_table(["runtime", "create ms", "min ms", "median ms", "mean ms", "p90 ms", "p99 ms", "samples/s"], rows)
    )
    if ratio is not None:
        print()
        print(
            f"onnxpy / {names[1]}: median {ratio['median']:.2f}x, min {ratio['min']:.2f}x, "
            f"p90 {ratio['p90']:.2f}x, session creation {ratio['create']:.2f}x"
        )
        if diff is not None:
            print(f"outputs agree to max |diff| {diff[0]:.3g} (relative to the largest value: {diff[1]:.3g})")
    return 0


# -- profile -------------------------------------------------------------------------------------


def cmd_profile(ns: argparse.Namespace) -> int:
    import onnxpy

    from .benchmark import session_options
    from .profiler import load_trace, slowest_nodes, time_by_op, without_first_runs, write_trace

    if ns.repeat < 1:
        raise UsageError(f"--repeat must be >= 1, got {ns.repeat}")
    if ns.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {ns.warmup}")
    _header, feeds = _prepare(ns, random=True)
    out_path = ns.output or f"{os.path.splitext(os.path.basename(ns.model))[0]}_profile.json"
    so = session_options(onnxpy, "onnxpy", _session_config(ns, feeds))
    so.enable_profiling = True
    tmp = tempfile.mkdtemp(prefix="onnxpy_profile_")
    try:
        so.profile_file_prefix = os.path.join(tmp, "trace")
        status("creating session...")
        sess = onnxpy.InferenceSession(ns.model, so)
        status("")
        bar = Progress("profile", ns.warmup + ns.repeat)
        for i in range(ns.warmup + ns.repeat):
            sess.run(None, feeds.arrays)
            bar.update(i + 1)
        bar.close()
        events = without_first_runs(load_trace(sess.end_profiling()), ns.warmup)
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        write_trace(out_path, events)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    n_runs = max(1, len(runs))
    run_us = sorted(int(e["dur"]) for e in runs)
    node_events = [e for e in events if e.get("cat") == "Node"]
    node_total = sum(int(e["dur"]) for e in node_events)
    ops = time_by_op(events)
    rows = []
    for t in ops:
        rows.append(
            [
                t.op_type,
                f"{t.calls / n_runs:g}",
                f"{t.total_us / n_runs / 1e3:.3f}",
                f"{100.0 * t.total_us / max(node_total, 1):.1f}%",
                f"{t.total_us / max(t.calls, 1):.1f}",
            ]
        )
    print(f"trace     {out_path} ({len(events)} events: open it in https://ui.perfetto.dev or chrome://tracing)")
    print("inputs    " + ", ".join(f"{n} {_describe_array(a)}" for n, a in feeds.arrays.items()))
    if run_us:
        med = run_us[len(run_us) // 2] / 1e3
        print(
            f"runs      {len(runs)} profiled after {ns.warmup} warm-up; median run {med:.3f} ms, of which nodes "
            f"{node_total / n_runs / 1e3:.3f} ms per run"
        )
    print()
    print(format_table(["op_type", "calls/run", "ms/run", "share", "us/call"], rows))
    top = slowest_nodes(events, ns.top)
    if top:
        print()
        print(f"slowest nodes (per run, top {len(top)})")
        print(
            format_table(
                ["node", "op_type", "ms/run"],
                [[name, op, f"{total / max(calls, 1) / 1e3:.3f}"] for name, op, calls, total in top],
            )
        )
    return 0


def format_error(e: BaseException) -> str:
    msg = str(e).strip()
    return msg if isinstance(e, UsageError) else f"{type(e).__name__}: {msg}"


__all__ = ["add_verbs", "UsageError", "format_error"]
