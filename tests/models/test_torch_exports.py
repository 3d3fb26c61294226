"""The transformer fusions on what torch's TorchScript exporter actually writes (the zoo's
builders imitate it): transformers' Conv1D and NewGELU, and nn.GELU(approximate="tanh"). Needs
torch, which CI installs only from a local wheel folder."""

from __future__ import annotations

import collections
import io
import math
import warnings

import numpy as np
import onnx
import pytest

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches

TORCH_REASON = "torch is not installed (these tests export torch modules)"


def _torchscript(torch, module, args, input_names, output_names, dynamic_axes) -> onnx.ModelProto:
    """``module`` exported by torch's TorchScript exporter (dynamo=False) at opset 17."""
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module, args, f, input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes,
            opset_version=17, dynamo=False,
        )  # fmt: skip
    return onnx.load_from_string(f.getvalue())


def _conv1d(torch) -> type:
    """transformers.pytorch_utils.Conv1D: addmm(bias, x.view(-1, nx), weight).view(..., nf)."""

    class Conv1D(torch.nn.Module):
        def __init__(self, nf: int, nx: int) -> None:
            super().__init__()
            self.nf = nf
            self.weight = torch.nn.Parameter(torch.randn(nx, nf) * 0.2)
            self.bias = torch.nn.Parameter(torch.randn(nf) * 0.1)

        def forward(self, x):
            size_out = x.size()[:-1] + (self.nf,)
            return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)

    return Conv1D


def _gpt2_mlp_export(torch) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    class NewGELU(torch.nn.Module):  # transformers.activations.NewGELUActivation
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    Conv1D = _conv1d(torch)

    class MLP(torch.nn.Module):  # GPT2MLP, plus torch's own tanh GELU on the residual
        def __init__(self) -> None:
            super().__init__()
            self.c_fc, self.act, self.c_proj = Conv1D(64, 16), NewGELU(), Conv1D(16, 64)
            self.tanh_gelu = torch.nn.GELU(approximate="tanh")

        def forward(self, x):
            return self.c_proj(self.act(self.c_fc(x))) + self.tanh_gelu(x)

    torch.manual_seed(0)
    mlp = MLP().eval()
    x = torch.randn(2, 5, 16) * 2
    model = _torchscript(torch, mlp, (x,), input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "b", 1: "s"}})
    with torch.no_grad():
        want = mlp(x).numpy()
    return model, x.numpy(), want


def test_torchscript_export_of_gpt2_mlp_fuses_to_two_products() -> None:
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    model, x, want = _gpt2_mlp_export(torch)
    exported = collections.Counter(n.op_type for n in model.graph.node)
    assert exported["Gemm"] == 2 and exported["Reshape"] >= 4 and exported["Tanh"] == 2
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    fused = sorted((n.op_type, n.attrs.get("activation", "")) for n in graph.nodes)
    # c_fc with NewGELU as its activation, c_proj with the residual (torch's tanh GELU of x)
    assert fused == [("FusedMatMul", ""), ("FusedMatMul", "GeluTanh"), ("GeluTanh", "")]
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # another batch and length: the same as the unfused graph and onnxruntime
    assert_optimized_matches(model, {"x": np.ascontiguousarray(x[:1, :3])}, rtol=1e-5, atol=1e-5)


def _gpt2_attention_export(torch) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    """transformers' GPT2Attention with past: Conv1D qkv, split_heads by view + permute, the past
    keys and values concatenated in front (returned as present), the scores divided by a
    traced sqrt(head size), a mask added, heads merged back, Conv1D out."""
    d, h = 32, 4

    Conv1D = _conv1d(torch)

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn, self.c_proj = Conv1D(3 * d, d), Conv1D(d, d)

        def split_heads(self, t):
            return t.view(t.size()[:-1] + (h, d // h)).permute(0, 2, 1, 3)

        def forward(self, x, past_key, past_value, mask):
            q, k, v = self.c_attn(x).split(d, dim=2)
            q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
            k, v = torch.cat((past_key, k), dim=-2), torch.cat((past_value, v), dim=-2)
            w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], (d // h) ** 0.5)
            w = torch.nn.functional.softmax(w + mask, dim=-1)
            o = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
            return self.c_proj(o.view(o.size()[:-2] + (d,))), k, v

    torch.manual_seed(1)
    attn = Attention().eval()
    args = (torch.randn(1, 1, d), torch.randn(1, h, 6, d // h), torch.randn(1, h, 6, d // h), torch.zeros(1, 1, 1, 7))
    names = ["x", "past_key", "past_value", "mask"]
    model = _torchscript(
        torch,
        attn,
        args,
        input_names=names,
        output_names=["y", "present_key", "present_value"],
        dynamic_axes={
            "x": {0: "b", 1: "s"},
            "past_key": {0: "b", 2: "p"},
            "past_value": {0: "b", 2: "p"},
            "mask": {0: "b", 2: "s", 3: "t"},
        },
    )
    with torch.no_grad():
        want = [t.numpy() for t in attn(*args)]
    return model, {n: a.numpy() for n, a in zip(names, args)}, want


def test_torchscript_export_of_gpt2_attention_with_past_fuses() -> None:
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    model, feeds, want = _gpt2_attention_export(torch)
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    # the present keys and values: new heads appended to the past ones in one step each
    assert ops["Attention"] == 1 and ops["FusedMatMul"] == 2 and ops["AppendHeads"] == 2 and "Concat" not in ops
    assert not {"Softmax", "MatMul", "Gemm", "Div"} & set(ops)
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_torchscript_exports_of_rms_norms_fuse() -> None:
    """transformers' LlamaRMSNorm (a float32 cast around it) and T5LayerNorm: one
    RMSNormalization each, matching torch."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)

    class LlamaRMSNorm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.rand(16) + 0.5), 1e-6

        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)

    class T5LayerNorm(LlamaRMSNorm):
        def forward(self, hidden_states):
            variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
            return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    torch.manual_seed(2)
    x = torch.randn(2, 3, 16) * 3
    for module in (LlamaRMSNorm().eval(), T5LayerNorm().eval()):
        model = _torchscript(
            torch, module, (x,), input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "b", 1: "s"}}
        )
        graph = build_graph(model)
        optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
        assert [n.op_type for n in graph.nodes] == ["RMSNormalization"], type(module).__name__
        with torch.no_grad():
            want = module(x).numpy()
        got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": x.numpy()})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_torchscript_export_of_llama_rotary_embedding_fuses() -> None:
    """transformers' apply_rotary_pos_emb with rotate_half, its split point x.shape[-1] // 2
    traced from Shape: one RotaryHalf for q and one for k, matching torch."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)

    def rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    class Rotary(torch.nn.Module):
        def forward(self, q, k, cos, sin):
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)

    torch.manual_seed(3)
    args = (torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 5, 8), torch.randn(1, 5, 8))
    names = ["q", "k", "cos", "sin"]
    model = _torchscript(
        torch,
        Rotary(),
        args,
        input_names=names,
        output_names=["q_embed", "k_embed"],
        dynamic_axes={"q": {0: "b", 2: "s"}, "k": {0: "b", 2: "s"}, "cos": {0: "b", 1: "s"}, "sin": {0: "b", 1: "s"}},
    )
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    assert sorted(n.op_type for n in graph.nodes) == ["RotaryHalf", "RotaryHalf", "Unsqueeze", "Unsqueeze"]
    with torch.no_grad():
        want = [t.numpy() for t in Rotary()(*args)]
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {n: a.numpy() for n, a in zip(names, args)})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sdpa", [False, True], ids=["eager", "sdpa"])
def test_torchscript_export_of_a_llama_block_with_past(sdpa: bool) -> None:
    """A Llama decoder layer as transformers writes it (RMS norms, bias-free projections, rotary
    embedding, grouped-query attention with repeat_kv over past keys and values, SwiGLU MLP),
    one token after 6 cached: 230 exported nodes run as about 30, matching torch. ``sdpa``:
    transformers' default attention, F.scaled_dot_product_attention, whose scale torch computes
    from the rotary output's shape (folded here: its head size is static)."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    d, heads, kv_heads, hd, inter = 64, 4, 2, 16, 96

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    def repeat_kv(x, n):
        b, kvh, s, size = x.shape
        return x[:, :, None, :, :].expand(b, kvh, n, s, size).reshape(b, kvh * n, s, size)

    class RMSNorm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(d) + 0.5)

        def forward(self, h):
            h32 = h.to(torch.float32)
            return self.weight * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = RMSNorm(), RMSNorm()
            linear = torch.nn.Linear
            self.q, self.k, self.v = (
                linear(d, heads * hd, False),
                linear(d, kv_heads * hd, False),
                linear(d, kv_heads * hd, False),
            )
            self.o = linear(heads * hd, d, False)
            self.gate, self.up, self.down = linear(d, inter, False), linear(d, inter, False), linear(inter, d, False)

        def forward(self, x, cos, sin, mask, past_key, past_value):
            b, s, _ = x.shape
            h = self.norm1(x)
            q = self.q(h).view(b, s, heads, hd).transpose(1, 2)
            k = self.k(h).view(b, s, kv_heads, hd).transpose(1, 2)
            v = self.v(h).view(b, s, kv_heads, hd).transpose(1, 2)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k, v = torch.cat((past_key, k), dim=-2), torch.cat((past_value, v), dim=-2)
            k_rep, v_rep = repeat_kv(k, heads // kv_heads), repeat_kv(v, heads // kv_heads)
            if sdpa:
                o = torch.nn.functional.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask)
            else:
                w = torch.matmul(q, k_rep.transpose(2, 3)) / math.sqrt(hd) + mask
                o = torch.matmul(torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v_rep)
            o = o.transpose(1, 2).contiguous().reshape(b, s, -1)
            x = x + self.o(o)
            h = self.norm2(x)
            return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h)), k, v

    torch.manual_seed(4)
    layer = Layer().eval()
    past = 6
    args = (
        torch.randn(1, 1, d), torch.randn(1, 1, hd), torch.randn(1, 1, hd), torch.zeros(1, 1, 1, past + 1),
        torch.randn(1, kv_heads, past, hd), torch.randn(1, kv_heads, past, hd),
    )  # fmt: skip
    names = ["x", "cos", "sin", "mask", "past_key", "past_value"]
    model = _torchscript(
        torch,
        layer,
        args,
        input_names=names,
        output_names=["y", "present_key", "present_value"],
        dynamic_axes={
            "x": {0: "b", 1: "s"},
            "cos": {0: "b", 1: "s"},
            "sin": {0: "b", 1: "s"},
            "mask": {0: "b", 2: "s", 3: "t"},
            "past_key": {0: "b", 2: "p"},
            "past_value": {0: "b", 2: "p"},
        },
    )
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    assert ops["Attention"] == 1 and ops["RMSNormalization"] == 2 and ops["RotaryHalf"] == 2
    assert not {"Softmax", "Sqrt", "Neg", "Sigmoid", "Add", "Expand"} & set(ops)  # residuals in the products
    assert ops["GatedMatMul"] == 1 and next(n for n in graph.nodes if n.op_type == "Attention").attrs["kv_repeat"]
    assert len(graph.nodes) < len(model.graph.node) // 6
    with torch.no_grad():
        want = [t.numpy() for t in layer(*args)]
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {n: a.numpy() for n, a in zip(names, args)})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_torchscript_export_of_scaled_dot_product_attention_fuses(mask: str) -> None:
    """timm's fused attention (F.scaled_dot_product_attention on one packed projection split by
    Reshape, Permute and unbind): torch writes the scale as sqrt(1 / sqrt(q.shape[-1])) on Q and
    on K^T, computed from Shape; it folds (the head size is static) and the attention fuses,
    with no mask, a causal one, a boolean one and an additive one, matching torch."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    d, heads = 32, 4

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

        def forward(self, x, attn_mask=None):
            b, n, c = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4).unbind(0)
            f = torch.nn.functional.scaled_dot_product_attention
            o = f(q, k, v, is_causal=True) if mask == "causal" else f(q, k, v, attn_mask=attn_mask)
            return self.proj(o.transpose(1, 2).reshape(b, n, c))

    torch.manual_seed(5)
    module = Attention().eval()
    x = torch.randn(2, 7, d)
    args, names, axes = (x,), ["x"], {"x": {0: "b", 1: "n"}}
    if mask in ("bool", "float"):
        m = torch.rand(2, 1, 7, 7) > 0.3 if mask == "bool" else torch.randn(2, 1, 7, 7)
        args, names, axes = (x, m), ["x", "mask"], {**axes, "mask": {0: "b", 2: "n", 3: "n"}}
    model = _torchscript(torch, module, args, input_names=names, output_names=["y"], dynamic_axes=axes)
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    assert ops["Attention"] == 1 and not {"Softmax", "MatMul", "Sqrt"} & set(ops), dict(ops)
    with torch.no_grad():
        want = module(*args).numpy()
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {n: a.numpy() for n, a in zip(names, args)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _gpt2_sdpa_block(torch, d: int, heads: int):
    f = torch.nn.functional

    class Block(torch.nn.Module):
        """transformers' GPT2SdpaAttention and MLP: c_attn split, heads by view + permute,
        scaled_dot_product_attention(is_causal=True), tanh GELU."""

        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.c_attn, self.c_proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.fc, self.proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.c_attn(self.ln1(x)).split(d, dim=2)

            def split(t):
                return t.view(b, n, heads, d // heads).permute(0, 2, 1, 3)

            o = f.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
            x = x + self.c_proj(o.transpose(1, 2).contiguous().view(b, n, d))
            return x + self.proj(f.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    return Block()


def _t5_layer(torch, d: int, heads: int):
    f = torch.nn.functional

    class Layer(torch.nn.Module):
        """T5 v1.1's encoder layer: T5LayerNorm, attention without a scale plus a position
        bias, softmax in float32, gated-GELU feed-forward (wi_0, wi_1, wo)."""

        def __init__(self) -> None:
            super().__init__()
            self.w1, self.w2 = torch.nn.Parameter(torch.rand(d) + 0.5), torch.nn.Parameter(torch.rand(d) + 0.5)
            self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d, False) for _ in range(4))
            self.wi0, self.wi1, self.wo = (
                torch.nn.Linear(d, 2 * d, False),
                torch.nn.Linear(d, 2 * d, False),
                torch.nn.Linear(2 * d, d, False),
            )

        def norm(self, x, w):
            return w * (x * torch.rsqrt(x.to(torch.float32).pow(2).mean(-1, keepdim=True) + 1e-6))

        def forward(self, x, position_bias):
            b = x.shape[0]

            def split(t):
                return t.view(b, -1, heads, d // heads).transpose(1, 2)

            h = self.norm(x, self.w1)
            q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
            scores = torch.matmul(q, k.transpose(3, 2)) + position_bias
            w = f.softmax(scores.float(), dim=-1).type_as(scores)
            x = x + self.o(torch.matmul(w, v).transpose(1, 2).contiguous().view(b, -1, d))
            h = self.norm(x, self.w2)
            return x + self.wo(f.gelu(self.wi0(h), approximate="tanh") * self.wi1(h))

    return Layer()


def _whisper_encoder_layer(torch, d: int, heads: int):
    f = torch.nn.functional

    class Layer(torch.nn.Module):
        """Whisper's encoder layer: pre-LayerNorm, q/v with bias and k without, SDPA with an
        explicit scale, erf GELU."""

        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (
                torch.nn.Linear(d, d), torch.nn.Linear(d, d, False), torch.nn.Linear(d, d), torch.nn.Linear(d, d),
            )  # fmt: skip
            self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            b, n, _ = x.shape

            def split(t):
                return t.view(b, n, heads, d // heads).transpose(1, 2)

            h = self.ln1(x)
            o = f.scaled_dot_product_attention(
                split(self.q(h)), split(self.k(h)), split(self.v(h)), scale=(d // heads) ** -0.5
            )
            x = x + self.o(o.transpose(1, 2).reshape(b, n, d))
            return x + self.fc2(f.gelu(self.fc1(self.ln2(x))))

    return Layer()


@pytest.mark.parametrize("arch", ["gpt2_sdpa", "t5", "whisper_encoder"])
def test_torchscript_exports_of_other_transformer_layers_fuse(arch: str) -> None:
    """GPT-2's SDPA attention (its causal mask sized from the keys through a permute the
    product reads merged with the transpose), T5 v1.1's layer (position bias, gated GELU) and
    Whisper's encoder layer: one Attention each (and T5's feed-forward one GatedMatMul),
    matching torch."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    d, heads = 64, 4
    torch.manual_seed(6)
    x = torch.randn(2, 9, d)
    args, names, axes = (x,), ["x"], {"x": {0: "b", 1: "n"}}
    if arch == "gpt2_sdpa":
        module = _gpt2_sdpa_block(torch, d, heads)
    elif arch == "t5":
        module = _t5_layer(torch, d, heads)
        args, names = (x, torch.randn(1, heads, 9, 9)), ["x", "position_bias"]
        axes["position_bias"] = {2: "n", 3: "n"}
    else:
        module = _whisper_encoder_layer(torch, d, heads)
    module.eval()
    model = _torchscript(torch, module, args, input_names=names, output_names=["y"], dynamic_axes=axes)
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    assert ops["Attention"] == 1 and not {"Softmax", "MatMul", "Mul"} & set(ops), dict(ops)
    assert ops["GatedMatMul"] == (1 if arch == "t5" else 0)
    with torch.no_grad():
        want = module(*args).numpy()
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {n: a.numpy() for n, a in zip(names, args)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_torchscript_export_of_phi3_mlp_is_one_gated_product() -> None:
    """Phi-3's MLP: gate_up_proj, chunk(2), up * silu(gate), down_proj: two products, matching torch."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up, self.down = torch.nn.Linear(32, 96, False), torch.nn.Linear(48, 32, False)

        def forward(self, x):
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(up * torch.nn.functional.silu(gate))

    torch.manual_seed(7)
    module, x = Mlp().eval(), torch.randn(2, 5, 32)
    model = _torchscript(
        torch, module, (x,), input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "b", 1: "n"}}
    )
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    assert sorted(n.op_type for n in graph.nodes) == ["GatedMatMul", "MatMul"]
    with torch.no_grad():
        want = module(x).numpy()
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_torchscript_export_of_distilbert_attention_fuses() -> None:
    """DistilBERT's attention: q divided by sqrt(d), masked_fill of the scores where the padding
    mask is 0 (its condition expanded to the scores' shape), softmax: one Attention, matching
    torch."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    d, heads = 32, 4

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.out = (torch.nn.Linear(d, d) for _ in range(4))

        def forward(self, x, mask):
            bs, n, _ = x.shape

            def shape(t):
                return t.view(bs, -1, heads, d // heads).transpose(1, 2)

            q = shape(self.q(x)) / math.sqrt(d // heads)
            scores = torch.matmul(q, shape(self.k(x)).transpose(2, 3))
            hidden = (mask == 0).view(bs, 1, 1, n).expand_as(scores)
            scores = scores.masked_fill(hidden, torch.tensor(torch.finfo(scores.dtype).min))
            w = torch.nn.functional.softmax(scores, dim=-1)
            return self.out(torch.matmul(w, shape(self.v(x))).transpose(1, 2).contiguous().view(bs, -1, d))

    torch.manual_seed(8)
    module = Attention().eval()
    x, mask = torch.randn(2, 7, d), torch.ones(2, 7, dtype=torch.int64)
    mask[1, 5:] = 0
    axes = {"x": {0: "b", 1: "n"}, "mask": {0: "b", 1: "n"}}
    model = _torchscript(torch, module, (x, mask), input_names=["x", "mask"], output_names=["y"], dynamic_axes=axes)
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    assert ops["Attention"] == 1 and not {"Softmax", "Where", "Expand", "MatMul"} & set(ops), dict(ops)
    with torch.no_grad():
        want = module(x, mask).numpy()
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": x.numpy(), "mask": mask.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _bmm_attention(torch, d: int, heads: int, form: str):
    """transformers' attention over (batch * heads, seq, size) tensors with torch.bmm (BART,
    Marian, OPT, CLIP before 4.48): the query scaled before the head split, the mask added on
    a 4-D view of the scores, OPT's clamp at the float minimum ("opt"), no mask ("nomask"), or
    a decoder step whose keys and values follow the past ones and are returned ("past")."""
    size = d // heads

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.out = (torch.nn.Linear(d, d) for _ in range(4))

        def _shape(self, t, seq, bsz):
            return t.view(bsz, seq, heads, size).transpose(1, 2).contiguous()

        def forward(self, x, mask, past_key=None, past_value=None):
            bsz, tgt, _ = x.size()
            q = self.q(x) * size**-0.5
            k, v = self._shape(self.k(x), -1, bsz), self._shape(self.v(x), -1, bsz)
            if past_key is not None:
                k, v = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
            present = (k, v)
            proj = (bsz * heads, -1, size)
            q = self._shape(q, tgt, bsz).view(*proj)
            k, v = k.reshape(*proj), v.reshape(*proj)
            src = k.size(1)
            w = torch.bmm(q, k.transpose(1, 2))
            if form != "nomask":
                w = w.view(bsz, heads, tgt, src) + mask
                if form == "opt":
                    w = torch.max(w, torch.tensor(torch.finfo(w.dtype).min))
                w = w.view(bsz * heads, tgt, src)
            o = torch.bmm(torch.nn.functional.softmax(w, dim=-1), v)
            o = o.view(bsz, heads, tgt, size).transpose(1, 2).reshape(bsz, tgt, d)
            return (self.out(o), *present) if past_key is not None else self.out(o)

    return Attention()


@pytest.mark.parametrize("form", ["bart", "opt", "nomask", "past"])
def test_torchscript_export_of_bmm_attention_fuses(form: str) -> None:
    """Attention written with bmm over (batch * heads, seq, size) (BART, OPT, Marian, CLIP
    before transformers 4.48): one Attention reading the projections (the query's scale and
    the Reshapes to and from 3-D folded, OPT's clamp kept as the kernel's floor), matching torch
    at the exported shapes and at others (one session, three runs)."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    d, heads = 32, 4
    torch.manual_seed(9)
    module = _bmm_attention(torch, d, heads, form).eval()

    def feeds(b: int, n: int, past: int) -> tuple:
        past = past if form == "past" else 0
        mask = torch.zeros(b, 1, n, n + past)
        mask[..., past + 1 :] = torch.finfo(torch.float32).min  # causal from the first new token
        mask[-1, ..., : min(2, n + past - 1)] = torch.finfo(torch.float32).min  # left padding
        if form == "opt":
            mask[0, :, 0] = -torch.inf  # a row hidden entirely: OPT's clamp makes it uniform, not NaN
        args = (torch.randn(b, n, d), mask)
        if form == "past":
            args += (torch.randn(b, heads, past, d // heads), torch.randn(b, heads, past, d // heads))
        return args

    names = ["x", "mask", "past_key", "past_value"][: 4 if form == "past" else 2]
    axes = {"x": {0: "b", 1: "n"}, "mask": {0: "b", 2: "n", 3: "t"}}
    outputs = ["y"]
    if form == "past":
        axes |= {"past_key": {0: "b", 2: "p"}, "past_value": {0: "b", 2: "p"}}
        outputs += ["present_key", "present_value"]
    model = _torchscript(torch, module, feeds(2, 5, 3), names, outputs, axes)
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    assert ops["Attention"] == 1 and not {"Softmax", "MatMul", "Max", "Mul"} & set(ops), dict(ops)
    fused = next(n for n in graph.nodes if n.op_type == "Attention")
    assert fused.attrs["merged_heads"] == 1 and fused.attrs.get("floored", 0) == (form == "opt")
    session = onnxpy.InferenceSession(model.SerializeToString())
    for b, n, past in ((2, 5, 3), (1, 1, 6), (3, 4, 2)):
        args = feeds(b, n, past)
        with torch.no_grad():
            want = module(*args)
        inputs = {i.name for i in session.get_inputs()}  # "nomask": the mask is not read
        got = session.run(None, {k: a.numpy() for k, a in zip(names, args) if k in inputs})
        for g, w in zip(got, want if form == "past" else (want,), strict=True):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)


def test_torchscript_export_of_gpt_neo_attention_with_a_sliced_causal_buffer_fuses() -> None:
    """GPT-Neo's _attn: per-head q, k, v (its keys after the past ones), the bool causal buffer
    sliced to [k.size(-2) - q.size(-2) : k.size(-2)] (a Shape node reads the queries too), the
    Where, the additive mask: one Attention, matching torch at two shapes."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    heads, size, longest = 4, 8, 32

    class Core(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            causal = torch.tril(torch.ones(longest, longest, dtype=torch.bool)).view(1, 1, longest, longest)
            self.register_buffer("bias", causal, persistent=False)

        def forward(self, q, k, v, attention_mask):
            ql, kl = q.size(-2), k.size(-2)
            w = torch.matmul(q, k.transpose(-1, -2))
            w = torch.where(self.bias[:, :, kl - ql : kl, :kl], w, torch.tensor(torch.finfo(w.dtype).min))
            return torch.matmul(torch.nn.functional.softmax(w + attention_mask, dim=-1), v)

    def feeds(b: int, s: int, past: int) -> tuple:
        mask = torch.zeros(b, 1, 1, past + s)
        mask[-1, ..., :2] = torch.finfo(torch.float32).min
        return (torch.randn(b, heads, s, size), *(torch.randn(b, heads, past + s, size) for _ in range(2)), mask)

    torch.manual_seed(10)
    module, names = Core().eval(), ["q", "k", "v", "attention_mask"]
    axes = {"q": {0: "b", 2: "s"}, "k": {0: "b", 2: "t"}, "v": {0: "b", 2: "t"}, "attention_mask": {0: "b", 3: "t"}}
    model = _torchscript(torch, module, feeds(2, 3, 5), names, ["o"], axes)
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    assert ops["Attention"] == 1 and not {"Softmax", "MatMul", "Where"} & set(ops), dict(ops)
    session = onnxpy.InferenceSession(model.SerializeToString())
    for shape in ((2, 3, 5), (1, 1, 9)):
        args = feeds(*shape)
        with torch.no_grad():
            want = module(*args).numpy()
        got = session.run(None, {n: a.numpy() for n, a in zip(names, args)})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("order", ["bias_then_mask", "mask_then_bias"])
def test_torchscript_export_of_attention_with_two_additive_terms_fuses(order: str) -> None:
    """Scores plus a relative-position bias, then plus a padding mask (Swin before its 5-D view,
    BEiT, T5 encoders), each its own Add: one Attention adding their sum, matching torch."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    d, heads, n = 32, 4, 9

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.register_buffer("rel_bias", torch.randn(1, heads, n, n))

        def forward(self, x, mask):
            b, t, c = x.shape
            q, k, v = self.qkv(x).reshape(b, t, 3, heads, c // heads).permute(2, 0, 3, 1, 4).unbind(0)
            attn = (q * (c // heads) ** -0.5) @ k.transpose(-2, -1)
            first, second = (self.rel_bias, mask) if order == "bias_then_mask" else (mask, self.rel_bias)
            attn = (attn + first) + second
            return self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c))

    torch.manual_seed(11)
    module = Block().eval()
    x, mask = torch.randn(2, n, d), torch.zeros(2, 1, 1, n)
    mask[1, ..., 6:] = -1e4
    model = _torchscript(torch, module, (x, mask), ["x", "mask"], ["y"], {"x": {0: "b"}, "mask": {0: "b"}})
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    assert ops["Attention"] == 1 and ops["Add"] == 1 and not {"Softmax", "MatMul"} & set(ops), dict(ops)
    with torch.no_grad():
        want = module(x, mask).numpy()
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": x.numpy(), "mask": mask.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["minus_one", "divided", "multihead"])
def test_torchscript_export_of_sdpa_with_a_computed_head_size_fuses(form: str) -> None:
    """torch's SDPA export takes its default scale from q's last dimension at run time; where
    the exporter computed the head size (timm BEiT's reshape(..., -1), C // heads,
    nn.MultiheadAttention) the optimizer cannot fold it, and the Attention multiplies its scale
    by that factor per run: one Attention, matching torch at two batch sizes."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    d, heads = 32, 4

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.mha = torch.nn.MultiheadAttention(d, heads, batch_first=True)

        def forward(self, x):
            if form == "multihead":
                return self.mha(x, x, x, need_weights=False)[0]
            b, n, c = x.shape
            size = -1 if form == "minus_one" else c // heads
            q, k, v = self.qkv(x).reshape(b, n, 3, heads, size).permute(2, 0, 3, 1, 4).unbind(0)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return self.proj(o.transpose(1, 2).reshape(b, n, c))

    torch.manual_seed(12)
    module = Block().eval()
    model = _torchscript(torch, module, (torch.randn(2, 7, d),), ["x"], ["y"], {"x": {0: "b", 1: "n"}})
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes)
    assert ops["Attention"] == 1 and not {"Softmax", "MatMul", "Mul"} & set(ops), dict(ops)
    session = onnxpy.InferenceSession(model.SerializeToString())
    # (torch's export of nn.MultiheadAttention keeps the traced sizes as constants)
    for b, n in ((2, 7), (2, 7) if form == "multihead" else (1, 11)):
        x = torch.randn(b, n, d)
        with torch.no_grad():
            want = module(x).numpy()
        np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], want, rtol=1e-5, atol=1e-6)
