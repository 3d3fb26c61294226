"""optimizer/passes/fuse_kv_append.py and its kernel (ops/append_heads.py): a decoder's new keys
or values split into heads and appended to the past ones,
Concat(past, Transpose<0,2,1,3>(Reshape(new, shape)), axis=2), become one AppendHeads step
that gives the unfused graph's (and onnxruntime's) present state; other chains stay."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches, make_model, vinfo

F = TensorProto.FLOAT
HEADS, SIZE = 3, 4


def _append_model(
    *,
    shape: str = "constant",
    axis: int = 2,
    perm: tuple[int, ...] = (0, 2, 1, 3),
    fetch_heads: bool = False,
    shape_reader: bool = False,
    allowzero: int = 0,
    free_past: bool = False,
) -> onnx.ModelProto:
    """present = Concat(past, Transpose(Reshape(new, shape)), axis), then a sum reading it.
    ``shape``: "constant" ([0, 0, heads, size]; with ``allowzero`` [0, 1, heads, size], its 0 a
    literal batch of 0), or "computed" from Shape(new) the way torch.onnx writes it."""
    inits: dict[str, np.ndarray] = {}
    nodes = []
    if shape == "constant":
        inits["heads_shape"] = np.array([0, 1, HEADS, SIZE] if allowzero else [0, 0, HEADS, SIZE], np.int64)
    else:
        inits.update(
            i0=np.array(0, np.int64),
            i1=np.array(1, np.int64),
            axes=np.array([0], np.int64),
            tail=np.array([HEADS, SIZE], np.int64),
        )
        nodes += [
            helper.make_node("Shape", ["new"], ["new_shape"]),
            helper.make_node("Gather", ["new_shape", "i0"], ["b"], axis=0),
            helper.make_node("Gather", ["new_shape", "i1"], ["s"], axis=0),
            helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
            helper.make_node("Unsqueeze", ["s", "axes"], ["s1"]),
            helper.make_node("Concat", ["b1", "s1", "tail"], ["heads_shape"], axis=0),
        ]
    reshape = helper.make_node("Reshape", ["new", "heads_shape"], ["heads"])
    if allowzero:
        reshape.attribute.append(helper.make_attribute("allowzero", 1))
    nodes += [
        reshape,
        helper.make_node("Transpose", ["heads"], ["heads_t"], perm=list(perm)),
        helper.make_node("Concat", ["past", "heads_t"], ["present"], axis=axis),
        helper.make_node("ReduceSum", ["present"], ["total"], keepdims=0),
    ]
    outputs = [vinfo("present", F, None), vinfo("total", F, None)]
    if fetch_heads:
        outputs.append(vinfo("heads_t", F, None))
    if shape_reader:
        nodes.append(helper.make_node("Shape", ["heads"], ["heads_dims"]))
        outputs.append(vinfo("heads_dims", TensorProto.INT64, None))
    past_axes = ["b", HEADS, "p", SIZE] if perm == (0, 2, 1, 3) else ["b", "s2", HEADS, SIZE]
    if free_past:
        past_axes = ["b", "h", "p", "d"]
    inputs = [vinfo("past", F, past_axes), vinfo("new", F, ["b", "s", HEADS * SIZE])]
    return make_model(nodes, inputs, outputs, initializers=inits)


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """The present state bit for bit as the unoptimized graph and onnxruntime give it; the sum
    read from it as close as summation order allows."""
    assert_optimized_matches(model, feeds, rtol=1e-6, atol=1e-5)
    data = model.SerializeToString()
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = onnxpy.InferenceSession(data).run(["present"], feeds)[0]
    plain = onnxpy.InferenceSession(data, plain_opts).run(["present"], feeds)[0]
    want = np.concatenate(
        [feeds["past"], feeds["new"].reshape(*feeds["new"].shape[:2], HEADS, SIZE).transpose(0, 2, 1, 3)], 2
    )
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(plain, want)


def _ops(model: onnx.ModelProto) -> collections.Counter[str]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return collections.Counter(n.op_type for n in graph.nodes)


def _feeds(batch: int, seq: int, past: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 100 + seq * 10 + past)
    return {
        "past": rng.standard_normal((batch, HEADS, past, SIZE)).astype(np.float32),
        "new": rng.standard_normal((batch, seq, HEADS * SIZE)).astype(np.float32),
    }


@pytest.mark.parametrize("shape", ["constant", "computed"])
@pytest.mark.parametrize("axis", [2, -2])
def test_heads_appended_to_the_past_fuse_into_one_step(shape: str, axis: int) -> None:
    model = _append_model(shape=shape, axis=axis)
    ops = _ops(model)
    assert ops["AppendHeads"] == 1
    assert "Transpose" not in ops and "Reshape" not in ops and "Concat" not in ops  # (a computed shape: ShapeMemo)
    # one new token onto a cache (a decoder step), a prompt onto nothing, several onto a cache
    for batch, seq, past in ((1, 1, 5), (2, 3, 0), (2, 4, 7)):
        _check(model, _feeds(batch, seq, past))


def test_allowzero_goes_with_the_reshape() -> None:
    # With allowzero the shape's 0 is a batch of 0 (the fed batch of 1 holds no token), where
    # without it the 0 would copy that 1 and the 12 values asked for could not come from none.
    model = _append_model(allowzero=1, free_past=True)
    assert _ops(model)["AppendHeads"] == 1
    feeds = {
        "past": np.zeros((0, HEADS, 5, SIZE), np.float32),
        "new": np.zeros((1, 0, HEADS * SIZE), np.float32),
    }
    assert_optimized_matches(model, feeds, rtol=0, atol=0)
    present = onnxpy.InferenceSession(model.SerializeToString()).run(["present"], feeds)[0]
    assert present.shape == (0, HEADS, 6, SIZE)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"perm": (0, 1, 2, 3)},  # not a head split
        {"axis": 1},  # appended along the heads
        {"fetch_heads": True},  # the split heads are a graph output too
        {"shape_reader": True},  # a Shape node reads the reshaped values
    ],
    ids=["other-perm", "other-axis", "heads-fetched", "shape-read"],
)
def test_chains_with_other_readers_or_axes_stay(kwargs: dict) -> None:
    model = _append_model(**kwargs)
    ops = _ops(model)
    assert "AppendHeads" not in ops and ops["Transpose"] == 1 and ops["Reshape"] == 1


def test_a_past_of_other_heads_is_refused_naming_the_node() -> None:
    sess = onnxpy.InferenceSession(_append_model(free_past=True).SerializeToString())
    feeds = _feeds(1, 1, 5)
    feeds["past"] = np.zeros((1, HEADS + 1, 5, SIZE), np.float32)
    with pytest.raises(
        Exception, match=r"AppendHeads: cannot append heads of shape \[1, 3, 1, 4\] to the past \[1, 4, 5, 4\]"
    ):
        sess.run(None, feeds)


def test_the_gpt2_decoder_step_appends_each_layers_keys_and_values_in_one_step() -> None:
    from tests.models import zoo

    model = zoo.gpt2(17, past=True)
    ops = _ops(model)
    layers = sum(1 for i in model.graph.input if i.name.endswith(".key"))
    assert layers >= 2 and ops["AppendHeads"] == 2 * layers and "Concat" not in ops
