"""CLI verbs. Each verb registers its parser and a ``func(namespace) -> int``.

- ``onnxpy info MODEL``: opsets, IR version, producer, inputs and outputs, operator histogram,
  operators onnxpy cannot run, parameter count and size.
- ``onnxpy run MODEL``: runs once on given (``--input NAME=FILE.npy``) or random inputs, prints a
  summary of each output, saves them with ``--output DIR``; ``--fetch NAME`` returns any
  intermediate value of the graph instead of the outputs.
- ``onnxpy bench MODEL``: latency min / median / p90 / p99 and throughput; ``--compare
  onnxruntime`` measures onnxruntime interleaved in the same process, prints the ratio and
  whether the outputs agree within ``benchmark.AGREE_RTOL``.
- ``onnxpy profile MODEL -o trace.json``: a Chrome trace (Perfetto) and the time per operator.

Command-line mistakes (bad numbers, unreadable input files, unwritable output paths) are found
before any model runs and raise ``UsageError`` (exit status 2).
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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .feeds import UsageError, load_model_header, make_feeds, model_inputs, parse_assignments, parse_dims
from .table import Progress, format_table, status

if TYPE_CHECKING:
    from .benchmark import OutputComparison


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= low (argparse names the option and exits with 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse ``type``: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def add_verbs(sub: Any) -> None:
    """Register the verbs (run, info, bench, profile) on the argparse subparsers."""
    p = sub.add_parser("info", help="describe a model: inputs, outputs, operators, parameters")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("run", help="run a model once and summarize (or save) its outputs")
    _model_args(p)
    p.add_argument("--random", action="store_true", help="random data for inputs not given with --input")
    p.add_argument(
        "--output",
        metavar="DIR",
        help="save each output as DIR/NAME.npy (strings as unicode arrays; names made unique)",
    )
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
    g.add_argument("--repeat", type=int_at_least(1), metavar="N", help="timed runs (default: up to 100 runs or 10 s)")
    g.add_argument("--duration", type=positive_float, metavar="S", help="run for S seconds")
    p.add_argument("--warmup", type=int_at_least(0), default=1, metavar="N", help="untimed runs first (default 1)")
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
    p.add_argument("--repeat", type=int_at_least(1), default=10, metavar="N", help="profiled runs (default 10)")
    p.add_argument(
        "--warmup",
        type=int_at_least(0),
        default=1,
        metavar="N",
        help="runs first, left out of the trace and the tables (default 1: the first run builds cached weights)",
    )
    p.add_argument("--top", type=int_at_least(0), default=10, metavar="N", help="slowest nodes to list (default 10)")
    p.set_defaults(func=cmd_profile)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument(
        "--input",
        action="append",
        metavar="NAME=FILE",
        help="input from a .npy file, or a serialized onnx TensorProto (SequenceProto, OptionalProto for "
        "sequence and optional inputs) .pb file; repeatable",
    )
    p.add_argument("--dim", action="append", metavar="NAME=VALUE", help="value of a named free dimension; repeatable")
    p.add_argument(
        "--batch", type=int_at_least(1), metavar="N", help="size of the first axis of inputs whose first axis is free"
    )
    p.add_argument(
        "--opt-level",
        choices=["disable", "basic", "extended", "all"],
        default="all",
        help="graph optimization level (default all)",
    )
    p.add_argument(
        "--threads", type=int_at_least(0), default=0, metavar="N", help="intra-op threads (0: library default)"
    )
    p.add_argument("--seed", type=int_at_least(0), default=0, metavar="N", help="seed of the random inputs (default 0)")


# -- shared helpers ------------------------------------------------------------------------------


def _prepare(ns: argparse.Namespace, random: bool) -> tuple[Any, Any]:
    """(model header, Feeds); free-dimension notes go to stderr."""
    header = load_model_header(ns.model)
    feeds = make_feeds(
        header,
        files=parse_assignments(ns.input, "--input", [s.name for s in model_inputs(header)]),
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


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt.kind == "V"  # "V": bfloat16, float8 (ml_dtypes)


def _summary_row(name: str, v: Any) -> list[Any]:
    if isinstance(v, list):
        return [name, "sequence", f"{len(v)} items", "", "", "", ""]
    if v is None:
        return [name, "optional", "empty", "", "", "", ""]
    a = np.asarray(v)
    shape = "x".join(str(d) for d in a.shape) or "scalar"
    if a.size == 0:
        return [name, str(a.dtype), shape, "", "", "", "(empty)"]
    more = ", ..." if a.size > 4 else ""
    if a.dtype.kind == "b":
        n_true = int(np.count_nonzero(a))
        head = ", ".join(str(bool(x)) for x in a.ravel()[:4]) + more
        counts = f"{n_true} True, {a.size - n_true} False: "
        return [name, "bool", shape, str(bool(a.min())), str(bool(a.max())), _fmt(n_true / a.size), counts + head]
    if a.dtype.kind in "iu":  # exact, however large: %g would round 1234567 to 1.23457e+06
        head = ", ".join(str(int(x)) for x in a.ravel()[:4]) + more
        return [name, str(a.dtype), shape, str(int(a.min())), str(int(a.max())), _fmt(a.mean(dtype=np.float64)), head]
    if _is_float(a.dtype):
        f = a.astype(np.float64)
        finite = np.isfinite(f)
        ok = f[finite]
        if ok.size:
            lo, hi, mean = _fmt(ok.min()), _fmt(ok.max()), _fmt(ok.mean())
        else:
            lo = hi = mean = "nan"
        head = ", ".join(_fmt(x) for x in f.ravel()[:4]) + more
        if not finite.all():
            head = f"{int((~finite).sum())} non-finite; " + head
        return [name, str(a.dtype), shape, lo, hi, mean, head]
    flat = [str(x) for x in a.ravel()[:3]]
    return [name, str(a.dtype), shape, "", "", "", ", ".join(flat) + (", ..." if a.size > 3 else "")]


def _safe_filename(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output"


def _unique_base(name: str, suffixes: list[str], taken: set[str]) -> str:
    """A file base for ``name`` whose files (base + each suffix) collide with none taken so far.

    Names that differ only in characters made '_' ("out/a", "out:a"), or only in case (on
    case-insensitive file systems), get "_1", "_2", ...
    """
    safe = _safe_filename(name)
    base, n = safe, 0
    while any((base + sfx).lower() in taken for sfx in suffixes):
        n += 1
        base = f"{safe}_{n}"
    taken.update((base + sfx).lower() for sfx in suffixes)
    return base


def _savable(v: np.ndarray) -> np.ndarray:
    """Strings as a numpy unicode array, which np.load reads without unpickling (and --input takes)."""
    if v.dtype.kind != "O":
        return v
    items = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in v.ravel()]
    return np.array(items, dtype=str).reshape(v.shape)


def save_outputs(folder: str, named: list[tuple[str, Any]]) -> list[tuple[str, str | None]]:
    """Save each value as .npy (a sequence as one file per item).

    Returns [(file name, output name where the file is not named after it, else None)].
    """
    taken: set[str] = set()
    saved: list[tuple[str, str | None]] = []
    for name, v in named:
        if isinstance(v, np.ndarray):
            files = [(".npy", v)]
        elif isinstance(v, list):
            files = [(f".{i}.npy", np.asarray(item)) for i, item in enumerate(v)]
        else:  # an empty optional: nothing to save
            continue
        base = _unique_base(name, [sfx for sfx, _ in files], taken)
        for sfx, arr in files:
            np.save(os.path.join(folder, base + sfx), _savable(arr))
            saved.append((base + sfx, None if base == name else name))
    return saved


def _check_output_dir(path: str, what: str) -> None:
    """Create the folder now and check that it takes files, so a bad path fails before the work."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{what} {path}: exists and is not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot write there ({e.strerror or e})") from None


def _check_output_file(path: str, what: str) -> None:
    if os.path.isdir(path):
        raise UsageError(f"{what} {path}: is a folder; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    try:
        _check_output_dir(parent, what)
    except UsageError as e:
        raise UsageError(f"{what} {path}: cannot write its folder ({str(e).rsplit('(', 1)[-1]}") from None
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UsageError(f"{what} {path}: the file is not writable")


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

    if ns.output:
        _check_output_dir(ns.output, "--output")
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

    rows_in = [_input_row(n, a) for n, a in feeds.arrays.items()]
    if rows_in:
        print(format_table(["input", "type", "shape"], rows_in))
        print()
    rows = [_summary_row(n, v) for n, v in zip(names, values)]
    print(format_table(["output", "type", "shape", "min", "max", "mean", "values"], rows))
    print()
    print(f"session created in {created * 1e3:.1f} ms, run in {ran * 1e3:.1f} ms")
    if ns.output:
        saved = save_outputs(ns.output, list(zip(names, values)))
        # A file whose name is not the output's says whose it is.
        listed = [f if renamed is None else f"{f} ({renamed})" for f, renamed in saved]
        print(f"saved {len(saved)} file(s) to {ns.output}: {', '.join(listed)}")
    return 0


def _input_row(name: str, a: Any) -> list[str]:
    if isinstance(a, np.ndarray):
        return [name, str(a.dtype), "x".join(str(d) for d in a.shape) or "scalar"]
    return [name, "sequence" if isinstance(a, list) else "optional", _describe_array(a)]


# -- bench ---------------------------------------------------------------------------------------

DEFAULT_MAX_RUNS = 100
DEFAULT_MAX_SECONDS = 10.0


def cmd_bench(ns: argparse.Namespace) -> int:
    from .benchmark import (
        compare_outputs,
        latency_stats,
        load_runtime,
        machine_summary,
        make_contender,
        time_interleaved,
    )
    from .modelinfo import random_operators

    if ns.compare:
        load_runtime(ns.compare)  # not installed: say so before any work
    header, feeds = _prepare(ns, random=True)
    cfg = _session_config(ns, feeds, ns.iobinding)
    status("creating onnxpy session and running it once...")
    contenders = [make_contender("onnxpy", ns.model, feeds.arrays, cfg)]
    compare_error = None
    if ns.compare:
        status(f"creating {ns.compare} session and running it once...")
        try:
            contenders.append(make_contender(ns.compare, ns.model, feeds.arrays, cfg))
        except Exception as e:  # noqa: BLE001 - the other runtime's failure is reported, not ours
            compare_error = _one_line(e)
            status("")
            print(
                f"onnxpy bench: {ns.compare} could not run the model ({compare_error}); timing onnxpy alone",
                file=sys.stderr,
            )
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
    other = contenders[1].name if len(contenders) > 1 else None
    comparison = None
    ratio = None
    if other is not None:
        names = [o.name for o in contenders[0].session.get_outputs()]
        comparison = compare_outputs(contenders[0].outputs, contenders[1].outputs, names)
        a, b = stats["onnxpy"], stats[other]
        ratio = {
            "median": a.median_ms / b.median_ms,
            "min": a.min_ms / b.min_ms,
            "p90": a.p90_ms / b.p90_ms,
            "create": contenders[0].create_s / max(contenders[1].create_s, 1e-9),
        }
    randoms = random_operators(header) if comparison is not None else []
    settings = {
        "opt_level": ns.opt_level,
        "threads": ns.threads or "default",
        "iobinding": bool(ns.iobinding),
        "warmup": ns.warmup,
        "batch": feeds.batch,
        "interleaved": len(contenders) > 1,
        "machine": machine_summary(),
    }
    if ns.json:
        out: dict[str, Any] = {
            "model": ns.model,
            "inputs": {n: _input_json(a) for n, a in feeds.arrays.items()},
            "settings": settings,
            "runtimes": {
                c.name: {"create_ms": round(c.create_s * 1e3, 3), **stats[c.name].as_dict()} for c in contenders
            },
        }
        if ratio is not None:
            out["ratio_onnxpy_over_" + str(other)] = {k: round(v, 4) for k, v in ratio.items()}
        if comparison is not None:
            out.update(_comparison_json(comparison, randoms))
        if compare_error is not None:
            out["compare_error"] = compare_error
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
    print(f"machine   {settings['machine']}")
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
                "-" if s.throughput is None else f"{s.throughput:.1f}",
            ]
        )
    print(
        format_table(["runtime", "create ms", "min ms", "median ms", "mean ms", "p90 ms", "p99 ms", "samples/s"], rows)
    )
    if ratio is not None and comparison is not None:
        print()
        print(
            f"onnxpy / {other}: median {ratio['median']:.2f}x, min {ratio['min']:.2f}x, "
            f"p90 {ratio['p90']:.2f}x, session creation {ratio['create']:.2f}x"
        )
        print(_agreement_line(comparison, randoms))
    return 0


def _one_line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def _input_json(a: Any) -> dict[str, Any]:
    if isinstance(a, np.ndarray):
        return {"dtype": str(a.dtype), "shape": list(a.shape)}
    return {"kind": "sequence", "length": len(a)} if isinstance(a, list) else {"kind": "optional", "empty": True}


def _comparison_json(c: OutputComparison, randoms: list[str]) -> dict[str, Any]:
    return {
        "outputs_agree": c.agree,
        "outputs_rtol": c.rtol,
        "outputs_max_abs_diff": c.max_abs,
        "outputs_max_rel_diff": c.max_rel,
        "outputs_nan_mismatches": c.nan_mismatches,
        "outputs_problems": list(c.problems),
        "random_operators": randoms,
    }


def _agreement_line(c: OutputComparison, randoms: list[str]) -> str:
    """One line: agree / differ against the stated tolerance, and why they differ."""
    line = (
        f"outputs {'agree' if c.agree else 'differ'} (tolerance {c.rtol:g} of each output's largest value): "
        f"max |diff| {c.max_abs:.3g}, relative {c.max_rel:.3g}"
    )
    if c.nan_mismatches:
        line += f"; {c.nan_mismatches} values NaN in one runtime only"
    if c.problems:
        line += "; " + "; ".join(c.problems[:4]) + ("; ..." if len(c.problems) > 4 else "")
    if randoms:
        line += f" - random outputs (the model uses {', '.join(randoms)}): values differ from run to run"
    return line


# -- profile -------------------------------------------------------------------------------------


def cmd_profile(ns: argparse.Namespace) -> int:
    import onnxpy

    from .benchmark import session_options
    from .profiler import load_trace, slowest_nodes, time_by_op, without_first_runs, write_trace

    out_path = ns.output or f"{os.path.splitext(os.path.basename(ns.model))[0]}_profile.json"
    _check_output_file(out_path, "-o" if ns.output else "the trace file")
    _header, feeds = _prepare(ns, random=True)
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
