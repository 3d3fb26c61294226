"""Session creation after loading: validate, infer types, build the graph, optimize, compile."""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import onnx
from onnx import ModelProto

from ..api.errors import InvalidGraph
from ..ir.functions import expand_functions, local_function_table
from ..ir.graph import (
    Graph,
    graph_from_proto,
    iter_graphs,
    nesting_depth,
    normalize_domain,
    release_protos,
    topological_sort,
)
from ..model import dtypes
from ..model.load import MAX_OPSET, check_nesting
from ..ops import registry
from .binding import validate_node, validate_protos
from .type_check import check_types

# Domains onnxruntime serves to nodes of a model that does not import them, at their newest
# version: models written by its transformer optimizer use com.microsoft operators and import
# only ai.onnx. (An unknown domain without an import stays an error, as there.)
IMPLIED_DOMAINS = {"com.microsoft": 1, "ai.onnx.ml": MAX_OPSET["ai.onnx.ml"], "ai.onnx.preview.training": 1}


def _domains_used(graph: onnx.GraphProto) -> set[str]:
    used: set[str] = set()
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            used.add(normalize_domain(node.domain))
            for a in node.attribute:
                if a.HasField("g"):
                    stack.append(a.g)
                stack.extend(a.graphs)
    return used


def model_opsets(model: ModelProto) -> dict[str, int]:
    opsets: dict[str, int] = {}
    for imp in model.opset_import:
        dom = normalize_domain(imp.domain)
        if dom in opsets and opsets[dom] != imp.version:
            raise InvalidGraph(
                f"the model imports domain '{imp.domain or 'ai.onnx'}' twice, at opsets {opsets[dom]} and {imp.version}"
            )
        opsets[dom] = imp.version
    if not model.opset_import:
        if model.ir_version >= 3:
            # From IR 3 on a model must say which opsets it uses (onnxruntime refuses it too).
            raise InvalidGraph(f"the model (IR version {model.ir_version}) imports no opset: opset_import is empty")
        opsets[""] = 1  # IR version < 3: the default domain at its first version
    for domain in _domains_used(model.graph) & IMPLIED_DOMAINS.keys():
        opsets.setdefault(domain, IMPLIED_DOMAINS[domain])
    return opsets


def apply_free_dimension_overrides(
    model: ModelProto, overrides: Mapping[str, int], by_denotation: Mapping[str, int] | None = None
) -> None:
    """Replace free dimensions of graph inputs by fixed values: those named (dim_param 'batch')
    in ``overrides``, and those whose denotation ('DATA_BATCH') is in ``by_denotation``."""
    if not overrides and not by_denotation:
        return
    for vi in model.graph.input:
        if not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                continue
            if d.HasField("dim_param") and d.dim_param in overrides:
                d.dim_value = int(overrides[d.dim_param])
            elif by_denotation and d.denotation in by_denotation:
                d.dim_value = int(by_denotation[d.denotation])


# Initializers larger than this are replaced by typed inputs for shape inference: inference
# needs their types and shapes, not their values, and copying the weights costs memory.
_INFERENCE_VALUE_LIMIT = 4096


def _weightless_copy(model: ModelProto) -> ModelProto:
    light = ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(light, field, getattr(model, field))
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    src, dst = model.graph, light.graph
    dst.name = src.name
    dst.node.extend(src.node)
    dst.input.extend(src.input)
    dst.output.extend(src.output)
    dst.value_info.extend(src.value_info)
    declared = {vi.name for vi in src.input}
    for t in src.initializer:
        count = 1
        for d in t.dims:
            count *= d
        if count <= _INFERENCE_VALUE_LIMIT:
            dst.initializer.append(t)
        elif t.name not in declared:
            dst.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    if light.ir_version < 4:
        light.ir_version = 4  # inputs that are not initializers are fine from IR 4 on
    return light


def _forget_invented_dims(graph: onnx.GraphProto) -> None:
    """onnx's inference names dimensions it cannot tell 'unk__N'; they mean unknown."""
    stack = [graph]
    while stack:
        g = stack.pop()
        for vi in [*g.value_info, *g.output]:
            if vi.type.HasField("tensor_type"):
                for d in vi.type.tensor_type.shape.dim:
                    if d.HasField("dim_param") and d.dim_param.startswith("unk__"):
                        d.ClearField("dim_param")
        for node in g.node:
            for a in node.attribute:
                if a.HasField("g"):
                    stack.append(a.g)
                stack.extend(a.graphs)


SHAPE_INFERENCE_MODES = ("isolated", "in_process", "off")


def shape_inference_mode() -> str:
    """'isolated' (default where a helper process can be used), 'in_process' or 'off'; the
    environment variable ONNXPY_SHAPE_INFERENCE chooses another."""
    mode = os.environ.get("ONNXPY_SHAPE_INFERENCE", "isolated")
    return mode if mode in SHAPE_INFERENCE_MODES else "isolated"


# The helper process: reads requests (8-byte length + model) on stdin, answers on the
# original stdout (1 status byte + 8-byte length + inferred model); anything onnx prints goes
# to stderr. Its address space is capped so a hostile model cannot make it exhaust memory.
# It loads onnx's compiled extension straight from its file and hands it the serialized model
# (what onnx.shape_inference.infer_shapes does around it), without site-packages or the onnx
# package: it starts in about 30 ms where `import onnx` took about 250, the whole cost of a
# process's first session on a small model. Where that load fails (another layout of the onnx
# package) it imports onnx as usual.
_WORKER_CODE = r"""
import os, struct, sys
try:
    import resource
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
except Exception:
    pass
reply = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
try:
    import importlib.machinery, importlib.util
    name = "onnx.onnx_cpp2py_export"
    loader = importlib.machinery.ExtensionFileLoader(name, sys.argv[2])
    native = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, sys.argv[2], loader=loader))
    loader.exec_module(native)
    infer = native.shape_inference.infer_shapes
except Exception:
    import site
    site.main()
    sys.path.insert(0, sys.argv[3])
    import onnx

    def infer(data, check_type, strict_mode, data_prop):
        model = onnx.ModelProto.FromString(data)
        return onnx.shape_inference.infer_shapes(model, check_type, strict_mode, data_prop).SerializeToString()

reply.write(b"R")  # ready: the parent knows this interpreter speaks the protocol
reply.flush()
requests = sys.stdin.buffer
while True:
    head = requests.read(8)
    if len(head) < 8:
        break
    (n,) = struct.unpack("<Q", head)
    data = requests.read(n)
    try:
        body = infer(data, False, False, True)
        reply.write(b"\x00" + struct.pack("<Q", len(body)) + body)
    except Exception:
        reply.write(b"\x01" + struct.pack("<Q", 0))
    reply.flush()
"""


def _worker_command(memory_limit: int) -> list[str]:
    """The helper's command line: an isolated interpreter (-I: no environment variables or
    user site; -S: no site-packages) given onnx's extension and the folder holding onnx."""
    native = getattr(getattr(onnx, "onnx_cpp2py_export", None), "__file__", None) or ""
    onnx_parent = os.path.dirname(os.path.dirname(os.path.abspath(onnx.__file__)))
    return [sys.executable, "-I", "-S", "-c", _WORKER_CODE, str(memory_limit), native, onnx_parent]


_UNAVAILABLE = object()


class _ShapeInference:
    """One helper process per interpreter, started on first use, serving one request at a time.

    A request that crashes or hangs the helper (killed after ``timeout`` seconds) yields None
    and the next request starts a fresh helper. After a fork the child starts its own.
    """

    memory_limit = 4 << 30
    timeout = 300.0
    startup_timeout = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = 0
        self._ready = False  # the running helper has said it is ready
        self._broken = False
        atexit.register(self.close)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's helper (closing only our copies of its pipes)
        and the lock, which another thread may have held at the fork."""
        proc, self._proc = self._proc, None
        self._lock = threading.Lock()
        if proc is not None:
            for f in (proc.stdin, proc.stdout):
                with contextlib.suppress(Exception):
                    if f is not None:
                        f.close()

    def infer(self, data: bytes) -> bytes | None | object:
        if self._broken or not hasattr(select, "select") or sys.platform == "win32":
            return _UNAVAILABLE
        with self._lock:
            proc = self._process()
            if proc is None:
                return _UNAVAILABLE
            ok = False
            try:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(struct.pack("<Q", len(data)) + data)
                proc.stdin.flush()
                deadline = time.monotonic() + self.timeout
                head = _read_exactly(proc.stdout.fileno(), 9, deadline)
                if head is None:
                    return None  # crashed or hung on this model
                status, n = head[0], struct.unpack("<Q", head[1:])[0]
                body = _read_exactly(proc.stdout.fileno(), n, deadline)
                if body is None:
                    return None
                ok = True
                return body if status == 0 else None
            except OSError:
                return None
            finally:
                if not ok:
                    self._kill()

    def prestart(self) -> None:
        """Start the helper without waiting for it, so that its start overlaps the caller's
        work until the first ``infer`` (which waits for it). Does nothing while another
        thread uses the helper."""
        if self._broken or not hasattr(select, "select") or sys.platform == "win32":
            return
        if self._lock.acquire(blocking=False):
            try:
                self._drop_stale()
                if self._proc is None:
                    self._spawn()
            finally:
                self._lock.release()

    def _drop_stale(self) -> None:
        if self._proc is not None and (self._owner != os.getpid() or self._proc.poll() is not None):
            if self._owner == os.getpid():
                self._kill()
            self._proc = None  # a forked child never touches its parent's helper

    def _spawn(self) -> bool:
        try:
            self._proc = subprocess.Popen(
                _worker_command(self.memory_limit),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError:
            self._broken = True
            return False
        self._owner = os.getpid()
        self._ready = False
        return True

    def _process(self) -> subprocess.Popen[bytes] | None:
        self._drop_stale()
        if self._proc is None and not self._spawn():
            return None
        assert self._proc is not None and self._proc.stdout is not None
        if not self._ready:
            ready = _read_exactly(self._proc.stdout.fileno(), 1, time.monotonic() + self.startup_timeout)
            if ready != b"R":
                # Not a Python that can run the helper (an embedding host's executable...):
                # inference stays in process from now on.
                self._kill()
                self._broken = True
                return None
            self._ready = True
        return self._proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
        for f in (proc.stdin, proc.stdout):
            with contextlib.suppress(Exception):
                if f is not None:
                    f.close()

    def close(self) -> None:
        if self._proc is not None and self._owner == os.getpid():
            self._kill()


def _read_exactly(fd: int, n: int, deadline: float) -> bytes | None:
    """``n`` bytes from ``fd`` before ``deadline``; None at end of file or on timeout."""
    chunks: list[bytes] = []
    while n > 0:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


_ISOLATED = _ShapeInference()


def prestart_shape_inference() -> None:
    """Start the shape-inference helper now, where it will be used and is not running yet:
    the first session of a process then overlaps its start with loading the model."""
    if shape_inference_mode() == "isolated":
        _ISOLATED.prestart()


def infer_types(model: ModelProto) -> dict[str, onnx.TypeProto]:
    """Types of intermediate values in every (sub)graph, from onnx's shape inference (empty where
    it cannot say). Value names are unique across scopes in valid ONNX, so one table serves all.

    onnx's inference is C++ written for well-formed models: on hostile ones some operators'
    inference functions read out of bounds or abort (fuzzing found Split with more outputs than
    'num_outputs'). By default it therefore runs in a helper process (see ``_ShapeInference``),
    where a crash costs only the inferred types, never the caller's process.
    """
    mode = shape_inference_mode()
    if mode == "off":
        return {}
    try:
        light = _weightless_copy(model)
        request = light.SerializeToString() if mode == "isolated" else b""
    except Exception:  # noqa: BLE001 - e.g. nested deeper than protobuf copies: no inference
        return {}
    inferred: ModelProto | None = None
    if mode == "isolated":
        data = _ISOLATED.infer(request)
        if data is _UNAVAILABLE:
            mode = "in_process"  # no helper process on this platform
        elif data is not None:
            inferred = ModelProto()
            try:
                inferred.ParseFromString(data)
            except Exception:  # noqa: BLE001 - a garbled reply is a failed inference
                return {}
        else:
            return {}
    if mode == "in_process":
        try:
            inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
        except Exception:  # noqa: BLE001 - inference is a help, not a requirement
            return {}
    assert inferred is not None
    out: dict[str, onnx.TypeProto] = {}
    _forget_invented_dims(inferred.graph)
    stack = [inferred.graph]
    while stack:
        g = stack.pop()
        out.update({vi.name: vi.type for vi in g.value_info if vi.HasField("type")})
        # Inference also completes graph outputs declared without a shape.
        out.update({vi.name: vi.type for vi in g.output if vi.HasField("type")})
        for node in g.node:
            for a in node.attribute:
                if a.HasField("g"):
                    stack.append(a.g)
                stack.extend(a.graphs)
    return out


def _check_io_types(model: ModelProto) -> None:
    """Graph inputs and outputs declare element types that exist and dimensions that are not
    negative (a clear error now rather than a confusing one at the first run)."""
    for kind, vis in (("input", model.graph.input), ("output", model.graph.output)):
        for vi in vis:
            tp = vi.type
            while tp.WhichOneof("value") in ("sequence_type", "optional_type"):
                tp = tp.sequence_type.elem_type if tp.HasField("sequence_type") else tp.optional_type.elem_type
            if not tp.HasField("tensor_type"):
                continue
            et = tp.tensor_type.elem_type
            if not et and kind == "input":
                # A feed could not be checked against it; onnxruntime refuses it too. (Outputs
                # may leave it to inference.)
                raise InvalidGraph(f"graph input '{vi.name}' declares no element type (UNDEFINED)")
            if et:
                try:
                    dtypes.np_dtype(et)
                except ValueError:
                    raise InvalidGraph(f"graph {kind} '{vi.name}' has an unknown element type ({et})") from None
            for i, d in enumerate(tp.tensor_type.shape.dim):
                if d.HasField("dim_value") and d.dim_value < 0:
                    raise InvalidGraph(
                        f"graph {kind} '{vi.name}' has a negative dimension ({d.dim_value} at index {i})"
                    )


def build_graph(model: ModelProto, release_data: bool = False, arrays: dict[str, Any] | None = None) -> Graph:
    """ModelProto -> Graph with types inferred, functions expanded, nodes topologically sorted.

    Validation is onnxpy's own, not onnx.checker (which rejects models onnxruntime runs, such
    as outputs declared without a shape): the loader checks versions and external data,
    graph building checks tensors against their shapes, topological sorting finds cycles,
    undefined and duplicate values, and binding checks attribute types against the schema.
    """
    if not model.HasField("graph"):
        raise InvalidGraph("the model has no graph")
    prestart_shape_inference()
    check_nesting(model)  # before onnx's shape inference, which recurses in C++
    _check_io_types(model)
    opsets = model_opsets(model)
    validate_protos(model, opsets)  # also before onnx's shape inference: it assumes sane nodes
    types = infer_types(model)
    graph = graph_from_proto(model.graph, opsets, types, release_data=release_data, arrays=arrays)
    names = [vi.name for vi in model.graph.input]
    if len(set(names)) != len(names):
        raise InvalidGraph(f"graph inputs have duplicate names: {names}")
    if model.ir_version < 4:
        # Before IR 4 every initializer had to be listed as an input too; they are constants
        # there, not inputs a caller may override (onnxruntime treats them the same way).
        graph.inputs = [n for n in graph.inputs if n not in graph.initializers]
    local = local_function_table(model.functions)
    expand_functions(graph, local, lambda n: registry.resolve(n.domain, n.op_type, n.opset) is not None)
    release_protos(graph)
    topological_sort(graph)
    for g in iter_graphs(graph):
        for node in g.nodes:
            validate_node(node)
    check_types(graph)
    ensure_recursion_limit(nesting_depth(graph))
    return graph


# Python frames one level of subgraph nesting takes when compiling and running it (a kernel
# calling its subgraph's executor: 7 measured, on CPython 3.11), with room to spare.
FRAMES_PER_LEVEL = 12


def ensure_recursion_limit(depth: int) -> None:
    """Let a model nesting ``depth`` levels of subgraphs compile and run without RecursionError.

    Graph building, sorting, expansion and export never recurse; compiling a subgraph and a
    kernel running one do, a few frames per level. Depth is capped by
    model.load.MAX_NESTING_DEPTH, so this stays far below what the C stack can take. The
    interpreter's limit is only ever raised, never lowered (other threads may rely on it).
    """
    need = 1000 + FRAMES_PER_LEVEL * depth
    if depth and sys.getrecursionlimit() < need:
        sys.setrecursionlimit(need)
