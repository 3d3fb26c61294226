"""Graph -> ModelProto, for optimized_model_filepath and tools."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, helper, numpy_helper

from ..api.errors import InvalidArgument
from .graph import Graph, Node


def _attribute(name: str, value: Any, attr_type: int | None) -> AttributeProto:
    if isinstance(value, Graph):
        return helper.make_attribute(name, graph_to_proto(value))
    if isinstance(value, list) and value and isinstance(value[0], Graph):
        return helper.make_attribute(name, [graph_to_proto(g) for g in value])
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [numpy_helper.from_array(v) for v in value])
    if isinstance(value, onnx.TypeProto):
        return helper.make_attribute(name, value)
    return helper.make_attribute(name, value, attr_type=attr_type if (isinstance(value, list) and not value) else None)


def node_to_proto(n: Node) -> onnx.NodeProto:
    p = helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name or None, domain=n.domain or None)
    for k, v in n.attrs.items():
        p.attribute.append(_attribute(k, v, n.attr_types.get(k)))
    return p


def graph_to_proto(g: Graph) -> GraphProto:
    def vi(name: str) -> onnx.ValueInfoProto:
        tp = g.types.get(name)
        v = onnx.ValueInfoProto(name=name)
        if tp is not None:
            v.type.CopyFrom(tp)
        return v

    gp = GraphProto(name=g.name, doc_string=g.doc_string)
    gp.node.extend(node_to_proto(n) for n in g.nodes)
    gp.input.extend(vi(n) for n in g.inputs)
    gp.output.extend(vi(n) for n in g.outputs)
    gp.initializer.extend(numpy_helper.from_array(a, name) for name, a in g.initializers.items())
    io = set(g.inputs) | set(g.outputs)
    gp.value_info.extend(vi(n) for n in g.types if n not in io and n not in g.initializers)
    return gp


def graph_to_model(g: Graph) -> ModelProto:
    versions = dict(g.opsets)
    for n in g.nodes:
        versions.setdefault(n.domain, n.opset or 1)  # e.g. onnxpy.fused, added by the optimizer
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(versions.items())]
    model = helper.make_model(graph_to_proto(g), opset_imports=opsets, producer_name="onnxpy")
    return model


def save_graph(g: Graph, path: str | os.PathLike, source_model_path: str | None = None) -> None:
    """Write the graph as a model; refuses to overwrite the model it came from."""
    target = Path(os.fspath(path))
    if source_model_path is not None and target.resolve() == Path(source_model_path).resolve():
        raise InvalidArgument(f"optimized_model_filepath '{path}' is the model being loaded; refusing to overwrite it")
    if target.is_symlink():
        raise InvalidArgument(f"optimized_model_filepath '{path}' is a symbolic link; refusing to write through it")
    if not target.parent.exists():
        raise InvalidArgument(f"optimized_model_filepath '{path}': folder '{target.parent}' does not exist")
    model = graph_to_model(g)
    with open(target, "wb") as f:
        f.write(model.SerializeToString())
