"""optimizer/passes/fold_shuffle.py and conv_nd(shuffle_groups=): ShuffleNet's channel shuffle
after a convolution folds into the convolution, with the unfused graph's (and onnxruntime's)
numbers, and only where the Reshape/Transpose/Reshape really is a channel shuffle."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxpy.ops.conv import conv_nd
from tests.helpers import check_optimized, make_model, optimized_op_counts, vinfo

F = TensorProto.FLOAT


def _shuffle_model(
    *,
    n: int = 1,
    c: int = 12,
    m: int = 12,
    group: int = 3,
    g: int = 3,
    kernel: int = 1,
    relu: bool = True,
    split: list[int] | None = None,
    merge: list[int] | None = None,
    perm: list[int] | None = None,
    residual: bool = False,
    fetch_split: bool = False,
) -> onnx.ModelProto:
    h = w = 5
    rng = np.random.default_rng(c * m + group + g + kernel)
    inits = {
        "w": rng.standard_normal((m, c // group, kernel, kernel)).astype(np.float32),
        "b": rng.standard_normal(m).astype(np.float32),
        "split": np.array(split or [0, g, -1, h, w], np.int64),
        "merge": np.array(merge or [n, -1, h, w], np.int64),
    }
    pads = [kernel // 2] * 4
    conv_in = ["x", "w", "b"]
    nodes = [helper.make_node("Conv", conv_in, ["y0"], group=group, pads=pads)]
    y = "y0"
    if residual:
        nodes.append(helper.make_node("Add", [y, "z"], ["y1"]))
        y = "y1"
    if relu:
        nodes.append(helper.make_node("Relu", [y], ["y2"]))
        y = "y2"
    nodes += [
        helper.make_node("Reshape", [y, "split"], ["s5"]),
        helper.make_node("Transpose", ["s5"], ["t5"], perm=perm or [0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "merge"], ["out"]),
    ]
    inputs = [vinfo("x", F, [n, c, h, w])] + ([vinfo("z", F, [n, m, h, w])] if residual else [])
    outputs = [vinfo("out", F, None)] + ([vinfo("s5", F, None)] if fetch_split else [])
    return make_model(nodes, inputs, outputs, initializers=inits)


def _check(model: onnx.ModelProto) -> None:
    rng = np.random.default_rng(1)
    feeds = {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }
    check_optimized(model, feeds)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # grouped 1x1 with as many groups as the shuffle: GEMM results written in place
        {"n": 2},
        {"relu": False},
        {"group": 4, "g": 3},  # other group counts: computed, then permuted
        {"kernel": 3, "group": 1, "g": 4},  # not 1x1
        {"split": [1, 3, 4, 5, 5], "merge": [1, 12, 5, 5], "n": 1},  # explicit sizes
    ],
    ids=["pointwise", "batch2", "no-relu", "other-groups", "3x3", "explicit-shapes"],
)
def test_shuffle_folds_into_the_convolution(kwargs: dict[str, Any]) -> None:
    model = _shuffle_model(**kwargs)
    ops = optimized_op_counts(model)
    assert ops == {"FusedConv": 1}, ops
    _check(model)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"perm": [0, 1, 2, 4, 3]},  # a spatial transpose, not a shuffle
        {"split": [0, 3, 4, 25, 1], "merge": [1, 12, 5, 5]},  # splits the map, not the channels
        {"residual": True},  # the shuffle comes after the residual add
        {"fetch_split": True},  # an intermediate the caller fetches
    ],
    ids=["perm", "not-a-channel-split", "residual", "fetched-intermediate"],
)
def test_near_misses_stay_unfolded(kwargs: dict[str, Any]) -> None:
    model = _shuffle_model(**kwargs)
    ops = optimized_op_counts(model)
    assert ops.get("Transpose") == 1, ops
    _check(model)


def test_shuffle_groups_must_divide_the_output_channels() -> None:
    x = np.ones((1, 4, 3, 3), np.float32)
    w = np.ones((6, 4, 1, 1), np.float32)
    with pytest.raises(ValueError, match="shuffle_groups 4 must divide the output channels \\(6\\)"):
        conv_nd(np, x, w, shuffle_groups=4)
