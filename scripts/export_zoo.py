"""Developer script: export small torch versions of the zoo's architectures with torch.onnx and
check them in onnxpy against onnxruntime. Not a test (tests never need torch).

It cross-checks tests/models/zoo.py: the op histogram of each real export is printed beside
that of the hand-built model, and the real exports themselves run through onnxpy.

    python scripts/export_zoo.py --out /tmp/zoo_torch            # export + compare
    python scripts/export_zoo.py --out /tmp/zoo_torch --only bert

Needs torch (and onnxscript for the dynamo exporter) in the running interpreter, plus onnxpy
and onnxruntime importable (PYTHONPATH=<repo>). torchvision/transformers are not needed: the
modules are defined here after their upstream structure. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _modules():  # noqa: C901 - one place for all torch definitions, imported lazily
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, cin: int, planes: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or cin != planes:
                self.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(y)) + idt)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, planes: int, stride: int) -> None:
            super().__init__()
            out = planes * 4
            self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != out:
                self.downsample = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + idt)

    class ResNet(nn.Module):
        def __init__(self, block, layers) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            cin = 8
            for i, (planes, n) in enumerate(zip((8, 16, 32, 64), layers)):
                blocks = []
                for j in range(n):
                    blocks.append(block(cin, planes, 2 if (j == 0 and i > 0) else 1))
                    cin = planes * block.expansion
                setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(cin, 10)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    class SE(nn.Module):
        def __init__(self, c: int, sq: int, act, scale_act) -> None:
            super().__init__()
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc1 = nn.Conv2d(c, sq, 1)
            self.fc2 = nn.Conv2d(sq, c, 1)
            self.activation = act()
            self.scale_activation = scale_act()

        def forward(self, x):
            s = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
            return s * x

    def cna(cin, cout, k, stride=1, groups=1, act=None):
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act())
        return nn.Sequential(*layers)

    class InvertedResidual(nn.Module):
        def __init__(self, cin, k, exp, cout, se, act, stride) -> None:
            super().__init__()
            act_layer = nn.Hardswish if act == "HS" else nn.ReLU
            layers = []
            if exp != cin:
                layers.append(cna(cin, exp, 1, act=act_layer))
            layers.append(cna(exp, exp, k, stride, exp, act=act_layer))
            if se:
                sq = max(8, int(exp // 4 + 4) // 8 * 8)
                layers.append(SE(exp, sq, nn.ReLU, nn.Hardsigmoid))
            layers.append(cna(exp, cout, 1))
            self.block = nn.Sequential(*layers)
            self.use_res = stride == 1 and cin == cout

        def forward(self, x):
            y = self.block(x)
            return y + x if self.use_res else y

    class MobileNetV3(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            cfg = [
                (16, 3, 16, 16, True, "RE", 2),
                (16, 3, 48, 24, False, "RE", 2),
                (24, 3, 56, 24, False, "RE", 1),
                (24, 5, 64, 32, True, "HS", 2),
                (32, 5, 96, 32, True, "HS", 1),
            ]
            feats = [cna(3, 16, 3, 2, act=nn.Hardswish)] + [InvertedResidual(*c) for c in cfg]
            feats.append(cna(32, 192, 1, act=nn.Hardswish))
            self.features = nn.Sequential(*feats)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Linear(192, 128), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(128, 10))

        def forward(self, x):
            return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))

    class MBConv(nn.Module):
        def __init__(self, expand, k, stride, cin, cout) -> None:
            super().__init__()
            exp = cin * expand
            layers = []
            if exp != cin:
                layers.append(cna(cin, exp, 1, act=nn.SiLU))
            layers.append(cna(exp, exp, k, stride, exp, act=nn.SiLU))
            layers.append(SE(exp, max(1, cin // 4), nn.SiLU, nn.Sigmoid))
            layers.append(cna(exp, cout, 1))
            self.block = nn.Sequential(*layers)
            self.use_res = stride == 1 and cin == cout

        def forward(self, x):
            y = self.block(x)
            return y + x if self.use_res else y

    class EfficientNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            feats = [cna(3, 16, 3, 2, act=nn.SiLU)]
            for expand, k, stride, cin, cout, n in [(1, 3, 1, 16, 8, 1), (6, 3, 2, 8, 16, 2), (6, 5, 2, 16, 24, 1)]:
                feats.append(
                    nn.Sequential(
                        *[MBConv(expand, k, stride if i == 0 else 1, cin if i == 0 else cout, cout) for i in range(n)]
                    )
                )
            feats.append(cna(24, 96, 1, act=nn.SiLU))
            self.features = nn.Sequential(*feats)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(96, 10))

        def forward(self, x):
            return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))

    class BertSelfAttention(nn.Module):
        def __init__(self, hid: int, heads: int) -> None:
            super().__init__()
            self.h, self.d = heads, hid // heads
            self.query, self.key, self.value = nn.Linear(hid, hid), nn.Linear(hid, hid), nn.Linear(hid, hid)

        def split(self, x):
            return x.view(x.size()[:-1] + (self.h, self.d)).permute(0, 2, 1, 3)

        def forward(self, x, mask):
            q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
            s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d) + mask
            c = torch.matmul(F.softmax(s, dim=-1), v).permute(0, 2, 1, 3).contiguous()
            return c.view(c.size()[:-2] + (self.h * self.d,))

    class BertLayer(nn.Module):
        def __init__(self, hid: int, heads: int, inter: int) -> None:
            super().__init__()
            self.attention = nn.Module()
            self.attention.self = BertSelfAttention(hid, heads)
            self.attention.output = nn.Module()
            self.attention.output.dense = nn.Linear(hid, hid)
            self.attention.output.LayerNorm = nn.LayerNorm(hid, eps=1e-12)
            self.intermediate = nn.Linear(hid, inter)
            self.output = nn.Linear(inter, hid)
            self.LayerNorm = nn.LayerNorm(hid, eps=1e-12)

        def forward(self, x, mask):
            a = self.attention.self(x, mask)
            x = self.attention.output.LayerNorm(self.attention.output.dense(a) + x)
            return self.LayerNorm(self.output(F.gelu(self.intermediate(x))) + x)

    class Bert(nn.Module):
        def __init__(self, vocab=100, hid=32, heads=4, layers=2, inter=64, max_pos=64) -> None:
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, hid)
            self.position_embeddings = nn.Embedding(max_pos, hid)
            self.token_type_embeddings = nn.Embedding(2, hid)
            self.LayerNorm = nn.LayerNorm(hid, eps=1e-12)
            self.register_buffer("position_ids", torch.arange(max_pos).expand((1, -1)), persistent=False)
            self.layer = nn.ModuleList([BertLayer(hid, heads, inter) for _ in range(layers)])
            self.pooler = nn.Linear(hid, hid)

        def forward(self, input_ids, attention_mask, token_type_ids):
            seq = input_ids.size(1)
            pos = self.position_ids[:, 0:seq]
            x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
            x = self.LayerNorm(x + self.position_embeddings(pos))
            mask = attention_mask[:, None, None, :].to(x.dtype)
            mask = (1.0 - mask) * torch.finfo(x.dtype).min
            for layer in self.layer:
                x = layer(x, mask)
            return x, torch.tanh(self.pooler(x[:, 0]))

    class Conv1D(nn.Module):
        def __init__(self, nf: int, nx: int) -> None:
            super().__init__()
            self.nf = nf
            self.weight = nn.Parameter(torch.randn(nx, nf) * nx**-0.5)
            self.bias = nn.Parameter(torch.randn(nf) * 0.1)

        def forward(self, x):
            size_out = x.size()[:-1] + (self.nf,)
            return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    class GPT2Block(nn.Module):
        def __init__(self, d: int, heads: int, n_pos: int) -> None:
            super().__init__()
            self.h, self.hd, self.d = heads, d // heads, d
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.c_attn, self.c_proj = Conv1D(3 * d, d), Conv1D(d, d)
            self.c_fc, self.mlp_proj = Conv1D(4 * d, d), Conv1D(d, 4 * d)
            self.register_buffer(
                "bias", torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool))[None, None], persistent=False
            )

        def heads(self, x):
            return x.view(x.size()[:-1] + (self.h, self.hd)).permute(0, 2, 1, 3)

        def forward(self, x, pad):
            q, k, v = self.c_attn(self.ln_1(x)).split(self.d, dim=2)
            q, k, v = self.heads(q), self.heads(k), self.heads(v)
            w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
            ql, kl = q.size(-2), k.size(-2)
            causal = self.bias[:, :, kl - ql : kl, :kl]
            w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype)) + pad
            a = torch.matmul(F.softmax(w, dim=-1), v).permute(0, 2, 1, 3).contiguous()
            a = a.view(a.size()[:-2] + (self.d,))
            x = x + self.c_proj(a)
            return x + self.mlp_proj(gelu_new(self.c_fc(self.ln_2(x)))), k, v

    class GPT2(nn.Module):
        def __init__(self, vocab=100, d=32, heads=4, layers=2, n_pos=64) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(n_pos, d)
            self.h = nn.ModuleList([GPT2Block(d, heads, n_pos) for _ in range(layers)])
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, input_ids, attention_mask):
            pos = torch.arange(0, input_ids.size(-1), dtype=torch.long).unsqueeze(0)
            x = self.wte(input_ids) + self.wpe(pos)
            pad = attention_mask.view(input_ids.size(0), -1)[:, None, None, :].to(x.dtype)
            pad = (1.0 - pad) * torch.finfo(x.dtype).min
            presents = []
            for block in self.h:
                x, k, v = block(x, pad)
                presents += [k, v]
            return (self.lm_head(self.ln_f(x)), *presents)

    class ViTBlock(nn.Module):
        def __init__(self, d: int, heads: int, mlp: int) -> None:
            super().__init__()
            self.h, self.hd = heads, d // heads
            self.norm1, self.norm2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)

        def forward(self, x):
            b, n, c = x.shape
            qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            attn = ((q * self.hd**-0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
            x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))

    class ViT(nn.Module):
        def __init__(self, image=32, patch=8, d=32, heads=4, depth=2, mlp=64, classes=10) -> None:
            super().__init__()
            self.proj = nn.Conv2d(3, d, patch, patch)
            self.cls_token = nn.Parameter(torch.randn(1, 1, d) * 0.5)
            self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, d) * 0.5)
            self.blocks = nn.ModuleList([ViTBlock(d, heads, mlp) for _ in range(depth)])
            self.norm = nn.LayerNorm(d, eps=1e-6)
            self.head = nn.Linear(d, classes)

        def forward(self, x):
            x = self.proj(x).flatten(2).transpose(1, 2)
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
            for blk in self.blocks:
                x = blk(x)
            x = self.norm(x)
            return self.head(x[:, 0]), x

    def randomize(m: nn.Module) -> nn.Module:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for mod in m.modules():
                if isinstance(mod, nn.BatchNorm2d):
                    mod.running_mean.normal_(0, 0.1, generator=g)
                    mod.running_var.uniform_(0.5, 1.5, generator=g)
                    mod.weight.uniform_(0.5, 1.5, generator=g)
                    mod.bias.normal_(0, 0.1, generator=g)
                elif isinstance(mod, nn.LayerNorm):
                    mod.weight.uniform_(0.8, 1.2, generator=g)
                    mod.bias.normal_(0, 0.1, generator=g)
                elif isinstance(mod, nn.Embedding):
                    mod.weight.normal_(0, 0.5, generator=g)
        return m.eval()

    image = (torch.randn(2, 3, 64, 64),)
    text_bert = (torch.randint(0, 100, (2, 7)), torch.ones(2, 7, dtype=torch.long), torch.zeros(2, 7, dtype=torch.long))
    text_gpt = (torch.randint(0, 100, (2, 7)), torch.ones(2, 7, dtype=torch.long))
    img_axes = {"input": {0: "batch_size"}, "output": {0: "batch_size"}}
    bt = {0: "batch_size", 1: "sequence_length"}
    return {
        # name: (module, example args, input names, output names, dynamic axes)
        "resnet18": (randomize(ResNet(BasicBlock, (2, 1, 1, 1))), image, ["input"], ["output"], img_axes),
        "resnet50": (randomize(ResNet(Bottleneck, (1, 1, 1, 1))), image, ["input"], ["output"], img_axes),
        "mobilenet_v3": (randomize(MobileNetV3()), image, ["input"], ["output"], img_axes),
        "efficientnet": (randomize(EfficientNet()), image, ["input"], ["output"], img_axes),
        "bert": (
            randomize(Bert()),
            text_bert,
            ["input_ids", "attention_mask", "token_type_ids"],
            ["last_hidden_state", "pooler_output"],
            {"input_ids": bt, "attention_mask": bt, "token_type_ids": bt, "last_hidden_state": bt},
        ),
        "gpt2": (
            randomize(GPT2()),
            text_gpt,
            ["input_ids", "attention_mask"],
            ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"],
            {"input_ids": bt, "attention_mask": bt, "logits": bt},
        ),
        "vit": (
            randomize(ViT()),
            (torch.randn(2, 3, 32, 32),),
            ["pixel_values"],
            ["logits", "last_hidden_state"],
            {"pixel_values": {0: "batch_size"}, "logits": {0: "batch_size"}},
        ),
    }


def export_all(out: Path, only: list[str]) -> list[Path]:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (module, args, in_names, out_names, axes) in _modules().items():
        if only and not any(o in name for o in only):
            continue
        for opset in (14, 17):
            path = out / f"{name}_ts{opset}.onnx"
            torch.onnx.export(
                module, args, str(path), input_names=in_names, output_names=out_names,
                dynamic_axes=axes, opset_version=opset, dynamo=False,
            )  # fmt: skip
            written.append(path)
        path = out / f"{name}_dynamo18.onnx"
        # One Dim object per label, so batch/sequence are the same symbol in every input;
        # positional, since forward()'s argument names need not be the ONNX input names.
        shared: dict[str, object] = {}
        dims = tuple(
            {
                ax: shared.setdefault(label, torch.export.Dim(label, min=1, max=64))
                for ax, label in axes.get(n, {}).items()
            }
            or None
            for n in in_names
        )
        try:
            prog = torch.onnx.export(
                module, args, input_names=in_names, output_names=out_names,
                dynamic_shapes=dims, opset_version=18, dynamo=True,
            )  # fmt: skip
            prog.save(str(path))
            written.append(path)
        except Exception as exc:  # noqa: BLE001 - report and go on with the other models
            print(f"{name}: dynamo export failed: {type(exc).__name__}: {str(exc)[:300]}")
    return written


def feeds_for(sess, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for a in sess.get_inputs():
        shape = [d if isinstance(d, int) else (batch if i == 0 else seq) for i, d in enumerate(a.shape)]
        if a.type == "tensor(int64)":
            if "mask" in a.name:
                m = np.ones(shape, dtype=np.int64)
                if batch > 1:
                    m[-1, -max(1, seq // 4) :] = 0
                feeds[a.name] = m
            elif "type" in a.name:
                feeds[a.name] = (np.arange(seq)[None, :] >= seq // 2).astype(np.int64).repeat(batch, 0)
            else:
                feeds[a.name] = rng.integers(0, 100, shape, dtype=np.int64)
        else:
            feeds[a.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def check(path: Path) -> str:
    import onnxruntime

    import onnxpy

    results = []
    for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL"):
        so = onnxpy.SessionOptions()
        so.graph_optimization_level = getattr(onnxpy.GraphOptimizationLevel, level)
        rso = onnxruntime.SessionOptions()
        rso.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, level)
        try:
            sess = onnxpy.InferenceSession(str(path), so)
            ref = onnxruntime.InferenceSession(str(path), rso, providers=["CPUExecutionProvider"])
            worst = 0.0
            for batch in (1, 2):
                for seq in (7, 16):
                    feeds = feeds_for(ref, batch, seq, np.random.default_rng(batch + seq))
                    for g, w in zip(sess.run(None, feeds), ref.run(None, feeds)):
                        scale = max(float(np.max(np.abs(w))), 1e-6) if w.size else 1.0
                        err = float(np.max(np.abs(g.astype(np.float64) - w))) / scale if w.size else 0.0
                        worst = max(worst, err)
            io_same = [(a.name, a.type, a.shape) for a in sess.get_inputs() + sess.get_outputs()] == [
                (a.name, a.type, a.shape) for a in ref.get_inputs() + ref.get_outputs()
            ]
            results.append(f"{level}: {worst:.2e}{'' if worst <= 1e-3 else ' FAIL'}{'' if io_same else ' IO-MISMATCH'}")
        except Exception as exc:  # noqa: BLE001 - a developer report, not a test
            results.append(f"{level}: ERROR {type(exc).__name__}: {str(exc)[:300]}")
    return "; ".join(results)


def main() -> None:
    import onnx

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/zoo_torch"))
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--no-check", action="store_true")
    args = parser.parse_args()
    for path in export_all(args.out, args.only):
        m = onnx.load(str(path))
        hist = collections.Counter(n.op_type for n in m.graph.node)
        fn = f" functions={len(m.functions)}" if m.functions else ""
        print(f"{path.name}: opset {m.opset_import[0].version}, {len(m.graph.node)} nodes{fn}")
        print("   ", dict(hist.most_common()))
        if not args.no_check:
            print("   ", check(path))


if __name__ == "__main__":
    main()
