"""onnxpy against onnxruntime, side by side, on real models.

    python benchmarks/bench.py                     # everything, about 5 minutes on 2 cores
    python benchmarks/bench.py --models resnet mlp --repeat 20
    python benchmarks/bench.py --random-weights    # light models with random weights
    python benchmarks/bench.py --quantized --no-light --batches 1   # the shared models quantized
    python benchmarks/bench.py --half --no-light --batches 1        # the shared models in float16
    python benchmarks/bench.py --transformers --no-light --no-shared --batches 1   # GPT-2, BERT, ViT

What it measures, for each model:

- median latency of ``run`` for onnxpy and onnxruntime, interleaved round by round in this one
  process (both see the same machine state), and their ratio onnxpy / onnxruntime; in each
  round a runtime makes untimed calls for 150 ms (at least one), then a block of timed calls
  lasting about 0.1 s, so each is measured as it runs alone, not fighting the other's
  spinning thread pool (see ``time_interleaved``);
- session-creation time of each;
- peak resident memory (RSS) of each runtime, each in a fresh subprocess that imports only that
  runtime, creates the session and runs the model twice; then the memory one more run touches
  (Linux page reference bits: what must come back from cache or RAM on every run);
- that both give the same outputs (max relative difference), so a fast wrong answer shows.

Models: onnx's light models (``onnx/backend/test/data/light``: real architectures whose weights
are ConstantOfShape nodes, so every weight tensor holds one repeated value; ``--random-weights``
replaces each by a random initializer of the same shape), the models in ``../shared/models``
(skipped with a message when the folder is absent) and a tiny MLP built here (per-call overhead).
With ``--quantized``, also the shared models as onnxruntime's quantizer writes them
(``quantized.py``), outside issue 5's figures. onnxruntime runs them with integer kernels that
round a little differently from the float graph the model describes, so their outputs differ
by a quantization step or two and the relative-difference warning leaves them out. With
``--half``, also the shared models in float16 (``half.py``), reported apart the same way. With
``--transformers``, also GPT-2 (one decoder step with 128 cached tokens, and a prompt), BERT and a
ViT built as transformers' and timm's exporters write them (``tests/models/zoo.py``, at the sizes
``transformer_models`` sets), also reported apart.

Batch 1 and 8. Batch 8 runs only where the model's batch axis is free: the light models (and
squeezenet1_1) were exported with a fixed batch of 1, which the table says.

Repeats adapt to the time each model takes: up to ``--repeat`` rounds (default 10), fewer when
a round is slow, so that a model spends about ``--budget`` seconds (default 6), never fewer than 3
rounds. It is a benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from onnxpy.tools.benchmark import (  # noqa: E402 - after making the repository importable
    SETTLE_S,
    SessionConfig,
    geomean,
    latency_stats,
    machine_summary,
    make_contender,
    max_difference,
    time_interleaved,
)
from onnxpy.tools.feeds import make_feeds, model_inputs  # noqa: E402
from onnxpy.tools.table import format_table  # noqa: E402

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
SHARED_DIR = REPO.parent / "shared" / "models"

TARGET_GEOMEAN = 1.3
TARGET_WORST = 2.5
TARGET_MLP = 3.0
TARGET_MEMORY = 1.5


# -- models --------------------------------------------------------------------------------------


@dataclass
class ModelEntry:
    name: str
    kind: str  # "light", "shared", "quantized", "half", "transformer" or "mlp"
    path: str
    note: str = ""
    dims: dict[str, int] | None = None  # free dimensions, where not --seq (a decoder step's)


def tiny_mlp(features: int = 64, hidden: int = 128, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """x[N, 64] -> Linear+Relu -> Linear+Relu -> Linear: microseconds of math, so latency is overhead."""
    rng = np.random.default_rng(seed)
    sizes = [features, hidden, hidden, classes]
    nodes, inits = [], []
    prev = "x"
    for i in range(3):
        w = (rng.standard_normal((sizes[i], sizes[i + 1])) / math.sqrt(sizes[i])).astype(np.float32)
        b = (0.1 * rng.standard_normal(sizes[i + 1])).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"], name=f"matmul{i}"))
        out = f"h{i}" if i < 2 else "logits"
        nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"lin{i}" if i < 2 else out], name=f"add{i}"))
        if i < 2:
            nodes.append(helper.make_node("Relu", [f"lin{i}"], [out], name=f"relu{i}"))
        prev = out
    graph = helper.make_graph(
        nodes,
        "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxpy-bench")
    model.ir_version = 8
    return model


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> int:
    """Replace every ConstantOfShape weight (constant shape, float value) by a random initializer.

    Values are scaled like a trained network's (``N(0, 2/fan_in)`` for matrices and kernels,
    ``U(0.5, 1.5)`` for vectors, which keeps BatchNormalization variances positive) so that
    activations stay finite through deep models. Returns how many tensors were replaced.
    """
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    keep: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    for node in model.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        dtype = np.float32 if value is None else numpy_helper.to_array(value).dtype
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits or dtype.kind != "f":
            keep.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:]))
            arr = rng.standard_normal(shape) * math.sqrt(2.0 / max(fan_in, 1))
        else:
            arr = rng.uniform(0.5, 1.5, size=shape)
        new_inits.append(numpy_helper.from_array(arr.astype(dtype), node.output[0]))
    replaced = len(new_inits)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    model.graph.initializer.extend(new_inits)
    # Shape initializers no node reads any more would make onnxruntime print warnings.
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    graph_inputs = [vi for vi in model.graph.input if vi.name in used]
    if model.ir_version < 4:  # before IR 4 every initializer is also a graph input
        graph_inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in new_inits]
    del model.graph.input[:]
    model.graph.input.extend(graph_inputs)
    return replaced


# Exporter-faithful transformers (tests/models/zoo.py) at sizes between the tests' toy ones and
# the published models: the per-node work of a real layer, a few layers.
GPT2_SIZE = {"vocab": 8192, "embd": 256, "heads": 4, "layers": 4, "positions": 512}
# GPT-2 small's width (its 12 heads of 64, 3072-wide MLP) in half its layers: a decoder step
# there streams 2-9 MB weights, where the 256-wide one stays in cache.
GPT2_WIDE_SIZE = {"vocab": 8192, "embd": 768, "heads": 12, "layers": 6, "positions": 512}
# A Llama-style decoder (grouped-query attention: 8 query heads over 2 KV heads, SwiGLU MLP) at
# 512 wide in 4 layers, its untied 8192-token head: a decoder step streams 60 MB of weights.
LLAMA_SIZE = {"vocab": 8192, "hidden": 512, "heads": 8, "kv_heads": 2, "inter": 1376, "layers": 4, "theta": 10000}
BERT_SIZE = {"vocab": 8192, "hidden": 256, "heads": 4, "layers": 4, "inter": 1024, "max_pos": 512, "types": 2}
VIT_SIZE = {"image": 224, "patch": 16, "dim": 192, "heads": 3, "depth": 4, "mlp": 768, "classes": 1000}
DECODER_PAST = 128  # tokens already in the cache of a decoder step


def transformer_models(workdir: str, seed: int) -> list[ModelEntry]:
    """GPT-2 (one decoder step after DECODER_PAST tokens, with past key/values as optimum
    exports it, at 256 and at 768 wide; and a prompt of --seq tokens), a Llama-style decoder
    step (grouped-query attention), BERT at --seq tokens and a ViT-Tiny-like ViT, as
    transformers' and timm's exporters write them. Outside issue 5's figures."""
    from tests.models import zoo

    step = {"sequence_length": 1, "past_sequence_length": DECODER_PAST}
    step["past_sequence_length + sequence_length"] = DECODER_PAST + 1
    models = [
        ("gpt2_decoder_step", zoo.gpt2(17, seed, past=True, cfg=GPT2_SIZE), step),
        ("gpt2_768_decoder_step", zoo.gpt2(17, seed, past=True, cfg=GPT2_WIDE_SIZE), step),
        ("llama_decoder_step", zoo.llama(17, seed, cfg=LLAMA_SIZE), step),
        ("gpt2_prompt", zoo.gpt2(17, seed, cfg=GPT2_SIZE), None),
        ("bert", zoo.bert(17, seed, cfg=BERT_SIZE), None),
        ("vit", zoo.vit(18, seed, cfg=VIT_SIZE), None),
    ]
    entries = []
    for name, model, dims in models:
        path = os.path.join(workdir, f"{name}.onnx")
        onnx.save(model, path)
        entries.append(ModelEntry(name, "transformer", path, dims=dims))
    return entries


def collect_models(args: argparse.Namespace, workdir: str) -> tuple[list[ModelEntry], list[str]]:
    entries: list[ModelEntry] = []
    messages: list[str] = []
    if not args.no_light:
        light = sorted(glob.glob(str(LIGHT_DIR / "*.onnx")))
        if not light:
            messages.append(f"onnx's light models not found in {LIGHT_DIR}: skipped")
        for p in light:
            name = Path(p).stem
            if args.random_weights:
                m = onnx.load(p)
                n = randomize_weights(m, seed=args.seed)
                p = os.path.join(workdir, f"{name}_random.onnx")
                onnx.save(m, p)
                entries.append(ModelEntry(name, "light", p, f"{n} random weight tensors"))
            else:
                entries.append(ModelEntry(name, "light", p))
    if not args.no_shared:
        shared_dir = Path(args.shared_dir)
        shared = sorted(glob.glob(str(shared_dir / "*.onnx"))) if shared_dir.is_dir() else []
        if not shared:
            messages.append(f"no models in {shared_dir}: skipped")
        entries += [ModelEntry(Path(p).stem, "shared", p) for p in shared]
        if args.quantized and shared:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from quantized import quantized_models  # benchmarks/quantized.py

            entries += [ModelEntry(name, "quantized", q) for name, q in quantized_models(shared, workdir, args.seed)]
        if args.half and shared:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from half import half_models  # benchmarks/half.py

            entries += [ModelEntry(name, "half", h) for name, h in half_models(shared, workdir)]
    if args.transformers:
        entries += transformer_models(workdir, args.seed)
    p = os.path.join(workdir, "tiny_mlp.onnx")
    onnx.save(tiny_mlp(seed=args.seed), p)
    entries.append(ModelEntry("tiny_mlp", "mlp", p))
    if args.models:
        entries = [e for e in entries if any(s.lower() in e.name.lower() for s in args.models)]
    return entries, messages


# -- measuring -----------------------------------------------------------------------------------


@dataclass
class Result:
    model: str
    kind: str
    batch: int
    status: str = "ok"  # "ok", "skipped", "error"
    reason: str = ""
    runs: int = 0
    onnxpy_ms: float = math.nan
    onnxruntime_ms: float = math.nan
    onnxpy_min_ms: float = math.nan
    onnxruntime_min_ms: float = math.nan
    ratio: float = math.nan
    create_onnxpy_ms: float = math.nan
    create_onnxruntime_ms: float = math.nan
    max_rel_diff: float = math.nan
    rss_onnxpy_mb: float = math.nan
    rss_onnxruntime_mb: float = math.nan
    touched_onnxpy_mb: float = math.nan
    touched_onnxruntime_mb: float = math.nan
    inputs: dict[str, list[int]] = field(default_factory=dict)


def free_batch_axis(path: str) -> bool:
    specs = model_inputs(onnx.load(path, load_external_data=False))
    return any(s.dims and not isinstance(s.dims[0], int) for s in specs)


def free_dims(model: onnx.ModelProto, seq: int) -> dict[str, int]:
    """Named free dimensions other than a leading batch axis get ``seq`` (sequence length)."""
    dims: dict[str, int] = {}
    for s in model_inputs(model):
        for axis, d in enumerate(s.dims or []):
            if isinstance(d, str) and axis > 0:
                dims.setdefault(d, seq)
    return dims


def _key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"want KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key, value


def measure(entry: ModelEntry, batch: int, args: argparse.Namespace) -> Result:
    res = Result(entry.name, entry.kind, batch)
    header = onnx.load(entry.path, load_external_data=False)
    if batch != 1 and not free_batch_axis(entry.path):
        res.status, res.reason = "skipped", "batch axis fixed at 1 in the model"
        return res
    dims = entry.dims or free_dims(header, args.seq)
    feeds = make_feeds(header, dims=dims, batch=batch, seed=args.seed)
    res.inputs = {n: list(a.shape) for n, a in feeds.arrays.items()}
    cfg = SessionConfig(
        args.opt_level, args.threads, dict(feeds.overrides), onnxpy_config=dict(getattr(args, "onnxpy_config", ()))
    )
    try:
        ours = make_contender("onnxpy", entry.path, feeds.arrays, cfg)
    except Exception as e:  # noqa: BLE001 - one failing model must not stop the benchmark
        res.status, res.reason = "error", f"onnxpy: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return res
    try:
        theirs = make_contender("onnxruntime", entry.path, feeds.arrays, cfg)
    except Exception as e:  # noqa: BLE001 - nothing to compare against
        res.status, res.reason = "error", f"onnxruntime: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return res
    res.create_onnxpy_ms = ours.create_s * 1e3
    res.create_onnxruntime_ms = theirs.create_s * 1e3
    diff = max_difference(ours.outputs, theirs.outputs)
    res.max_rel_diff = diff[1] if diff else math.nan
    # One untimed round (the second run of each), which also sizes the number of rounds.
    t0 = time.perf_counter()
    ours.call()
    theirs.call()
    round_s = time.perf_counter() - t0
    # Timed calls come in blocks of about 0.1 s per runtime, after SETTLE_S of settling calls
    # (see time_interleaved); --repeat counts timed calls.
    per_call = max(round_s / 2, 1e-9)
    # The tiny MLP measures per-call overhead: its calls take microseconds, and --repeat 20
    # made its median two blocks of ten calls, which one slow stretch of the machine could
    # set (2.05x-3.38x over five runs of one build). It gets at least --mlp-calls.
    repeat = max(args.repeat, args.mlp_calls) if entry.kind == "mlp" else args.repeat
    block = max(1, min(10, repeat, int(0.1 / per_call)))
    per_round = 2 * (max(SETTLE_S, per_call) + block * per_call)
    rounds = max(-(-args.min_repeat // block), min(repeat // block, int(args.budget / per_round)), 1)
    if entry.kind == "mlp":
        # ... whatever the time budget says (six seconds of settled rounds gave 19 blocks)
        rounds = max(rounds, -(-args.mlp_calls // block))
    times = time_interleaved([ours, theirs], repeat=rounds, warmup=0, block=block)
    a, b = latency_stats(times["onnxpy"], batch), latency_stats(times["onnxruntime"], batch)
    res.runs = a.runs
    res.onnxpy_ms, res.onnxruntime_ms = a.median_ms, b.median_ms
    res.onnxpy_min_ms, res.onnxruntime_min_ms = a.min_ms, b.min_ms
    res.ratio = a.median_ms / b.median_ms
    return res


RSS_CHILD = r"""
import json, resource, sys, time


def proc_kb(path, field):
    # A kB figure from a /proc file (None where there is none).
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_kb():
    # VmHWM is this process's own high-water mark; ru_maxrss would also count the parent's
    # RSS at fork time, which Linux carries across exec.
    kb = proc_kb("/proc/self/status", "VmHWM:")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss if kb is None else kb


runtime, path, feeds_path, threads, opt = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
import numpy as np
feeds = dict(np.load(feeds_path, allow_pickle=False))
if runtime == "onnxpy":
    import onnxpy as rt
else:
    import onnxruntime as rt
base = peak_kb()
so = rt.SessionOptions()
so.graph_optimization_level = getattr(rt.GraphOptimizationLevel, opt)
if threads:
    so.intra_op_num_threads = threads
if runtime == "onnxruntime":
    so.log_severity_level = 3
t = time.perf_counter()
sess = rt.InferenceSession(path, so, providers=["CPUExecutionProvider"])
create = time.perf_counter() - t
for _ in range(2):
    sess.run(None, feeds)
peak = peak_kb()


def touched_kb():
    # Memory one warm run touches: clear the pages' referenced bits, run, count them again
    # (Linux). Memory a runtime touches each run must come back from cache or RAM every run.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("1")
    except OSError:
        return None
    sess.run(None, feeds)
    return proc_kb("/proc/self/smaps_rollup", "Referenced:")


print(json.dumps({"peak_kb": peak, "import_kb": base, "create_s": create, "touched_kb": touched_kb()}))
"""


def memory_use(
    runtime: str, entry: ModelEntry, feeds: dict[str, np.ndarray], args: argparse.Namespace
) -> tuple[float, float]:
    """Peak RSS in MB of a fresh process running ``entry`` twice on ``runtime``, and the MB one
    more run touches (NaN on failure, or where Linux's page reference bits are unavailable)."""
    from onnxpy.tools.benchmark import OPT_LEVELS

    with tempfile.TemporaryDirectory() as tmp:
        fp = os.path.join(tmp, "feeds.npz")
        np.savez(fp, **feeds)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [
            sys.executable,
            "-c",
            RSS_CHILD,
            runtime,
            entry.path,
            fp,
            str(args.threads),
            OPT_LEVELS[args.opt_level],
        ]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=True)
            stats = json.loads(out.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, ValueError, IndexError, KeyError):
            return math.nan, math.nan
        touched = stats.get("touched_kb")
        return stats["peak_kb"] / 1024.0, math.nan if touched is None else touched / 1024.0


# -- report --------------------------------------------------------------------------------------


def _f(x: float, fmt: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def report(results: list[Result], memory: bool) -> str:
    lines = []
    rows = []
    skipped: dict[str, list[str]] = {}
    for r in results:
        if r.status == "skipped":
            skipped.setdefault(f"batch {r.batch} skipped ({r.reason})", []).append(r.model)
            continue
        if r.status != "ok":
            rows.append([r.model, r.batch, "-", "-", "-", "-", "-", "-", "-", "-", f"{r.status}: {r.reason}"])
            continue
        rows.append(
            [
                r.model,
                r.batch,
                _f(r.onnxpy_ms, ".3f"),
                _f(r.onnxruntime_ms, ".3f"),
                _f(r.ratio) + "x",
                r.runs,
                _f(r.create_onnxpy_ms, ".0f"),
                _f(r.create_onnxruntime_ms, ".0f"),
                _f(r.rss_onnxpy_mb, ".0f") if memory else "-",
                _f(r.rss_onnxruntime_mb, ".0f") if memory else "-",
                _f(r.touched_onnxpy_mb, ".0f") if memory else "-",
                _f(r.touched_onnxruntime_mb, ".0f") if memory else "-",
                _f(r.max_rel_diff, ".1e"),
            ]
        )
    lines.append(
        format_table(
            [
                "model",
                "batch",
                "onnxpy ms",
                "ort ms",
                "ratio",
                "runs",
                "create ms",
                "ort create",
                "RSS MB",
                "ort RSS",
                "touch MB",
                "ort touch",
                "rel diff / note",
            ],
            rows,
        )
    )
    for why, names in skipped.items():
        lines.append(f"{why}: {', '.join(names)}")
    lines.append("")
    lines.append("ms: median latency of run(); ratio: onnxpy / onnxruntime (lower is better, 1.0 = parity)")
    if memory:
        lines.append("RSS: peak resident memory; touch: memory one warm run touches (weights included)")
    for batch in sorted({r.batch for r in results}):
        ok = [r for r in results if r.batch == batch and r.status == "ok" and r.kind in ("light", "shared")]
        if ok:
            gm = geomean([r.ratio for r in ok])
            worst = max(ok, key=lambda r: r.ratio)
            line = (
                f"batch {batch}: geometric mean of ratios over {len(ok)} models: {gm:.2f}x; "
                f"worst {worst.model} {worst.ratio:.2f}x"
            )
            if batch == 1:
                line += f" (issue 5 targets: geomean <= {TARGET_GEOMEAN}, none above {TARGET_WORST})"
            lines.append(line)
        for kind, what in (("quantized", "quantized"), ("half", "float16"), ("transformer", "transformer")):
            apart = [r for r in results if r.batch == batch and r.status == "ok" and r.kind == kind]
            if apart:
                lines.append(
                    f"batch {batch}: {what} models (outside issue 5's figures): geometric mean "
                    f"{geomean([r.ratio for r in apart]):.2f}x over {len(apart)}"
                )
    mlp = [r for r in results if r.kind == "mlp" and r.status == "ok"]
    for r in mlp:
        lines.append(
            f"tiny MLP per-call, batch {r.batch}: onnxpy {r.onnxpy_min_ms * 1e3:.0f} us vs onnxruntime "
            f"{r.onnxruntime_min_ms * 1e3:.0f} us (min), median ratio {r.ratio:.2f}x"
            + (f" (target <= {TARGET_MLP:g}x)" if r.batch == 1 else "")
        )
    if memory:
        for r in results:
            if "resnet50" in r.model and r.batch == 1 and r.status == "ok" and not math.isnan(r.rss_onnxpy_mb):
                lines.append(
                    f"{r.model} peak RSS: onnxpy {r.rss_onnxpy_mb:.0f} MB vs onnxruntime {r.rss_onnxruntime_mb:.0f} MB: "
                    f"{r.rss_onnxpy_mb / r.rss_onnxruntime_mb:.2f}x (target <= {TARGET_MEMORY})"
                )
    bad = [r for r in results if r.status == "ok" and r.kind not in ("quantized", "half") and r.max_rel_diff > 1e-3]
    bad += [r for r in results if r.status == "ok" and r.kind == "half" and r.max_rel_diff > 1e-2]
    if bad:
        lines.append(
            "outputs differ from onnxruntime (relative > 1e-3; 1e-2 for float16 models): "
            + ", ".join(r.model for r in bad)
        )
    return "\n".join(lines)


def _load_line() -> str:
    """The machine's load: figures taken while other work runs are slower and noisier."""
    try:
        one, five, _ = os.getloadavg()
    except (OSError, AttributeError):
        return ""
    cores = os.cpu_count() or 1
    warn = " (busy machine: expect noisy, slower figures)" if one > cores * 0.75 else ""
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {cores} cores{warn}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", metavar="PATTERN", help="only models whose name contains a pattern")
    p.add_argument("--repeat", type=int, default=10, help="most timed rounds per model (default 10)")
    p.add_argument("--min-repeat", type=int, default=3, help="fewest timed rounds per model (default 3)")
    p.add_argument("--budget", type=float, default=6.0, help="seconds of timed rounds to aim for per model")
    p.add_argument(
        "--mlp-calls",
        type=int,
        default=200,
        help="fewest timed calls of the tiny MLP, whose median needs many (default 200: about 20 blocks)",
    )
    p.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    p.add_argument("--seq", type=int, default=128, help="value of free non-batch dimensions (default 128)")
    p.add_argument("--random-weights", action="store_true", help="light models with random weights")
    p.add_argument("--quantized", action="store_true", help="also the shared models, quantized by onnxruntime")
    p.add_argument("--half", action="store_true", help="also the shared models in float16")
    p.add_argument(
        "--transformers",
        action="store_true",
        help="also GPT-2 (a decoder step with past, a prompt), BERT and ViT as exporters write them",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-RSS subprocesses")
    p.add_argument("--no-light", action="store_true", help="skip onnx's light models")
    p.add_argument("--no-shared", action="store_true", help="skip ../shared/models")
    p.add_argument("--shared-dir", default=str(SHARED_DIR), help=f"default {SHARED_DIR}")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads of both runtimes (0: default)")
    p.add_argument(
        "--onnxpy-config",
        action="append",
        default=[],
        type=_key_value,
        metavar="KEY=VALUE",
        help="a session config entry for onnxpy only, e.g. session.split_processes=1 (repeatable)",
    )
    p.add_argument("--opt-level", choices=["disable", "basic", "extended", "all"], default="all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.repeat < 1 or args.min_repeat < 1:
        p.error("--repeat and --min-repeat must be >= 1")
    args.min_repeat = min(args.min_repeat, args.repeat)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    memory = not args.no_memory

    started = time.perf_counter()
    load = _load_line()
    if load:
        print(load, flush=True)
    with tempfile.TemporaryDirectory(prefix="onnxpy_bench_") as workdir:
        entries, messages = collect_models(args, workdir)
        for m in messages:
            print(f"note: {m}", flush=True)
        if args.random_weights:
            print("note: light models run with random weights (--random-weights)", flush=True)
        results: list[Result] = []
        total = len(entries) * len(batches)
        k = 0
        for entry in entries:
            for batch in batches:
                k += 1
                r = measure(entry, batch, args)
                if memory and r.status == "ok" and batch == batches[0]:
                    header = onnx.load(entry.path, load_external_data=False)
                    dims = entry.dims or free_dims(header, args.seq)
                    feeds = make_feeds(header, dims=dims, batch=batch, seed=args.seed)
                    r.rss_onnxpy_mb, r.touched_onnxpy_mb = memory_use("onnxpy", entry, feeds.arrays, args)
                    r.rss_onnxruntime_mb, r.touched_onnxruntime_mb = memory_use(
                        "onnxruntime", entry, feeds.arrays, args
                    )
                results.append(r)
                if r.status == "ok":
                    msg = (
                        f"onnxpy {r.onnxpy_ms:.3f} ms, onnxruntime {r.onnxruntime_ms:.3f} ms, "
                        f"ratio {r.ratio:.2f}x ({r.runs} runs)"
                    )
                else:
                    msg = f"{r.status}: {r.reason}"
                print(f"[{k}/{total}] {entry.name} batch {batch}: {msg}", flush=True)
    print()
    print(report(results, memory))
    print(f"\ntotal time {time.perf_counter() - started:.0f} s")
    machine = machine_summary()
    print(f"machine: {machine}")
    load = _load_line()
    if load:
        print(load)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "results": [asdict(r) for r in results],
                    "settings": {k: v for k, v in vars(args).items() if k != "json"},
                    "machine": machine,
                },
                f,
                indent=2,
                default=str,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
