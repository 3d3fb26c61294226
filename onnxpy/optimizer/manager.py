"""Maps GraphOptimizationLevel to lists of passes and runs each list to a fixpoint.

A pass is a function ``run(graph) -> bool`` (True when it changed the graph). Passes are
registered per level in PASSES_BY_LEVEL; each level also runs the levels below it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..ir.graph import Graph, topological_sort

Pass = Callable[[Graph], bool]

BASIC: list[Pass] = []
EXTENDED: list[Pass] = []
LAYOUT: list[Pass] = []

MAX_ROUNDS = 16


def passes_for_level(level: int) -> list[Pass]:
    passes: list[Pass] = []
    if level >= 1:
        passes += BASIC
    if level >= 2:
        passes += EXTENDED
    if level >= 3:
        passes += LAYOUT
    return passes


def optimize(graph: Graph, level: int) -> list[str]:
    """Run the passes of ``level`` on ``graph`` in place; return the names of passes that changed it."""
    passes = passes_for_level(int(level))
    debug = os.environ.get("ONNXPY_CHECK_PASSES") == "1"
    applied: list[str] = []
    for _ in range(MAX_ROUNDS):
        changed = False
        for p in passes:
            if p(graph):
                changed = True
                applied.append(p.__name__)
                if debug:
                    topological_sort(graph)
        if not changed:
            break
    return applied
