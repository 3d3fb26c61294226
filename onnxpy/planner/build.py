"""build_plan: a pure function from (graph, bound kernels, what to fetch) to an ExecutionPlan."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.errors import InvalidGraph
from ..ir.graph import Graph
from .plan import ABSENT, DISCARD, ExecutionPlan, Step


@dataclass(frozen=True)
class BoundNode:
    """A node with its kernel bound: what the planner needs to know about it."""

    fn: Callable[..., Any]
    op_type: str
    domain: str
    name: str
    describe: str
    inputs: tuple[str, ...]  # explicit inputs ("" when omitted), then implicit outer-scope ones
    outputs: tuple[str, ...]
    single_output: bool
    # {input position: output position} the kernel can write in place (from its registration)
    may_inplace: tuple[tuple[int, int], ...] = ()
    accepts_out: bool = False
    # the kernel checks an ``out`` buffer itself (see OpDef.out_checked)
    out_checked: bool = False


def build_plan(
    graph: Graph,
    bound: Sequence[BoundNode],
    fetch: Sequence[str],
    constants: dict[str, Any],
    outer: Sequence[str] = (),
    feeds: Sequence[str] | None = None,
) -> ExecutionPlan:
    """Assign value ids, order steps as given, and compute when each value can be dropped.

    ``bound`` must be in topological order (one entry per node of ``graph``). ``fetch`` names
    the values returned at the end; they are never released early. ``constants`` are the
    initializers (already converted for the provider). ``outer`` names values a subgraph reads
    from enclosing scopes.
    """
    names = ["<absent>", "<discarded>"]
    ids: dict[str, int] = {}

    def vid(name: str) -> int:
        if not name:
            return ABSENT
        i = ids.get(name)
        if i is None:
            i = ids[name] = len(names)
            names.append(name)
        return i

    feed_names = list(graph.inputs) if feeds is None else list(feeds)
    feed_ids = {n: vid(n) for n in feed_names}
    outer_ids = {n: vid(n) for n in outer}
    const_ids = {vid(n): v for n, v in constants.items()}
    fetch_ids = [vid(n) for n in fetch]
    keep = set(fetch_ids) | set(const_ids)

    step_inputs = [tuple(vid(n) for n in b.inputs) for b in bound]
    step_outputs = [tuple(vid(n) if n else DISCARD for n in b.outputs) for b in bound]

    # Every input must exist before its reader runs (a broken order would read None).
    ready = set(feed_ids.values()) | set(outer_ids.values()) | set(const_ids) | {ABSENT}
    for b, ins, outs in zip(bound, step_inputs, step_outputs):
        missing = [names[i] for i in ins if i not in ready]
        if missing:
            raise InvalidGraph(f"{b.describe} reads {missing} before any step produces them (graph out of order)")
        ready.update(outs)

    # Last step reading each value; a value nobody reads dies at the step that makes it.
    last_use: dict[int, int] = {}
    for s, (ins, outs) in enumerate(zip(step_inputs, step_outputs)):
        for o in outs:
            last_use.setdefault(o, s)
        for i in ins:
            last_use[i] = s
    for i in feed_ids.values():
        last_use.setdefault(i, -1)
    release: list[list[int]] = [[] for _ in bound]
    for v, s in last_use.items():
        if v in keep or v in (ABSENT, DISCARD) or s < 0:
            continue
        release[s].append(v)

    # In-place candidates: an input the kernel may overwrite with its output, when this step is
    # that value's last reader and the value is the graph's own (not a feed, an outer value, a
    # constant or a fetched value). Whether the buffer can really be written (it owns its memory,
    # nothing else views it, shapes and dtypes match) is checked at run time by the executor.
    protected = keep | set(feed_ids.values()) | set(outer_ids.values()) | {ABSENT, DISCARD}
    inplace = [-1] * len(bound)
    for s, b in enumerate(bound):
        if not b.accepts_out or not b.single_output:
            continue
        ins = step_inputs[s]
        for pos, out_pos in b.may_inplace:
            if out_pos != 0 or pos >= len(ins):
                continue
            v = ins[pos]
            if v not in protected and last_use.get(v) == s and ins.count(v) == 1:
                inplace[s] = pos
                break

    steps = [
        Step(
            index=s,
            op_type=b.op_type,
            domain=b.domain,
            node_name=b.name,
            describe=b.describe,
            fn=b.fn,
            inputs=step_inputs[s],
            outputs=step_outputs[s],
            release=tuple(sorted(release[s])),
            single_output=b.single_output,
            inplace_input=inplace[s],
            inplace_any_shape=b.out_checked,
        )
        for s, b in enumerate(bound)
    ]
    template: list[Any] = [None] * len(names)
    for i, v in const_ids.items():
        template[i] = v
    return ExecutionPlan(
        value_names=names,
        feed_ids=feed_ids,
        outer_ids=outer_ids,
        constants=const_ids,
        fetch_ids=fetch_ids,
        steps=steps,
        template=template,
    )
