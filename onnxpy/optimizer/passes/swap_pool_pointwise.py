"""Swap an AveragePool and the 1x1 convolution next to it, to pool fewer channels or convolve
fewer positions.

An average pool takes, at each output position, a weighted sum of input positions with weights
that depend on the position alone, never on the channel; a 1x1 convolution (stride 1, no
padding) mixes the channels at each position alone. The two commute:
Pool(Conv(x)) = Conv(Pool(x)), the bias included when every window's weights sum to 1 (no
padded position counted: ``count_include_pad`` 0, or no padding and ``ceil_mode`` 0).

- Conv -> AveragePool (DenseNet's transitions: a 1x1 convolution, then a 2x2/2 pool) becomes
  AveragePool -> Conv: the convolution runs on a quarter of the positions (DenseNet-121's three
  transitions: 1107 -> 718, 886 -> 456, 834 -> 433 us measured alone).
- AveragePool -> Conv [-> Relu] (Inception's pool projections: a 3x3/1 pool over all of a
  block's channels, then a 1x1 convolution down to few) becomes Conv -> AveragePool [-> Relu]:
  the pool runs on the convolution's fewer output channels (576 -> 128 at 14x14: 413 -> 278 us).
  A fused Relu moves after the pool as its own node. Where the pool counts padded positions
  (``count_include_pad`` 1 with pads: torchvision's Inception v3) a bias would be scaled at the
  borders, so it stays behind: Conv without bias -> AveragePool -> Add(bias) [-> Relu], the Add
  a pass over the few pooled channels (Inception v3's nine pool projections, 192-2048 channels
  pooled before, 32-192 after).

The order is chosen by a cost estimate (``_cost``); both rewrites use it, so they never undo
each other. Float32 only; every dimension but the batch must be known.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import helper

from ...ir.graph import Graph, Node
from ..rewrite import Sweep, constant, is_conv
from .fuse_activation import activation_of

# GEMM multiply-adds per pool tap-element in the same time: 1x1 convolutions ran at about
# 130 multiply-adds per ns, a separable average pool at about 7 tap-elements per ns.
MACS_PER_POOL_TAP = 16


def _pool_attrs(pool: Node) -> dict[str, Any] | None:
    """The average pool's kernel, strides and pads, or None when the swap does not apply."""
    if pool.domain or pool.op_type != "AveragePool" or len([o for o in pool.outputs if o]) != 1:
        return None
    if pool.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    kernel = [int(k) for k in pool.attrs.get("kernel_shape", []) or []]
    if not kernel:
        return None
    nd = len(kernel)
    pads = [int(p) for p in pool.attrs.get("pads", []) or []] or [0] * (2 * nd)
    if pool.attrs.get("auto_pad", "NOTSET") == "VALID":
        pads = [0] * (2 * nd)
    return {"kernel": kernel, "pads": pads}


def _weights_sum_to_one(pool: Node, pads: list[int]) -> bool:
    """Every window's weights sum to 1: no padded (or past-the-end) position is counted."""
    if int(pool.attrs.get("count_include_pad", 0)) == 0:
        return True
    return not any(pads) and int(pool.attrs.get("ceil_mode", 0)) == 0


def _pointwise(graph: Graph, conv: Node, rank: int) -> list[int] | None:
    """The 1x1 convolution's weight shape (M, C/group, 1, ...), or None if it is not one that
    commutes with a pool: stride 1, no padding, no residual input, no channel shuffle."""
    if not is_conv(conv):
        return None
    w = graph.shape(conv.inputs[1])
    if w is None or len(w) != rank or not all(isinstance(d, int) for d in w) or any(d != 1 for d in w[2:]):
        return None
    if any(int(s) != 1 for s in conv.attrs.get("strides", []) or []):
        return None
    if any(int(p) for p in conv.attrs.get("pads", []) or []):
        return None
    if conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    if (len(conv.inputs) > 3 and conv.inputs[3]) or conv.attrs.get("shuffle_groups"):
        return None
    return w  # type: ignore[return-value]


def _has_bias(conv: Node) -> bool:
    return len(conv.inputs) > 2 and bool(conv.inputs[2])


def _static(shape: list[Any] | None, rank: int) -> list[int] | None:
    """``shape`` with its batch dimension set to 1, or None unless every other dimension is a
    known int. Both orders' costs grow alike with the batch, so a free batch is no obstacle."""
    if shape is None or len(shape) != rank or not all(isinstance(d, int) for d in shape[1:]):
        return None
    return [1, *shape[1:]]


def _batch(graph: Graph, name: str) -> Any:
    """The batch dimension of ``name``'s static shape as declared (int, name or None)."""
    shape = graph.shape(name)
    return shape[0] if shape else None


def _cost(conv_w: list[int], conv_positions: int, pool_channels: int, pool_positions: int, kernel: list[int]) -> int:
    """Estimated time of one order for one image, in pool tap-elements: the convolution's
    multiply-adds over MACS_PER_POOL_TAP, plus the separable pool's taps (one pass per kernel
    axis) over its input of ``pool_positions`` positions and ``pool_channels`` channels."""
    macs = conv_w[0] * conv_w[1] * conv_positions
    return macs // MACS_PER_POOL_TAP + pool_channels * pool_positions * sum(kernel)


def _typed(graph: Graph, name: str, shape: list[Any]) -> None:
    graph.types[name] = helper.make_tensor_type_proto(1, shape)


def _without_activation(conv: Node, new_input: str, new_output: str) -> Node:
    attrs = {k: v for k, v in conv.attrs.items() if k not in ("activation", "activation_params")}
    return Node(conv.op_type, [new_input, *conv.inputs[1:]], [new_output], attrs, conv.name, conv.domain, conv.opset)


def _settled(graph: Graph, sweep: Sweep, conv: Node) -> bool:
    """No fold into the convolution is still pending: its only reader is not a
    BatchNormalization, an activation or a per-channel Mul/Add that a later round fuses in."""
    after = sweep.uses.only_reader(conv.outputs[0])
    if after is None:
        return True
    if after.op_type in ("BatchNormalization", "Mul", "Add") and not after.domain:
        return False
    return activation_of(graph, after) is None


def run(graph: Graph) -> bool:
    sweep = Sweep(graph)
    uses = sweep.uses
    for node in list(graph.nodes):
        if not sweep.fresh(node):
            continue
        if node.op_type == "AveragePool" and not node.domain:
            _pool_then_conv(graph, sweep, node)
        elif is_conv(node):
            _conv_then_pool(graph, sweep, node, uses.only_reader(node.outputs[0]))
    return sweep.finish()


def _costs(
    graph: Graph, conv: Node, pool: Node, p: dict[str, Any], x: str, mid: str, pooled: str, detach: bool = False
) -> tuple[list[int], list[int], list[int], int, int, np.ndarray | None] | None:
    """For the chain from ``x`` through the intermediate ``mid`` to a value pooled like
    ``pooled``: (W's shape, x's and the pool output's shapes with batch 1, the cost with the
    convolution first, the cost with the pool first, the bias to add after the pool), or None
    when the two cannot swap. A bias that the pool's weights would not keep (padding counted)
    stops the swap, or with ``detach`` (convolution first) is returned to add after the pool,
    a constant (M,) bias only; otherwise that entry is None."""
    if graph.elem_type(x) != 1 or graph.elem_type(mid) != 1:
        return None
    rank = len(p["kernel"]) + 2
    w = _pointwise(graph, conv, rank)
    xs, ps = _static(graph.shape(x), rank), _static(graph.shape(pooled), rank)
    if w is None or xs is None or ps is None:
        return None
    bias = None
    if _has_bias(conv) and not _weights_sum_to_one(pool, p["pads"]):
        bias = constant(graph, conv.inputs[2]) if detach else None
        if bias is None or bias.shape != (w[0],) or bias.dtype != np.float32:
            return None
    if 0 in xs[2:] or 0 in ps[2:]:
        return None  # an empty map: nothing to save, and a convolution of an empty input fails
    positions = math.prod(xs[2:])
    pooled_positions = math.prod(ps[2:])
    conv_first = _cost(w, positions, w[0], positions, p["kernel"])
    if bias is not None:
        conv_first += w[0] * pooled_positions  # the pass adding the bias
    pool_first = _cost(w, pooled_positions, xs[1], positions, p["kernel"])
    return w, xs, ps, conv_first, pool_first, bias


def _conv_then_pool(graph: Graph, sweep: Sweep, conv: Node, pool: Node | None) -> None:
    """Conv -> AveragePool becomes AveragePool -> Conv where that costs less."""
    if pool is None or not sweep.fresh(pool) or pool.inputs[0] != conv.outputs[0]:
        return
    p = _pool_attrs(pool)
    if p is None or conv.attrs.get("activation"):
        return
    x, z = conv.inputs[0], pool.outputs[0]
    plan = _costs(graph, conv, pool, p, x, conv.outputs[0], z)
    if plan is None or plan[4] >= plan[3]:
        return
    _, xs, zs, _, _, _ = plan
    pooled = sweep.new_name(f"{x}_pooled")
    _typed(graph, pooled, [_batch(graph, x), xs[1], *zs[2:]])
    sweep.replace(pool, Node(pool.op_type, [x], [pooled], dict(pool.attrs), pool.name, pool.domain, pool.opset))
    sweep.replace(conv, _without_activation(conv, pooled, z))


def _pool_then_conv(graph: Graph, sweep: Sweep, pool: Node) -> None:
    """AveragePool -> Conv [Relu] becomes Conv -> AveragePool [-> Relu] where that costs less."""
    p = _pool_attrs(pool)
    conv = sweep.uses.only_reader(pool.outputs[0])
    if p is None or conv is None or not sweep.fresh(conv) or conv.inputs[0] != pool.outputs[0]:
        return
    activation = conv.attrs.get("activation", "")
    if activation not in ("", "Relu") or not _settled(graph, sweep, conv):
        return
    x, y, z = pool.inputs[0], pool.outputs[0], conv.outputs[0]
    plan = _costs(graph, conv, pool, p, x, y, y, detach=True)
    if plan is None or plan[3] >= plan[4]:
        return
    w, xs, ys, _, _, bias = plan
    mixed = sweep.new_name(f"{z}_before_pool")
    _typed(graph, mixed, [_batch(graph, x), w[0], *xs[2:]])
    new_conv = _without_activation(conv, x, mixed)
    if bias is not None:
        # Conv without its bias -> AveragePool -> Add(bias, per channel) [-> Relu].
        new_conv = Node(new_conv.op_type, new_conv.inputs[:2], new_conv.outputs, new_conv.attrs, new_conv.name,
                        new_conv.domain, new_conv.opset)  # fmt: skip
        sweep.replace(conv, new_conv)
        unbiased = sweep.new_name(f"{z}_pooled")
        _typed(graph, unbiased, [_batch(graph, x), w[0], *ys[2:]])
        sweep.replace(
            pool, Node(pool.op_type, [mixed], [unbiased], dict(pool.attrs), pool.name, pool.domain, pool.opset)
        )
        shift = sweep.new_name(f"{conv.inputs[2]}_per_channel")
        graph.initializers[shift] = bias.reshape(w[0], *([1] * (len(xs) - 2)))
        biased = sweep.new_name(f"{z}_before_relu") if activation else z
        if activation:
            _typed(graph, biased, [_batch(graph, x), w[0], *ys[2:]])
        add_name = f"{pool.name or 'avgpool'}_bias"
        sweep.add(Node("Add", [unbiased, shift], [biased], {}, add_name, "", graph.opsets.get("", 13)))
        if activation:
            sweep.add(Node("Relu", [biased], [z], {}, f"{pool.name or 'avgpool'}_relu", "", graph.opsets.get("", 13)))
        return
    sweep.replace(conv, new_conv)
    if activation:
        pooled = sweep.new_name(f"{z}_before_relu")
        _typed(graph, pooled, [_batch(graph, x), w[0], *ys[2:]])
        sweep.replace(pool, Node(pool.op_type, [mixed], [pooled], dict(pool.attrs), pool.name, pool.domain, pool.opset))
        sweep.add(Node("Relu", [pooled], [z], {}, f"{pool.name or 'avgpool'}_relu", "", graph.opsets.get("", 13)))
    else:
        sweep.replace(pool, Node(pool.op_type, [mixed], [z], dict(pool.attrs), pool.name, pool.domain, pool.opset))
