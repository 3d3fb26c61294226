"""The fuzzing engine behind test_fuzz.py: mutate valid models and their inputs, then check
that onnxpy either works or raises one of its own errors.

Seeds are onnx's backend node test cases (about 1,900 small models covering every operator,
with recorded inputs). A hypothesis ``data`` object drives every choice, so a failure shrinks
to a small reproducible example. Mutations act on:

- bytes: flips, truncation, insertion and deletion in the serialized model;
- attributes: new values (extremes, NaN, empty lists, wrong types), removal, unknown names;
- shapes and types: dimensions of inputs/outputs/value_info (0, -1, huge, symbolic), element
  types (valid and invalid), initializer dims, data types and raw bytes;
- nodes: op type, domain, input/output lists (dropped, duplicated, renamed to other values,
  which makes cycles), order, opset version;
- inputs: values (NaN, infinities, extremes, zeros), shapes of dynamic dimensions, sometimes
  the wrong element type or rank.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import AttributeProto, TensorProto, numpy_helper

import onnxpy
from onnxpy.ir import graph as ir_graph
from onnxpy.model import dtypes
from onnxpy.ops import _compat

# Allocations a mutated model may make while fuzzing: far below the machine's memory, so a
# campaign never pushes the machine into swap or the OOM killer.
FUZZ_BUDGET = 64 << 20

# Integers a mutation uses: the edges where arithmetic and indexing break, and small values.
EDGE_INTS = [-(1 << 63), -(1 << 31), -2, -1, 0, 1, 2, 3, 7, (1 << 31) - 1, 1 << 40, (1 << 63) - 1]
EDGE_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 1e30, 3.4e38, -3.4e38, math.inf, -math.inf, math.nan]

# Every element type onnx defines (and two it does not).
ELEM_TYPES = sorted(v for v in TensorProto.DataType.values() if v) + [0, 999]


@functools.cache
def seeds() -> list[tuple[str, bytes, list[Any], list[str]]]:
    """(name, model bytes, recorded inputs, input names) of onnx's node test cases."""
    from tests.conformance.suite import _array, node_cases

    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, case in sorted(node_cases().items()):
            inputs = [_array(v) for v in case.data_sets[0][0]] if case.data_sets else []
            names = [i.name for i in case.model.graph.input]
            out.append((name, case.model.SerializeToString(), inputs, names))
    return out


@functools.cache
def seeds_by_name() -> dict[str, tuple[bytes, list[Any], list[str]]]:
    return {name: (raw, inputs, names) for name, raw, inputs, names in seeds()}


# -- proto mutations ---------------------------------------------------------------------------


def _graphs(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    out, stack = [], [model.graph]
    while stack:
        g = stack.pop()
        out.append(g)
        for n in g.node:
            for a in n.attribute:
                if a.HasField("g"):
                    stack.append(a.g)
                stack.extend(a.graphs)
    return out


def _nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for g in _graphs(model) for n in g.node]


def _value_infos(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    return [vi for g in _graphs(model) for vi in (*g.input, *g.output, *g.value_info)]


def _names(model: onnx.ModelProto) -> list[str]:
    names: list[str] = []
    for g in _graphs(model):
        names += [i.name for i in g.input] + [t.name for t in g.initializer]
        for n in g.node:
            names += list(n.input) + list(n.output)
    return sorted({n for n in names if n}) or ["x"]


def _draw_int(data: Any) -> int:
    return data.draw(st.one_of(st.sampled_from(EDGE_INTS), st.integers(-10, 10)))


def _draw_float(data: Any) -> float:
    return data.draw(st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(-10, 10)))


def mutate_attribute(data: Any, model: onnx.ModelProto) -> str:
    nodes = [n for n in _nodes(model) if n.attribute] or _nodes(model)
    if not nodes:
        return "no node"
    node = data.draw(st.sampled_from(nodes))
    how = data.draw(st.sampled_from(["value", "type", "remove", "unknown", "empty"]))
    if how == "unknown" or not node.attribute:
        node.attribute.append(onnx.helper.make_attribute(f"fuzz_{_draw_int(data) % 7}", _draw_int(data)))
        return "attribute added"
    a = data.draw(st.sampled_from(list(node.attribute)))
    if how == "remove":
        node.attribute.remove(a)
        return f"attribute {a.name} removed"
    if how == "empty":
        for f in ("ints", "floats", "strings", "tensors", "graphs"):
            a.ClearField(f)
        return f"attribute {a.name} emptied"
    if how == "type":
        a.type = data.draw(st.sampled_from(sorted(AttributeProto.AttributeType.values())))
        return f"attribute {a.name} retyped"
    if a.type == AttributeProto.INT:
        a.i = _draw_int(data)
    elif a.type == AttributeProto.FLOAT:
        a.f = _draw_float(data)
    elif a.type == AttributeProto.INTS:
        a.ClearField("ints")
        a.ints.extend(_draw_int(data) for _ in range(data.draw(st.integers(0, 5))))
    elif a.type == AttributeProto.FLOATS:
        a.ClearField("floats")
        a.floats.extend(_draw_float(data) for _ in range(data.draw(st.integers(0, 5))))
    elif a.type == AttributeProto.STRING:
        a.s = data.draw(st.sampled_from([b"", b"NOTSET", b"nearest", b"\xff\xfe", b"x" * 100]))
    elif a.type == AttributeProto.TENSOR:
        mutate_tensor(data, a.t)
    elif a.type == AttributeProto.GRAPH:
        a.g.ClearField(data.draw(st.sampled_from(["node", "input", "output"])))
    return f"attribute {a.name} changed"


def mutate_tensor(data: Any, t: TensorProto) -> str:
    how = data.draw(st.sampled_from(["dims", "dtype", "raw", "field"]))
    if how == "dims":
        if t.dims and data.draw(st.booleans()):
            t.dims[data.draw(st.integers(0, len(t.dims) - 1))] = _draw_int(data)
        else:
            t.dims.append(data.draw(st.sampled_from([0, 1, 2, -1, 1 << 40])))
    elif how == "dtype":
        t.data_type = data.draw(st.sampled_from(ELEM_TYPES))
    elif how == "raw":
        raw = t.raw_data
        cut = data.draw(st.integers(0, len(raw))) if raw else 0
        t.raw_data = raw[:cut] + data.draw(st.binary(max_size=16))
    else:
        t.ClearField("raw_data")
        t.float_data.extend(_draw_float(data) for _ in range(data.draw(st.integers(0, 4))))
    return f"tensor {how}"


def mutate_shape_or_type(data: Any, model: onnx.ModelProto) -> str:
    vis = [vi for vi in _value_infos(model) if vi.type.HasField("tensor_type")]
    inits = [t for g in _graphs(model) for t in g.initializer]
    if inits and data.draw(st.booleans()):
        return "initializer " + mutate_tensor(data, data.draw(st.sampled_from(inits)))
    if not vis:
        return "no value info"
    vi = data.draw(st.sampled_from(vis))
    tt = vi.type.tensor_type
    if data.draw(st.booleans()):
        tt.elem_type = data.draw(st.sampled_from(ELEM_TYPES))
        return f"{vi.name} elem type"
    dims = tt.shape.dim
    how = data.draw(st.sampled_from(["value", "param", "add", "drop", "clear"]))
    if how == "clear":
        tt.ClearField("shape")
    elif how == "add" or not dims:
        dims.add().dim_value = data.draw(st.sampled_from([0, 1, 3]))
    elif how == "drop":
        del dims[len(dims) - 1]
    else:
        d = dims[data.draw(st.integers(0, len(dims) - 1))]
        if how == "param":
            d.dim_param = data.draw(st.sampled_from(["n", "batch", "x"]))
        else:
            d.dim_value = data.draw(st.sampled_from([0, 1, 2, 5, -1, 1 << 40]))
    return f"{vi.name} shape {how}"


def mutate_node(data: Any, model: onnx.ModelProto) -> str:
    nodes = _nodes(model)
    if not nodes:
        return "no node"
    node = data.draw(st.sampled_from(nodes))
    how = data.draw(
        st.sampled_from(["op", "domain", "drop_input", "dup_input", "rename_input", "rename_output", "add_output"])
    )
    if how == "op":
        node.op_type = data.draw(st.sampled_from(sorted({n.op_type for n in nodes}) + ["Identity", "If", "NoSuch"]))
    elif how == "domain":
        node.domain = data.draw(st.sampled_from(["", "ai.onnx", "ai.onnx.ml", "com.microsoft", "bogus"]))
    elif how == "drop_input" and node.input:
        del node.input[data.draw(st.integers(0, len(node.input) - 1))]
    elif how == "dup_input" and node.input:
        node.input.append(node.input[data.draw(st.integers(0, len(node.input) - 1))])
    elif how == "rename_input" and node.input:
        node.input[data.draw(st.integers(0, len(node.input) - 1))] = data.draw(st.sampled_from(_names(model) + [""]))
    elif how == "rename_output" and node.output:
        node.output[data.draw(st.integers(0, len(node.output) - 1))] = data.draw(st.sampled_from(_names(model)))
    else:
        node.output.append(f"fuzz_out_{len(node.output)}")
    return f"node {how}"


def mutate_model_level(data: Any, model: onnx.ModelProto) -> str:
    how = data.draw(st.sampled_from(["opset", "ir", "order", "drop_output"]))
    if how == "opset" and model.opset_import:
        model.opset_import[0].version = data.draw(st.sampled_from([1, 6, 7, 9, 11, 13, 18, 21, 99, -1]))
    elif how == "ir":
        model.ir_version = data.draw(st.sampled_from([0, 3, 4, 7, 10, 99]))
    elif how == "order" and len(model.graph.node) > 1:
        nodes = list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(reversed(nodes))
    elif model.graph.output:
        del model.graph.output[0]
    return how


def freeze_input(data: Any, model: onnx.ModelProto, recorded: dict[str, Any]) -> str:
    """Turn a graph input into an initializer holding its recorded value, maybe with an edge
    value in it: constant folding then runs the kernel at session creation."""
    names = [i.name for i in model.graph.input if isinstance(recorded.get(i.name), np.ndarray)]
    if not names:
        return "nothing to freeze"
    name = data.draw(st.sampled_from(names))
    value = np.array(recorded[name], copy=True)
    if value.size and value.dtype.kind in "iu" and data.draw(st.booleans()):
        flat = value.reshape(-1)
        edge = data.draw(st.sampled_from([-1, 0, 1, 2, 1 << 20, -(1 << 20)]))
        flat[data.draw(st.integers(0, flat.size - 1))] = np.array(edge).astype(value.dtype)
    elif value.size and value.dtype.kind == "f" and data.draw(st.booleans()):
        value.reshape(-1)[0] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 0.0]))
    try:
        tensor = numpy_helper.from_array(value, name)
    except Exception:  # noqa: BLE001 - a dtype onnx cannot store: leave the input alone
        return "unfreezable"
    keep = [i for i in model.graph.input if i.name != name]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    model.graph.initializer.append(tensor)
    model.ir_version = max(model.ir_version, 4)
    return f"froze {name}"


PROTO_MUTATIONS: list[Callable[[Any, onnx.ModelProto], str]] = [
    mutate_attribute,
    mutate_shape_or_type,
    mutate_node,
    mutate_model_level,
]


def mutate_bytes(data: Any, raw: bytes) -> bytes:
    b = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        if not b:
            break
        how = data.draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        i = data.draw(st.integers(0, len(b) - 1))
        if how == "flip":
            b[i] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "set":
            b[i] = data.draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
        elif how == "cut":
            del b[i:]
        elif how == "insert":
            b[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del b[i : i + data.draw(st.integers(1, 8))]
    return bytes(b)


# -- inputs ------------------------------------------------------------------------------------


def _random_tensor(data: Any, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    size = int(np.prod(shape)) if shape else 1
    if dtype.kind == "f" or str(dtype).startswith(("bfloat16", "float8", "float4")):
        vals = rng.standard_normal(size) * data.draw(st.sampled_from([1.0, 1e-3, 1e6]))
        if size and data.draw(st.booleans()):
            vals[rng.integers(0, size)] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 0.0]))
        return vals.astype(dtype).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype) if dtype.kind in "iu" and dtype.itemsize <= 8 else None
        lo, hi = (-3, 5) if info is None or info.min < 0 else (0, 5)
        vals = rng.integers(lo, hi, size)
        if size and info is not None and data.draw(st.integers(0, 4)) == 0:
            vals = vals.astype(object)
            vals[rng.integers(0, size)] = data.draw(st.sampled_from([int(info.min), int(info.max)]))
        return np.asarray(vals).astype(dtype).reshape(shape)
    if dtype.kind == "b":
        return rng.integers(0, 2, size).astype(bool).reshape(shape)
    if dtype.kind == "c":
        return (rng.standard_normal(size) + 1j).astype(dtype).reshape(shape)
    if dtype.kind in "OUS":
        words = np.array(["", "a", "hello world", "\u00e9t\u00e9", "x" * 40], dtype=object)
        return words[rng.integers(0, len(words), size)].reshape(shape)
    return np.zeros(shape, dtype=dtype)


def _value_for(data: Any, tp: onnx.TypeProto) -> Any:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        try:
            dtype = dtypes.np_dtype(tp.tensor_type.elem_type) if tp.tensor_type.elem_type else np.dtype(np.float32)
        except ValueError:
            dtype = np.dtype(np.float32)
        dims = tp.tensor_type.shape.dim if tp.tensor_type.HasField("shape") else []
        if not tp.tensor_type.HasField("shape"):
            dims = [None] * data.draw(st.integers(0, 3))
        shape = []
        for d in dims:
            fixed = getattr(d, "dim_value", 0) if d is not None and d.HasField("dim_value") else None
            shape.append(fixed if fixed is not None and 0 <= fixed <= 8 else data.draw(st.integers(0, 3)))
        return _random_tensor(data, dtype, shape)
    if kind == "sequence_type":
        return [_value_for(data, tp.sequence_type.elem_type) for _ in range(data.draw(st.integers(0, 2)))]
    if kind == "optional_type":
        return None if data.draw(st.booleans()) else _value_for(data, tp.optional_type.elem_type)
    if kind == "map_type":
        return {1: 0.5, 2: 1.5} if tp.map_type.key_type == TensorProto.INT64 else {"a": 0.5}
    return _random_tensor(data, np.dtype(np.float32), [2])


def feeds_for(data: Any, sess: onnxpy.InferenceSession, recorded: dict[str, Any], model: onnx.ModelProto) -> dict:
    types = {vi.name: vi.type for vi in model.graph.input}
    feeds: dict[str, Any] = {}
    for arg in sess.get_inputs():
        if arg.name in recorded and data.draw(st.integers(0, 3)) != 0:
            v = recorded[arg.name]
            if isinstance(v, np.ndarray) and v.size and v.dtype.kind == "f" and data.draw(st.booleans()):
                v = v.copy()
                v.reshape(-1)[0] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 0.0, 1e30]))
            feeds[arg.name] = v
        elif arg.name in types:
            feeds[arg.name] = _value_for(data, types[arg.name])
        if arg.name in feeds and data.draw(st.integers(0, 9)) == 0:
            feeds[arg.name] = _random_tensor(data, np.dtype(data.draw(st.sampled_from(["float64", "int32"]))), [2, 1])
    return feeds


# -- one example -------------------------------------------------------------------------------


class Hang(Exception):
    """Raised by the watchdog when one example runs too long."""


@dataclass
class Outcome:
    seed: str
    mutations: list[str] = field(default_factory=list)
    stage: str = "create"  # create, run, done
    error: str = ""


@contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise Hang in the main thread after ``seconds`` (where SIGALRM exists); a no-op elsewhere."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"one example ran longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextmanager
def small_budgets() -> Iterator[None]:
    """Session-independent limits (constant folding at creation, sparse tensors) kept small."""
    saved = _compat.DEFAULT_MAX_ALLOC_BYTES, ir_graph.MAX_DENSE_BYTES
    _compat.DEFAULT_MAX_ALLOC_BYTES = ir_graph.MAX_DENSE_BYTES = FUZZ_BUDGET
    try:
        yield
    finally:
        _compat.DEFAULT_MAX_ALLOC_BYTES, ir_graph.MAX_DENSE_BYTES = saved


def session_options(level: int = 99) -> onnxpy.SessionOptions:
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel(level)
    so.add_session_config_entry("session.max_allocation_bytes", str(FUZZ_BUDGET))
    so.log_severity_level = 4
    return so


def run_example(data: Any, log: Callable[[bytes, Outcome], None] | None = None) -> Outcome:
    """Draw a seed, mutate it, create a session and run it. Returns what happened; raises only
    when onnxpy raised something that is not an OnnxpyError (or hung)."""
    by_name = seeds_by_name()
    name = data.draw(st.sampled_from(sorted(by_name)))  # a name: readable in a failure report
    raw, inputs, input_names = by_name[name]
    out = Outcome(seed=name)
    recorded = dict(zip(input_names, inputs))
    model = onnx.ModelProto()
    model.ParseFromString(raw)
    if data.draw(st.integers(0, 3)) == 0:
        out.mutations.append(freeze_input(data, model, recorded))
    for _ in range(data.draw(st.integers(0, 3))):
        mutation = data.draw(st.sampled_from(PROTO_MUTATIONS))
        out.mutations.append(mutation(data, model))
    source: Any = model.SerializeToString()
    if data.draw(st.integers(0, 4)) == 0:
        source = mutate_bytes(data, source)
        out.mutations.append("bytes")
    if log is not None:
        log(source, out)
    parsed = onnx.ModelProto()
    try:
        parsed.ParseFromString(source)
    except Exception:  # noqa: BLE001 - unparsable mutations still go to onnxpy as bytes
        parsed = model
    try:
        sess = onnxpy.InferenceSession(source, session_options(data.draw(st.sampled_from([99, 99, 1, 0]))))
    except onnxpy.OnnxpyError as e:
        out.error = type(e).__name__
        return out
    out.stage = "run"
    feeds = feeds_for(data, sess, recorded, parsed)
    try:
        if data.draw(st.integers(0, 3)) == 0:
            _run_bound(sess, feeds)
        else:
            sess.run(None, feeds)
    except onnxpy.OnnxpyError as e:
        out.error = type(e).__name__
        return out
    out.stage = "done"
    return out


def _run_bound(sess: onnxpy.InferenceSession, feeds: dict[str, Any]) -> None:
    """The same run through an IOBinding with outputs allocated by the session."""
    if not all(isinstance(v, np.ndarray) for v in feeds.values()):
        sess.run(None, feeds)  # sequences, maps and empty optionals are not bound from numpy
        return
    io = sess.io_binding()
    for name, value in feeds.items():
        io.bind_cpu_input(name, value)
    for arg in sess.get_outputs():
        io.bind_output(arg.name)
    sess.run_with_iobinding(io)
    io.copy_outputs_to_cpu()


def env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default
