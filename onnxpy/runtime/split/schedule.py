"""A split schedule: for one set of input shapes, which steps run in bands, where each value
they share lives in the arena, and where the two processes must meet.

Built once per input signature from a traced run of the plan (the shapes and layouts every
step saw) and sent to the helper as plain data, so both processes walk the same actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...planner.plan import ABSENT, DISCARD, ExecutionPlan
from .geometry import CHANNELS_BELOW, FUSED, RowRule, Rule, channel_rule, halves, read_rows, row_rule

#: byte alignment of each value in the arena (a cache line)
ALIGN = 64


@dataclass(frozen=True)
class Traced:
    """What one value was in the traced run."""

    shape: tuple[int, ...]
    dtype: str
    #: an NCHW view of channels-last memory: its slot keeps that layout for its readers
    channels_last: bool


@dataclass(frozen=True)
class Slot:
    offset: int
    shape: tuple[int, ...]
    dtype: str
    channels_last: bool

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Action:
    """What happens at one plan step."""

    #: the step's band rule (rows or channels); None: this process runs it whole and the helper
    #: skips it
    band: Rule | None
    #: both processes meet before the step (one reads rows the other wrote since they last met)
    barrier: bool
    #: outputs of a whole step that band steps read later: copied into their slots
    publish: tuple[int, ...] = ()
    #: input position whose slot the output shares (the input dies here): the band's kernel
    #: writes into that input's band (``out=``), as the plain executor's in-place steps do
    inplace: int = -1


@dataclass(frozen=True)
class Schedule:
    slots: dict[int, Slot]
    #: arena bytes the slots need
    size: int
    #: fed values band steps read: copied into their slots when a run starts
    feeds: tuple[int, ...]
    actions: tuple[Action, ...]
    #: the helper's last writes are read only after the last step: meet once more
    final_barrier: bool

    @property
    def banded(self) -> int:
        return sum(1 for a in self.actions if a.band is not None)


def build_schedule(
    plan: ExecutionPlan, values: dict[int, Traced], steps: dict[int, tuple[list[Any], list[Any]]], fed: set[int]
) -> Schedule | None:
    """The schedule for a run like the traced one: ``values`` (value id -> what it was),
    ``steps`` (step index -> input and output shapes), ``fed`` (ids the caller fed). None when
    no step can run in bands."""
    constant = {i for i in plan.constants if i not in fed}
    rules: dict[int, Rule] = {}
    for st in plan.steps:
        if st.index not in steps or any(o in (ABSENT, DISCARD) for o in st.outputs):
            continue
        if any(i not in constant and i != ABSENT and i not in values for i in st.inputs):
            continue  # an input that is not an array (a sequence, an optional left empty)
        ins, outs = steps[st.index]
        op, const = (st.domain, st.op_type), [i in constant for i in st.inputs]
        small = bool(outs) and outs[0] is not None and len(outs[0]) == 4 and outs[0][2] < CHANNELS_BELOW
        rule: Rule | None
        if small:
            rule = channel_rule(op, st.fn, ins, outs, const) or row_rule(op, st.fn, ins, outs, const)
        else:
            rule = row_rule(op, st.fn, ins, outs, const) or channel_rule(op, st.fn, ins, outs, const)
        if rule is not None:
            rules[st.index] = rule
    if not rules:
        return None

    shared: set[int] = set()
    for st in plan.steps:
        if st.index in rules:
            shared.update(i for i in st.inputs if i != ABSENT and i not in constant)
            shared.update(st.outputs)
    aliases = _in_place(plan, rules, values, shared, fed)
    slots = {}
    offset = 0
    for vid in sorted(shared):
        if vid in aliases:
            continue
        t = values[vid]
        slot = Slot(offset, t.shape, t.dtype, t.channels_last)
        slots[vid] = slot
        offset += -(-slot.nbytes // ALIGN) * ALIGN
    for out in sorted(aliases):
        root = out
        while root in aliases:  # a chain of in-place steps shares one slot
            root = aliases[root][1]
        slots[out] = slots[root]

    # Walk the steps as both processes will, tracking the rows each wrote (and, for values
    # later written in place, read) since they last met.
    written: dict[int, list[tuple[int, int, int]]] = {}  # value id -> [(process, r0, r1)]
    read: dict[int, list[tuple[int, int, int]]] = {}
    overwritten = {source for _, source in aliases.values()}

    def rows_of(vid: int) -> int:
        shape = slots[vid].shape
        return shape[-2] if len(shape) >= 2 else 1

    feeds = tuple(sorted(v for v in fed if v in shared))
    for vid in feeds:
        written[vid] = [(0, 0, rows_of(vid))]
    actions = []
    for st in plan.steps:
        rule = rules.get(st.index)
        alias = aliases.get(st.outputs[0], (-1, -1))
        # what each process reads of the shared inputs: (process, value id, rows or None: all)
        reads: list[tuple[int, int, tuple[int, int] | None]] = []
        if isinstance(rule, RowRule):
            for proc, (o0, o1) in enumerate(halves(slots[st.outputs[0]].shape[-2])):
                for pos, vid in enumerate(st.inputs):
                    if vid in slots:
                        reads.append((proc, vid, read_rows(rule, pos, o0, o1, rows_of(vid))))
        else:  # a channel band reads every input whole in both processes; a whole step in this one
            readers = (0, 1) if rule is not None else (0,)
            blind = _shape_only(st) if rule is None else ()
            reads = [
                (proc, vid, None)
                for pos, vid in enumerate(st.inputs)
                if vid in slots and pos not in blind
                for proc in readers
            ]
        meet = any(_clashes(written.get(vid, ()), proc, rows) for proc, vid, rows in reads)
        if alias[1] >= 0:
            # each process overwrites its rows of that input: the other must be done reading them
            for proc, band in enumerate(halves(slots[st.outputs[0]].shape[-2])):
                meet = meet or _clashes(read.get(alias[1], ()), proc, band)
        if meet:
            written.clear()
            read.clear()
        for proc, vid, rows in reads:
            if vid in overwritten:
                read.setdefault(vid, []).append((proc, *(rows or (0, rows_of(vid)))))
        publish: tuple[int, ...] = ()
        if isinstance(rule, RowRule):
            mine, theirs = halves(slots[st.outputs[0]].shape[-2])
            for vid in st.outputs:
                written[vid] = [(0, *mine), (1, *theirs)]
        elif rule is not None:  # each process wrote some channels of every row
            for vid in st.outputs:
                written[vid] = [(0, 0, rows_of(vid)), (1, 0, rows_of(vid))]
        else:
            publish = tuple(v for v in st.outputs if v in slots)
            for vid in publish:
                written[vid] = [(0, 0, rows_of(vid))]
        actions.append(Action(rule, meet, publish, alias[0]))
    final = any(p == 1 for w in written.values() for p, _, _ in w)
    return Schedule(slots, offset, feeds, tuple(actions), final)


def _in_place(
    plan: ExecutionPlan, rules: dict[int, Rule], values: dict[int, Traced], shared: set[int], fed: set[int]
) -> dict[int, tuple[int, int]]:
    """Band steps whose output can share the slot of the input the plain executor would write
    in place (an input read at the output's rows, that dies at this step and has the output's
    shape, dtype and layout): output id -> (input position, input id)."""
    aliases: dict[int, tuple[int, int]] = {}
    taken: set[int] = set()
    # A step run whole may return a view of its input (Reshape, Flatten): a value that outlives
    # its source's id. The slot of a value such a step reads is never written over.
    read_whole = {i for st in plan.steps if st.index not in rules for i in st.inputs}
    for st in plan.steps:
        rule = rules.get(st.index)
        pos = st.inplace_input
        if not isinstance(rule, RowRule) or pos < 0 or pos >= len(st.inputs) or len(st.outputs) != 1:
            continue
        source, out = st.inputs[pos], st.outputs[0]
        if (
            rule.reads[pos] != "rows"
            or source not in shared
            or source in fed
            or source in taken
            or source in read_whole
            or source not in st.release
            or st.inputs.count(source) != 1
            or values[source] != values[out]
        ):
            continue
        aliases[out] = (pos, source)
        taken.add(source)
    return aliases


def _shape_only(step: Any) -> tuple[int, ...]:
    """Input positions whose shape alone a step reads (no barrier for rows the other process
    is still writing): Shape's and Size's input, and a ShapeMemo's keyed inputs (its cache key
    and the sources of its shape computations, optimizer/passes/memoize_shapes.py)."""
    if step.domain == "" and step.op_type in ("Shape", "Size"):
        return (0,)
    if step.domain == FUSED and step.op_type == "ShapeMemo":
        return tuple(range(int((getattr(step.fn, "keywords", None) or {}).get("keyed", 0))))
    return ()


def _clashes(writes: Any, reader: int, rows: tuple[int, int] | None) -> bool:
    """Whether process ``reader`` reading ``rows`` (None: all) of a value could see rows the
    other process wrote since they last met."""
    for proc, r0, r1 in writes:
        if proc != reader and r1 > r0 and (rows is None or (rows[0] < r1 and r0 < rows[1])):
            return True
    return False


def slot_view(buf: Any, base: int, slot: Slot) -> np.ndarray:
    """The value's array in the arena ``buf`` (slots start at byte ``base``), in its layout."""
    dtype = np.dtype(slot.dtype)
    if slot.channels_last and len(slot.shape) == 4:
        n, c, h, w = slot.shape
        return np.ndarray((n, h, w, c), dtype, buf, base + slot.offset).transpose(0, 3, 1, 2)
    return np.ndarray(slot.shape, dtype, buf, base + slot.offset)
