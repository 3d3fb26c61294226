"""Multi-head attention as exporters write it -> onnxpy.fused.Attention (one step).

The pattern, matched from each Softmax over the last axis:

    Q = Transpose<0,2,1,3>(Reshape(q, sq)) [* c]      K = Transpose<0,2,3,1>(Reshape(k, sk)) [* c]
    S = MatMul(Q, K) [* or / scalar] [+ mask]
    P = Softmax(S, axis=-1) [-> Where(IsNaN(P), constant, P)]
    O = MatMul(P, V)        V = Transpose<0,2,1,3>(Reshape(v, sv))

Q may instead be any 4-D value [times a scalar], K Transpose<0,1,3,2>(keys) and V any 4-D
value, all already split per head (batch, heads, seq, size): GPT-2's decoder concatenates the
past keys and values in front of the new ones and returns them, so they stay as they are and
the fused node reads them; timm's ViT splits one packed projection with Reshape, Transpose,
Split and Squeeze, which stay (views).

O, the per-head context (batch, heads, seq, size), is the fused node's output: how exporters
merge the heads afterwards varies, and they often read O's shape to do it.

Every intermediate must be read by the pattern alone (and not be a graph output), except that
Shape nodes may read the per-head tensors (those Reshape/Transpose views then stay), the Reshapes
must not use allowzero, and q, k, v must be float32 or float64 (or of unknown type: a Softmax
reads them, so they are floats). The shape inputs stay inputs of the fused
node (they are computed from the run's shapes), so any batch and sequence length works; the
scalar factors combine into one ``scale`` applied to Q.
"""

from __future__ import annotations

from collections.abc import Callable

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, constant, fresh_name, is_plain, scalar_value, shapes_only

_HEADS = [0, 2, 1, 3]  # (batch, seq, heads, size) <-> (batch, heads, seq, size)
_KEYS_T = [0, 2, 3, 1]  # (batch, seq, heads, size) -> (batch, heads, size, seq)


def _sole(uses: Uses, name: str, node: Node | None) -> bool:
    """``name`` is read by ``node`` and nothing else."""
    return node is not None and uses.only_reader(name) is node


def _shape_readers(uses: Uses, name: str, node: Node) -> bool | None:
    """None when ``name`` has readers besides ``node`` that are not Shape nodes (or is a graph
    output); else whether Shape nodes read it too (exporters take the head sizes from the
    split tensors: such a node must stay, for its Shape readers)."""
    readers = uses.readers_of(name)
    if node not in readers or name in uses.graph_outputs:
        return None
    others = [r for r in readers if r is not node]
    if any(not shapes_only(uses, r) for r in others):
        return None
    return bool(others)


def _scalar_factor(graph: Graph, node: Node, x: str) -> float | None:
    """The factor a Mul or Div by a scalar constant applies to ``x``; None otherwise."""
    if len(node.inputs) != 2 or x not in node.inputs:
        return None
    other = node.inputs[1] if node.inputs[0] == x else node.inputs[0]
    value = scalar_value(constant(graph, other))
    if value is None:
        return None
    if node.op_type == "Mul":
        return value
    if node.op_type == "Div" and node.inputs[0] == x and value != 0:
        return 1.0 / value
    return None


def _runtime_factor(graph: Graph, node: Node, x: str) -> str | None:
    """The one-value tensor a Mul multiplies ``x`` by, where it is computed at run time (torch's
    SDPA export takes its default scale from q's last dimension, Sqrt(1 / Sqrt(Cast(Slice(
    Shape(q), -1)))), which stays unknown where the head size is computed, reshape(..., -1) or
    C // heads); None otherwise."""
    if not is_plain(node, "Mul") or len(node.inputs) != 2 or x not in node.inputs or node.inputs[0] == node.inputs[1]:
        return None
    other = node.inputs[1] if node.inputs[0] == x else node.inputs[0]
    if constant(graph, other) is not None or graph.shape(other) not in ([], [1]):
        return None
    return other if graph.elem_type(other) in (1, 11) else None


def _split_heads(
    graph: Graph,
    uses: Uses,
    name: str,
    reader: Node,
    perm: list[int],
    nodes: list[Node],
    keep: set[int],
    pre_scale: bool = False,
) -> tuple[str, str, float] | None:
    """(projection, its Reshape shape, scale) when ``name``, read by ``reader`` (and Shape
    nodes), is [scale *] Transpose<perm>(Reshape(projection)); with ``pre_scale`` (queries and
    keys, whose factors scale the scores alike) also Transpose<perm>(Reshape(projection *
    scale)), the scale BART, OPT and CLIP apply to the query projection. The matched nodes go
    to ``nodes``; the ids of those that must stay for Shape readers (and what feeds them) to
    ``keep``."""
    chain: list[tuple[Node, bool]] = []  # (node, its output has Shape readers)
    scale = 1.0
    shapes = _shape_readers(uses, name, reader)
    node = uses.producer.get(name)
    if shapes is None or node is None:
        return None
    if is_plain(node, "Mul") or is_plain(node, "Div"):
        inner = next((i for i in node.inputs if is_plain(uses.producer.get(i), "Transpose")), None)
        factor = None if inner is None else _scalar_factor(graph, node, inner)
        inner_shapes = None if inner is None else _shape_readers(uses, inner, node)
        if inner is None or factor is None or inner_shapes is None:
            return None
        chain.append((node, shapes))
        scale, name, node, shapes = factor, inner, uses.producer.get(inner), inner_shapes
    if node is None or not is_plain(node, "Transpose") or list(node.attrs.get("perm", [])) != perm:
        return None
    reshape = uses.producer.get(node.inputs[0])
    if reshape is None or not is_plain(reshape, "Reshape") or reshape.attrs.get("allowzero", 0):
        return None
    reshape_shapes = _shape_readers(uses, node.inputs[0], node)
    if reshape_shapes is None or graph.elem_type(reshape.inputs[0]) not in (1, 11, None):
        return None
    chain += [(node, shapes), (reshape, reshape_shapes)]
    source = reshape.inputs[0]
    pre = uses.producer.get(source)
    if pre_scale and (is_plain(pre, "Mul") or is_plain(pre, "Div")) and uses.only_reader(source) is reshape:
        assert pre is not None
        x = pre.inputs[0] if pre.op_type == "Div" else next((i for i in pre.inputs if constant(graph, i) is None), "")
        factor = _scalar_factor(graph, pre, x) if x else None
        if factor is not None and graph.elem_type(x) in (1, 11, None):
            chain.append((pre, False))
            scale, source = scale * factor, x
    # A node kept for its Shape readers keeps the nodes upstream of it as well.
    kept = False
    for n, read_by_shape in chain:
        kept = kept or read_by_shape
        nodes.append(n)
        if kept:
            keep.add(id(n))
    return source, reshape.inputs[1], scale


def _match(graph: Graph, uses: Uses, softmax: Node) -> tuple[Node, list[Node], list[Node]] | None:
    """(the fused node, the nodes it replaces, nodes to add) for the attention around ``softmax``."""
    axis = int(softmax.attrs.get("axis", -1 if softmax.opset >= 13 else 1))
    rank = len(graph.shape(softmax.inputs[0]) or [])
    if axis != -1 and not (rank == 4 and axis == 3):
        return None
    nodes: list[Node] = [softmax]
    # Upwards: [+ mask] [Where(condition, scores, fill)] [* or / scalar] MatMul(Q, K).
    scores, bias, scale = softmax.inputs[0], "", 1.0
    node = uses.producer.get(scores)
    added: list[Node] = []
    if is_plain(node, "Add") and _sole(uses, scores, softmax):
        assert node is not None
        pair = _two_terms(graph, uses, node)
        if pair is not None:
            # (S + a) + b, a relative-position bias then a mask (Swin, BEiT, T5): S + (a + b).
            inner, total = pair
            nodes.append(node)
            added.append(total)
            scores, node = inner.outputs[0], inner
        found_scores = [i for i in node.inputs if _scores_source(uses, i)]
        # A product before a Where: the mask itself may be a Where (Where(keep, 0, -inf)).
        mm = next((i for i in found_scores if not is_plain(uses.producer.get(i), "Where")), None)
        mm = mm or (found_scores[0] if found_scores else None)
        if mm is None or node.inputs.count(mm) != 1:
            return None
        bias = added[0].outputs[0] if added else node.inputs[1] if node.inputs[0] == mm else node.inputs[0]
        if added:
            added[0].inputs[0] = node.inputs[1] if node.inputs[0] == mm else node.inputs[0]
        nodes.append(node)
        reader, scores, node = node, mm, uses.producer.get(mm)
    else:
        reader = softmax
    masked: tuple[str, float, int] | None = None
    gone: set[int] = set()  # Shape readers of the scores that go with the fusion

    def sole(name: str, reader: Node | None) -> bool:
        readers = [r for r in uses.readers_of(name) if id(r) not in gone]
        return reader is not None and readers == [reader] and name not in uses.graph_outputs

    if is_plain(node, "Where") and _sole(uses, scores, reader):
        assert node is not None
        found = _where_mask(graph, uses, node, nodes)
        if found is None:
            return None
        masked, inner = found
        gone.update(id(n) for n in nodes if is_plain(n, "Shape"))
        reader, scores, node = node, inner, uses.producer.get(inner)
    past = _past_scale(graph, uses, node, scores, reader, sole, nodes)
    if past is None:
        return None
    scale, node, scores, reader = past
    if not is_plain(node, "MatMul") or not sole(scores, reader):
        return None
    assert node is not None
    nodes.append(node)
    keep: set[int] = set()
    q = _split_heads(graph, uses, node.inputs[0], node, _HEADS, nodes, keep, pre_scale=True) or _query_per_head(
        graph, uses, node.inputs[0], node, nodes
    )
    k = _split_heads(graph, uses, node.inputs[1], node, _KEYS_T, nodes, keep, pre_scale=True) or _given_per_head(
        graph, uses, node.inputs[1], node, nodes
    )
    if q is None or k is None:
        return None
    # Downwards: [NaN guard] MatMul(P, V).
    probs = softmax.outputs[0]
    if probs in uses.graph_outputs:
        return None
    nan_to_zero, nan_value = 0, 0.0
    readers = uses.readers_of(probs)
    isnan = next((r for r in readers if is_plain(r, "IsNaN")), None)
    if isnan is not None:
        where = uses.only_reader(isnan.outputs[0])
        if len(readers) != 2 or not is_plain(where, "Where") or where not in readers:
            return None
        assert where is not None
        fill = scalar_value(constant(graph, where.inputs[1]))
        if where.inputs[0] != isnan.outputs[0] or where.inputs[2] != probs or fill is None:
            return None
        nodes += [isnan, where]
        nan_to_zero, nan_value, probs = 1, fill, where.outputs[0]
    mm2 = uses.only_reader(probs)
    if not is_plain(mm2, "MatMul") or mm2.inputs[0] != probs:
        return None
    assert mm2 is not None
    nodes.append(mm2)
    v = _split_heads(graph, uses, mm2.inputs[1], mm2, _HEADS, nodes, keep)
    if v is None and _rank(graph, mm2.inputs[1]) == 4:
        v = (mm2.inputs[1], "", 1.0)  # given per head (a decoder's present values)
    if v is None or v[2] != 1.0:
        return None
    total = scale * q[2] * k[2]
    attrs: dict[str, float | int] = {"scale": float(total), "nan_to_zero": nan_to_zero, "nan_value": float(nan_value)}
    if not q[1]:
        attrs["query_heads"] = 1
    if not k[1]:
        attrs["key_heads"] = 1
    if not v[1]:
        attrs["value_heads"] = 1
    inputs = [q[0], k[0], v[0], q[1], k[1], v[1], bias]
    if masked is not None:
        inputs += ["", "", "", "", masked[0]]
        attrs["where_fill"], attrs["where_keep"] = masked[1], masked[2]
    factors = [found[3] if len(found) > 3 else "" for found in (q, k)]
    if any(factors):
        inputs += [""] * (18 - len(inputs)) + factors
    fused = Node(
        "Attention",
        inputs,
        [mm2.outputs[0]],
        attrs,
        softmax.name or "attention",
        FUSED_DOMAIN,
        1,
    )
    return fused, [n for n in nodes if id(n) not in keep], added


def _past_scale(
    graph: Graph,
    uses: Uses,
    node: Node | None,
    scores: str,
    reader: Node,
    sole: Callable[[str, Node], bool],
    nodes: list[Node],
) -> tuple[float, Node | None, str, Node] | None:
    """(scale, producer, value, its reader) one step up from the scores ``scores`` (made by
    ``node``, read by ``reader``): past a Mul or Div of the product by a scalar, which goes to
    ``nodes``, or where there is none, (1, as given); None for a Mul or Div of anything else."""
    if not (is_plain(node, "Mul") or is_plain(node, "Div")) or not sole(scores, reader):
        return 1.0, node, scores, reader
    assert node is not None
    inner = node.inputs[0]
    factor = _scalar_factor(graph, node, inner) if is_plain(uses.producer.get(inner), "MatMul") else None
    if factor is None:
        return None
    nodes.append(node)
    return factor, uses.producer.get(inner), inner, node


def _two_terms(graph: Graph, uses: Uses, outer: Node) -> tuple[Node, Node] | None:
    """(inner, Add(a, b)) where ``outer`` is Add(Add(S, a), b) in either order, S a product of
    Q and K [scaled] and neither a nor b one, the inner Add read by ``outer`` alone; the new
    node's first input is filled in by the caller."""
    if len(outer.inputs) != 2 or any(_scores_source(uses, i) for i in outer.inputs):
        return None
    for i, name in enumerate(outer.inputs):
        inner = uses.producer.get(name)
        if not is_plain(inner, "Add") or inner is None or not _sole(uses, name, outer) or len(inner.inputs) != 2:
            continue
        if sum(_scores_source(uses, j) for j in inner.inputs) != 1:
            continue
        total = fresh_name(graph, f"{outer.outputs[0]}_terms")
        return inner, Node("Add", ["", outer.inputs[1 - i]], [total], name=total, opset=outer.opset)
    return None


def _merged(
    graph: Graph, uses: Uses, name: str, reader: Node, nodes: list[Node], keep: set[int], pre_scale: bool
) -> tuple[str, str, float, str] | None:
    """(projection, its 4-D Reshape shape, scale, the 3-D Reshape shape) when ``name``, read
    by ``reader`` (and Shape nodes), is Reshape(Transpose<0,2,1,3>(Reshape(projection)), shape):
    heads split, then merged with the batch axis, (batch * heads, seq, size); or (x, "", 1, the
    3-D shape) for Reshape(x, shape) of any 4-D x, taken as given per head. The matched nodes
    go to ``nodes``, those kept for Shape readers (and all under them) to ``keep``."""
    merge = uses.producer.get(name)
    if not is_plain(merge, "Reshape") or merge is None or len(merge.inputs) < 2 or merge.attrs.get("allowzero", 0):
        return None
    shapes = _shape_readers(uses, name, reader)
    if shapes is None:
        return None
    inner: list[Node] = []
    inner_keep: set[int] = set()
    heads = _split_heads(graph, uses, merge.inputs[0], merge, _HEADS, inner, inner_keep, pre_scale)
    if heads is None:
        # Given per head (a decoder's keys with the past ones in front, also returned as its
        # present state): read as it is.
        given = merge.inputs[0]
        if _rank(graph, given) != 4 or graph.elem_type(given) not in (1, 11, None):
            return None
        heads = (given, "", 1.0)
    nodes += [merge, *inner]
    keep.update({id(merge), *(id(n) for n in inner)} if shapes else inner_keep)
    return heads[0], heads[1], heads[2], merge.inputs[1]


def _match_merged(graph: Graph, uses: Uses, softmax: Node) -> tuple[Node, list[Node], list[Node]] | None:
    """(the fused node, the nodes it replaces, none to add) for attention written over (batch * heads, seq,
    size) tensors, transformers' bmm form (BART, OPT, Marian, CLIP before 4.48):

        Q3 = Reshape(Transpose<0,2,1,3>(Reshape(q [* c], sq)), mq)       (K3, V3 alike)
        S = MatMul(Q3, Transpose<0,2,1>(K3)) [* or / scalar]
        [S = Reshape([Max](Reshape(S, split) + mask, floor), merge)]     the mask added in 4-D
        O = MatMul(Softmax(S, axis=-1), V3) [-> Reshape(O, (batch, heads, seq, size))]

    The Attention takes the projections and every Reshape's shape (inputs 12-17,
    ``merged_heads``); the kernel checks at run time that they merge and split the batch and
    head axes as intended, and computes each step as written where they do not."""
    axis = int(softmax.attrs.get("axis", -1 if softmax.opset >= 13 else 1))
    if axis != -1 and not (axis == 2 and _rank(graph, softmax.inputs[0]) == 3):
        return None
    nodes: list[Node] = [softmax]
    reader, name = softmax, softmax.inputs[0]
    node = uses.producer.get(name)
    split, merge, bias, floor = "", "", "", None
    if is_plain(node, "Reshape") and _sole(uses, name, reader):
        assert node is not None
        if len(node.inputs) < 2 or node.attrs.get("allowzero", 0):
            return None
        merge = node.inputs[1]
        nodes.append(node)
        reader, name, node = node, node.inputs[0], uses.producer.get(node.inputs[0])
        if is_plain(node, "Max") and _sole(uses, name, reader):
            assert node is not None
            values = [scalar_value(constant(graph, i)) for i in node.inputs]
            if len(node.inputs) != 2 or values.count(None) != 1:
                return None
            floor = next(v for v in values if v is not None)
            nodes.append(node)
            reader, name = node, node.inputs[values.index(None)]
            node = uses.producer.get(name)
        if not is_plain(node, "Add") or not _sole(uses, name, reader):
            return None
        assert node is not None
        found = [i for i in node.inputs if _split_scores(uses, i)]
        if len(found) != 1 or node.inputs.count(found[0]) != 1:
            return None
        bias = node.inputs[1] if node.inputs[0] == found[0] else node.inputs[0]
        nodes.append(node)
        reader, name = node, found[0]
        node = uses.producer.get(name)
        if not _sole(uses, name, reader):
            return None
        assert node is not None
        split = node.inputs[1]
        nodes.append(node)
        reader, name, node = node, node.inputs[0], uses.producer.get(node.inputs[0])
    past = _past_scale(graph, uses, node, name, reader, lambda n, r: _sole(uses, n, r), nodes)
    if past is None:
        return None
    scale, node, name, reader = past
    if not is_plain(node, "MatMul") or not _sole(uses, name, reader):
        return None
    assert node is not None
    nodes.append(node)
    keep: set[int] = set()
    q = _merged(graph, uses, node.inputs[0], node, nodes, keep, True)
    kt = uses.producer.get(node.inputs[1])
    if q is None or not is_plain(kt, "Transpose") or not _sole(uses, node.inputs[1], node):
        return None
    assert kt is not None
    if list(kt.attrs.get("perm", [])) != [0, 2, 1]:
        return None
    nodes.append(kt)
    k = _merged(graph, uses, kt.inputs[0], kt, nodes, keep, True)
    probs = softmax.outputs[0]
    mm2 = uses.only_reader(probs)
    if k is None or not is_plain(mm2, "MatMul") or mm2 is None or mm2.inputs[0] != probs:
        return None
    nodes.append(mm2)
    v = _merged(graph, uses, mm2.inputs[1], mm2, nodes, keep, False)
    if v is None or v[2] != 1.0:
        return None
    tail, last = mm2, ""
    after = uses.only_reader(mm2.outputs[0])
    if (
        is_plain(after, "Reshape")
        and after is not None
        and len(after.inputs) > 1
        and not after.attrs.get("allowzero", 0)
    ):
        nodes.append(after)
        tail, last = after, after.inputs[1]
    attrs: dict[str, float | int] = {
        "scale": float(scale * q[2] * k[2]), "nan_to_zero": 0, "nan_value": 0.0, "merged_heads": 1,
    }  # fmt: skip
    for flag, found in (("query_heads", q), ("key_heads", k), ("value_heads", v)):
        if not found[1]:
            attrs[flag] = 1
    if floor is not None:
        attrs["floor"], attrs["floored"] = float(floor), 1
    inputs = [q[0], k[0], v[0], q[1], k[1], v[1], bias, "", "", "", "", "", q[3], k[3], v[3], split, merge, last]
    fused = Node("Attention", inputs, [tail.outputs[0]], attrs, softmax.name or "attention", FUSED_DOMAIN, 1)
    return fused, [n for n in nodes if id(n) not in keep], []


def _split_scores(uses: Uses, name: str) -> bool:
    """``name`` is Reshape of a [scaled] product: 3-D scores viewed in 4-D for the mask."""
    node = uses.producer.get(name)
    if not is_plain(node, "Reshape") or node is None or len(node.inputs) < 2 or node.attrs.get("allowzero", 0):
        return False
    return is_plain(uses.producer.get(node.inputs[0]), "MatMul") or _scaled(uses, node.inputs[0])


def _scores_source(uses: Uses, name: str) -> bool:
    """``name`` is a product of Q and K, scaled, or such a product masked by a Where: the
    scores an additive mask may follow."""
    node = uses.producer.get(name)
    if is_plain(node, "Where") and node is not None and len(node.inputs) == 3:
        return any(is_plain(uses.producer.get(i), "MatMul") or _scaled(uses, i) for i in node.inputs[1:])
    return is_plain(node, "MatMul") or _scaled(uses, name)


def _where_mask(graph: Graph, uses: Uses, where: Node, nodes: list[Node]) -> tuple[tuple[str, float, int], str] | None:
    """((condition, fill, keep), scores) for Where(condition, scores, fill) (keep 1: the
    condition marks the scores kept) or Where(condition, fill, scores) (keep 0), fill a scalar
    constant and scores a [scaled] product: GPT-2's causal buffer and DistilBERT's masked_fill.
    A condition Expanded to Shape(scores) (masked_fill's expand_as) is taken before the Expand,
    which broadcasting makes unnecessary; those nodes go to ``nodes`` with the Where."""
    if len(where.inputs) != 3:
        return None
    cond, a, b = where.inputs
    for keep, data, fill_name in ((1, a, b), (0, b, a)):
        fill = scalar_value(constant(graph, fill_name))
        source = uses.producer.get(data)
        if fill is None or not (is_plain(source, "MatMul") or _scaled(uses, data)):
            continue
        extra: list[Node] = []
        expand = uses.producer.get(cond)
        if is_plain(expand, "Expand") and expand is not None and uses.only_reader(cond) is where:
            shape = uses.producer.get(expand.inputs[1])
            if is_plain(shape, "Shape") and shape is not None and shape.inputs[0] == data and not shape.attrs:
                if uses.only_reader(expand.inputs[1]) is expand:
                    extra, cond = [expand, shape], expand.inputs[0]
        if not _sole(uses, data, where) and not (
            extra and {id(r) for r in uses.readers_of(data)} == {id(where), id(extra[1])}
        ):
            return None
        if graph.elem_type(cond) not in (9, None):  # a bool condition
            return None
        nodes.append(where)
        nodes.extend(extra)
        return (cond, float(fill), keep), data
    return None


def _rank(graph: Graph, name: str) -> int | None:
    shape = graph.shape(name)
    return None if shape is None else len(shape)


def _given_per_head(
    graph: Graph, uses: Uses, name: str, reader: Node, nodes: list[Node]
) -> tuple[str, str, float, str] | None:
    """(keys, "", scale) when ``name``, read by ``reader`` alone, is Transpose<0,1,3,2> of 4-D
    keys already split per head (a decoder's past and new keys concatenated, which the graph
    also returns), [times or divided by a scalar] (torch's scaled_dot_product_attention scales
    K^T by sqrt(scale)): the fused node reads them as they are. The Transpose and a scaling
    node go to ``nodes``."""
    node = uses.producer.get(name)
    scale, scaling, runtime = 1.0, None, ""
    if (is_plain(node, "Mul") or is_plain(node, "Div")) and _sole(uses, name, reader):
        assert node is not None
        inner = next((i for i in node.inputs if is_plain(uses.producer.get(i), "Transpose")), None)
        factor = None if inner is None else _scalar_factor(graph, node, inner)
        found = _runtime_factor(graph, node, inner) if inner is not None and factor is None else None
        if factor is None and found is None:
            return None
        runtime = found or ""
        scale, scaling, reader, name, node = factor or 1.0, node, node, inner, uses.producer.get(inner)
    if not is_plain(node, "Transpose") or not _sole(uses, name, reader):
        return None
    assert node is not None
    if list(node.attrs.get("perm", [])) != [0, 1, 3, 2] or _rank(graph, node.inputs[0]) != 4:
        return None
    if graph.elem_type(node.inputs[0]) not in (1, 11, None):
        return None
    nodes.append(node)
    if scaling is not None:
        nodes.append(scaling)
    return node.inputs[0], "", scale, runtime


def _query_per_head(
    graph: Graph, uses: Uses, name: str, reader: Node, nodes: list[Node]
) -> tuple[str, str, float, str] | None:
    """(queries, "", scale) when ``name``, read by ``reader`` alone, is 4-D queries already
    split per head, [times or divided by a scalar] (timm's ViT: Squeeze(Split(Transpose(
    Reshape(qkv)))) * scale). A scaling node goes to ``nodes``; the last entry names a factor
    computed at run time ("" for none)."""
    node = uses.producer.get(name)
    scale = 1.0
    if (is_plain(node, "Mul") or is_plain(node, "Div")) and _sole(uses, name, reader):
        assert node is not None
        inner = (
            node.inputs[0]
            if node.op_type == "Div"
            else next((i for i in node.inputs if constant(graph, i) is None), node.inputs[0])
        )
        factor = _scalar_factor(graph, node, inner)
        runtime = _runtime_factor(graph, node, inner) if factor is None else ""
        if runtime is None or _rank(graph, inner) != 4 or graph.elem_type(inner) not in (1, 11, None):
            return None
        nodes.append(node)
        return inner, "", 1.0 if factor is None else factor, runtime
    if _rank(graph, name) != 4 or graph.elem_type(name) not in (1, 11, None):
        return None
    # Shape readers may stay (GPT-Neo slices its causal buffer to query.size(-2)): the fused
    # node reads the queries as they are.
    if _shape_readers(uses, name, reader) is None:
        return None
    return name, "", scale, ""


def _scaled(uses: Uses, name: str) -> bool:
    """``name`` is a Mul/Div of a MatMul result (the scale written before the mask)."""
    node = uses.producer.get(name)
    return (
        (is_plain(node, "Mul") or is_plain(node, "Div"))
        and node is not None
        and is_plain(uses.producer.get(node.inputs[0]), "MatMul")
    )


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    for node in list(graph.nodes):
        if not is_plain(node, "Softmax") or not sweep.fresh(node):
            continue
        m = _match(graph, sweep.uses, node) or _match_merged(graph, sweep.uses, node)
        if m is None or not sweep.fresh(*m[1]):
            continue
        fused, dead, added = m
        tail = next(d for d in dead if d.outputs == fused.outputs)  # MatMul(P, V): the fused node takes its place
        for node in added:
            sweep.add(node)
        sweep.replace(tail, fused)
        sweep.remove(*[d for d in dead if d is not tail])
    return sweep.finish()
