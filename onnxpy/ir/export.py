"""Graph -> ModelProto, for optimized_model_filepath and tools."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, helper, numpy_helper

from ..api.errors import Fail, InvalidArgument
from .graph import Graph, Node


def _attribute(name: str, value: Any, attr_type: int | None) -> AttributeProto:
    """Any attribute but a GRAPH / GRAPHS one (those are filled in by graph_to_proto)."""
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [numpy_helper.from_array(v) for v in value])
    if isinstance(value, onnx.TypeProto):
        return helper.make_attribute(name, value)
    return helper.make_attribute(name, value, attr_type=attr_type if (isinstance(value, list) and not value) else None)


def _is_graphs(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], Graph)


def node_to_proto(n: Node) -> onnx.NodeProto:
    p = onnx.NodeProto()
    pending: list[tuple[Graph, GraphProto]] = []
    _fill_node(n, p, pending)
    _fill_pending(pending)
    return p


def _fill_node(n: Node, p: onnx.NodeProto, pending: list[tuple[Graph, GraphProto]]) -> None:
    p.op_type = n.op_type
    p.input.extend(n.inputs)
    p.output.extend(n.outputs)
    if n.name:
        p.name = n.name
    if n.domain:
        p.domain = n.domain
    for k, v in n.attrs.items():
        if isinstance(v, Graph):
            a = p.attribute.add(name=k, type=AttributeProto.GRAPH)
            pending.append((v, a.g))  # filled later, in place (``a.g`` lives inside ``p``)
        elif _is_graphs(v):
            a = p.attribute.add(name=k, type=AttributeProto.GRAPHS)
            pending.extend((g, a.graphs.add()) for g in v)
        else:
            p.attribute.append(_attribute(k, v, n.attr_types.get(k)))


# Writes a main-graph initializer elsewhere and returns the TensorProto that refers to it, or
# None to keep it inline (optimized models saved with external data).
Store = Callable[[str, np.ndarray], "onnx.TensorProto | None"]


def graph_to_proto(g: Graph, store: Store | None = None) -> GraphProto:
    """The graph as a GraphProto; subgraphs are written from a work list, not by recursion.
    ``store`` may take the main graph's initializers out of the proto."""
    gp = GraphProto()
    _fill_graph(g, gp, pending := [], store)
    _fill_pending(pending)
    return gp


def _fill_pending(pending: list[tuple[Graph, GraphProto]]) -> None:
    while pending:
        g, gp = pending.pop()
        _fill_graph(g, gp, pending)


def _fill_graph(g: Graph, gp: GraphProto, pending: list[tuple[Graph, GraphProto]], store: Store | None = None) -> None:
    def vi(name: str) -> onnx.ValueInfoProto:
        tp = g.types.get(name)
        v = onnx.ValueInfoProto(name=name)
        if tp is not None:
            v.type.CopyFrom(tp)
        return v

    gp.name = g.name
    if g.doc_string:
        gp.doc_string = g.doc_string
    for n in g.nodes:
        _fill_node(n, gp.node.add(), pending)
    gp.input.extend(vi(n) for n in g.inputs)
    gp.output.extend(vi(n) for n in g.outputs)
    for name, a in g.initializers.items():
        stored = store(name, a) if store is not None else None
        gp.initializer.append(stored if stored is not None else numpy_helper.from_array(a, name))
    io = set(g.inputs) | set(g.outputs)
    gp.value_info.extend(vi(n) for n in g.types if n not in io and n not in g.initializers)


# What a saved model keeps of the one it came from, as onnxruntime keeps it.
_HEADER_FIELDS = ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string")


def graph_to_model(g: Graph, header: ModelProto | None = None, store: Store | None = None) -> ModelProto:
    """The graph as a model; ``header`` (the source model) gives its IR version, producer,
    version, doc string and metadata, so get_modelmeta() reads the same from the saved file.
    ``store``: see ``graph_to_proto``."""
    versions = dict(g.opsets)
    for n in g.nodes:
        versions.setdefault(n.domain, n.opset or 1)  # e.g. onnxpy.fused, added by the optimizer
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(versions.items())]
    model = helper.make_model(graph_to_proto(g, store), opset_imports=opsets, producer_name="onnxpy")
    if header is not None:
        for field in _HEADER_FIELDS:
            if header.HasField(field):
                setattr(model, field, getattr(header, field))
        model.metadata_props.extend(header.metadata_props)
    return model


#: onnxruntime's session config entries for saving an optimized model's weights beside it
EXTERNAL_FILE_KEY = "session.optimized_model_external_initializers_file_name"
EXTERNAL_MIN_SIZE_KEY = "session.optimized_model_external_initializers_min_size_in_bytes"


def save_graph(
    g: Graph,
    path: str | os.PathLike,
    source_model_path: str | None = None,
    header: ModelProto | None = None,
    external: tuple[str, int] | None = None,
) -> None:
    """Write the graph as a model at ``path``; never overwrites the model it came from and never
    writes anywhere but the folder ``path`` names.

    ``external`` = (file name, minimum size in bytes): main-graph initializers of that size or
    more go to that file in the same folder (onnxruntime's
    ``session.optimized_model_external_initializers_file_name``), written straight from their
    arrays: no protobuf copy, and models past protobuf's 2 GB can be saved.

    The bytes go to new temporary files in that folder, which then replace ``path`` (and the
    data file): a symbolic link or a hard link there is replaced, never written through, and a
    reader never sees half a file.
    """
    target = _checked_target(path, source_model_path)
    folder = target.parent
    data_target = _checked_data_file(target, external[0]) if external is not None else None
    tmp: list[str] = []
    try:
        if data_target is not None and external is not None:
            fd, data_tmp = tempfile.mkstemp(prefix=f".{data_target.name}.", suffix=".tmp", dir=folder)
            tmp.append(data_tmp)
            with os.fdopen(fd, "wb") as data_file:
                os.fchmod(data_file.fileno(), 0o644)
                data = _serialized(g, header, _external_store(data_file, data_target.name, external[1]), path)
        else:
            data = _serialized(g, header, None, path)
        fd, model_tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        tmp.append(model_tmp)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide the model from other readers
            f.write(data)
        if data_target is not None:
            os.replace(tmp[0], data_target)
        os.replace(model_tmp, target)
        tmp = []
    except OSError as e:
        raise Fail(f"optimized_model_filepath '{path}': cannot write the optimized model: {e}") from None
    finally:
        for t in tmp:
            with contextlib.suppress(OSError):
                os.unlink(t)


def _serialized(g: Graph, header: ModelProto | None, store: Store | None, path: str | os.PathLike) -> bytes:
    try:
        return graph_to_model(g, header, store).SerializeToString()
    except (ValueError, RecursionError) as e:  # over protobuf's 2 GB, or nested too deeply
        hint = "" if store else f" (to save its weights beside it, set the session config entry '{EXTERNAL_FILE_KEY}')"
        raise Fail(f"optimized_model_filepath '{path}': the optimized model cannot be serialized: {e}{hint}") from None


def _checked_target(path: str | os.PathLike, source_model_path: str | None) -> Path:
    try:
        target = Path(os.fspath(path))
    except TypeError:
        raise InvalidArgument(f"optimized_model_filepath must be a path, got {type(path).__name__}") from None
    if not target.name or target.name in (".", ".."):
        raise InvalidArgument(f"optimized_model_filepath '{path}' names a folder, not a file")
    if "\0" in str(target):
        raise InvalidArgument("optimized_model_filepath contains a NUL character")
    folder = target.parent
    if not folder.is_dir():
        raise InvalidArgument(f"optimized_model_filepath '{path}': folder '{folder}' does not exist")
    if target.is_symlink():
        raise InvalidArgument(f"optimized_model_filepath '{path}' is a symbolic link; refusing to write through it")
    if target.exists() and not target.is_file():
        raise InvalidArgument(f"optimized_model_filepath '{path}' exists and is not a regular file")
    if source_model_path is not None:
        source = Path(source_model_path)
        same = target.resolve() == source.resolve()
        if not same and target.exists() and source.exists():
            same = os.path.samefile(target, source)  # a hard link to the model
        if same:
            raise InvalidArgument(
                f"optimized_model_filepath '{path}' is the model being loaded; refusing to overwrite it"
            )
    return target


def _checked_data_file(target: Path, name: str) -> Path:
    """The external data file: a plain name in the model's folder, not the model itself."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or os.path.isabs(name):
        raise InvalidArgument(
            f"session config '{EXTERNAL_FILE_KEY}' must be a file name in the optimized model's folder, got '{name}'"
        )
    data = target.parent / name
    if data.name == target.name:
        raise InvalidArgument(f"session config '{EXTERNAL_FILE_KEY}' names the optimized model itself ('{name}')")
    if data.is_symlink() or (data.exists() and not data.is_file()):
        raise InvalidArgument(f"session config '{EXTERNAL_FILE_KEY}': '{data}' exists and is not a regular file")
    return data


def _external_store(f: Any, location: str, min_size: int) -> Store:
    """Writes initializers of ``min_size`` bytes or more to ``f`` (little-endian, as ONNX
    stores them), each aligned to 64 bytes, and returns their TensorProtos."""

    def store(name: str, a: np.ndarray) -> onnx.TensorProto | None:
        elem = _plain_elem_type(a)
        if elem is None or a.nbytes < max(min_size, 1):
            return None  # strings, packed 4-bit types, small tensors: inline
        pad = -f.tell() % 64
        if pad:
            f.write(b"\0" * pad)
        offset = f.tell()
        data = np.ascontiguousarray(a)
        if data.dtype.byteorder == ">" or (data.dtype.byteorder == "=" and np.little_endian is False):
            data = data.byteswap().view(data.dtype.newbyteorder("<"))
        f.write(memoryview(data).cast("B"))
        t = onnx.TensorProto(name=name, data_type=elem, dims=list(a.shape))
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(a.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        return t

    return store


def _plain_elem_type(a: np.ndarray) -> int | None:
    """The ONNX element type of an array stored byte for byte (no packing, no strings)."""
    try:
        elem = helper.np_dtype_to_tensor_dtype(a.dtype)
    except (KeyError, TypeError, ValueError):
        return None
    packed = {onnx.TensorProto.STRING, onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
    packed |= {getattr(onnx.TensorProto, n) for n in ("FLOAT4E2M1", "INT2", "UINT2") if hasattr(onnx.TensorProto, n)}
    return None if elem in packed or a.dtype.itemsize * 8 < 8 else elem
