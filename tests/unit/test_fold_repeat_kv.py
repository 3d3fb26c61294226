"""optimizer/passes/fold_repeat_kv.py and the grouped form of the Attention kernel
(ops/fused_attention.py): grouped-query attention's repeat_kv (Unsqueeze, Expand, Reshape of
the keys and values) folds into the fused Attention, which reads each KV head for its group of
query heads in place and gives the unfolded graph's (and onnxruntime's) numbers; other shapes
get the copy the nodes would have made."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ops import fused_attention
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches, make_model, vinfo

F = TensorProto.FLOAT
KV, GROUP, SIZE = 2, 3, 4  # two KV heads, each serving three query heads
HEADS = KV * GROUP


def _gqa_model(*, unsqueeze_axis: int = 2, fetch_expanded: bool = False, plain_values: bool = False) -> onnx.ModelProto:
    """A decoder's grouped-query attention as transformers' Llama exports it: new keys and
    values appended to the past ones (the present state, also returned), each KV head repeated
    for its query heads, then softmax(Q K^T / sqrt(d) + mask) V merged to (batch, seq, hidden)."""
    inits = {
        "axes": np.array([unsqueeze_axis], np.int64),
        # axis 2: each KV head repeated in place (repeat_kv); axis 1: the heads tiled instead
        "expand_shape": np.array([1, KV, GROUP, 1, 1] if unsqueeze_axis == 2 else [1, GROUP, 1, 1, 1], np.int64),
        "heads_shape": np.array([0, HEADS, -1, SIZE], np.int64),
        "merged_shape": np.array([0, 0, HEADS * SIZE], np.int64),
        "root_size": np.array(np.sqrt(SIZE), np.float32),
    }
    nodes = [
        helper.make_node("Concat", ["past_key", "new_key"], ["present_key"], axis=2),
        helper.make_node("Concat", ["past_value", "new_value"], ["present_value"], axis=2),
    ]
    for name in ("key", "value"):
        if name == "value" and plain_values:
            # values repeated by Tile instead: not the repeat_kv chain
            inits["tile"] = np.array([1, GROUP, 1, 1], np.int64)
            nodes.append(helper.make_node("Tile", ["present_value", "tile"], ["value_rep"]))
            continue
        nodes += [
            helper.make_node("Unsqueeze", [f"present_{name}", "axes"], [f"{name}_u"]),
            helper.make_node("Expand", [f"{name}_u", "expand_shape"], [f"{name}_e"]),
            helper.make_node("Reshape", [f"{name}_e", "heads_shape"], [f"{name}_rep"]),
        ]
    nodes += [
        helper.make_node("Transpose", ["key_rep"], ["key_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "key_t"], ["scores"]),
        helper.make_node("Div", ["scores", "root_size"], ["scores_d"]),
        helper.make_node("Add", ["scores_d", "mask"], ["scores_m"]),
        helper.make_node("Softmax", ["scores_m"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "value_rep"], ["context"]),
        helper.make_node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "merged_shape"], ["y"]),
    ]
    inputs = [vinfo("q", F, ["b", HEADS, "s", SIZE]), vinfo("mask", F, ["b", 1, "s", "t"])]
    inputs += [
        vinfo(f"{p}_{n}", F, ["b", KV, "p" if p == "past" else "s", SIZE])
        for p in ("past", "new")
        for n in ("key", "value")
    ]
    outputs = [vinfo("y", F, ["b", "s", HEADS * SIZE]), vinfo("present_key", F, None), vinfo("present_value", F, None)]
    if fetch_expanded:
        outputs.append(vinfo("key_e", F, None))
    return make_model(nodes, inputs, outputs, initializers=inits)


def _feeds(batch: int, seq: int, past: int, hide_row: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 100 + seq * 10 + past)
    feeds = {"q": rng.standard_normal((batch, HEADS, seq, SIZE)).astype(np.float32)}
    for p, n in (("past", past), ("new", seq)):
        for name in ("key", "value"):
            feeds[f"{p}_{name}"] = rng.standard_normal((batch, KV, n, SIZE)).astype(np.float32)
    mask = np.zeros((batch, 1, seq, past + seq), np.float32)
    mask[..., past:] = np.triu(np.full((seq, seq), -1e9, np.float32), 1)  # causal over the new tokens
    if hide_row:
        mask[0, :, 0, :] = -np.inf  # every key hidden from the first query: a NaN row
    feeds["mask"] = mask
    return feeds


def _optimized_ops(model: onnx.ModelProto) -> collections.Counter[str]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return collections.Counter(n.op_type for n in graph.nodes)


def test_repeat_kv_folds_into_the_attention() -> None:
    model = _gqa_model()
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    (attention,) = [n for n in graph.nodes if n.op_type == "Attention"]
    assert attention.attrs["kv_repeat"] == 1
    assert attention.inputs[1:3] == ["present_key", "present_value"]
    assert not {"Unsqueeze", "Expand"} & {n.op_type for n in graph.nodes}


@pytest.mark.parametrize(("batch", "seq", "past"), [(1, 1, 6), (2, 1, 5), (2, 3, 4), (1, 4, 0)])
def test_folded_attention_matches_the_graph(batch: int, seq: int, past: int) -> None:
    # one token (the rows of a group in one product) and several (a 5-D product per group)
    assert_optimized_matches(_gqa_model(), _feeds(batch, seq, past), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "variant",
    [{"unsqueeze_axis": 1}, {"fetch_expanded": True}, {"plain_values": True}],
    ids=["another-axis", "expanded-keys-fetched", "values-tiled"],
)
def test_near_misses_keep_their_copies(variant: dict[str, object]) -> None:
    model = _gqa_model(**variant)  # type: ignore[arg-type]
    assert _optimized_ops(model)["Expand"] >= 1
    assert_optimized_matches(model, _feeds(2, 3, 4), rtol=1e-5, atol=1e-6)


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float) -> np.ndarray:
    k, v = np.repeat(k, GROUP, axis=1), np.repeat(v, GROUP, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) * scale + mask
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return (probs / probs.sum(-1, keepdims=True)) @ v


def _shapes(batch: int, t: int) -> dict[str, np.ndarray]:
    expand = np.array([batch, KV, GROUP, t, SIZE], np.int64)
    reshape = np.array([batch, HEADS, t, SIZE], np.int64)
    return {"key_expand": expand, "key_reshape": reshape, "value_expand": expand, "value_reshape": reshape}


@pytest.mark.parametrize(("q_batch", "kv_batch", "seq"), [(1, 1, 1), (3, 3, 1), (3, 1, 1), (2, 2, 5), (2, 1, 5)])
def test_grouped_kernel_reads_each_kv_head_for_its_queries(q_batch: int, kv_batch: int, seq: int) -> None:
    rng = np.random.default_rng(q_batch * 10 + kv_batch + seq)
    t = 7
    q = rng.standard_normal((q_batch, HEADS, seq, SIZE)).astype(np.float32)
    k = rng.standard_normal((kv_batch, KV, t, SIZE)).astype(np.float32)
    v = rng.standard_normal((kv_batch, KV, t, SIZE)).astype(np.float32)
    mask = rng.standard_normal((q_batch, 1, seq, t)).astype(np.float32)
    got = fused_attention.attention(
        np, q, k, v, None, None, None, mask, **_shapes(max(q_batch, kv_batch), t),
        scale=0.5, query_heads=1, key_heads=1, value_heads=1, kv_repeat=1,
    )  # fmt: skip
    assert got.shape == (max(q_batch, kv_batch), HEADS, seq, SIZE)
    np.testing.assert_allclose(got, _reference(q, k, v, mask, 0.5), rtol=1e-5, atol=1e-6)


def test_grouped_kernel_zeroes_rows_with_every_key_hidden() -> None:
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, HEADS, 2, SIZE)).astype(np.float32)
    k = rng.standard_normal((1, KV, 3, SIZE)).astype(np.float32)
    v = rng.standard_normal((1, KV, 3, SIZE)).astype(np.float32)
    mask = np.zeros((1, 1, 2, 3), np.float32)
    mask[0, 0, 1] = -np.inf
    with np.errstate(invalid="ignore"):  # as sessions run kernels
        got = fused_attention.attention(
            np, q, k, v, None, None, None, mask, **_shapes(1, 3),
            query_heads=1, key_heads=1, value_heads=1, kv_repeat=1, nan_to_zero=1,
        )  # fmt: skip
        want = _reference(q, k, v, mask, 1.0)
    assert not np.isnan(got).any() and np.all(got[:, :, 1] == 0)
    np.testing.assert_allclose(got[:, :, 0], want[:, :, 0], rtol=1e-5, atol=1e-6)


def test_shapes_that_are_not_a_repetition_get_the_nodes_copy() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, KV, 3, SIZE)).astype(np.float32)
    # the plain repetition: the KV heads themselves, and the copy when asked for
    same, n, copy = fused_attention._repeated_heads(x, [1, KV, GROUP, 3, SIZE], [0, -1, 3, SIZE], 0, "key")
    assert same is x and n == GROUP
    np.testing.assert_array_equal(copy(), np.repeat(x, GROUP, axis=1))
    # the heads and the tokens merged instead: Reshape's result, as the three nodes give it
    other, n, copy = fused_attention._repeated_heads(x, [1, KV, GROUP, 3, SIZE], [1, KV, GROUP * 3, SIZE], 0, "key")
    assert n == 1 and copy is None
    np.testing.assert_array_equal(
        other, np.broadcast_to(x[:, :, None], (1, KV, GROUP, 3, SIZE)).reshape(1, KV, -1, SIZE)
    )
    with pytest.raises(ValueError, match="cannot expand key"):
        fused_attention._repeated_heads(x, [1, KV + 1, GROUP, 3, SIZE], [0, -1, 3, SIZE], 0, "key")


# -- repeated keys also read for their shape ------------------------------------------------------


def _shape_read_model(reader: str, *, dynamic_expand: bool = False) -> onnx.ModelProto:
    """The grouped-query attention of ``_gqa_model``, with its mask sliced to the repeated keys'
    length as transformers' eager attention does (``mask[:, :, :, : key_states.shape[-2]]``), read
    by ``reader``: "window" (Shape with start and end on the repeated keys), "gather" (Shape,
    Gather and Unsqueeze, as torch exports ``.shape[-2]``) or "expanded" (Shape of the Expand's
    output). The shapes of the chain's three values are graph outputs too; ``dynamic_expand``:
    the Expand's shape is a graph input, so runs may give shapes that make no repetition."""
    inits = {
        "axes": np.array([2], np.int64),
        "heads_shape": np.array([0, HEADS, -1, SIZE], np.int64),
        "root_size": np.array(np.sqrt(SIZE), np.float32),
        "zero": np.array([0], np.int64),
        "last_axis": np.array([3], np.int64),
        "two": np.array(2, np.int64),
    }
    inputs = [vinfo("q", F, ["b", HEADS, "s", SIZE]), vinfo("mask", F, ["b", 1, "s", "m"])]
    inputs += [vinfo(n, F, ["b", KV, "t", SIZE]) for n in ("key", "value")]
    if dynamic_expand:
        inputs.append(vinfo("expand_shape", TensorProto.INT64, [5]))
    else:
        inits["expand_shape"] = np.array([1, KV, GROUP, 1, 1], np.int64)
    nodes = []
    for name in ("key", "value"):
        nodes += [
            helper.make_node("Unsqueeze", [name, "axes"], [f"{name}_u"]),
            helper.make_node("Expand", [f"{name}_u", "expand_shape"], [f"{name}_e"], name=f"{name}_expand"),
            helper.make_node("Reshape", [f"{name}_e", "heads_shape"], [f"{name}_rep"]),
        ]
    if reader == "window":
        nodes.append(helper.make_node("Shape", ["key_rep"], ["key_len"], start=-2, end=-1))
    elif reader == "gather":
        nodes += [
            helper.make_node("Shape", ["key_rep"], ["key_dims"]),
            helper.make_node("Gather", ["key_dims", "two"], ["key_len0"], axis=0),
            helper.make_node("Unsqueeze", ["key_len0", "zero"], ["key_len"]),
        ]
    else:
        nodes.append(helper.make_node("Shape", ["key_e"], ["key_len"], start=3, end=4))
    nodes += [helper.make_node("Shape", [f"key_{v}"], [f"key_{v}_shape"]) for v in ("u", "e", "rep")]
    nodes += [
        helper.make_node("Slice", ["mask", "zero", "key_len", "last_axis"], ["mask_cut"]),
        helper.make_node("Transpose", ["key_rep"], ["key_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "key_t"], ["scores"]),
        helper.make_node("Div", ["scores", "root_size"], ["scores_d"]),
        helper.make_node("Add", ["scores_d", "mask_cut"], ["scores_m"]),
        helper.make_node("Softmax", ["scores_m"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "value_rep"], ["y"]),
    ]
    outputs = [vinfo("y", F, ["b", HEADS, "s", SIZE])]
    outputs += [vinfo(f"key_{v}_shape", TensorProto.INT64, None) for v in ("u", "e", "rep")]
    return make_model(nodes, inputs, outputs, initializers=inits)


def _shape_read_feeds(batch: int, seq: int, t: int, spare: int = 3) -> dict[str, np.ndarray]:
    """Keys and values of length ``t``, and a causal mask ``spare`` columns longer (junk there:
    only the slice to the keys' length makes the product's shapes agree)."""
    rng = np.random.default_rng(batch * 100 + seq * 10 + t)
    feeds = {"q": rng.standard_normal((batch, HEADS, seq, SIZE)).astype(np.float32)}
    for name in ("key", "value"):
        feeds[name] = rng.standard_normal((batch, KV, t, SIZE)).astype(np.float32)
    mask = np.full((batch, 1, seq, t + spare), 5.0, np.float32)
    mask[..., :t] = np.triu(np.full((seq, t), -1e9, np.float32), t - seq + 1)
    feeds["mask"] = mask
    return feeds


@pytest.mark.parametrize("reader", ["window", "gather", "expanded"])
def test_repeat_kv_read_for_its_shape_still_folds(reader: str) -> None:
    model = _shape_read_model(reader)
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    (attention,) = [n for n in graph.nodes if n.op_type == "Attention"]
    assert attention.attrs["kv_repeat"] == 1 and attention.inputs[1:3] == ["key", "value"]
    # the chain is gone: its Shape readers compute from the keys' shape instead (memoized)
    assert not {"Unsqueeze", "Expand", "Reshape"} & {n.op_type for n in graph.nodes}
    for batch, seq, t in [(1, 1, 7), (2, 3, 5), (2, 3, 3), (1, 1, 7)]:
        assert_optimized_matches(model, _shape_read_feeds(batch, seq, t), rtol=1e-5, atol=1e-6)


def test_shape_readers_get_the_copys_shape_when_it_is_no_repetition() -> None:
    model = _shape_read_model("window", dynamic_expand=True)
    assert _optimized_ops(model)["Expand"] == 0
    feeds = _shape_read_feeds(2, 1, 1, spare=4)
    for expand_shape in ([1, KV, GROUP, 1, 1], [2, KV, GROUP, 4, 1], [1, 1, GROUP, 1, 1]):
        # a repetition; the one key broadcast to 4 tokens (the kernel makes the copy, and the
        # mask is cut to 4 columns); KV heads kept as given (a repetition of 1, broadcast)
        feeds["expand_shape"] = np.array(expand_shape, np.int64)
        assert_optimized_matches(model, feeds, rtol=1e-5, atol=1e-6)


def test_an_expand_shape_that_does_not_broadcast_still_fails_the_run() -> None:
    model = _shape_read_model("window", dynamic_expand=True)
    feeds = dict(_shape_read_feeds(1, 1, 2), expand_shape=np.array([1, KV + 1, GROUP, 1, 1], np.int64))
    # the Expand's shape is computed for the Shape readers now: its error, named after the Expand
    with pytest.raises(onnxpy.OnnxpyError, match=r"'key_expand \(shape\)'.*cannot expand shape \[1, 2, 1, 2, 4\]"):
        onnxpy.InferenceSession(model.SerializeToString()).run(None, feeds)
