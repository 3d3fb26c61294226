"""Grouped-query attention as torch exports transformers' forms of it: repeat_kv (Unsqueeze,
Expand, Reshape of the keys and values) folds into the fused Attention even though the causal
mask takes its size from the repeated keys, as both of transformers' attentions do: the eager
one slices the mask to ``key_states.shape[-2]``, and torch's export of
scaled_dot_product_attention(is_causal=True) builds the mask from the keys' shape. The chains
then go entirely (their Shape readers compute from the KV heads' shape), and the numbers match
torch's. Needs torch, which CI installs only from a local wheel folder."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches
from tests.models.test_torch_exports import TORCH_REASON, _torchscript

HEADS, KV_HEADS, SIZE = 4, 2, 16
NAMES = ["q", "k", "v", "mask"]


def _module(torch, form: str):
    """Attention over repeated KV heads: "eager" (transformers' eager_attention_forward, its mask
    sliced to the keys' length) or "sdpa" (sdpa_attention_forward on a prompt: is_causal, no
    mask; the mask input is read, as nothing, so that the inputs stay the same)."""

    def repeat_kv(x, n):  # transformers' repeat_kv
        b, kvh, s, d = x.shape
        return x[:, :, None, :, :].expand(b, kvh, n, s, d).reshape(b, kvh * n, s, d)

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, mask):
            k, v = repeat_kv(k, HEADS // KV_HEADS), repeat_kv(v, HEADS // KV_HEADS)
            if form == "sdpa":
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SIZE**-0.5)
                return o + 0 * mask.sum()
            w = torch.matmul(q, k.transpose(2, 3)) * SIZE**-0.5 + mask[:, :, :, : k.shape[-2]]
            return torch.matmul(torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)

    return Attention().eval()


def _args(torch, batch: int, seq: int, past: int, spare: int) -> tuple:
    """A query of ``seq`` tokens after ``past`` cached ones, and a causal mask ``spare`` columns
    longer than the keys (as a mask sized for the longest sequence is)."""
    t = past + seq
    mask = torch.triu(torch.full((seq, t + spare), -1e9), past + 1)[None, None].expand(batch, 1, seq, t + spare)
    return (
        torch.randn(batch, HEADS, seq, SIZE),
        torch.randn(batch, KV_HEADS, t, SIZE),
        torch.randn(batch, KV_HEADS, t, SIZE),
        mask.contiguous(),
    )


def _export(torch, form: str) -> tuple[object, onnx.ModelProto]:
    module = _module(torch, form)
    axes = {"q": {0: "b", 2: "s"}, "k": {0: "b", 2: "t"}, "v": {0: "b", 2: "t"}, "mask": {0: "b", 2: "s", 3: "m"}}
    model = _torchscript(torch, module, _args(torch, 2, 5, 0, 2), NAMES, ["o"], axes)
    return module, model


@pytest.mark.parametrize("form", ["eager", "sdpa"])
def test_repeat_kv_read_for_the_mask_size_folds_and_goes(form: str) -> None:
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    torch.manual_seed(0)
    module, model = _export(torch, form)
    exported = collections.Counter(n.op_type for n in model.graph.node)
    assert exported["Expand"] >= 2 and exported["Shape"] >= 9  # the chains, and their shapes read
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    (attention,) = [n for n in graph.nodes if n.op_type == "Attention"]
    assert attention.attrs["kv_repeat"] == 1 and attention.inputs[1:3] == ["k", "v"]
    assert not {"Unsqueeze", "Expand", "Reshape", "Softmax", "MatMul"} & set(ops)
    session = onnxpy.InferenceSession(model.SerializeToString())
    # prompts of several lengths (sdpa's causal mask needs as many keys as queries), and for the
    # eager form decoder steps after a cache too; the first shapes again: the memo follows them
    steps = [(2, 5, 0), (1, 3, 0), (2, 1, 6), (1, 2, 4), (2, 5, 0)]
    for batch, seq, past in steps if form == "eager" else [s for s in steps if not s[2]]:
        args = _args(torch, batch, seq, past, spare=3)
        feeds = {n: a.numpy() for n, a in zip(NAMES, args)}
        with torch.no_grad():
            want = module(*args).numpy()
        np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)
        assert_optimized_matches(model, feeds, rtol=1e-5, atol=1e-5)
