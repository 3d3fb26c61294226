"""Shape of a view -> the same numbers computed from the view's input, so the view can go.

Exporters read head counts and sizes from the shapes of intermediate views, for example
``Shape(Transpose(Reshape(v, target)))`` in BERT's attention. Once the attention fusion has
taken those views' data, their Shape readers alone keep the Reshape and the Transpose alive:
two kernel calls per layer and tensor for nothing but a shape. Likewise repeat_kv's Unsqueeze,
Expand and Reshape once fold_repeat_kv has the Attention read the KV heads in place: the
causal masks of transformers' eager and SDPA attention take their size from the repeated keys,
and the Expand would copy the whole cache for them. This pass computes the same shape from the
view's input:

    Shape(Transpose(u, perm))[a:b]  ->  Gather(Shape(u), perm[a:b])
    Shape(Reshape(u, target))[a:b]  ->  Slice(ReshapeShape(Shape(u), target), a, b)
    Shape(Expand(u, shape))[a:b]    ->  Slice(ExpandShape(Shape(u), shape), a, b)
    Shape(Unsqueeze(u, axes))[a:b]  ->  Slice(UnsqueezeShape(Shape(u), axes), a, b)
    Shape(Squeeze(u, axes))[a:b]    ->  Slice(SqueezeShape(Shape(u), axes), a, b)

(no Slice without a start or end; axes given as attributes before opset 13 become constants)
where every reader of the view is a Shape node, so that the view then has no reader and is
pruned (and the view under it gets the same treatment in the next round). The ``...Shape`` ops
(onnxpy.fused) apply the view's rules to a shape: the same 0 and -1 handling, broadcasting and
axes, and the same errors, so a bad target still fails the run, naming the problem. The results
are shape-derived: ``memoize_shapes``, which runs right after, folds them into its memo nodes.

Host sessions only (with memoize_shapes), where Shape values live on the host.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, TensorProto, helper

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, is_plain, shape_window

# Rounds of rewriting: each removes one view layer under the Shape readers.
MAX_ROUNDS = 8

# The nodes whose output's shape this pass computes from their input's, and the onnxpy.fused
# ops doing it (Transpose's is a Gather); all are views but Expand, which copies.
_SHAPE_OPS = {
    "Reshape": "ReshapeShape",
    "Expand": "ExpandShape",
    "Unsqueeze": "UnsqueezeShape",
    "Squeeze": "SqueezeShape",
}
_VIEWS = frozenset({"Transpose", *_SHAPE_OPS})


def _only_shape_readers(uses: Uses, name: str) -> bool:
    readers = uses.readers_of(name)
    return bool(readers) and name not in uses.graph_outputs and all(is_plain(r, "Shape") for r in readers)


def _int64_vector(graph: Graph, name: str, length: int | None) -> None:
    graph.types[name] = helper.make_tensor_type_proto(TensorProto.INT64, [length])


def _operands(graph: Graph, sweep: Sweep, view: Node) -> tuple[list[str], dict[str, int]] | None:
    """The inputs after the shape, and the attributes, of the onnxpy.fused op computing
    ``view``'s shape from its input's (None when ``view`` is not one this pass rewrites)."""
    op, second = view.op_type, view.inputs[1] if len(view.inputs) > 1 else ""
    if op == "Reshape":
        return ([second], {"allowzero": int(view.attrs.get("allowzero", 0))}) if second else None
    if op == "Expand":
        return ([second], {}) if second else None
    if view.opset >= 13 or second:
        # Squeeze's axes are optional (none: every axis of size 1), Unsqueeze's are not.
        return ([second], {}) if second or op == "Squeeze" else None
    axes = view.attrs.get("axes")  # opset 1-11: an attribute, passed on as a constant
    if axes is None:
        return ([], {}) if op == "Squeeze" else None
    name = sweep.new_name(f"{view.outputs[0]}_axes")
    graph.initializers[name] = np.array([int(a) for a in axes], dtype=np.int64)
    return [name], {}


def _computed(graph: Graph, sweep: Sweep, shape: Node, view: Node, base: str) -> Node | None:
    """Shape(view) as ``view``'s fused shape op over ``base`` (the Shape of its input), sliced to
    the Shape node's start and end; None when ``view`` cannot be computed so."""
    found = _operands(graph, sweep, view)
    if found is None:
        return None
    operands, attrs = found
    out = shape.outputs[0]
    sweep.add(Node("Shape", [view.inputs[0]], [base], name=base, opset=shape.opset))
    _int64_vector(graph, base, None)
    types = {k: AttributeProto.INT for k in attrs}
    # Named after the view: a bad shape fails here now, and the error should say where.
    label = f"{view.name or view.outputs[0]} (shape)"
    op = _SHAPE_OPS[view.op_type]
    if "start" not in shape.attrs and "end" not in shape.attrs:
        return Node(op, [base, *operands], [out], attrs, label, FUSED_DOMAIN, 1, types)
    full = sweep.new_name(f"{out}_full")
    sweep.add(Node(op, [base, *operands], [full], attrs, label, FUSED_DOMAIN, 1, types))
    _int64_vector(graph, full, None)
    bounds = sweep.new_name(f"{out}_bounds")
    start = int(shape.attrs.get("start", 0))
    end = shape.attrs.get("end")
    graph.initializers[bounds + "_starts"] = np.array([start], dtype=np.int64)
    graph.initializers[bounds + "_ends"] = np.array(
        [np.iinfo(np.int64).max if end is None else int(end)], dtype=np.int64
    )
    return Node("Slice", [full, bounds + "_starts", bounds + "_ends"], [out], name=shape.name, opset=shape.opset)


def _gathered(graph: Graph, sweep: Sweep, shape: Node, view: Node, base: str) -> Node | None:
    """Shape(Transpose(u, perm))[a:b] as Gather(Shape(u), perm[a:b])."""
    source, out = view.inputs[0], shape.outputs[0]
    perm = view.attrs.get("perm")
    if perm is None:
        rank = len(graph.shape(source) or []) if graph.shape(source) is not None else None
        if rank is None:
            return None
        perm = list(range(rank))[::-1]
    s, e = shape_window(shape, len(perm))
    indices = sweep.new_name(f"{out}_perm")
    graph.initializers[indices] = np.array(list(perm)[s:e], dtype=np.int64)
    sweep.add(Node("Shape", [source], [base], name=base, opset=shape.opset))
    _int64_vector(graph, base, None)
    return Node(
        "Gather", [base, indices], [out], {"axis": 0}, shape.name, "", shape.opset, {"axis": AttributeProto.INT}
    )


def _rewrite(graph: Graph, sweep: Sweep, shape: Node, view: Node) -> bool:
    """Replace ``shape`` (reading ``view``'s output) by nodes reading ``view``'s input."""
    if not view.inputs or not view.inputs[0]:
        return False
    base = sweep.new_name(f"{shape.outputs[0]}_of_input")
    if view.op_type == "Transpose":
        final = _gathered(graph, sweep, shape, view, base)
    else:
        final = _computed(graph, sweep, shape, view, base)
    if final is None:
        return False
    sweep.replace(shape, final)
    sweep.touch(view)
    return True


def _round(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for node in list(graph.nodes):
        if not is_plain(node, "Shape") or not node.inputs or not sweep.fresh(node):
            continue
        view = uses.producer.get(node.inputs[0])
        if view is None or view.domain or view.op_type not in _VIEWS:
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
