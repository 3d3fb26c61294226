"""A graph compiled for one provider: bound kernels plus an execution plan, ready to run.

Subgraphs (the bodies of If / Loop / Scan) compile to the same thing; their kernels receive a
:class:`Subgraph` in place of the GraphProto attribute and call ``run`` on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..ir.graph import Graph, Node, free_names
from ..planner.build import build_plan
from ..planner.plan import ExecutionPlan
from ..providers.base import Provider
from .binding import bind_node
from .executor import current_terminate, execute
from .placement import place, run_scope, to_provider


class CompiledGraph:
    def __init__(
        self,
        graph: Graph,
        provider: Provider,
        session_facts: Any = None,
        outer: Sequence[str] = (),
        fetch: Sequence[str] | None = None,
    ) -> None:
        self.graph = graph
        self.provider = provider
        self.session_facts = session_facts
        # Each node runs on its own provider (CPU fallback, with copies, on a device session).
        self.placement = place(graph, provider, outer)
        self._node_provider = {id(n): p for n, p in zip(graph.nodes, self.placement.providers)}
        self.bound = [
            bind_node(n, graph, p, self._compile_subgraph, session_facts)
            for n, p in zip(graph.nodes, self.placement.providers)
        ]
        self.constants = {
            name: self.placement.constant_provider(name).from_host(_read_only(arr))
            for name, arr in graph.initializers.items()
        }
        self.outer = tuple(outer)
        self._mixed: bool | None = None
        self.plan: ExecutionPlan = self.plan_for(graph.outputs if fetch is None else fetch)

    def plan_for(self, fetch: Sequence[str]) -> ExecutionPlan:
        """A plan returning ``fetch`` (any value names); releases everything else early."""
        return build_plan(self.graph, self.bound, list(fetch), self.constants, self.outer)

    def _compile_subgraph(self, graph: Graph, node: Node, attr: str) -> Subgraph:
        provider = self._node_provider.get(id(node), self.provider)
        return Subgraph(graph, provider, self.session_facts, f"{node.describe()} attribute '{attr}'")

    def run(
        self,
        feeds: dict[str, Any],
        plan: ExecutionPlan | None = None,
        outer: dict[str, Any] | None = None,
        terminate: Callable[[], bool] | None = None,
        observer: Any = None,
    ) -> list[Any]:
        plan = plan or self.plan
        by_id = {plan.feed_ids[n]: v for n, v in feeds.items()}
        if outer:
            for n, i in plan.outer_ids.items():
                by_id[i] = outer[n]
        if self._mixed is None:  # computed once: placement never changes after compiling
            self._mixed = self.placement.mixed
        if self.provider.device_type == "cpu" and not self._mixed:
            return execute(plan, by_id, terminate=terminate, observer=observer)
        with run_scope(self.provider):  # a device provider's device and stream
            out = execute(plan, by_id, terminate=terminate, observer=observer)
            if self._mixed:  # a fetched intermediate value may have been made on the CPU
                out = [to_provider(v, self.provider) for v in out]
        return out


class Subgraph:
    """A compiled subgraph: ``run(inputs, outer)`` with positional inputs and outer-scope values."""

    def __init__(self, graph: Graph, provider: Provider, session_facts: Any, where: str) -> None:
        self.graph = graph
        self.where = where
        self.input_names = list(graph.inputs)
        self.output_names = list(graph.outputs)
        self.outer_names = sorted(free_names(graph))
        self.compiled = CompiledGraph(graph, provider, session_facts, outer=self.outer_names)
        self._input_ids = [self.compiled.plan.feed_ids[n] for n in self.input_names]
        self._outer_ids = [self.compiled.plan.outer_ids[n] for n in self.outer_names]

    @property
    def num_inputs(self) -> int:
        return len(self.input_names)

    @property
    def num_outputs(self) -> int:
        return len(self.output_names)

    def run(self, inputs: Sequence[Any], outer: dict[str, Any]) -> list[Any]:
        if len(inputs) != len(self._input_ids):
            raise ValueError(f"{self.where}: the subgraph takes {len(self._input_ids)} inputs, got {len(inputs)}")
        feeds = dict(zip(self._input_ids, inputs))
        for name, i in zip(self.outer_names, self._outer_ids):
            feeds[i] = outer[name]
        # RunOptions.terminate reaches the body's steps too: a long Loop or Scan stops within
        # one iteration, not after its last.
        return execute(self.compiled.plan, feeds, terminate=current_terminate())

    def __repr__(self) -> str:
        return f"<Subgraph {self.graph.name!r} inputs={self.input_names} outputs={self.output_names}>"


def _read_only(arr: Any) -> Any:
    """Constants are shared by every run and thread: no kernel may write into them, and
    kernels may cache what they derive from them (Winograd weights) knowing they never change."""
    if isinstance(arr, np.ndarray) and arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr
