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
"""

from __future__ import annotations

from ...ir.graph import Graph, Node
from ..rewrite import FUSED_DOMAIN, Sweep, Uses
from ..shape_arith import const_ints


def _plain(node: Node | None, op: str) -> bool:
    return node is not None and not node.domain and node.op_type == op


def _chain(graph: Graph, uses: Uses, name: str, reader: Node) -> tuple[str, str, str, int, list[Node]] | None:
    """(x, expand shape, reshape shape, allowzero, nodes) where ``name``, read by ``reader``
    alone, is Reshape(Expand(Unsqueeze(x, axes=[2]), shape), shape), each read once."""
    reshape = uses.producer.get(name)
    if not _plain(reshape, "Reshape") or uses.only_reader(name) is not reader:
        return None
    assert reshape is not None
    expand = uses.producer.get(reshape.inputs[0])
    if not _plain(expand, "Expand") or uses.only_reader(reshape.inputs[0]) is not reshape:
        return None
    assert expand is not None
    unsqueeze = uses.producer.get(expand.inputs[0])
    if not _plain(unsqueeze, "Unsqueeze") or uses.only_reader(expand.inputs[0]) is not expand:
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
    return x, expand.inputs[1], reshape.inputs[1], allowzero, [unsqueeze, expand, reshape]


def _match(graph: Graph, uses: Uses, node: Node) -> tuple[Node, list[Node]] | None:
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
    return fused, key[4] + value[4]


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    for node in list(graph.nodes):
        if node.op_type != "Attention" or not sweep.fresh(node):
            continue
        m = _match(graph, sweep.uses, node)
        if m is None or not sweep.fresh(*m[1]):
            continue
        fused, dead = m
        sweep.replace(node, fused)
        sweep.remove(*dead)
    return sweep.finish()
