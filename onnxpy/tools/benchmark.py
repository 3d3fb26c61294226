"""Latency measurement shared by ``onnxpy bench`` and benchmarks/bench.py.

Several runtimes ("contenders") run the same model on the same inputs in one process, in
alternating rounds, so that both see the same machine state (frequency, cache, other load); the
one that goes first alternates from one round to the next, and within a round each settles and
then runs a block of timed calls (see ``time_interleaved``).

onnxruntime is loaded only when the user asks for a comparison with it: onnxpy never computes
anything with it.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: --opt-level -> GraphOptimizationLevel member (same names in onnxpy and onnxruntime)
OPT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}

RUNTIMES = ("onnxpy", "onnxruntime")


def load_runtime(name: str) -> Any:
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; choose from {RUNTIMES}")
    if name == "onnxpy":
        import onnxpy

        return onnxpy
    try:
        # Only for a side-by-side comparison the user asked for.
        return importlib.import_module("onnxruntime")
    except ImportError:
        raise ValueError("--compare onnxruntime needs the onnxruntime package (pip install onnxruntime)") from None


@dataclass
class SessionConfig:
    opt_level: str = "all"
    threads: int = 0
    #: free dimension name -> value
    overrides: dict[str, int] = field(default_factory=dict)
    iobinding: bool = False
    #: session config entries given to onnxpy only (onnxruntime's keys differ), e.g.
    #: {"session.split_processes": "1"}
    onnxpy_config: dict[str, str] = field(default_factory=dict)


@dataclass
class Contender:
    name: str
    session: Any
    create_s: float
    #: one inference, results discarded
    call: Callable[[], Any]
    #: the outputs of the first run (the warm-up), for a cross-check between runtimes
    outputs: list[Any]


def session_options(module: Any, name: str, cfg: SessionConfig) -> Any:
    so = module.SessionOptions()
    so.graph_optimization_level = getattr(module.GraphOptimizationLevel, OPT_LEVELS[cfg.opt_level])
    if cfg.threads:
        so.intra_op_num_threads = int(cfg.threads)
    if name == "onnxruntime":
        so.log_severity_level = 3  # keep its "removing unused initializer" warnings off the table
    for dim, value in cfg.overrides.items():
        so.add_free_dimension_override_by_name(dim, int(value))
    if name == "onnxpy":
        for key, value in cfg.onnxpy_config.items():
            so.add_session_config_entry(key, value)
    return so


def make_contender(name: str, model: str | bytes, feeds: dict[str, Any], cfg: SessionConfig) -> Contender:
    """Create the session (timed) and run it once, which also warms it up."""
    module = load_runtime(name)
    so = session_options(module, name, cfg)
    t0 = time.perf_counter()
    sess = module.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    create_s = time.perf_counter() - t0
    outputs = sess.run(None, feeds)
    if cfg.iobinding:
        call = _iobinding_call(module, sess, feeds, outputs)
    else:

        def call() -> Any:
            return sess.run(None, feeds)

    return Contender(name, sess, create_s, call, outputs)


def _iobinding_call(module: Any, sess: Any, feeds: dict[str, Any], outputs: list[Any]) -> Callable[[], Any]:
    """Inputs bound once; outputs written into buffers allocated once (shapes from the first run)."""
    binding = sess.io_binding()
    for name, arr in feeds.items():
        binding.bind_cpu_input(name, arr)
    for arg, out in zip(sess.get_outputs(), outputs):
        if isinstance(out, np.ndarray):
            binding.bind_ortvalue_output(arg.name, module.OrtValue.ortvalue_from_numpy(np.empty_like(out)))
        else:
            binding.bind_output(arg.name, "cpu")

    def call() -> Any:
        sess.run_with_iobinding(binding)

    return call


# Untimed calls before each block (seconds): longer than OpenBLAS's idle workers spin after a
# GEMM (50-100 ms here), so that no runtime is timed against the other's spinning threads. At
# 50 ms, onnxruntime's MobileNet-v2 ran 1.6x slower than alone, flattering onnxpy's ratio.
SETTLE_S = 0.15


def time_interleaved(
    contenders: Sequence[Contender],
    repeat: int | None = None,
    duration: float | None = None,
    warmup: int = 1,
    min_repeat: int = 3,
    progress: Callable[[int, float], None] | None = None,
    settle_s: float = SETTLE_S,
    block: int = 1,
    max_calls: int | None = None,
) -> dict[str, list[float]]:
    """Seconds per call for each contender, measured in alternating rounds.

    In each round every contender first makes untimed calls for ``settle_s`` seconds (at least
    one), then ``block`` timed calls in a row. Both runtimes keep thread pools that spin after
    a call (onnxruntime's intra-op threads, OpenBLAS's workers): a call timed soon after the
    other runtime's measures the two fighting over the cores, which neither does when it runs
    alone. On this project's 2-core virtual machine, the first 30 ms of onnxpy calls after an
    onnxruntime call ran 2.5x slower, and OpenBLAS's idle worker (onnxpy's BLAS) spins for
    50-100 ms after onnxpy's last GEMM: onnxruntime timed 50 ms after onnxpy ran MobileNet-v2
    in 6.3 ms, 100 ms and more after it in 4.0, as alone (see ``SETTLE_S``). Settling first,
    then timing a block, reproduces what each runtime does alone, while the alternation still
    spreads slow phases of the machine over both.

    Stops after ``repeat`` rounds, or once ``duration`` seconds have passed (and at least
    ``min_repeat`` rounds ran); with both, whichever comes first. ``max_calls`` caps the timed
    calls per contender (the last block is cut short), so that a caller asking for N runs gets
    exactly N whatever block size suited the machine. ``progress(rounds, elapsed)`` is called
    after each round.
    """
    if repeat is None and duration is None:
        raise ValueError("give repeat or duration")
    for _ in range(max(0, warmup)):
        for c in contenders:
            c.call()
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    alternating = len(contenders) > 1
    clock = time.perf_counter
    start = clock()
    rounds = 0
    while True:
        order = contenders if rounds % 2 == 0 else list(reversed(contenders))
        for c in order:
            if alternating:  # alone, a runtime has nobody's thread pool to wait out
                settle_end = clock() + settle_s
                c.call()
                while clock() < settle_end:
                    c.call()
            todo = block if max_calls is None else min(block, max_calls - len(times[c.name]))
            for _ in range(todo):
                t0 = clock()
                c.call()
                times[c.name].append(clock() - t0)
        rounds += 1
        elapsed = clock() - start
        if progress is not None:
            progress(rounds, elapsed)
        if repeat is not None and rounds >= repeat:
            break
        if max_calls is not None and all(len(t) >= max_calls for t in times.values()):
            break
        if duration is not None and elapsed >= duration and rounds >= min_repeat:
            break
    return times


@dataclass
class LatencyStats:
    runs: int
    min_ms: float
    median_ms: float
    mean_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    #: samples per second at the mean latency (batch / mean); None when the inputs have no batch
    throughput: float | None

    def as_dict(self) -> dict[str, float]:
        # Six significant digits, not a fixed number of decimals: a model that runs in 47.65 us
        # kept only "0.0477" ms (0.1% off), and its throughput then disagreed with its mean.
        return {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in asdict(self).items()}


def latency_stats(seconds: Sequence[float], batch: int | None = 1) -> LatencyStats:
    a = np.asarray(seconds, dtype=np.float64) * 1e3
    if a.size == 0:
        raise ValueError("no timings")
    mean = float(a.mean())
    return LatencyStats(
        runs=int(a.size),
        min_ms=float(a.min()),
        median_ms=float(np.median(a)),
        mean_ms=mean,
        p90_ms=float(np.percentile(a, 90)),
        p99_ms=float(np.percentile(a, 99)),
        max_ms=float(a.max()),
        throughput=None if batch is None else (batch * 1e3 / mean if mean > 0 else math.inf),
    )


#: outputs agree when every float output is within this much of onnxruntime's, relative to the
#: output's largest magnitude (the README's accuracy claim); other types must be equal
AGREE_RTOL = 1e-4


@dataclass
class OutputComparison:
    """How the outputs of two runtimes compare (``compare_outputs``)."""

    #: over the float outputs: max |a-b|, and that relative to the output's largest magnitude
    max_abs: float = 0.0
    max_rel: float = 0.0
    #: elements where exactly one runtime produced NaN
    nan_mismatches: int = 0
    #: one line per output that does not compare: dtype, shape or kind mismatch, unequal values
    problems: list[str] = field(default_factory=list)
    rtol: float = AGREE_RTOL

    @property
    def agree(self) -> bool:
        return not self.problems and not self.nan_mismatches and self.max_rel <= self.rtol


def compare_outputs(
    a: Sequence[Any], b: Sequence[Any], names: Sequence[str] | None = None, rtol: float = AGREE_RTOL
) -> OutputComparison:
    """Compare the outputs ``a`` of one runtime with ``b`` of the reference, output by output."""
    res = OutputComparison(rtol=rtol)
    names = list(names) if names is not None else [f"output {i}" for i in range(len(b))]
    if len(a) != len(b):
        res.problems.append(f"{len(a)} outputs vs {len(b)}")
    for name, x, y in zip(names, a, b):
        _compare_value(name, x, y, res)
    return res


def _compare_value(name: str, x: Any, y: Any, res: OutputComparison) -> None:
    if isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            res.problems.append(f"{name}: sequence of {len(x)} vs {len(y)}")
        for i, (xi, yi) in enumerate(zip(x, y)):
            _compare_value(f"{name}[{i}]", xi, yi, res)
        return
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
        if (x is None) != (y is None) or type(x) is not type(y):
            res.problems.append(f"{name}: {_kind(x)} vs {_kind(y)}")
        return
    if x.dtype != y.dtype:
        res.problems.append(f"{name}: dtype {x.dtype} vs {y.dtype}")
    if x.shape != y.shape:
        res.problems.append(f"{name}: shape {list(x.shape)} vs {list(y.shape)}")
        return
    if x.size == 0:
        return
    if x.dtype.kind in "fc" or y.dtype.kind in "fc" or _is_ml_float(x.dtype) or _is_ml_float(y.dtype):
        _compare_floats(x.astype(np.complex128 if "c" in x.dtype.kind + y.dtype.kind else np.float64), y, res)
        return
    unequal = int(np.count_nonzero(_as_comparable(x) != _as_comparable(y)))
    if unequal:
        res.problems.append(f"{name}: {unequal} of {x.size} values differ")


def _compare_floats(xf: np.ndarray, y: np.ndarray, res: OutputComparison) -> None:
    yf = y.astype(xf.dtype)
    xnan, ynan = np.isnan(xf), np.isnan(yf)
    res.nan_mismatches += int(np.count_nonzero(xnan != ynan))
    with np.errstate(invalid="ignore"):
        # Equal values (infinities included) and NaN on both sides differ by 0.
        d = np.where((xf == yf) | (xnan & ynan), 0.0, np.abs(xf - yf))
    d = np.where(xnan != ynan, 0.0, d)  # counted above, not as a size
    diff = float(d.max())
    finite = np.abs(yf[np.isfinite(yf)])
    scale = max(float(finite.max()) if finite.size else 0.0, 1e-30)
    res.max_abs = max(res.max_abs, diff)
    res.max_rel = max(res.max_rel, diff / scale)


def _is_ml_float(dt: np.dtype) -> bool:
    return dt.kind == "V"  # bfloat16 and float8 (ml_dtypes) are "V" to numpy


def _as_comparable(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "OSU":
        return np.array([x.decode() if isinstance(x, bytes) else str(x) for x in a.ravel()], dtype=object)
    return a.ravel()


def _kind(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, list):
        return "sequence"
    return "tensor" if isinstance(v, np.ndarray) else type(v).__name__


def max_difference(a: Sequence[Any], b: Sequence[Any]) -> tuple[float, float] | None:
    """(max |a-b|, max |a-b| / max(|b|, tiny)) over the numeric outputs; None if none compare.

    A shape mismatch, or NaN on one side only, is (inf, inf).
    """
    worst_abs = worst_rel = 0.0
    compared = False
    for x, y in zip(a, b):
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)) or x.shape != y.shape:
            if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
                return (math.inf, math.inf)
            continue
        if x.dtype.kind not in "biufc" or x.size == 0:
            continue
        xf, yf = x.astype(np.float64), y.astype(np.float64)
        if np.count_nonzero(np.isnan(xf) != np.isnan(yf)):
            return (math.inf, math.inf)
        both_nan = np.isnan(xf) & np.isnan(yf)
        d = np.where(both_nan, 0.0, np.abs(xf - yf))
        diff = float(np.nanmax(d))
        scale = max(float(np.nanmax(np.abs(yf))), 1e-30)
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / scale)
        compared = True
    return (worst_abs, worst_rel) if compared else None


def geomean(values: Sequence[float]) -> float:
    v = [x for x in values if x > 0 and math.isfinite(x)]
    return float(math.exp(sum(math.log(x) for x in v) / len(v))) if v else math.nan


def machine_summary() -> str:
    """The CPU model, its widest vector instructions and the per-core L2 size, as one line for a
    benchmark's report: a ratio against onnxruntime depends on them (on an AVX-512 Xeon its
    kernels gain more over numpy's passes than on an AVX2 EPYC: docs/benchmark.md). Parts that
    cannot be read on this platform are left out."""
    l2 = _l2_size()
    return ", ".join(p for p in (_cpu_model(), _vector_level(), l2 and f"L2 {l2}") if p)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _vector_level() -> str:
    """The widest x86 vector extension numpy found at run time ("" elsewhere)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features  # numpy >= 2
    except ImportError:  # a numpy without it: no level named
        return ""
    for name, label in (("AVX512F", "AVX-512"), ("AVX2", "AVX2"), ("SSE42", "SSE4.2"), ("ASIMD", "NEON")):
        if features.get(name):
            return label
    return ""


def _l2_size() -> str:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""
