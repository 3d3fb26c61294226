"""ExecutionPlan: what to run, in which order, on which value slots. Data only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: value id that always holds None: an omitted optional input reads it
ABSENT = 0
#: value id an omitted optional output is written to and never read
DISCARD = 1


@dataclass(frozen=True)
class Step:
    index: int
    op_type: str
    domain: str
    node_name: str
    #: how errors name the node, e.g. "node 'conv1' (Conv)"
    describe: str
    #: the bound kernel: ``fn(*inputs)``, its array namespace and attributes already applied
    fn: Callable[..., Any]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    #: values whose last reader is this step: dropped right after it so memory is freed early
    release: tuple[int, ...]
    #: the kernel returns its only output directly rather than a tuple
    single_output: bool
    #: position (into ``inputs``) of an input whose buffer the output may be written into, or -1
    inplace_input: int = -1
    #: the kernel checks that buffer itself, so the other inputs need not broadcast to it
    inplace_any_shape: bool = False


@dataclass
class ExecutionPlan:
    #: id -> value name (ids 0 and 1 are ABSENT and DISCARD)
    value_names: list[str]
    #: graph inputs (and overridable initializers) the caller may feed, name -> id
    feed_ids: dict[str, int]
    #: outer-scope values a subgraph reads, name -> id (empty for the main graph)
    outer_ids: dict[str, int]
    #: id -> constant value (initializers), already on the provider's device
    constants: dict[int, Any]
    #: ids fetched at the end, in order
    fetch_ids: list[int]
    steps: list[Step]
    #: the value list every run starts from: constants in place, None elsewhere
    template: list[Any] = field(default_factory=list)

    @property
    def num_values(self) -> int:
        return len(self.value_names)

    def id_of(self, name: str) -> int:
        return self.value_names.index(name)

    def released_after(self, step_index: int) -> list[str]:
        return [self.value_names[i] for i in self.steps[step_index].release]
