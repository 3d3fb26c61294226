"""optimizer/passes/fuse_attention.py and its kernel (ops/fused_attention.py): the exported
attention patterns fuse into one node, the fused graph gives the unfused graph's (and
onnxruntime's) numbers, and near misses stay unfused."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches, make_model, vinfo

HEADS, SIZE = 2, 4
F = TensorProto.FLOAT


def _split(name: str, perm: list[int], shape: str = "heads_shape", allowzero: int = 0) -> list[onnx.NodeProto]:
    return [
        helper.make_node("Reshape", [name, shape], [f"{name}_r"], allowzero=allowzero),
        helper.make_node("Transpose", [f"{name}_r"], [f"{name}_h"], perm=perm),
    ]


def _attention_model(
    style: str, *, mask: bool = True, guard: bool = False, shape_readers: bool = False, **variant: Any
) -> onnx.ModelProto:
    """q, k, v (batch, seq, heads*size) -> per-head context merged back to (batch, seq, hidden).

    style "sdpa": sqrt(scale) on Q and K heads before the product (torch's SDPA export);
    style "hf": the product divided by sqrt(size) (the classic BERT export)."""
    allowzero = variant.get("allowzero", 0)
    nodes = _split("q", [0, 2, 1, 3], "q_shape" if allowzero else "heads_shape", allowzero)
    nodes += _split("k", [0, 2, 3, 1]) + _split("v", [0, 2, 1, 3])
    inits: dict[str, np.ndarray] = {
        "heads_shape": np.array([0, 0, HEADS, SIZE], np.int64),
        "merged_shape": np.array([0, 0, HEADS * SIZE], np.int64),
    }
    if allowzero:  # allowzero takes 0 literally: an explicit shape for the (2, 5) feeds
        inits["q_shape"] = np.array([2, 5, HEADS, SIZE], np.int64)
    q, k = "q_h", "k_h"
    if style == "sdpa":
        inits["root_scale"] = np.array(SIZE**-0.25, np.float32)
        inits["q_scale"] = np.asarray(variant.get("q_scale", SIZE**-0.25), np.float32)
        nodes += [
            helper.make_node("Mul", ["q_h", "q_scale"], ["q_s"]),
            helper.make_node("Mul", ["root_scale", "k_h"], ["k_s"]),  # constant first: either order
        ]
        q, k = "q_s", "k_s"
    nodes.append(helper.make_node("MatMul", [q, k], ["scores"]))
    scores = "scores"
    if style == "hf":
        inits["root_size"] = np.array(np.sqrt(SIZE), np.float32)
        nodes.append(helper.make_node("Div", ["scores", "root_size"], ["scores_d"]))
        scores = "scores_d"
    if mask:
        nodes.append(helper.make_node("Add", [scores, "mask"], ["scores_m"]))
        scores = "scores_m"
    nodes.append(helper.make_node("Softmax", [scores], ["probs"], axis=variant.get("axis", -1)))
    probs = "probs"
    if guard:
        inits["zero"] = np.array(0.0, np.float32)
        nodes += [
            helper.make_node("IsNaN", ["probs"], ["nan"]),
            helper.make_node("Where", ["nan", "zero", "probs"], ["probs_g"]),
        ]
        probs = "probs_g"
    nodes += [
        helper.make_node("MatMul", [probs, "v_h"], ["context"]),
        helper.make_node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "merged_shape"], ["y"]),
    ]
    outputs = [vinfo("y", F, ["b", "s", HEADS * SIZE])]
    if shape_readers:  # exporters read the head sizes off the split tensors and the context
        nodes += [helper.make_node("Shape", [t], [f"{t}_shape"]) for t in ("q_h", "v_h", "context")]
        outputs += [vinfo(f"{t}_shape", TensorProto.INT64, [4]) for t in ("q_h", "v_h", "context")]
    if variant.get("scores_output"):
        outputs.append(vinfo("scores", F, None))
    inputs = [vinfo(n, F, ["b", "s", HEADS * SIZE]) for n in ("q", "k", "v")]
    if mask:
        inputs.append(vinfo("mask", F, ["b", 1, 1, "s"]))
    return make_model(nodes, inputs, outputs, initializers=inits)


def _feeds(model: onnx.ModelProto, batch: int = 2, seq: int = 5, hide_row: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 10 + seq)
    feeds = {n: rng.standard_normal((batch, seq, HEADS * SIZE)).astype(np.float32) for n in ("q", "k", "v")}
    if any(i.name == "mask" for i in model.graph.input):
        mask = np.zeros((batch, 1, 1, seq), np.float32)
        mask[0, ..., seq // 2 :] = -np.inf  # padding keys of the first sequence
        if hide_row:
            mask[-1] = -np.inf  # every key hidden: Softmax gives NaN, the guard zeros it
        feeds["mask"] = mask
    return feeds


def _fused_ops(model: onnx.ModelProto) -> dict[str, int]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return dict(collections.Counter(n.op_type for n in graph.nodes))


def _check_numbers(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    assert_optimized_matches(model, feeds, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("style", ["sdpa", "hf", "plain"])
@pytest.mark.parametrize("mask", [True, False])
def test_attention_patterns_fuse_into_one_node(style: str, mask: bool) -> None:
    model = _attention_model(style, mask=mask)
    ops = _fused_ops(model)
    assert ops.get("Attention") == 1
    assert not {"Softmax", "MatMul", "Mul", "Div", "Add"} & set(ops)
    for batch, seq in ((2, 5), (1, 1), (3, 8)):
        _check_numbers(model, _feeds(model, batch, seq))


def test_nan_guard_and_shape_readers_fuse_and_keep_the_views_shape_reads() -> None:
    model = _attention_model("sdpa", guard=True, shape_readers=True)
    ops = _fused_ops(model)
    assert ops.get("Attention") == 1 and "IsNaN" not in ops and "Where" not in ops
    # The fusion keeps Q's and V's Reshape/Transpose for their Shape readers; shape_of_views
    # then reads those shapes off the projections, and only the merge of the heads remains.
    assert ops["Transpose"] == 1 and ops["Reshape"] == 1 and ops["ShapeMemo"] >= 1
    feeds = _feeds(model, 3, 6, hide_row=True)
    _check_numbers(model, feeds)
    (y, *_), fully_hidden = onnxpy.InferenceSession(model.SerializeToString()).run(None, feeds), 2
    assert np.all(y[fully_hidden] == 0)  # the guard's zeros, not NaN


@pytest.mark.parametrize(
    "variant",
    [
        {"axis": 1},  # Softmax over the heads, not the keys
        {"scores_output": True},  # an intermediate the caller fetches
        {"q_scale": np.linspace(0.3, 0.7, SIZE, dtype=np.float32)},  # per feature, not a scalar
    ],
    ids=["softmax-axis", "scores-fetched", "vector-scale"],
)
def test_near_misses_stay_unfused(variant: dict[str, Any]) -> None:
    model = _attention_model("sdpa", **variant)
    assert "Attention" not in _fused_ops(model)
    _check_numbers(model, _feeds(model))


def test_a_split_the_fusion_cannot_absorb_stays_and_is_read_per_head() -> None:
    # Q's Reshape takes 0 literally (allowzero): it stays a node of its own, with its Transpose,
    # and the fused node reads the queries they split per head
    model = _attention_model("sdpa", allowzero=1)
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    (attention,) = [n for n in graph.nodes if n.op_type == "Attention"]
    assert attention.attrs.get("query_heads") == 1 and "key_heads" not in attention.attrs
    assert any(n.op_type == "Reshape" and n.attrs.get("allowzero") for n in graph.nodes)
    _check_numbers(model, _feeds(model))


def test_bad_head_shape_names_the_input() -> None:
    model = _attention_model("hf", mask=False)
    for init in model.graph.initializer:
        if init.name == "heads_shape":
            init.CopyFrom(onnx.numpy_helper.from_array(np.array([0, 0, HEADS * SIZE], np.int64), "heads_shape"))
    feeds = _feeds(model)
    with pytest.raises(Exception, match="query reshaped to \\[2, 5, 8\\], expected 4 dimensions"):
        onnxpy.InferenceSession(model.SerializeToString()).run(None, feeds)


@pytest.mark.parametrize("batched", [False, True])
def test_context_comes_back_in_sequence_memory_order(batched: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel writes the per-head context in (batch, seq, heads, size) memory, so the
    exporter's head merge (Transpose<0,2,1,3>, Reshape) is a view; a stack the batched OpenBLAS
    call takes keeps the plain (batch, heads, seq, size) layout. Values equal either way."""
    from onnxpy.ops import fused_attention

    monkeypatch.setattr(fused_attention, "batches", lambda a, b: batched)
    rng = np.random.default_rng(3)
    b, s, h, d = 2, 7, 3, 5
    q, k, v = (rng.standard_normal((b, s, h * d)).astype(np.float32) for _ in range(3))
    shape = np.array([0, 0, h, d], np.int64)
    context = fused_attention.attention(np, q, k, v, shape, shape, shape, scale=0.5)
    qh, kh, vh = (t.reshape(b, s, h, d).transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = qh @ kh.transpose(0, 1, 3, 2) * np.float32(0.5)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(context, probs @ vh, rtol=1e-5, atol=1e-6)
    merged = context.transpose(0, 2, 1, 3)
    assert merged.flags.c_contiguous is not batched
    assert context.flags.c_contiguous is batched


def _decoder_model(key_perm: tuple[int, ...] = (0, 1, 3, 2), sdpa: bool = False) -> onnx.ModelProto:
    """GPT-2's attention with past: the new keys and values split per head and concatenated
    behind the past ones (returned as present_key / present_value), keys transposed for the
    product, scores divided by sqrt(size), a mask added. ``sdpa``: scaled as torch exports
    scaled_dot_product_attention instead, Q and K^T each times sqrt(1 / sqrt(size)) computed
    from Q's shape at run time."""
    nodes = _split("q", [0, 2, 1, 3]) + _split("k", [0, 2, 1, 3]) + _split("v", [0, 2, 1, 3])
    nodes += [
        helper.make_node("Concat", ["past_key", "k_h"], ["present_key"], axis=-2),
        helper.make_node("Concat", ["past_value", "v_h"], ["present_value"], axis=-2),
        helper.make_node("Transpose", ["present_key"], ["keys_t"], perm=list(key_perm)),
    ]
    if sdpa:
        nodes += [
            helper.make_node("Shape", ["q_h"], ["q_shape_all"]),
            helper.make_node("Slice", ["q_shape_all", "last", "to_end"], ["q_size"]),
            helper.make_node("Cast", ["q_size"], ["q_size_f"], to=F),
            helper.make_node("Sqrt", ["q_size_f"], ["q_root"]),
            helper.make_node("Div", ["one", "q_root"], ["sdpa_scale"]),
            helper.make_node("Sqrt", ["sdpa_scale"], ["half_scale"]),
            helper.make_node("Mul", ["q_h", "half_scale"], ["q_s"]),
            helper.make_node("Mul", ["keys_t", "half_scale"], ["keys_s"]),
            helper.make_node("MatMul", ["q_s", "keys_s"], ["scores_d"]),
        ]
    else:
        nodes += [
            helper.make_node("MatMul", ["q_h", "keys_t"], ["scores"]),
            helper.make_node("Div", ["scores", "root_size"], ["scores_d"]),
        ]
    nodes += [
        helper.make_node("Add", ["scores_d", "mask"], ["scores_m"]),
        helper.make_node("Softmax", ["scores_m"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "present_value"], ["context"]),
        helper.make_node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "merged_shape"], ["y"]),
    ]
    inits = {
        "heads_shape": np.array([0, 0, HEADS, SIZE], np.int64),
        "merged_shape": np.array([0, 0, HEADS * SIZE], np.int64),
        "root_size": np.array(np.sqrt(SIZE), np.float32),
        "last": np.array([-1], np.int64),
        "to_end": np.array([2**63 - 1], np.int64),
        "one": np.array(1.0, np.float32),
    }
    inputs = [vinfo(n, F, ["b", "s", HEADS * SIZE]) for n in ("q", "k", "v")]
    inputs += [vinfo(n, F, ["b", HEADS, "p", SIZE]) for n in ("past_key", "past_value")]
    inputs.append(vinfo("mask", F, ["b", 1, "s", "t"]))
    outputs = [vinfo("y", F, ["b", "s", HEADS * SIZE])]
    outputs += [vinfo(n, F, ["b", HEADS, "t", SIZE]) for n in ("present_key", "present_value")]
    return make_model(nodes, inputs, outputs, initializers=inits)


def _decoder_feeds(batch: int, seq: int, past: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch + 10 * seq + 100 * past)
    feeds = {n: rng.standard_normal((batch, seq, HEADS * SIZE)).astype(np.float32) for n in ("q", "k", "v")}
    for n in ("past_key", "past_value"):
        feeds[n] = rng.standard_normal((batch, HEADS, past, SIZE)).astype(np.float32)
    # causal: new token i sees the past and new tokens up to i
    mask = np.triu(np.full((seq, past + seq), -1e4, np.float32), past + 1)
    feeds["mask"] = np.broadcast_to(mask, (batch, 1, seq, past + seq)).copy()
    return feeds


def test_decoder_attention_reads_present_keys_and_values_per_head() -> None:
    model = _decoder_model()
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    (attention,) = [n for n in graph.nodes if n.op_type == "Attention"]
    assert attention.attrs["key_heads"] == 1 and attention.attrs["value_heads"] == 1
    assert attention.inputs[1:3] == ["present_key", "present_value"]
    assert not {"Softmax", "MatMul", "Div", "Add"} & {n.op_type for n in graph.nodes}
    assert sum(n.op_type == "AppendHeads" for n in graph.nodes) == 2  # the present outputs (fuse_kv_append)
    for batch, seq, past in ((1, 1, 0), (1, 1, 6), (2, 3, 4)):
        _check_numbers(model, _decoder_feeds(batch, seq, past))


def test_decoder_attention_scaled_as_torch_exports_sdpa_fuses() -> None:
    # the scale from Q's shape folds to a constant (its last dimension is known); Q and K^T
    # each carry its square root
    model = _decoder_model(sdpa=True)
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    (attention,) = [n for n in graph.nodes if n.op_type == "Attention"]
    assert attention.attrs["key_heads"] == 1 and attention.inputs[1] == "present_key"
    assert attention.attrs["scale"] == pytest.approx(1 / np.sqrt(SIZE), rel=1e-6)
    assert not {"Softmax", "MatMul", "Mul", "Sqrt", "Shape"} & {n.op_type for n in graph.nodes}
    for batch, seq, past in ((1, 1, 6), (2, 3, 4)):
        _check_numbers(model, _decoder_feeds(batch, seq, past))


def test_decoder_keys_read_elsewhere_stay_unfused() -> None:
    # the transposed keys fetched by the caller too: the Transpose must stay, and so the pattern
    model = _decoder_model()
    model.graph.output.append(vinfo("keys_t", F, None))
    assert "Attention" not in _fused_ops(model)
    _check_numbers(model, _decoder_feeds(2, 3, 4))
    # batch and heads swapped as well (a valid product when batch == heads): not K^T
    model = _decoder_model(key_perm=(1, 0, 3, 2))
    assert "Attention" not in _fused_ops(model)
    _check_numbers(model, _decoder_feeds(HEADS, 3, 4))


def test_per_head_inputs_of_the_wrong_rank_name_the_input() -> None:
    from onnxpy.ops import fused_attention

    q = np.zeros((1, 2, HEADS * SIZE), np.float32)
    shape = np.array([0, 0, HEADS, SIZE], np.int64)
    with pytest.raises(ValueError, match=r"key has shape \[2, 8\], expected \(batch, heads, seq, size\)"):
        fused_attention.attention(np, q, np.zeros((2, 8), np.float32), q, shape, None, shape, key_heads=1)


def test_vit_attention_split_from_one_packed_projection_fuses() -> None:
    # timm: Reshape(qkv, [b, n, 3, heads, size]) -> Transpose<2,0,3,1,4> -> Split -> Squeeze,
    # q * scale, k transposed for the product: one Attention per block, reading the views
    from tests.models.zoo import vit

    model = vit()
    ops = _fused_ops(model)
    assert ops.get("Attention") == 2 and "Softmax" not in ops and "MatMul" not in ops
    feeds = {"pixel_values": np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)}
    assert_optimized_matches(model, feeds, rtol=1e-4, atol=1e-5)


def test_per_head_operands_broadcast_as_matmul_does() -> None:
    # queries and keys of one image, values of two: the context has the values' batch
    from onnxpy.ops import fused_attention

    rng = np.random.default_rng(8)
    q = rng.standard_normal((1, HEADS, 3, SIZE)).astype(np.float32)
    k = rng.standard_normal((1, HEADS, 5, SIZE)).astype(np.float32)
    v = rng.standard_normal((2, HEADS, 5, SIZE)).astype(np.float32)
    got = fused_attention.attention(np, q, k, v, None, None, None, query_heads=1, key_heads=1, value_heads=1)
    scores = q @ k.transpose(0, 1, 3, 2)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, probs @ v, rtol=1e-5, atol=1e-6)


def _reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: Any = 0.0) -> np.ndarray:
    scores = q @ k.transpose(0, 1, 3, 2) + bias
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return (probs / probs.sum(-1, keepdims=True)) @ v


def test_a_bias_larger_than_the_scores_broadcasts_them_as_add_does() -> None:
    # one query per head, a mask of four query rows: the Add gives four rows of scores
    from onnxpy.ops import fused_attention

    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, HEADS, 1, SIZE)).astype(np.float32)
    k = rng.standard_normal((1, HEADS, 5, SIZE)).astype(np.float32)
    v = rng.standard_normal((1, HEADS, 5, SIZE)).astype(np.float32)
    bias = rng.standard_normal((1, 1, 4, 5)).astype(np.float32)
    got = fused_attention.attention(np, q, k, v, None, None, None, bias, query_heads=1, key_heads=1, value_heads=1)
    assert got.shape == (1, HEADS, 4, SIZE)
    np.testing.assert_allclose(got, _reference_attention(q, k, v, bias), rtol=1e-5, atol=1e-6)


def test_queries_of_two_images_with_shared_keys_and_values_broadcast() -> None:
    from onnxpy.ops import fused_attention

    rng = np.random.default_rng(10)
    q = rng.standard_normal((2, HEADS, 3, SIZE)).astype(np.float32)
    k = rng.standard_normal((1, HEADS, 5, SIZE)).astype(np.float32)
    v = rng.standard_normal((1, 1, 5, SIZE)).astype(np.float32)  # one value head shared by all
    got = fused_attention.attention(np, q, k, v, None, None, None, query_heads=1, key_heads=1, value_heads=1)
    assert got.shape == (2, HEADS, 3, SIZE)
    np.testing.assert_allclose(got, _reference_attention(q, k, v), rtol=1e-5, atol=1e-6)


def _where_masked_model(keep: bool, additive: bool, expand_as: bool) -> onnx.ModelProto:
    """Attention over per-head q, k, v whose scaled scores pass a Where before the Softmax:
    Where(keep, scores, fill) as GPT-2's causal buffer does, or Where(hide, fill, scores) as
    DistilBERT's masked_fill (its condition Expanded to Shape(scores) with ``expand_as``), then
    [+ an additive mask]."""
    inits = {"root_size": np.array(np.sqrt(SIZE), np.float32), "fill": np.array(-3.4e38, np.float32)}
    nodes = [
        helper.make_node("Transpose", ["k"], ["k_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "k_t"], ["scores"]),
        helper.make_node("Div", ["scores", "root_size"], ["scores_d"]),
    ]
    cond = "cond"
    if expand_as:
        nodes += [
            helper.make_node("Shape", ["scores_d"], ["scores_shape"]),
            helper.make_node("Expand", ["cond", "scores_shape"], ["cond_x"]),
        ]
        cond = "cond_x"
    branches = ["scores_d", "fill"] if keep else ["fill", "scores_d"]
    nodes.append(helper.make_node("Where", [cond, *branches], ["scores_w"]))
    probs_in = "scores_w"
    if additive:
        nodes.append(helper.make_node("Add", ["scores_w", "mask"], ["scores_m"]))
        probs_in = "scores_m"
    nodes += [
        helper.make_node("Softmax", [probs_in], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"]),
    ]
    inputs = [vinfo(n, F, ["b", HEADS, "s", SIZE]) for n in ("q", "k", "v")]
    inputs.append(vinfo("cond", TensorProto.BOOL, ["b", 1, "s", "s"]))
    if additive:
        inputs.append(vinfo("mask", F, ["b", 1, 1, "s"]))
    return make_model(nodes, inputs, [vinfo("context", F, ["b", HEADS, "s", SIZE])], initializers=inits)


@pytest.mark.parametrize("keep", [True, False], ids=["keep-mask", "hide-mask"])
@pytest.mark.parametrize("additive", [False, True], ids=["alone", "then-additive"])
@pytest.mark.parametrize("expand_as", [False, True], ids=["direct", "expand-as"])
def test_where_masked_scores_fuse(keep: bool, additive: bool, expand_as: bool) -> None:
    model = _where_masked_model(keep, additive, expand_as)
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    assert [n.op_type for n in graph.nodes] == ["Attention"]
    (attention,) = graph.nodes
    assert attention.inputs[11] == "cond" and attention.attrs["where_keep"] == int(keep)
    rng = np.random.default_rng(int(keep) + 2 * int(additive) + 4 * int(expand_as))
    for batch, seq in ((1, 4), (2, 6)):
        feeds = {n: rng.standard_normal((batch, HEADS, seq, SIZE)).astype(np.float32) for n in ("q", "k", "v")}
        causal = np.tril(np.ones((seq, seq), bool))
        feeds["cond"] = np.broadcast_to(causal if keep else ~causal, (batch, 1, seq, seq)).copy()
        if additive:
            feeds["mask"] = np.where(rng.random((batch, 1, 1, seq)) < 0.2, -1e4, 0.0).astype(np.float32)
        _check_numbers(model, feeds)


def test_gpt2_opset14_export_with_its_causal_buffer_fuses() -> None:
    # transformers' older GPT-2: Where(bool causal buffer slice, scores / sqrt(d), min) + mask,
    # the scale from Shape(v)[3]: both attentions fuse
    from tests.models import zoo

    graph = build_graph(zoo.gpt2(14))
    optimize(graph, 99, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    assert ops["Attention"] == 2 and "Softmax" not in ops and "Where" not in ops


def test_an_additive_mask_made_by_a_where_and_added_first_fuses() -> None:
    # SDPA-style exports build the additive mask as Where(keep, 0, -inf); written as the Add's
    # first input it must not be taken for the scores
    inits = {"root_size": np.array(np.sqrt(SIZE), np.float32), "zero": np.array(0.0, np.float32)}
    inits["low"] = np.array(-1e4, np.float32)
    nodes = [
        helper.make_node("Transpose", ["k"], ["k_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "k_t"], ["scores"]),
        helper.make_node("Div", ["scores", "root_size"], ["scores_d"]),
        helper.make_node("Where", ["keep", "zero", "low"], ["mask"]),
        helper.make_node("Add", ["mask", "scores_d"], ["scores_m"]),
        helper.make_node("Softmax", ["scores_m"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"]),
    ]
    inputs = [vinfo(n, F, ["b", HEADS, "s", SIZE]) for n in ("q", "k", "v")]
    inputs.append(vinfo("keep", TensorProto.BOOL, ["b", 1, 1, "s"]))
    model = make_model(nodes, inputs, [vinfo("context", F, ["b", HEADS, "s", SIZE])], initializers=inits)
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    assert sorted(n.op_type for n in graph.nodes) == ["Attention", "Where"]
    rng = np.random.default_rng(12)
    feeds = {n: rng.standard_normal((2, HEADS, 5, SIZE)).astype(np.float32) for n in ("q", "k", "v")}
    feeds["keep"] = rng.random((2, 1, 1, 5)) < 0.7
    feeds["keep"][..., 0] = True
    _check_numbers(model, feeds)


def _bmm_model(batch: int, split: list[int], mask_shape: list[int]) -> onnx.ModelProto:
    """transformers' bmm form with constant shapes for one batch size: Q (scaled first), K and V
    split into heads and merged with the batch axis, (batch * heads, seq, size); the scores
    reshaped to ``split`` for the mask and back; the context reshaped to 4-D, then merged back
    to (batch, seq, hidden)."""
    seq, merged = 5, [batch * HEADS, 5, SIZE]
    inits = {
        "heads_shape": np.array([batch, seq, HEADS, SIZE], np.int64),
        "merged3": np.array(merged, np.int64),
        "split": np.array(split, np.int64),
        "merge": np.array([batch * HEADS, seq, seq], np.int64),
        "context4": np.array([batch, HEADS, seq, SIZE], np.int64),
        "hidden": np.array([batch, seq, HEADS * SIZE], np.int64),
        "scale": np.array(SIZE**-0.5, np.float32),
    }
    nodes = [helper.make_node("Mul", ["q", "scale"], ["q_s"])]
    for name, source in (("q", "q_s"), ("k", "k"), ("v", "v")):
        nodes += [
            helper.make_node("Reshape", [source, "heads_shape"], [f"{name}_r"]),
            helper.make_node("Transpose", [f"{name}_r"], [f"{name}_h"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"{name}_h", "merged3"], [f"{name}3"]),
        ]
    nodes += [
        helper.make_node("Transpose", ["k3"], ["k3_t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q3", "k3_t"], ["scores"]),
        helper.make_node("Reshape", ["scores", "split"], ["scores4"]),
        helper.make_node("Add", ["scores4", "mask"], ["masked4"]),
        helper.make_node("Reshape", ["masked4", "merge"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v3"], ["context"]),
        helper.make_node("Reshape", ["context", "context4"], ["context_h"]),
        helper.make_node("Transpose", ["context_h"], ["context_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "hidden"], ["y"]),
    ]
    hidden = [batch, seq, HEADS * SIZE]
    inputs = [vinfo(n, F, hidden) for n in "qkv"] + [vinfo("mask", F, mask_shape)]
    return make_model(nodes, inputs, [vinfo("y", F, hidden)], inits)


@pytest.mark.parametrize(
    ("batch", "split", "mask_shape"),
    [
        (3, [3, HEADS, 5, 5], [3, 1, 5, 5]),  # the form as written: the 4-D computation
        (3, [HEADS, 3, 5, 5], [1, 3, 5, 5]),  # heads first: the mask spans another axis, as written
    ],
    ids=["batch-heads", "heads-batch"],
)
def test_attention_over_batch_times_heads_fuses_and_keeps_its_reshapes_meaning(
    batch: int, split: list[int], mask_shape: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bmm form fuses into one Attention whatever its Reshapes' shapes; where they do not
    split the batch and head axes as the form intends (heads first here), the kernel computes
    each step as the graph wrote it, and the numbers still match."""
    from onnxpy.ops import fused_attention

    written = []
    step_by_step = fused_attention._as_written
    monkeypatch.setattr(fused_attention, "_as_written", lambda *a: written.append(1) or step_by_step(*a))
    model = _bmm_model(batch, split, mask_shape)
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    assert ops["Attention"] == 1 and not {"Softmax", "MatMul", "Mul"} & set(ops), dict(ops)
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal((batch, 5, HEADS * SIZE)).astype(np.float32) for n in "qkv"}
    feeds["mask"] = np.where(rng.random(mask_shape) < 0.3, -1e9, 0).astype(np.float32)
    assert_optimized_matches(model, feeds, rtol=1e-5, atol=1e-6)
    assert bool(written) == (split[0] != batch)  # the 4-D computation where the shapes allow it
