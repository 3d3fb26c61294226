"""Model inputs for the command line: free dimensions, input files and random data.

Free dimensions (a named ``dim_param`` or an unnamed one) take their value from ``--dim
NAME=VALUE``; ``--batch N`` sets the first axis of every input whose first axis is free. Other
free dimensions default to 1 and are reported in ``notes``. Random integers stay inside the
row count of any table the input indexes (``Gather`` on an initializer), so token ids are valid.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..api.errors import InvalidProtobuf
from ..model import dtypes


class UsageError(ValueError):
    """A command-line mistake: printed as one line, exit status 2."""


def parse_assignments(items: Iterable[str] | None, what: str) -> dict[str, str]:
    """``["a=1", "b=x.npy"]`` -> ``{"a": "1", "b": "x.npy"}`` (split at the last '=')."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.rpartition("=")
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
        specs.append(InputSpec(vi.name, elem, dims, dtypes.type_string(tp)))
    return specs


@dataclass
class ResolvedShapes:
    shapes: dict[str, tuple[int, ...]]
    #: named dimensions and their values: fed to add_free_dimension_override_by_name
    overrides: dict[str, int]
    notes: list[str] = field(default_factory=list)


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
    batch_used = False
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
                batch_used |= axis == 0 and batch is not None and d not in dims
            elif axis == 0 and batch is not None:
                shape.append(batch)
                batch_used = True
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
    if batch is not None and fixed_batch and not batch_used:
        raise UsageError(
            f"--batch {batch}: no input has a free first axis: {', '.join(fixed_batch)}. "
            "The model was exported with a fixed batch size."
        )
    return ResolvedShapes(shapes, values, notes)


def gather_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Inputs used as Gather indices into an initializer: input name -> number of rows."""
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        data, idx = node.input[0], node.input[1]
        if data not in inits:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        shape = inits[data]
        if not shape:
            continue
        rows = int(shape[axis % len(shape)])
        bounds[idx] = min(bounds.get(idx, rows), rows)
    return bounds


def random_array(
    spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator, bound: int | None = None
) -> np.ndarray:
    """Random data of the input's type: normal floats, small non-negative ints, coin-flip bools."""
    dt = spec.dtype
    if dt is None:
        raise UsageError(f"input '{spec.name}' is {spec.type_string}: give it with --input (no random data for it)")
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


def load_array(path: str, what: str) -> np.ndarray:
    """A .npy file, or a serialized onnx TensorProto (.pb, as in onnx's test data)."""
    if not os.path.exists(path):
        raise UsageError(f"{what}: no such file {path!r}")
    if path.endswith(".pb"):
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        return onnx.numpy_helper.to_array(t)
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise UsageError(f"{what}: cannot read {path!r} as .npy: {e}") from None


@dataclass
class Feeds:
    arrays: dict[str, np.ndarray]
    overrides: dict[str, int]
    notes: list[str]
    batch: int


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
    arrays: dict[str, np.ndarray] = {}
    for name, path in files.items():
        arrays[name] = load_array(path, f"--input {name}")
    # Named dimensions take their size from the given files, so the other inputs agree with them.
    derived: dict[str, int] = {}
    for name, arr in arrays.items():
        declared = by_name[name].dims
        if declared is not None and arr.ndim == len(declared):
            for d, n in zip(declared, arr.shape):
                if isinstance(d, str) and d not in dims:
                    derived.setdefault(d, int(n))
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
    first = [a.shape[0] for a in arrays.values() if getattr(a, "ndim", 0) >= 1]
    return Feeds(arrays, resolved.overrides, notes, batch if batch is not None else (first[0] if first else 1))


def describe_dims(dims: Sequence[int | str | None] | None) -> str:
    if dims is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def load_model_header(path: str) -> onnx.ModelProto:
    """The model without its external data: enough for shapes, types and graph structure."""
    if not os.path.exists(path):
        raise UsageError(f"no such model file: {path!r}")
    try:
        return onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - any parse failure is the user's file, reported as such
        # The file is there but is no model: a model that failed to load (exit status 1), not
        # a command-line mistake.
        raise InvalidProtobuf(f"cannot read {path!r} as an ONNX model: {e}") from None


def session_kwargs_overrides(opts: Any, overrides: dict[str, int]) -> None:
    """Apply free-dimension values to a SessionOptions (onnxpy's or onnxruntime's)."""
    for name, value in overrides.items():
        opts.add_free_dimension_override_by_name(name, int(value))
