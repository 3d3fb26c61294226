"""Graph -> ModelProto, for optimized_model_filepath and tools."""

from __future__ import annotations

import contextlib
import os
import tempfile
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


def graph_to_proto(g: Graph) -> GraphProto:
    """The graph as a GraphProto; subgraphs are written from a work list, not by recursion."""
    gp = GraphProto()
    _fill_pending([(g, gp)])
    return gp


def _fill_pending(pending: list[tuple[Graph, GraphProto]]) -> None:
    while pending:
        g, gp = pending.pop()
        _fill_graph(g, gp, pending)


def _fill_graph(g: Graph, gp: GraphProto, pending: list[tuple[Graph, GraphProto]]) -> None:
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
    gp.initializer.extend(numpy_helper.from_array(a, name) for name, a in g.initializers.items())
    io = set(g.inputs) | set(g.outputs)
    gp.value_info.extend(vi(n) for n in g.types if n not in io and n not in g.initializers)


# What a saved model keeps of the one it came from, as onnxruntime keeps it.
_HEADER_FIELDS = ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string")


def graph_to_model(g: Graph, header: ModelProto | None = None) -> ModelProto:
    """The graph as a model; ``header`` (the source model) gives its IR version, producer,
    version, doc string and metadata, so get_modelmeta() reads the same from the saved file."""
    versions = dict(g.opsets)
    for n in g.nodes:
        versions.setdefault(n.domain, n.opset or 1)  # e.g. onnxpy.fused, added by the optimizer
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(versions.items())]
    model = helper.make_model(graph_to_proto(g), opset_imports=opsets, producer_name="onnxpy")
    if header is not None:
        for field in _HEADER_FIELDS:
            if header.HasField(field):
                setattr(model, field, getattr(header, field))
        model.metadata_props.extend(header.metadata_props)
    return model


def save_graph(
    g: Graph, path: str | os.PathLike, source_model_path: str | None = None, header: ModelProto | None = None
) -> None:
    """Write the graph as a model at ``path``; never overwrites the model it came from and never
    writes anywhere but that one file in the folder ``path`` names.

    The bytes go to a new temporary file in that folder, which then replaces ``path``: a symbolic
    link or a hard link at ``path`` is replaced, never written through, and a reader never sees
    half a file.
    """
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
    try:
        data = graph_to_model(g, header).SerializeToString()
    except (ValueError, RecursionError) as e:  # over protobuf's 2 GB, or nested too deeply
        raise Fail(f"optimized_model_filepath '{path}': the optimized model cannot be serialized: {e}") from None
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide the model from other readers
            f.write(data)
        os.replace(tmp, target)
        tmp = None
    except OSError as e:
        raise Fail(f"optimized_model_filepath '{path}': cannot write the optimized model: {e}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
