"""Maps GraphOptimizationLevel to lists of passes and runs each list to a fixpoint.

A pass is a function ``run(graph) -> bool`` (True when it changed the graph). Passes are
registered per level in PASSES_BY_LEVEL; each level also runs the levels below it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.graph import Graph, topological_sort
from .passes import (
    chain_concat,
    channels_last_output,
    common_subexpressions,
    constant_folding,
    eliminate,
    fold_batchnorm,
    fold_bias_forward,
    fold_layer_scale,
    fold_relu_floor,
    fold_repeat_kv,
    fold_shuffle,
    fuse_activation,
    fuse_attention,
    fuse_concat_conv,
    fuse_dynamic_matmul,
    fuse_fake_quant,
    fuse_flat_gemm,
    fuse_kv_append,
    fuse_patterns,
    fuse_pointwise_depthwise,
    fuse_rotary,
    half_in_float,
    memoize_shapes,
    merge_sibling_pointwise,
    pack_gated_mlp,
    pack_matmuls,
    relu_after_pool,
    shape_of_views,
    swap_pool_pointwise,
)

Pass = Callable[[Graph], bool]

# Like onnxruntime's levels: basic = semantics-preserving cleanups, extended = fusions into
# onnxpy's own fused kernels, layout = nothing yet.
BASIC: list[Pass] = [constant_folding.run, eliminate.run, common_subexpressions.run]
EXTENDED: list[Pass] = [
    fuse_fake_quant.run,
    fuse_dynamic_matmul.run,
    fuse_flat_gemm.run,
    fold_batchnorm.run,
    fold_layer_scale.run,
    fuse_activation.run,
    fold_shuffle.run,
    fold_relu_floor.run,
    fold_bias_forward.run,
    fuse_patterns.run,
    fuse_rotary.run,
    fuse_attention.run,
    fold_repeat_kv.run,
    fuse_kv_append.run,
    swap_pool_pointwise.run,
    relu_after_pool.run,
    fuse_pointwise_depthwise.run,
    pack_gated_mlp.run,
    pack_matmuls.run,
    fuse_concat_conv.run,
    chain_concat.run,
]
LAYOUT: list[Pass] = []
# Run once at the end (extended level, host sessions): they wrap what the others left.
FINAL_HOST: list[Pass] = [
    merge_sibling_pointwise.run,
    shape_of_views.run,
    memoize_shapes.run,
    channels_last_output.run,
]

# Run once first (any level but disabled, host sessions): float16/bfloat16 computed in float32,
# as onnxruntime's CPU provider computes them, so the other passes see float32 graphs.
FIRST_HOST: list[Pass] = [half_in_float.run]

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


def pass_name(p: Pass) -> str:
    """A pass's name: its module's (``relu_after_pool``), as logs and disabled_optimizers use it."""
    return p.__module__.rsplit(".", 1)[-1]


def pass_names() -> list[str]:
    """Every pass's name, in the order the levels run them."""
    names: list[str] = []
    for p in [*FIRST_HOST, *BASIC, *EXTENDED, *LAYOUT, *FINAL_HOST]:
        if pass_name(p) not in names:
            names.append(pass_name(p))
    return names


def optimize(graph: Graph, level: int, host_only: bool = False, disabled: frozenset[str] = frozenset()) -> list[str]:
    """Run the passes of ``level`` on ``graph`` in place; return the names of passes that changed
    it. ``host_only``: the session runs every node on the CPU (enables FINAL_HOST).
    ``disabled``: names of passes not to run (InferenceSession's disabled_optimizers)."""
    passes = [p for p in passes_for_level(int(level)) if pass_name(p) not in disabled]
    applied: list[str] = []
    if int(level) >= 1 and host_only:
        for p in FIRST_HOST:
            if pass_name(p) in disabled:
                continue
            if p(graph):
                applied.append(pass_name(p))
                topological_sort(graph)
    for _ in range(MAX_ROUNDS):
        changed = False
        for p in passes:
            if p(graph):
                changed = True
                applied.append(pass_name(p))
                # A fusion may move work to a node placed before one of its new inputs'
                # producers; re-sorting restores order and re-checks the graph.
                topological_sort(graph)
        if not changed:
            break
    if int(level) >= 2 and host_only:
        for p in FINAL_HOST:
            if pass_name(p) in disabled:
                continue
            if p(graph):
                applied.append(pass_name(p))
                topological_sort(graph)
    return applied
