"""optimizer/passes/chain_concat.py and ConcatAppend: DenseNet-style chains of channel Concats
grow one buffer in place, and every value handed out keeps its numbers."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxpy.ops import concat_append as ca
from tests.helpers import check_optimized, make_model, optimized_op_counts, vinfo

F = TensorProto.FLOAT


def _dense_block(layers: int, batch: int = 1, *, branch: bool = False, inplace_reader: bool = False) -> onnx.ModelProto:
    """x -> [cat_k = Concat(cat_{k-1}, Relu(Conv1x1(cat_{k-1})))] for k = 1..layers; every
    cat_k is also fetched, so the test sees each prefix view's values."""
    rng = np.random.default_rng(2)
    c0, growth = 4, 3
    inits: dict[str, np.ndarray] = {}
    nodes = []
    outputs = []
    prev, width = "x", c0
    for k in range(1, layers + 1):
        inits[f"w{k}"] = rng.standard_normal((growth, width, 1, 1)).astype(np.float32)
        nodes += [
            helper.make_node("Conv", [prev, f"w{k}"], [f"c{k}"]),
            helper.make_node("Relu", [f"c{k}"], [f"y{k}"]),
            helper.make_node("Concat", [prev, f"y{k}"], [f"cat{k}"], axis=1),
        ]
        outputs.append(vinfo(f"cat{k}", F, None))
        prev, width = f"cat{k}", width + growth
    if branch:
        # A second Concat appending to cat1: two appenders of one prefix.
        nodes.append(helper.make_node("Concat", ["cat1", "y1"], ["other"], axis=1))
        outputs.append(vinfo("other", F, None))
    if inplace_reader:
        # Add may run in place on its input; cat1 is a view that later links write past.
        nodes.append(helper.make_node("Add", ["cat1", "cat1"], ["twice"]))
        outputs.append(vinfo("twice", F, None))
    return make_model(nodes, [vinfo("x", F, [batch, c0, 5, 6])], outputs, initializers=inits)


def _check(model: onnx.ModelProto, batch: int = 1) -> None:
    check_optimized(model, {"x": np.random.default_rng(3).standard_normal((batch, 4, 5, 6)).astype(np.float32)})


def _count_appends(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    stats: collections.Counter[str] = collections.Counter()
    original = ca._growable

    def spy(a: Any, total: int) -> Any:
        buf = original(a, total)
        stats["in place" if buf is not None else "fresh"] += 1
        return buf

    monkeypatch.setattr(ca, "_growable", spy)
    return stats


@pytest.mark.parametrize("batch", [1, 2])
def test_a_chain_grows_one_buffer(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _dense_block(4, batch)
    assert optimized_op_counts(model)["ConcatAppend"] == 4
    stats = _count_appends(monkeypatch)
    _check(model, batch)
    assert stats == {"fresh": 1, "in place": 3}


def test_two_appenders_of_one_prefix_stay_correct(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _dense_block(3, branch=True)
    ops = optimized_op_counts(model)
    assert ops["Concat"] == 2 and ops["ConcatAppend"] == 2  # cat1 has two appenders: the chain starts after it
    _check(model)


def test_in_place_readers_of_a_link_do_not_disturb_it() -> None:
    model = _dense_block(3, inplace_reader=True)
    assert optimized_op_counts(model)["ConcatAppend"] == 3
    _check(model)


def test_a_lone_concat_is_left_alone() -> None:
    model = _dense_block(1)
    assert "ConcatAppend" not in optimized_op_counts(model)
    _check(model)


def test_kernel_appends_only_to_its_own_filled_prefix() -> None:
    a = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)
    b = np.ones((2, 1, 3), np.float32)
    first = ca.concat_append(np, a, b, capacity=5)  # fresh buffer of 5 channels, 3 filled
    second = ca.concat_append(np, first, b * 2, capacity=5)  # appends in place
    assert second.base is first.base and np.shares_memory(first, second)
    again = ca.concat_append(np, first, b * 3, capacity=5)  # first's tail is taken: fresh copy
    assert not np.shares_memory(again, second)
    np.testing.assert_array_equal(second[:, 3], 2)
    np.testing.assert_array_equal(again[:, 3], 3)
    np.testing.assert_array_equal(first, np.concatenate([a, b], axis=1))
    with pytest.raises(ValueError, match="must match outside axis 1"):
        ca.concat_append(np, a, np.ones((2, 1, 4), np.float32), capacity=5)
