"""Shape of a view -> the same numbers computed from the view's input, so the view can go.

Exporters read head counts and sizes from the shapes of intermediate views, for example
``Shape(Transpose(Reshape(v, target)))`` in BERT's attention. Once the attention fusion has
taken those views' data, their Shape readers alone keep the Reshape and the Transpose alive:
two kernel calls per layer and tensor for nothing but a shape. This pass computes the same
shape from the view's input:

    Shape(Transpose(u, perm))[a:b]  ->  Gather(Shape(u), perm[a:b])
    Shape(Reshape(u, target))[a:b]  ->  Slice(ReshapeShape(Shape(u), target), a, b)

where every reader of the view is a Shape node, so that the view then has no reader and is
pruned (and the view under it gets the same treatment in the next round). ``ReshapeShape``
(onnxpy.fused) applies Reshape's rules to a shape: the same 0 and -1 handling and the same
errors, so a bad target still fails the run, naming the problem. The results are
shape-derived: ``memoize_shapes``, which runs right after, folds them into its memo nodes.

Host sessions only (with memoize_shapes), where Shape values live on the host.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, TensorProto, helper

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, shape_window

# Rounds of rewriting: each removes one view layer under the Shape readers.
MAX_ROUNDS = 8


def _plain(node: Node | None, op: str) -> bool:
    return node is not None and not node.domain and node.op_type == op


def _only_shape_readers(uses: Uses, name: str) -> bool:
    readers = uses.readers_of(name)
    return bool(readers) and name not in uses.graph_outputs and all(_plain(r, "Shape") for r in readers)


def _int64_vector(graph: Graph, name: str, length: int | None) -> None:
    graph.types[name] = helper.make_tensor_type_proto(TensorProto.INT64, [length])


def _rewrite(graph: Graph, sweep: Sweep, shape: Node, view: Node) -> bool:
    """Replace ``shape`` (reading ``view``'s output) by nodes reading ``view``'s input."""
    source = view.inputs[0] if view.inputs else ""
    if not source:
        return False
    out = shape.outputs[0]
    base = sweep.new_name(f"{out}_of_input")
    if _plain(view, "Transpose"):
        perm = view.attrs.get("perm")
        if perm is None:
            rank = len(graph.shape(source) or []) if graph.shape(source) is not None else None
            if rank is None:
                return False
            perm = list(range(rank))[::-1]
        s, e = shape_window(shape, len(perm))
        indices = sweep.new_name(f"{out}_perm")
        graph.initializers[indices] = np.array(list(perm)[s:e], dtype=np.int64)
        sweep.add(Node("Shape", [source], [base], name=base, opset=shape.opset))
        final = Node(
            "Gather", [base, indices], [out], {"axis": 0}, shape.name, "", shape.opset, {"axis": AttributeProto.INT}
        )
        _int64_vector(graph, base, None)
    elif _plain(view, "Reshape") and len(view.inputs) > 1 and view.inputs[1]:
        allowzero = int(view.attrs.get("allowzero", 0))
        sweep.add(Node("Shape", [source], [base], name=base, opset=shape.opset))
        _int64_vector(graph, base, None)
        attrs = {"allowzero": allowzero}
        types = {"allowzero": AttributeProto.INT}
        # Named after the Reshape: a bad target fails here now, and the error should say where.
        label = f"{view.name or view.outputs[0]} (shape)"
        if "start" not in shape.attrs and "end" not in shape.attrs:
            final = Node("ReshapeShape", [base, view.inputs[1]], [out], attrs, label, FUSED_DOMAIN, 1, types)
        else:
            full = sweep.new_name(f"{out}_full")
            sweep.add(Node("ReshapeShape", [base, view.inputs[1]], [full], attrs, label, FUSED_DOMAIN, 1, types))
            _int64_vector(graph, full, None)
            bounds = sweep.new_name(f"{out}_bounds")
            start = int(shape.attrs.get("start", 0))
            end = shape.attrs.get("end")
            graph.initializers[bounds + "_starts"] = np.array([start], dtype=np.int64)
            graph.initializers[bounds + "_ends"] = np.array(
                [np.iinfo(np.int64).max if end is None else int(end)], dtype=np.int64
            )
            final = Node(
                "Slice", [full, bounds + "_starts", bounds + "_ends"], [out], name=shape.name, opset=shape.opset
            )
    else:
        return False
    sweep.replace(shape, final)
    sweep.touch(view)
    return True


def _round(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for node in list(graph.nodes):
        if not _plain(node, "Shape") or not node.inputs or not sweep.fresh(node):
            continue
        view = uses.producer.get(node.inputs[0])
        if view is None or not (_plain(view, "Transpose") or _plain(view, "Reshape")):
            continue
        if not _only_shape_readers(uses, node.inputs[0]):
            continue
        _rewrite(graph, sweep, node, view)
    return sweep.finish()


def run(graph: Graph) -> bool:
    changed = False
    for _ in range(MAX_ROUNDS):
        if not _round(graph):
            break
        changed = True
    return changed
