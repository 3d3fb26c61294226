"""Remove nodes that compute nothing: Identity, inference-mode Dropout, Cast to the same type,
Reshape/Flatten/Squeeze/Unsqueeze to the shape the value already has... (the latter when shapes
are static)."""

from __future__ import annotations

from ...ir.graph import Graph, Node
from ..rewrite import Uses, constant, remove_nodes, rename_all


def _passthrough(graph: Graph, node: Node, uses: Uses) -> str | None:
    """The input a node merely forwards, or None."""
    if node.domain:
        return None
    op = node.op_type
    if op == "Identity" and len(node.inputs) == 1:
        return node.inputs[0]
    if op == "Dropout":
        mask = node.outputs[1] if len(node.outputs) > 1 else ""
        if mask and (uses.readers_of(mask) or mask in uses.graph_outputs):
            return None  # the mask is used
        if len(node.inputs) >= 3 and node.inputs[2]:
            training = constant(graph, node.inputs[2])
            if training is None or bool(training.reshape(-1)[0]):
                return None
        return node.inputs[0]
    if op == "Cast":
        src = graph.elem_type(node.inputs[0])
        if src is not None and src == node.attrs.get("to"):
            return node.inputs[0]
    return None


def run(graph: Graph) -> bool:
    uses = Uses(graph)
    dead: list[Node] = []
    mapping: dict[str, str] = {}
    for node in graph.nodes:
        src = _passthrough(graph, node, uses)
        if src is None:
            continue
        out = node.outputs[0]
        if out in uses.graph_outputs:
            continue  # a graph output keeps its name: the node stays
        mapping[out] = src
        dead.append(node)
    if not dead:
        return False
    # Chains (Identity of an Identity...) resolve to their first source; one rename pass.
    for out in list(mapping):
        src = mapping[out]
        seen = {out}
        while src in mapping and src not in seen:
            seen.add(src)
            src = mapping[src]
        mapping[out] = src
    remove_nodes(graph, dead)
    rename_all(graph, mapping)
    return True
