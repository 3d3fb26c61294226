"""Shared test helpers: tiny model builders and where the real models live."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
SHARED_MODELS = REPO.parent / "shared" / "models"
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
DEMO_MODEL = REPO / "onnxpy" / "data" / "demo.onnx"


def load_benchmark(name: str) -> Any:
    """benchmarks/<name>.py loaded as a module (the folder is not a package), registered in
    sys.modules under a name of its own, where dataclasses look their module up."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"onnxpy_bench_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def python_lines_run(fn: Any) -> tuple[Any, int]:
    """(fn(), the number of Python lines executed while it ran): a deterministic measure of
    interpreter-level work. A per-element (or per-pixel, per-sample) Python loop runs millions
    of lines where a vectorized kernel runs a few thousand, whatever the machine's speed, so
    tests bound this count instead of asserting a wall-clock time."""
    import sys
    import threading

    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    from onnxpy.runtime import contention

    # The BLAS watch (runtime/contention.py) adds lines of its own when the machine is busy,
    # which would make the count depend on the load: it sits out while lines are counted.
    watch = contention.WATCH
    idle = contention.BlasContention()
    idle._active = False
    contention.WATCH = idle
    previous = sys.gettrace()
    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        result = fn()
    finally:
        sys.settrace(previous)
        threading.settrace(previous)  # type: ignore[arg-type]
        contention.WATCH = watch
    return result, count


def run_in_threads(worker: Any, count: int) -> None:
    """``worker(i)`` for i in range(count), each on its own thread, all joined."""
    import threading

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def light_models() -> list[Path]:
    return [Path(p) for p in sorted(glob.glob(str(LIGHT_DIR / "*.onnx")))]


def shared_models() -> list[Path]:
    if not SHARED_MODELS.is_dir():
        return []
    return [Path(p) for p in sorted(glob.glob(str(SHARED_MODELS / "*.onnx")))]


def skip_before_onnxruntime(version: tuple[int, int], why: str) -> None:
    """Skip the calling test where the installed onnxruntime, its oracle, is older than
    ``version``: that onnxruntime ``why`` (Python 3.10 gets onnxruntime 1.23 at most). The test
    checks onnxpy against the newer behaviour."""
    import onnxruntime

    if onnxruntime_older_than(version):
        import pytest

        pytest.skip(
            f"onnxruntime {onnxruntime.__version__} {why}; this comparison needs onnxruntime >= "
            f"{version[0]}.{version[1]}"
        )


def onnxruntime_older_than(version: tuple[int, int]) -> bool:
    import onnxruntime

    return tuple(int(p) for p in onnxruntime.__version__.split(".")[:2] if p.isdigit()) < version


# onnxruntime's com.microsoft operators stay at version 1 while their behaviour changes between
# releases (outputs added, inputs reinterpreted, bit widths allowed): the contrib tests compare
# with the onnxruntime they were written against, and skip where an older one is installed.
CONTRIB_ORACLE = (1, 32)
CONTRIB_SKIP_REASON = (
    "com.microsoft operators are compared with onnxruntime >= 1.32 (their behaviour changed in "
    "earlier releases without a new operator version)"
)


def draw_padded_map(draw: Any, reach: Sequence[int], max_pad: int, largest: int) -> tuple[list[int], tuple[int, int]]:
    """For a hypothesis strategy: 2-D pads (begin, begin, end, end) up to ``max_pad`` and a map
    size up to ``largest`` on which a kernel spanning ``reach`` (its dilated extent) yields at
    least one output position."""
    from hypothesis import strategies as st

    pads = [draw(st.integers(0, max_pad)) for _ in range(4)]
    h = draw(st.integers(max(1, reach[0] - pads[0] - pads[2]), largest))
    w = draw(st.integers(max(1, reach[1] - pads[1] - pads[3]), largest))
    return pads, (h, w)


def vinfo(name: str, elem: int = TensorProto.FLOAT, shape: Sequence[Any] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    ir_version: int = 8,
    name: str = "test_graph",
    extra_opsets: dict[str, int] | None = None,
    functions: Sequence[onnx.FunctionProto] = (),
) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), initializer=inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="onnxpy-tests", functions=list(functions))
    model.ir_version = ir_version
    return model


def single_node_model(
    op_type: str,
    inputs: dict[str, tuple[int, Sequence[Any]]],
    outputs: dict[str, tuple[int, Sequence[Any] | None]],
    opset: int = 17,
    **attrs: Any,
) -> onnx.ModelProto:
    node = helper.make_node(op_type, list(inputs), list(outputs), name=f"the_{op_type.lower()}", **attrs)
    return make_model(
        [node],
        [vinfo(n, e, s) for n, (e, s) in inputs.items()],
        [vinfo(n, e, s) for n, (e, s) in outputs.items()],
        opset=opset,
    )


def random_feeds(args: Sequence[Any], rng: np.random.Generator, batch: int = 1, seq: int = 16) -> dict[str, np.ndarray]:
    """Random inputs for NodeArgs; named dims get ``batch`` (first axis) or ``seq``; int inputs are
    token ids (or ones for masks)."""
    feeds = {}
    for a in args:
        shape = [d if isinstance(d, int) else (batch if i == 0 else seq) for i, d in enumerate(a.shape)]
        if a.type == "tensor(int64)":
            if "mask" in a.name:
                feeds[a.name] = np.ones(shape, dtype=np.int64)
            else:
                feeds[a.name] = rng.integers(0, 100, size=shape, dtype=np.int64)
        else:
            feeds[a.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def model_id(path: os.PathLike[str] | str) -> str:
    return Path(path).stem


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace every ConstantOfShape weight (one repeated value) by random values of the same
    shape, and every float initializer by random values: real-looking weights for the light
    models. BatchNormalization variances stay positive."""
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    positive = {n.input[4] for n in g.node if n.op_type == "BatchNormalization" and len(n.input) > 4}

    def values(name: str, shape: Sequence[int]) -> np.ndarray:
        if name in positive:
            return rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
        # Weights scaled by fan-in keep activations of deep nets of order one.
        scale = 1 / np.sqrt(max(int(np.prod(shape[1:])), 1)) if len(shape) >= 2 else 0.1
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    keep = []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = numpy_helper.to_array(inits[node.input[0]]).astype(np.int64).tolist()
            value = [a for a in node.attribute if a.name == "value"]
            dtype = numpy_helper.to_array(value[0].t).dtype if value else np.dtype(np.float32)
            if dtype == np.float32:
                g.initializer.append(numpy_helper.from_array(values(node.output[0], shape), node.output[0]))
                continue
        keep.append(node)
    del g.node[:]
    g.node.extend(keep)
    # IR 3 required initializers to be listed as inputs; the new ones are not, so say IR 4+.
    init_names = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in init_names]
    del g.input[:]
    g.input.extend(inputs)
    m.ir_version = max(m.ir_version, 7)
    for t in list(g.initializer):
        if t.data_type == TensorProto.FLOAT and len(t.dims) > 0 and t.name not in {o for n in keep for o in n.output}:
            arr = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array(values(t.name, arr.shape), t.name))
    return m


def optimized_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node counts by op type after onnxpy's full optimization (host session)."""
    import collections

    from onnxpy.optimizer.manager import optimize
    from onnxpy.runtime.compile import build_graph

    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return dict(collections.Counter(n.op_type for n in graph.nodes))


def check_optimized(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    *,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    fetches: list[str] | None = None,
) -> list[np.ndarray]:
    """Run ``model`` in onnxpy optimized and unoptimized and in onnxruntime: every optimized
    output has onnxruntime's shape, comes back C-contiguous and matches both within the
    tolerances. Returns the optimized outputs."""
    import onnxruntime as ort

    import onnxpy

    data = model.SerializeToString()
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = onnxpy.InferenceSession(data).run(fetches, feeds)
    plain = onnxpy.InferenceSession(data, plain_opts).run(fetches, feeds)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(fetches, feeds)
    assert len(got) == len(want)
    for g, p, w in zip(got, plain, want):
        assert g.shape == w.shape and g.flags.c_contiguous, (g.shape, w.shape)
        np.testing.assert_allclose(g, p, rtol=rtol, atol=atol)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


def assert_optimized_matches(model: onnx.ModelProto, feeds: dict[str, Any], rtol: float, atol: float) -> None:
    """Run ``model`` unoptimized and fully optimized on onnxpy and on onnxruntime; assert the
    optimized outputs match both within (rtol, atol)."""
    import onnxruntime as ort

    import onnxpy

    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model.SerializeToString()
    plain = onnxpy.InferenceSession(data, plain_opts).run(None, feeds)
    got = onnxpy.InferenceSession(data).run(None, feeds)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, p, w in zip(got, plain, want, strict=True):
        np.testing.assert_allclose(g, p, rtol=rtol, atol=atol)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def quantize_static_model(
    tmp_path: Any,
    model: onnx.ModelProto,
    fmt: str,
    activations: str,
    weights: str,
    *,
    per_channel: bool = False,
    **extra: Any,
) -> onnx.ModelProto:
    """``model`` (one float input "x" of shape [N, 3, 16, 16]) quantized by onnxruntime's
    quantize_static in format ``fmt`` ("QDQ" or "QOperator"), calibrated on four random batches."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(1)
    calibration = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    fp, qp = tmp_path / "float.onnx", tmp_path / "quant.onnx"
    onnx.save(model, fp)
    quantize_static(
        str(fp),
        str(qp),
        Reader(),
        quant_format=getattr(QuantFormat, fmt),
        activation_type=getattr(QuantType, activations),
        weight_type=getattr(QuantType, weights),
        per_channel=per_channel,
        extra_options=extra or None,
    )
    return onnx.load(str(qp))
