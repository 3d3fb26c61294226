"""Grouped-query attention's repeat_kv folded into the fused Attention.

Llama, Mistral, Qwen and other models with fewer key/value heads than query heads repeat each
KV head for its group of query heads before the products (transformers' repeat_kv):

    x[:, :, None, :, :].expand(b, kv_heads, n, s, d).reshape(b, kv_heads * n, s, d)

which torch exports as Unsqueeze(axis 2), Expand and Reshape: one full copy of the keys and one
of the values per layer and call, n times their size (a decoder step copies the whole cache).
Where both the Attention's keys and values (given per head) come from such chains read by
nothing else, the Attention takes the KV heads themselves, with the Expand's and the Reshape's
shapes as inputs 7-10 and ``kv_repeat`` = 1. The kernel (ops/fused_attention.py) checks at run
time that those shapes make exactly that repetition and then reads each KV head for its n query
heads in place; any other shapes get the copy the three nodes would have made.

The chain's values may also be read for their shape alone (Shape nodes, or views only Shape
nodes read): transformers' eager attention slices the mask to ``key_states.shape[-2]`` and
torch's export of scaled_dot_product_attention(is_causal=True) sizes its causal mask from the
repeated keys. The nodes such readers need then stay, for them alone; shape_of_views (host
sessions) computes their shapes from x's instead, and they go too.
"""

from __future__ import annotations

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses, is_plain, shapes_only
from ..shape_arith import const_ints


def _next_and_shapes(uses: Uses, name: str, reader: Node) -> bool | None:
    """None unless ``name`` is read once by ``reader`` and otherwise only for its shape (Shape
    nodes, or views only Shape nodes read; not a graph output); else whether it is so read."""
    readers = uses.readers_of(name)
    if name in uses.graph_outputs or sum(r is reader for r in readers) != 1:
        return None
    others = [r for r in readers if r is not reader]
    if not all(shapes_only(uses, r) for r in others):
        return None
    return bool(others)


def _chain(graph: Graph, uses: Uses, name: str, reader: Node) -> tuple[str, str, str, int, list[Node], int] | None:
    """(x, expand shape, reshape shape, allowzero, nodes, kept) where ``name``, read by
    ``reader`` (and for its shape), is Reshape(Expand(Unsqueeze(x, axes=[2]), shape), shape),
    each read by the next (and for its shape). Of the nodes (Unsqueeze, Expand, Reshape) the
    first ``kept`` must stay for their Shape readers (and the nodes feeding those)."""
    reshape = uses.producer.get(name)
    read = _next_and_shapes(uses, name, reader) if is_plain(reshape, "Reshape") else None
    if read is None:
        return None
    assert reshape is not None
    expand = uses.producer.get(reshape.inputs[0])
    expand_read = _next_and_shapes(uses, reshape.inputs[0], reshape) if is_plain(expand, "Expand") else None
    if expand_read is None:
        return None
    assert expand is not None
    unsqueeze = uses.producer.get(expand.inputs[0])
    unsqueeze_read = _next_and_shapes(uses, expand.inputs[0], expand) if is_plain(unsqueeze, "Unsqueeze") else None
    if unsqueeze_read is None:
        return None
    assert unsqueeze is not None
    if len(unsqueeze.inputs) > 1:
        axes = const_ints(graph, unsqueeze.inputs[1])
    else:
        axes = [int(a) for a in unsqueeze.attrs.get("axes", [])]
    x = unsqueeze.inputs[0]
    shape = graph.shape(x)
    if axes != [2] or (shape is not None and len(shape) != 4) or graph.elem_type(x) not in (1, 11, None):
        return None
    allowzero = int(reshape.attrs.get("allowzero", 0))
    # A node staying for its Shape readers keeps those upstream of it (shape_of_views then
    # computes their shapes from x's, and they go).
    kept = 3 if read else 2 if expand_read else 1 if unsqueeze_read else 0
    return x, expand.inputs[1], reshape.inputs[1], allowzero, [unsqueeze, expand, reshape], kept


def _match(graph: Graph, uses: Uses, node: Node) -> tuple[Node, list[Node], list[Node]] | None:
    """(the folded Attention, the chains' nodes it replaces, those staying for Shape readers)."""
    attrs = node.attrs
    if node.domain != FUSED_DOMAIN or node.op_type != "Attention" or attrs.get("kv_repeat"):
        return None
    if not (attrs.get("key_heads") and attrs.get("value_heads")) or any(node.inputs[7:11]):
        return None
    key = _chain(graph, uses, node.inputs[1], node)
    value = _chain(graph, uses, node.inputs[2], node)
    if key is None or value is None:
        return None
    inputs = list(node.inputs) + [""] * (11 - len(node.inputs))
    inputs[1], inputs[2] = key[0], value[0]
    inputs[7:11] = [key[1], key[2], value[1], value[2]]
    new_attrs = dict(attrs, kv_repeat=1, key_allowzero=key[3], value_allowzero=value[3])
    fused = Node("Attention", inputs, list(node.outputs), new_attrs, node.name, FUSED_DOMAIN, 1)
    return fused, key[4][key[5] :] + value[4][value[5] :], key[4][: key[5]] + value[4][: value[5]]


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    for node in list(graph.nodes):
        if node.op_type != "Attention" or not sweep.fresh(node):
            continue
        m = _match(graph, sweep.uses, node)
        if m is None or not sweep.fresh(*m[1], *m[2]):
            continue
        fused, dead, kept = m
        sweep.replace(node, fused)
        sweep.remove(*dead)
        sweep.touch(*kept)
    return sweep.finish()
