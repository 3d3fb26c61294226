"""Model inputs for the command line: free dimensions, input files and random data.

Free dimensions (a named ``dim_param`` or an unnamed one) take their value from ``--dim
NAME=VALUE``; ``--batch N`` sets the first axis of every input whose first axis is free. Other
free dimensions default to 1 and are reported in ``notes``. Random integers stay inside the
row count of any table the input indexes (``Gather`` on an initializer or a ``Constant``, also
through ``Cast``, ``Reshape`` and the like), so token ids are valid.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from ..api.errors import InvalidProtobuf
from ..model import dtypes


class UsageError(ValueError):
    """A command-line mistake: printed as one line, exit status 2."""


def parse_assignments(items: Iterable[str] | None, what: str, names: Iterable[str] = ()) -> dict[str, str]:
    """``["a=1", "b=x.npy"]`` -> ``{"a": "1", "b": "x.npy"}``.

    Split at the first '=', so that file paths may hold '='; a name that holds '=' itself is
    recognized when it is one of ``names`` (the model's input names).
    """
    known = set(names)
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        for i, ch in enumerate(item):
            if ch == "=" and item[:i] in known:
                name, sep, value = item[:i], "=", item[i + 1 :]
                break
        if not sep or not name or not value:
            raise UsageError(f"{what} expects NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def parse_dims(items: Iterable[str] | None) -> dict[str, int]:
    dims: dict[str, int] = {}
    for name, value in parse_assignments(items, "--dim").items():
        try:
            dims[name] = int(value)
        except ValueError:
            raise UsageError(f"--dim {name}={value}: the value must be an integer") from None
        if dims[name] < 0:
            raise UsageError(f"--dim {name}={value}: the value must be >= 0")
    return dims


@dataclass
class InputSpec:
    name: str
    elem_type: int  # 0 for non-tensor inputs (sequences, optionals, maps)
    #: declared dims: int (fixed), str (named free dimension) or None (unnamed free dimension)
    dims: list[int | str | None] | None
    type_string: str
    #: "tensor", "sequence", "optional", "map", "sparse_tensor" (TypeProto's value, less "_type")
    kind: str = "tensor"

    @property
    def dtype(self) -> np.dtype | None:
        try:
            return dtypes.np_dtype(self.elem_type) if self.elem_type else None
        except ValueError:
            return None


def model_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """The graph inputs a caller must feed (initializers listed as inputs are left out)."""
    inits = {t.name for t in model.graph.initializer}
    specs: list[InputSpec] = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tp = vi.type
        kind = (tp.WhichOneof("value") or "tensor_type").removesuffix("_type")
        elem = tp.tensor_type.elem_type if tp.HasField("tensor_type") else 0
        dims: list[int | str | None] | None = None
        if tp.HasField("tensor_type") and tp.tensor_type.HasField("shape"):
            dims = []
            for d in tp.tensor_type.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    dims.append(d.dim_param)
                else:
                    dims.append(None)
        specs.append(InputSpec(vi.name, elem, dims, dtypes.type_string(tp), kind))
    return specs


@dataclass
class ResolvedShapes:
    shapes: dict[str, tuple[int, ...]]
    #: named dimensions and their values: fed to add_free_dimension_override_by_name
    overrides: dict[str, int]
    notes: list[str] = field(default_factory=list)
    #: the inputs whose first axis took its size from ``batch``
    batch_inputs: list[str] = field(default_factory=list)


def resolve_shapes(specs: Sequence[InputSpec], dims: dict[str, int], batch: int | None) -> ResolvedShapes:
    """Concrete shapes for every tensor input; raises UsageError for impossible requests."""
    known = {d for s in specs for d in (s.dims or []) if isinstance(d, str)}
    unknown = sorted(set(dims) - known)
    if unknown:
        raise UsageError(
            f"--dim {', '.join(unknown)}: the model's inputs have no dimension of that name "
            f"(named dimensions: {sorted(known) or 'none'})"
        )
    values = dict(dims)
    notes: list[str] = []
    shapes: dict[str, tuple[int, ...]] = {}
    batch_inputs: list[str] = []
    fixed_batch: list[str] = []
    for s in specs:
        if s.dims is None:
            if s.elem_type:
                notes.append(f"input '{s.name}' has no declared shape: fed as a scalar; give it with --input")
                shapes[s.name] = ()
            continue
        shape: list[int] = []
        for axis, d in enumerate(s.dims):
            if isinstance(d, int):
                if axis == 0 and batch is not None and d != batch:
                    fixed_batch.append(f"'{s.name}' (first axis fixed at {d})")
                shape.append(d)
            elif isinstance(d, str) and d in values:
                shape.append(values[d])
                if axis == 0 and batch is not None and d not in dims:
                    batch_inputs.append(s.name)
            elif axis == 0 and batch is not None:
                shape.append(batch)
                batch_inputs.append(s.name)
                if isinstance(d, str):
                    values[d] = batch
            else:
                shape.append(1)
                if isinstance(d, str):
                    values[d] = 1
                    notes.append(f"free dimension '{d}' of input '{s.name}' set to 1 (use --dim {d}=N)")
                else:
                    notes.append(f"unnamed free dimension {axis} of input '{s.name}' set to 1")
        shapes[s.name] = tuple(shape)
    if batch is not None and fixed_batch and not batch_inputs:
        raise UsageError(
            f"--batch {batch}: no input has a free first axis: {', '.join(fixed_batch)}. "
            "The model was exported with a fixed batch size."
        )
    return ResolvedShapes(shapes, values, notes, batch_inputs)


_INDEX_PASS_THROUGH = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten"})


def _constant_shapes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """Shapes of the graph's constants: initializers and the outputs of Constant nodes."""
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or not node.output:
            continue
        for a in node.attribute:
            if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                shapes[node.output[0]] = list(a.t.dims)
            elif a.name in ("value_ints", "value_floats", "value_strings"):
                shapes[node.output[0]] = [len(a.ints) + len(a.floats) + len(a.strings)]
    return shapes


def _index_source(name: str, producers: dict[str, onnx.NodeProto]) -> str:
    """The value the indices ``name`` come from, followed back through ops that keep values."""
    seen: set[str] = set()
    while name in producers and name not in seen:
        seen.add(name)
        node = producers[name]
        if node.op_type not in _INDEX_PASS_THROUGH or node.domain not in ("", "ai.onnx") or not node.input:
            break
        name = node.input[0]
    return name


def gather_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Values used as Gather indices into a constant table: value name -> number of rows.

    The indices are followed back through Cast, Identity, Reshape, Unsqueeze, Squeeze and
    Flatten, so an input that reaches the Gather that way (token ids cast to int32) is bounded.
    """
    graph = model.graph
    tables = _constant_shapes(graph)
    producers = {out: node for node in graph.node for out in node.output}
    bounds: dict[str, int] = {}
    for node in graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        shape = tables.get(node.input[0])
        if not shape:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        rows = int(shape[axis % len(shape)])
        for idx in {node.input[1], _index_source(node.input[1], producers)}:
            bounds[idx] = min(bounds.get(idx, rows), rows)
    return bounds


def random_array(
    spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator, bound: int | None = None
) -> np.ndarray:
    """Random data of the input's type: normal floats, small non-negative ints, coin-flip bools."""
    dt = spec.dtype
    if dt is None:
        raise UsageError(
            f"input '{spec.name}' is {spec.type_string}: give it with --input (no random data for it; "
            "sequences and optionals as serialized onnx SequenceProto / OptionalProto .pb files)"
        )
    if "mask" in spec.name.lower() and dt.kind in "biu":
        return np.ones(shape, dtype=dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        hi = 10 if bound is None else max(1, bound)
        info = np.iinfo(dt)
        return rng.integers(0, min(hi, int(info.max)), size=shape, endpoint=False).astype(dt)
    if dtypes.is_string_dtype(dt):
        return np.full(shape, "onnxpy", dtype=object)
    return rng.standard_normal(shape).astype(dt)


_PROTOS: dict[str, type] = {"sequence": onnx.SequenceProto, "optional": onnx.OptionalProto}


def load_input(path: str, what: str, spec: InputSpec | None = None) -> Any:
    """The value of one input from a file: an array, a list (sequence) or None (empty optional).

    ``.pb`` files are serialized onnx protos (as in onnx's test data): a TensorProto, or a
    SequenceProto / OptionalProto for a sequence / optional input. Other files are read as .npy.
    """
    if not os.path.exists(path):
        raise UsageError(f"{what}: no such file {path!r}")
    if os.path.isdir(path):
        raise UsageError(f"{what}: {path!r} is a folder, not a file")
    kind = spec.kind if spec is not None else "tensor"
    if path.endswith(".pb"):
        return _load_proto(path, what, kind)
    if kind == "sequence":
        raise UsageError(f"{what}: the input is a sequence: give it as a serialized onnx SequenceProto .pb file")
    return _load_npy(path, what, spec.dtype if spec is not None else None)


def load_array(path: str, what: str) -> np.ndarray:
    """A .npy file, or a serialized onnx TensorProto (.pb, as in onnx's test data)."""
    value = load_input(path, what)
    assert isinstance(value, np.ndarray)
    return value


def _load_npy(path: str, what: str, want: np.dtype | None) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise UsageError(
                f"{what}: {path!r} holds Python objects, which are not unpickled; save strings as a "
                "numpy unicode array (arr.astype(str))"
            ) from None
        raise UsageError(f"{what}: cannot read {path!r} as .npy: {e}") from None
    except (OSError, EOFError) as e:
        raise UsageError(f"{what}: cannot read {path!r} as .npy: {e}") from None
    if not isinstance(arr, np.ndarray):  # an .npz archive
        arr.close()
        raise UsageError(f"{what}: {path!r} is an .npz archive; give one array saved with np.save (.npy)")
    if arr.dtype.kind == "V" and want is not None and want.itemsize == arr.dtype.itemsize:
        # numpy saves bfloat16, float8 and int4 (ml_dtypes) as raw bytes ('|V2', '|V1'): the
        # model's input type says what they are.
        arr = arr.view(want)
    return arr


def _load_proto(path: str, what: str, kind: str) -> Any:
    proto_type = _PROTOS.get(kind, onnx.TensorProto)
    proto = proto_type()
    with open(path, "rb") as f:
        data = f.read()
    try:
        proto.ParseFromString(data)
    except DecodeError:
        raise UsageError(f"{what}: {path!r} is not a serialized onnx {proto_type.__name__}") from None
    if isinstance(proto, onnx.TensorProto) and proto.data_type == onnx.TensorProto.UNDEFINED:
        raise UsageError(
            f"{what}: {path!r} holds no tensor (element type UNDEFINED): an empty file, or not a TensorProto"
        )
    try:
        if isinstance(proto, onnx.SequenceProto):
            return onnx.numpy_helper.to_list(proto)
        if isinstance(proto, onnx.OptionalProto):
            return onnx.numpy_helper.to_optional(proto)
        return onnx.numpy_helper.to_array(proto, base_dir=os.path.dirname(os.path.abspath(path)))
    except Exception as e:  # noqa: BLE001 - onnx's converters raise assorted types for bad protos
        raise UsageError(f"{what}: cannot read {path!r} as an onnx {proto_type.__name__}: {e}") from None


@dataclass
class Feeds:
    #: input name -> array (a list for a sequence input, None for an empty optional)
    arrays: dict[str, Any]
    overrides: dict[str, int]
    notes: list[str]
    #: samples per run: the first axis of the inputs --batch applied to (or, without it, of the
    #: inputs with a free first axis, else a fixed one); None when no input has a first axis
    batch: int | None


def make_feeds(
    model: onnx.ModelProto,
    files: dict[str, str] | None = None,
    dims: dict[str, int] | None = None,
    batch: int | None = None,
    random: bool = True,
    seed: int = 0,
) -> Feeds:
    """Inputs from files, the rest random (when ``random``), shaped by ``dims`` and ``batch``."""
    specs = model_inputs(model)
    by_name = {s.name: s for s in specs}
    files = files or {}
    extra = sorted(set(files) - set(by_name))
    if extra:
        raise UsageError(f"--input {', '.join(extra)}: the model has no such input (inputs: {sorted(by_name)})")
    dims = dict(dims or {})
    arrays: dict[str, Any] = {}
    for name, path in files.items():
        arrays[name] = load_input(path, f"--input {name}", by_name[name])
    derived = _dims_from_files(by_name, arrays, files, dims)
    resolved = resolve_shapes(specs, {**derived, **dims}, batch)
    missing = [s.name for s in specs if s.name not in arrays]
    if missing and not random:
        raise UsageError(f"no data for input(s) {missing}: give --input NAME=FILE.npy or --random")
    rng = np.random.default_rng(seed)
    bounds = gather_bounds(model)
    for name in missing:
        s = by_name[name]
        arrays[name] = random_array(s, resolved.shapes.get(name, ()), rng, bounds.get(name))
    notes = [n for n in resolved.notes if any(f"'{m}'" in n for m in missing)]
    fed = batch if resolved.batch_inputs else _first_axis(specs, arrays)
    if batch is not None and fed != batch:
        why = (
            "no input has a first axis (throughput is left out)"
            if fed is None
            else f"the inputs' first axis is {fed}, set by --input files, --dim or the model"
        )
        notes.append(f"--batch {batch} ignored: {why}")
    return Feeds(arrays, resolved.overrides, notes, fed)


def _dims_from_files(
    by_name: dict[str, InputSpec], arrays: dict[str, Any], files: dict[str, str], dims: dict[str, int]
) -> dict[str, int]:
    """Named dimensions as the given files have them, so the other inputs agree with them.

    A file that contradicts ``--dim`` or another file on a named dimension is a usage error:
    the session would only fail later, with a less direct message.
    """
    derived: dict[str, int] = {}
    source: dict[str, str] = {}
    for name, arr in arrays.items():
        declared = by_name[name].dims
        if not isinstance(arr, np.ndarray) or declared is None or arr.ndim != len(declared):
            continue
        for axis, (d, n) in enumerate(zip(declared, arr.shape)):
            if not isinstance(d, str):
                continue
            here = f"--input {name}={files[name]} (shape {list(arr.shape)}, axis {axis} is '{d}')"
            if d in dims and dims[d] != n:
                raise UsageError(f"--dim {d}={dims[d]} contradicts {here}")
            if d in derived and derived[d] != n:
                raise UsageError(f"{here} contradicts {source[d]}")
            derived.setdefault(d, int(n))
            source.setdefault(d, here)
    return derived


def _first_axis(specs: Sequence[InputSpec], arrays: dict[str, Any]) -> int | None:
    """Size of the first axis fed: of an input whose first axis is free, else of a fixed one."""
    free = [s for s in specs if s.dims and not isinstance(s.dims[0], int)]
    fixed = [s for s in specs if s.dims and isinstance(s.dims[0], int)]
    for s in free + fixed:
        a = arrays.get(s.name)
        if isinstance(a, np.ndarray) and a.ndim >= 1:
            return int(a.shape[0])
    return None


def describe_dims(dims: Sequence[int | str | None] | None) -> str:
    if dims is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def load_model_header(path: str) -> onnx.ModelProto:
    """The model without its external data: enough for shapes, types and graph structure."""
    if not os.path.exists(path):
        raise UsageError(f"no such model file: {path!r}")
    if os.path.isdir(path):
        raise UsageError(f"{path!r} is a folder, not a model file")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - any parse failure is the user's file, reported as such
        # The file is there but is no model: a model that failed to load (exit status 1), not
        # a command-line mistake.
        raise InvalidProtobuf(f"cannot read {path!r} as an ONNX model: {e}") from None
    if not model.HasField("graph"):
        # An empty file, or a few bytes that happen to parse, is a ModelProto with no graph.
        raise InvalidProtobuf(f"cannot read {path!r} as an ONNX model: it holds no graph")
    return model


def session_kwargs_overrides(opts: Any, overrides: dict[str, int]) -> None:
    """Apply free-dimension values to a SessionOptions (onnxpy's or onnxruntime's)."""
    for name, value in overrides.items():
        opts.add_free_dimension_override_by_name(name, int(value))
