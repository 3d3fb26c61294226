"""Small re-creations of what exporters emit for common vision and transformer models.

Each builder writes, node by node with ``onnx.helper``, the graph that torch.onnx (TorchScript
exporter, opset 13-17, node names like ``/encoder/layer.0/attention/MatMul``), the torch dynamo
exporter (opset 18, model-local functions) or HF optimum produces for one architecture: the same
op patterns (dynamic Shape/Gather/Concat/Reshape arithmetic, decomposed LayerNorm and GELU,
additive attention masks, BN kept or folded into Conv...), at small sizes with random weights
from a fixed seed, a dynamic batch axis and, for text models, a dynamic sequence axis.

``ZOO`` maps a model name to a ``ZooModel``: ``build()`` returns the ModelProto and
``feeds(batch, seq, rng)`` a matching input dict. Nothing is downloaded; no torch needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT_MIN = float(np.finfo(np.float32).min)
TORCH_PRODUCER = ("pytorch", "2.1.0")


class Builder:
    """Accumulates nodes and initializers with torch.onnx's naming: a node is named after its
    module scope (``/layer1/layer1.0/conv1/Conv``), its outputs ``<node>_output_<i>``, and a
    parameter after its module path (``layer1.0.conv1.weight``)."""

    def __init__(self, seed: int, opset: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.segments: list[str] = []  # scope segments in node names
        self.path: list[str] = []  # module path in parameter names
        self._used: dict[str, int] = {}
        self._n_matmul = 0
        self.fold_bn = False  # fold BatchNormalization into the Conv before it, as exporters do

    # -- naming ---------------------------------------------------------------------------
    @contextmanager
    def module(self, name: str) -> Iterator[None]:
        # torch names a Sequential/ModuleList child "<parent>.<index>" in the node scope.
        segment = f"{self.path[-1]}.{name}" if name.isdigit() and self.path else name
        self.segments.append(segment)
        self.path.append(name)
        try:
            yield
        finally:
            self.segments.pop()
            self.path.pop()

    def pname(self, leaf: str) -> str:
        return ".".join([*self.path, leaf])

    def _node_name(self, op_type: str) -> str:
        base = "/" + "/".join([*self.segments, op_type])
        n = self._used.get(base, 0)
        self._used[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    # -- nodes ----------------------------------------------------------------------------
    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        n_out: int = 1,
        *,
        out: Sequence[str] | None = None,
        domain: str = "",
        **attrs: Any,
    ) -> Any:
        name = self._node_name(op_type)
        outs = list(out) if out is not None else [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, domain=domain or None, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def constant(self, value: Any, dtype: Any = np.float32) -> str:
        """A Constant node, as the TorchScript exporter emits for literals and shape pieces."""
        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(value, dtype=dtype)))

    def init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def param(self, leaf: str, shape: Sequence[int], fan_in: int | None = None, std: float | None = None) -> str:
        """A random float weight scaled by 1/sqrt(fan_in) so deep stacks keep activations near one."""
        if std is None:
            fan = fan_in if fan_in is not None else int(np.prod(shape[1:])) if len(shape) > 1 else 1
            std = 1.0 / math.sqrt(max(fan, 1))
        return self.init(self.pname(leaf), self._randn(shape, std))

    def _randn(self, shape: Sequence[int], std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def bias(self, leaf: str, n: int) -> str:
        return self.init(self.pname(leaf), (self.rng.standard_normal(n) * 0.1).astype(np.float32))

    # -- opset-aware forms of ops whose signature changed ----------------------------------
    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.constant(list(axes), np.int64)])
        return self.op("Unsqueeze", [x], axes=list(axes))

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.constant(list(axes), np.int64)])
        return self.op("Squeeze", [x], axes=list(axes))

    def reduce_mean(self, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.constant(list(axes), np.int64)], keepdims=keepdims)
        return self.op("ReduceMean", [x], axes=list(axes), keepdims=keepdims)

    def split(self, x: str, sizes: Sequence[int], axis: int) -> list[str]:
        if self.opset >= 13:
            return self.op("Split", [x, self.constant(list(sizes), np.int64)], len(sizes), axis=axis)
        return self.op("Split", [x], len(sizes), axis=axis, split=list(sizes))

    # -- dynamic shape arithmetic, as traced sizes come out of torch.onnx ------------------
    def dim(self, x: str, i: int) -> str:
        """x.size(i): a 0-d int64."""
        return self.op("Gather", [self.op("Shape", [x]), self.constant(i, np.int64)], axis=0)

    def shape_vec(self, parts: Sequence[str | int]) -> str:
        """Concat of traced sizes (0-d tensors, unsqueezed) and literal ints into a 1-D shape."""
        pieces = [self.unsqueeze(p, [0]) if isinstance(p, str) else self.constant([p], np.int64) for p in parts]
        return self.op("Concat", pieces, axis=0)

    # -- common layers -----------------------------------------------------------------------
    def linear(self, x: str, cin: int, cout: int, name: str, bias: bool = True) -> str:
        """nn.Linear on a 3-D input: MatMul with the transposed weight folded into an initializer, then Add."""
        with self.module(name):
            # The transposed weight is constant-folded into an anonymous initializer.
            self._n_matmul += 1
            w = self.init(f"onnx::MatMul_{self._n_matmul}", self._randn((cin, cout), 1.0 / math.sqrt(cin)))
            y = self.op("MatMul", [x, w])
            if bias:
                y = self.op("Add", [self.bias("bias", cout), y])
        return y

    def gemm(self, x: str, cin: int, cout: int, name: str) -> str:
        """nn.Linear on a 2-D input: Gemm with transB=1."""
        with self.module(name):
            w = self.param("weight", (cout, cin))
            return self.op("Gemm", [x, w, self.bias("bias", cout)], alpha=1.0, beta=1.0, transB=1)

    def conv(
        self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, bias: bool = False, *, name: str
    ) -> str:
        pad = (k - 1) // 2
        with self.module(name):
            ins = [x, self.param("weight", (cout, cin // groups, k, k))]
            if bias:
                ins.append(self.bias("bias", cout))
            return self.op(
                "Conv", ins, dilations=[1, 1], group=groups, kernel_shape=[k, k], pads=[pad] * 4, strides=[stride] * 2
            )

    def batchnorm(self, x: str, c: int, name: str, eps: float = 1e-5, momentum: float = 0.1) -> str:
        with self.module(name):
            gamma = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
            beta = (self.rng.standard_normal(c) * 0.1).astype(np.float32)
            mean = (self.rng.standard_normal(c) * 0.1).astype(np.float32)
            var = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
            if self.fold_bn:
                return self._fold_into_conv(x, gamma, beta, mean, var, eps)
            ins = [
                x,
                *(
                    self.init(self.pname(k), v)
                    for k, v in zip(("weight", "bias", "running_mean", "running_var"), (gamma, beta, mean, var))
                ),
            ]
            attrs: dict[str, Any] = {"epsilon": eps, "momentum": 1.0 - momentum}
            if self.opset >= 15:
                attrs["training_mode"] = 0
            return self.op("BatchNormalization", ins, **attrs)

    def _fold_into_conv(
        self, x: str, gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float
    ) -> str:
        conv = next(n for n in reversed(self.nodes) if x in n.output)
        assert conv.op_type == "Conv" and len(conv.input) == 2, "BN folding expects a bias-free Conv"
        inits = {t.name: t for t in self.inits}
        w = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
        k = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
        inits[conv.input[1]].CopyFrom(
            numpy_helper.from_array((w * k[:, None, None, None]).astype(np.float32), conv.input[1])
        )
        conv.input.append(self.init(conv.input[1] + "_bias", (beta - mean * k).astype(np.float32)))
        return x

    def layer_norm(self, x: str, dim: int, name: str, eps: float, decomposed: bool) -> str:
        with self.module(name):
            gamma = self.init(self.pname("weight"), self.rng.uniform(0.8, 1.2, dim).astype(np.float32))
            beta = self.init(self.pname("bias"), (self.rng.standard_normal(dim) * 0.1).astype(np.float32))
            if not decomposed:
                return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps)
            # What opset < 17 exports of nn.LayerNorm look like.
            mean = self.reduce_mean(x, [-1])
            d = self.op("Sub", [x, mean])
            var = self.reduce_mean(self.op("Pow", [d, self.constant(2.0)]), [-1])
            std = self.op("Sqrt", [self.op("Add", [var, self.constant(eps)])])
            y = self.op("Div", [d, std])
            return self.op("Add", [self.op("Mul", [y, gamma]), beta])

    def gelu_erf(self, x: str) -> str:
        """nn.GELU(): x * 0.5 * (1 + erf(x / sqrt(2)))."""
        e = self.op("Erf", [self.op("Div", [x, self.constant(1.4142135381698608)])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [e, self.constant(1.0)])]), self.constant(0.5)])

    def gelu_tanh(self, x: str) -> str:
        """HF gelu_new: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))."""
        half_x = self.op("Mul", [self.constant(0.5), x])
        cube = self.op("Mul", [self.constant(0.044715), self.op("Pow", [x, self.constant(3.0)])])
        inner = self.op("Mul", [self.constant(math.sqrt(2.0 / math.pi)), self.op("Add", [x, cube])])
        return self.op("Mul", [half_x, self.op("Add", [self.constant(1.0), self.op("Tanh", [inner])])])

    def silu(self, x: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    def hardswish(self, x: str) -> str:
        if self.opset >= 14:
            return self.op("HardSwish", [x])
        # Before opset 14 torch exports hardswish as x * hardsigmoid(x).
        return self.op("Mul", [x, self.op("HardSigmoid", [x], alpha=1.0 / 6, beta=0.5)])

    # -- model ----------------------------------------------------------------------------
    def model(
        self,
        name: str,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
        ir_version: int | None = None,
        producer: tuple[str, str] = TORCH_PRODUCER,
        functions: Sequence[onnx.FunctionProto] = (),
        extra_opsets: dict[str, int] | None = None,
        value_info: bool = False,
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, list(inputs), list(outputs), initializer=self.inits)
        opsets = [helper.make_opsetid("", self.opset)]
        opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
        model = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
        # torch.onnx's TorchScript exporter writes IR 7 up to opset 14 and IR 8 for 15-17.
        model.ir_version = ir_version if ir_version is not None else (7 if self.opset <= 14 else 8)
        model.producer_name, model.producer_version = producer
        if value_info:
            # The dynamo exporter writes a value_info for every intermediate value; the declared
            # graph outputs stay as written.
            outputs = [onnx.ValueInfoProto.FromString(o.SerializeToString()) for o in model.graph.output]
            model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
            del model.graph.output[:]
            model.graph.output.extend(outputs)
        return model


def _vi(name: str, elem: int, shape: Sequence[Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


# =========================================================================================
# torchvision ResNet (BasicBlock / Bottleneck), BatchNormalization kept
# =========================================================================================
def _basic_block(b: Builder, x: str, cin: int, planes: int, stride: int, idx: int) -> str:
    with b.module(str(idx)):
        y = b.op("Relu", [b.batchnorm(b.conv(x, cin, planes, 3, stride, name="conv1"), planes, "bn1")])
        y = b.batchnorm(b.conv(y, planes, planes, 3, 1, name="conv2"), planes, "bn2")
        if stride != 1 or cin != planes:
            with b.module("downsample"):
                x = b.batchnorm(b.conv(x, cin, planes, 1, stride, name="0"), planes, "1")
        return b.op("Relu", [b.op("Add", [y, x])])


def _bottleneck(b: Builder, x: str, cin: int, planes: int, stride: int, idx: int) -> str:
    out = planes * 4
    with b.module(str(idx)):
        y = b.op("Relu", [b.batchnorm(b.conv(x, cin, planes, 1, name="conv1"), planes, "bn1")])
        y = b.op("Relu", [b.batchnorm(b.conv(y, planes, planes, 3, stride, name="conv2"), planes, "bn2")])
        y = b.batchnorm(b.conv(y, planes, out, 1, name="conv3"), out, "bn3")
        if stride != 1 or cin != out:
            with b.module("downsample"):
                x = b.batchnorm(b.conv(x, cin, out, 1, stride, name="0"), out, "1")
        return b.op("Relu", [b.op("Add", [y, x])])


def resnet(
    bottleneck: bool, opset: int, seed: int = 0, blocks: Sequence[int] = (2, 1, 1, 1), dynamo: bool = False
) -> onnx.ModelProto:
    """TorchScript style keeps BatchNormalization (as with training=PRESERVE) and pools with
    GlobalAveragePool + Flatten; the dynamo style (torch >= 2.9 default) folds BN into the Conv
    bias and pools with ReduceMean(axes input) + Reshape(allowzero=1)."""
    b = Builder(seed, opset)
    b.fold_bn = dynamo
    widths = (8, 16, 32, 64)
    x = b.batchnorm(b.conv("input", 3, widths[0], 7, 2, name="conv1"), widths[0], "bn1")
    x = b.op("Relu", [x])
    with b.module("maxpool"):
        x = b.op("MaxPool", [x], ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    block, expansion = (_bottleneck, 4) if bottleneck else (_basic_block, 1)
    cin = widths[0]
    for li, (planes, n) in enumerate(zip(widths, blocks)):
        with b.module(f"layer{li + 1}"):
            for i in range(n):
                x = block(b, x, cin, planes, 2 if (i == 0 and li > 0) else 1, i)
                cin = planes * expansion
    if dynamo:
        x = b.op("ReduceMean", [x, b.constant([-1, -2], np.int64)], keepdims=1, noop_with_empty_axes=0)
        x = b.op("Reshape", [x, b.constant([-1, cin], np.int64)], allowzero=1)
    else:
        with b.module("avgpool"):
            x = b.op("GlobalAveragePool", [x])
        x = b.op("Flatten", [x], axis=1)
    with b.module("fc"):
        w = b.param("weight", (10, cin))
        b.op("Gemm", [x, w, b.bias("bias", 10)], out=["output"], alpha=1.0, beta=1.0, transA=0, transB=1)
    return b.model(
        "resnet50" if bottleneck else "resnet18",
        [_vi("input", TensorProto.FLOAT, ["batch_size", 3, 64, 64])],
        [_vi("output", TensorProto.FLOAT, ["batch_size", 10])],
        ir_version=10 if dynamo else None,
        value_info=dynamo,
    )


# =========================================================================================
# torchvision MobileNetV3 (small-like), BN folded into Conv as the default export does
# =========================================================================================
def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _mnv3_act(b: Builder, x: str, act: str) -> str:
    return b.hardswish(x) if act == "HS" else b.op("Relu", [x])


def _mnv3_block(
    b: Builder, x: str, idx: int, cin: int, k: int, exp: int, cout: int, se: bool, act: str, stride: int
) -> str:
    with b.module("features"), b.module(str(idx)), b.module("block"):
        y, part = x, 0
        if exp != cin:
            with b.module(str(part)):
                y = _mnv3_act(b, b.conv(y, cin, exp, 1, bias=True, name="0"), act)
            part += 1
        with b.module(str(part)):
            y = _mnv3_act(b, b.conv(y, exp, exp, k, stride, groups=exp, bias=True, name="0"), act)
        part += 1
        if se:
            sq = _make_divisible(exp // 4, 8)
            with b.module(str(part)):
                s = b.op("GlobalAveragePool", [y])
                s = b.op("Relu", [b.conv(s, exp, sq, 1, bias=True, name="fc1")])
                s = b.conv(s, sq, exp, 1, bias=True, name="fc2")
                s = b.op("HardSigmoid", [s], alpha=1.0 / 6, beta=0.5)
                y = b.op("Mul", [s, y])
            part += 1
        with b.module(str(part)):
            y = b.conv(y, exp, cout, 1, bias=True, name="0")
    if stride == 1 and cin == cout:
        y = b.op("Add", [y, x])
    return y


def mobilenet_v3(opset: int, seed: int = 0) -> onnx.ModelProto:
    b = Builder(seed, opset)
    with b.module("features"), b.module("0"):
        x = b.hardswish(b.conv("input", 3, 16, 3, 2, bias=True, name="0"))
    config = [  # cin, kernel, expanded, cout, SE, activation, stride
        (16, 3, 16, 16, True, "RE", 2),
        (16, 3, 48, 24, False, "RE", 2),
        (24, 3, 56, 24, False, "RE", 1),
        (24, 5, 64, 32, True, "HS", 2),
        (32, 5, 96, 32, True, "HS", 1),
    ]
    for i, cfg in enumerate(config):
        x = _mnv3_block(b, x, i + 1, *cfg)
    with b.module("features"), b.module(str(len(config) + 1)):
        x = b.hardswish(b.conv(x, 32, 192, 1, bias=True, name="0"))
    with b.module("avgpool"):
        x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x], axis=1)
    with b.module("classifier"):
        x = b.hardswish(b.gemm(x, 192, 128, "0"))
        with b.module("3"):
            w = b.param("weight", (10, 128))
            b.op("Gemm", [x, w, b.bias("bias", 10)], out=["output"], alpha=1.0, beta=1.0, transB=1)
    return b.model(
        f"mobilenet_v3_small_opset{opset}",
        [_vi("input", TensorProto.FLOAT, ["batch_size", 3, 64, 64])],
        [_vi("output", TensorProto.FLOAT, ["batch_size", 10])],
    )


# =========================================================================================
# torchvision EfficientNet-B0-like: MBConv with SE, SiLU as Sigmoid*Mul, BN kept
# =========================================================================================
def efficientnet(opset: int = 18, seed: int = 0) -> onnx.ModelProto:
    b = Builder(seed, opset)
    with b.module("features"), b.module("0"):
        x = b.silu(b.batchnorm(b.conv("input", 3, 16, 3, 2, name="0"), 16, "1", eps=1e-3))
    config = [(1, 3, 1, 16, 8, 1), (6, 3, 2, 8, 16, 2), (6, 5, 2, 16, 24, 1)]  # expand, k, stride, in, out, n
    stage = 1
    for expand, k, stride, cin, cout, n in config:
        for i in range(n):
            s, ci = (stride, cin) if i == 0 else (1, cout)
            exp = ci * expand
            with b.module("features"), b.module(str(stage)), b.module(str(i)), b.module("block"):
                y, part = x, 0
                if exp != ci:
                    with b.module(str(part)):
                        y = b.silu(b.batchnorm(b.conv(y, ci, exp, 1, name="0"), exp, "1", eps=1e-3))
                    part += 1
                with b.module(str(part)):
                    y = b.silu(b.batchnorm(b.conv(y, exp, exp, k, s, groups=exp, name="0"), exp, "1", eps=1e-3))
                part += 1
                with b.module(str(part)):
                    sq = max(1, ci // 4)
                    g = b.op("GlobalAveragePool", [y])
                    g = b.silu(b.conv(g, exp, sq, 1, bias=True, name="fc1"))
                    g = b.op("Sigmoid", [b.conv(g, sq, exp, 1, bias=True, name="fc2")])
                    y = b.op("Mul", [g, y])
                part += 1
                with b.module(str(part)):
                    y = b.batchnorm(b.conv(y, exp, cout, 1, name="0"), cout, "1", eps=1e-3)
            # Stochastic depth is the identity in an inference graph: the residual is a plain Add.
            x = b.op("Add", [y, x]) if (s == 1 and ci == cout) else y
        stage += 1
    with b.module("features"), b.module(str(stage)):
        x = b.silu(b.batchnorm(b.conv(x, 24, 96, 1, name="0"), 96, "1", eps=1e-3))
    with b.module("avgpool"):
        x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x], axis=1)
    with b.module("classifier"), b.module("1"):
        w = b.param("weight", (10, 96))
        b.op("Gemm", [x, w, b.bias("bias", 10)], out=["output"], alpha=1.0, beta=1.0, transB=1)
    return b.model(
        "efficientnet_b0",
        [_vi("input", TensorProto.FLOAT, ["batch_size", 3, 64, 64])],
        [_vi("output", TensorProto.FLOAT, ["batch_size", 10])],
    )


# =========================================================================================
# HF BERT (BertModel): embeddings, post-norm encoder, pooler
# =========================================================================================
BERT = {"vocab": 100, "hidden": 32, "heads": 4, "layers": 2, "inter": 64, "max_pos": 64, "types": 2}


def _heads(b: Builder, x: str, heads: int, hd: int) -> str:
    """(b, s, h*d) -> (b, s, h, d) with traced batch/seq sizes: x.view(x.size()[:-1] + (h, d))."""
    return b.op("Reshape", [x, b.shape_vec([b.dim(x, 0), b.dim(x, 1), heads, hd])])


def bert(opset: int, seed: int = 0, sdpa: bool = False, cfg: dict[str, int] | None = None) -> onnx.ModelProto:
    """opset 14: decomposed LayerNorm, mask * -10000 (older transformers); opset 17:
    LayerNormalization, mask * finfo.min. ``sdpa``: attention through
    F.scaled_dot_product_attention as the TorchScript exporter writes it (transformers >= 4.36):
    a bool mask expanded to (b, 1, s, s) turned into 0/-inf by Where, q and k^T each scaled by
    sqrt(1/sqrt(head_dim)) computed from the traced shape, and an IsNaN/Where guard after the
    Softmax."""
    cfg = cfg or BERT  # another size: benchmarks/bench.py --transformers
    hid, heads, hd = cfg["hidden"], cfg["heads"], cfg["hidden"] // cfg["heads"]
    decomposed = opset < 17
    b = Builder(seed, opset)
    std = 0.5
    with b.module("embeddings"):
        with b.module("word_embeddings"):
            words = b.op("Gather", [b.param("weight", (cfg["vocab"], hid), std=std), "input_ids"])
        with b.module("token_type_embeddings"):
            types = b.op("Gather", [b.param("weight", (cfg["types"], hid), std=std), "token_type_ids"])
        # position_ids buffer sliced to the sequence length: self.position_ids[:, 0:seq]
        pos_buf = b.init("embeddings.position_ids", np.arange(cfg["max_pos"], dtype=np.int64)[None, :])
        seq = b.unsqueeze(b.dim("input_ids", 1), [0])
        pos = b.op(
            "Slice", [pos_buf, b.constant([0], np.int64), seq, b.constant([1], np.int64), b.constant([1], np.int64)]
        )
        with b.module("position_embeddings"):
            pemb = b.op("Gather", [b.param("weight", (cfg["max_pos"], hid), std=std), pos])
        x = b.op("Add", [b.op("Add", [words, types]), pemb])
        x = b.layer_norm(x, hid, "LayerNorm", 1e-12, decomposed)
    m = b.unsqueeze(b.unsqueeze("attention_mask", [1]), [2])
    if sdpa:
        m = b.op("Cast", [m], to=TensorProto.BOOL)
        s_len = b.dim("input_ids", 1)
        keep = b.op("Expand", [m, b.shape_vec([b.dim("input_ids", 0), 1, s_len, s_len])])
    else:
        # get_extended_attention_mask: (1.0 - mask[:, None, None, :]) * min
        m = b.op("Cast", [m], to=TensorProto.FLOAT)
        m = b.op("Sub", [b.constant(1.0), m])
        mask = b.op("Mul", [m, b.constant(-10000.0 if decomposed else FLOAT_MIN)])
    with b.module("encoder"):
        for li in range(cfg["layers"]):
            with b.module("layer"), b.module(str(li)):
                with b.module("attention"):
                    with b.module("self"):
                        q = _heads(b, b.linear(x, hid, hid, "query"), heads, hd)
                        k = _heads(b, b.linear(x, hid, hid, "key"), heads, hd)
                        v = _heads(b, b.linear(x, hid, hid, "value"), heads, hd)
                        q = b.op("Transpose", [q], perm=[0, 2, 1, 3])
                        v = b.op("Transpose", [v], perm=[0, 2, 1, 3])
                        if sdpa:
                            k = b.op("Transpose", [k], perm=[0, 2, 1, 3])
                            p = _sdpa_probs(b, q, k, keep)
                        else:
                            k = b.op("Transpose", [k], perm=[0, 2, 3, 1])
                            s = b.op("Div", [b.op("MatMul", [q, k]), b.constant(math.sqrt(hd))])
                            p = b.op("Softmax", [b.op("Add", [s, mask])], axis=-1)
                        ctx = b.op("Transpose", [b.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
                        ctx = b.op("Reshape", [ctx, b.shape_vec([b.dim(ctx, 0), b.dim(ctx, 1), hid])])
                    with b.module("output"):
                        a = b.linear(ctx, hid, hid, "dense")
                        x = b.layer_norm(b.op("Add", [a, x]), hid, "LayerNorm", 1e-12, decomposed)
                with b.module("intermediate"):
                    h = b.linear(x, hid, cfg["inter"], "dense")
                    with b.module("intermediate_act_fn"):
                        h = b.gelu_erf(h)
                with b.module("output"):
                    h = b.linear(h, cfg["inter"], hid, "dense")
                    x = b.layer_norm(b.op("Add", [h, x]), hid, "LayerNorm", 1e-12, decomposed)
    b.op("Identity", [x], out=["last_hidden_state"])
    with b.module("pooler"):
        first = b.op("Gather", [x, b.constant(0, np.int64)], axis=1)  # hidden_states[:, 0]
        with b.module("dense"):
            w = b.param("weight", (hid, hid))
            first = b.op("Gemm", [first, w, b.bias("bias", hid)], alpha=1.0, beta=1.0, transB=1)
        b.op("Tanh", [first], out=["pooler_output"])
    text = ["batch_size", "sequence_length"]
    return b.model(
        f"bert{'_sdpa' if sdpa else ''}_opset{opset}",
        [_vi(n, TensorProto.INT64, text) for n in ("input_ids", "attention_mask", "token_type_ids")],
        [
            _vi("last_hidden_state", TensorProto.FLOAT, [*text, hid]),
            _vi("pooler_output", TensorProto.FLOAT, ["batch_size", hid]),
        ],
    )


def _sdpa_probs(b: Builder, q: str, k: str, keep: str) -> str:
    """softmax(q k^T / sqrt(d) + mask) the way torch.onnx decomposes scaled_dot_product_attention."""
    i64 = np.int64
    d = b.op("Cast", [b.op("Slice", [b.op("Shape", [q]), b.constant([-1], i64), b.constant([2**63 - 1], i64)])], to=1)
    scale = b.op("Cast", [b.op("Div", [b.constant(1.0), b.op("Sqrt", [d])])], to=1)
    qs = b.op("Mul", [q, b.op("Sqrt", [scale])])
    ks = b.op("Mul", [b.op("Transpose", [k], perm=[0, 1, 3, 2]), b.op("Sqrt", [scale])])
    bias = b.op("Where", [keep, b.constant(0.0), b.constant(-np.inf)])
    p = b.op("Softmax", [b.op("Add", [b.op("MatMul", [qs, ks]), bias])], axis=-1)
    # A row with every key masked is NaN after the Softmax: SDPA makes it zeros.
    return b.op("Where", [b.op("IsNaN", [p]), b.constant(0.0), p])


# =========================================================================================
# HF GPT-2 (GPT2LMHeadModel): Conv1D as Reshape/Gemm/Reshape, gelu_new, tied lm_head
# =========================================================================================
GPT2 = {"vocab": 100, "embd": 32, "heads": 4, "layers": 2, "positions": 64}


def _conv1d(b: Builder, x: str, nx: int, nf: int, name: str) -> str:
    """transformers' Conv1D: addmm(bias, x.view(-1, x.size(-1)), weight).view(x.size()[:-1] + (nf,))."""
    with b.module(name):
        flat = b.op("Reshape", [x, b.shape_vec([-1, b.dim(x, 2)])])
        y = b.op("Gemm", [flat, b.param("weight", (nx, nf), fan_in=nx), b.bias("bias", nf)], alpha=1.0, beta=1.0)
        return b.op("Reshape", [y, b.shape_vec([b.dim(x, 0), b.dim(x, 1), nf])])


def gpt2(opset: int, seed: int = 0, past: bool = False, cfg: dict[str, int] | None = None) -> onnx.ModelProto:
    """opset 14: decomposed LayerNorm, the causal mask a bool lower-triangular buffer sliced to
    (key_len - query_len : key_len, :key_len) and applied with Where, scale by a traced
    sqrt(head_dim). opset 17: LayerNormalization, a float causal mask built at run time with
    ConstantOfShape + Trilu and merged with the padding mask by Where (newer transformers).
    ``past``: optimum's decoder_with_past: past_key_values.* inputs concatenated in front of the
    new keys/values, positions from the past length, a mask over past + new tokens."""
    cfg = cfg or GPT2
    d, heads = cfg["embd"], cfg["heads"]
    hd = d // heads
    decomposed = opset < 17
    b = Builder(seed, opset)
    with b.module("transformer"):
        wte = b.param("wte.weight", (cfg["vocab"], d), std=0.5)
        x = b.op("Gather", [wte, "input_ids"])
        seq = b.dim("input_ids", 1)
        past_len = b.dim("past_key_values.0.key", 2) if past else b.constant(0, np.int64)
        total = b.op("Add", [past_len, seq]) if past else seq
        pos = b.unsqueeze(b.op("Range", [past_len, total, b.constant(1, np.int64)]), [0])
        x = b.op("Add", [x, b.op("Gather", [b.param("wpe.weight", (cfg["positions"], d), std=0.5), pos])])
        pad = b.unsqueeze(b.unsqueeze("attention_mask", [1]), [2])
        if decomposed:
            causal_buf = b.init(
                "transformer.h.bias",
                np.tril(np.ones((cfg["positions"], cfg["positions"]), dtype=bool))[None, None],
            )
            pad = b.op("Cast", [pad], to=TensorProto.FLOAT)
            pad = b.op("Mul", [b.op("Sub", [b.constant(1.0), pad]), b.constant(FLOAT_MIN)])
        else:
            full = b.op(
                "ConstantOfShape",
                [b.shape_vec([seq, total])],
                value=numpy_helper.from_array(np.array([FLOAT_MIN], dtype=np.float32)),
            )
            # Query i sits at position past + i: keys after it are masked.
            diag = b.op("Add", [past_len, b.constant(1, np.int64)]) if past else b.constant(1, np.int64)
            causal = b.op("Trilu", [full, diag], upper=1)
            causal = b.unsqueeze(causal, [0, 1])
            causal = b.op("Expand", [causal, b.shape_vec([b.dim("input_ids", 0), 1, seq, total])])
            padded = b.op("Equal", [b.op("Cast", [pad], to=TensorProto.FLOAT), b.constant(0.0)])
            mask = b.op("Where", [padded, b.constant(FLOAT_MIN), causal])
        presents: list[str] = []
        for li in range(cfg["layers"]):
            with b.module("h"), b.module(str(li)):
                h = b.layer_norm(x, d, "ln_1", 1e-5, decomposed)
                with b.module("attn"):
                    qkv = _conv1d(b, h, d, 3 * d, "c_attn")
                    q, k, v = b.split(qkv, [d, d, d], axis=2)
                    q = b.op("Transpose", [_heads(b, q, heads, hd)], perm=[0, 2, 1, 3])
                    names = [f"present.{li}.key"], [f"present.{li}.value"]
                    k = b.op("Transpose", [_heads(b, k, heads, hd)], perm=[0, 2, 1, 3], out=None if past else names[0])
                    v = b.op("Transpose", [_heads(b, v, heads, hd)], perm=[0, 2, 1, 3], out=None if past else names[1])
                    if past:
                        k = b.op("Concat", [f"past_key_values.{li}.key", k], axis=-2, out=names[0])
                        v = b.op("Concat", [f"past_key_values.{li}.value", v], axis=-2, out=names[1])
                    presents += [k, v]
                    w = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
                    if decomposed:
                        scale = b.op("Sqrt", [b.op("Cast", [b.dim(v, 3)], to=TensorProto.FLOAT)])
                        w = b.op("Div", [w, scale])
                        qlen, klen = b.dim(q, 2), b.dim(k, 2)
                        start = b.unsqueeze(b.op("Sub", [klen, qlen]), [0])
                        stop = b.unsqueeze(klen, [0])
                        cm = b.op(
                            "Slice", [causal_buf, start, stop, b.constant([2], np.int64), b.constant([1], np.int64)]
                        )
                        cm = b.op(
                            "Slice",
                            [cm, b.constant([0], np.int64), stop, b.constant([3], np.int64), b.constant([1], np.int64)],
                        )
                        w = b.op("Where", [cm, w, b.constant(FLOAT_MIN)])
                        w = b.op("Add", [w, pad])
                    else:
                        w = b.op("Add", [b.op("Div", [w, b.constant(math.sqrt(hd))]), mask])
                    p = b.op("Softmax", [w], axis=-1)
                    a = b.op("Transpose", [b.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
                    a = b.op("Reshape", [a, b.shape_vec([b.dim(a, 0), b.dim(a, 1), d])])
                    a = _conv1d(b, a, d, d, "c_proj")
                x = b.op("Add", [a, x])
                h = b.layer_norm(x, d, "ln_2", 1e-5, decomposed)
                with b.module("mlp"):
                    h = _conv1d(b, h, d, 4 * d, "c_fc")
                    with b.module("act"):
                        h = b.gelu_tanh(h)
                    h = _conv1d(b, h, 4 * d, d, "c_proj")
                x = b.op("Add", [h, x])
        x = b.layer_norm(x, d, "ln_f", 1e-5, decomposed)
    with b.module("lm_head"):
        # Tied weights: the output projection reads wte itself.
        b.op("MatMul", [x, b.op("Transpose", [wte], perm=[1, 0])], out=["logits"])
    text = ["batch_size", "sequence_length"]
    full_len = "past_sequence_length + sequence_length" if past else "sequence_length"
    kv = ["batch_size", heads, full_len, hd]
    outputs = [_vi("logits", TensorProto.FLOAT, [*text, cfg["vocab"]])]
    outputs += [_vi(p, TensorProto.FLOAT, kv) for p in presents]
    inputs = [
        _vi("input_ids", TensorProto.INT64, text),
        _vi("attention_mask", TensorProto.INT64, ["batch_size", full_len]),
    ]
    if past:
        pkv = ["batch_size", heads, "past_sequence_length", hd]
        inputs += [
            _vi(f"past_key_values.{i}.{kind}", TensorProto.FLOAT, pkv)
            for i in range(cfg["layers"])
            for kind in ("key", "value")
        ]
    return b.model(
        f"gpt2_opset{opset}{'_with_past' if past else ''}",
        inputs,
        outputs,
    )


# =========================================================================================
# Llama (transformers' LlamaForCausalLM through optimum, TorchScript exporter): RMS norms,
# rotary embeddings from position_ids, grouped-query attention with repeat_kv, SwiGLU MLP
# =========================================================================================
LLAMA = {"vocab": 1000, "hidden": 64, "heads": 4, "kv_heads": 2, "inter": 96, "layers": 2, "theta": 10000}
INT64_MAX = 2**63 - 1


def _rms_norm(b: Builder, x: str, dim: int, name: str, eps: float = 1e-6) -> str:
    """LlamaRMSNorm: weight * (h * rsqrt(mean(h^2) + eps)) with h = x in float32 and back."""
    with b.module(name):
        weight = b.init(b.pname("weight"), b.rng.uniform(0.8, 1.2, dim).astype(np.float32))
        h = b.op("Cast", [x], to=TensorProto.FLOAT)
        var = b.reduce_mean(b.op("Pow", [h, b.constant(2.0)]), [-1])
        inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, b.constant(eps)])])])
        h = b.op("Cast", [b.op("Mul", [h, inv])], to=TensorProto.FLOAT)
        return b.op("Mul", [weight, h])


def _rotate_half(b: Builder, x: str) -> str:
    """cat(-x[..., h:], x[..., :h]) with h = x.shape[-1] // 2 traced from Shape."""
    half = b.unsqueeze(b.op("Div", [b.dim(x, 3), b.constant(2, np.int64)]), [0])
    axis, step = b.constant([3], np.int64), b.constant([1], np.int64)
    low = b.op("Slice", [x, b.constant([0], np.int64), half, axis, step])
    high = b.op("Slice", [x, half, b.constant([INT64_MAX], np.int64), axis, step])
    return b.op("Concat", [b.op("Neg", [high]), low], axis=-1)


def llama(opset: int = 17, seed: int = 0, cfg: dict[str, int] | None = None) -> onnx.ModelProto:
    """A decoder with past as optimum exports LlamaForCausalLM (input_ids, attention_mask,
    position_ids and past_key_values.* in; logits and present.* out): cos/sin computed from
    position_ids and inv_freq, a float causal mask from ConstantOfShape + Trilu merged with the
    padding mask, bias-free projections, keys and values appended to the past ones and
    repeated for each group of query heads (Unsqueeze, Expand, Reshape), softmax in float32,
    SiLU-gated MLP, an untied lm_head."""
    cfg = cfg or LLAMA
    d, heads, kvh = cfg["hidden"], cfg["heads"], cfg["kv_heads"]
    hd, groups = d // heads, heads // kvh
    b = Builder(seed, opset)
    with b.module("model"):
        x = b.op("Gather", [b.param("embed_tokens.weight", (cfg["vocab"], d), std=0.5), "input_ids"])
        batch, seq = b.dim("input_ids", 0), b.dim("input_ids", 1)
        past_len = b.dim("past_key_values.0.key", 2)
        total = b.op("Add", [past_len, seq])
        with b.module("rotary_emb"):
            inv_freq = 1.0 / cfg["theta"] ** (np.arange(0, hd, 2, dtype=np.float32) / hd)
            inv = b.op("Expand", [b.constant(inv_freq[None, :, None]), b.shape_vec([batch, hd // 2, 1])])
            pos = b.op("Cast", [b.unsqueeze("position_ids", [1])], to=TensorProto.FLOAT)
            freqs = b.op("Transpose", [b.op("MatMul", [inv, pos])], perm=[0, 2, 1])
            emb = b.op("Concat", [freqs, freqs], axis=-1)
            cos, sin = b.op("Cos", [emb]), b.op("Sin", [emb])
        full = b.op(
            "ConstantOfShape",
            [b.shape_vec([seq, total])],
            value=numpy_helper.from_array(np.array([FLOAT_MIN], dtype=np.float32)),
        )
        causal = b.op("Trilu", [full, b.op("Add", [past_len, b.constant(1, np.int64)])], upper=1)
        causal = b.op("Expand", [b.unsqueeze(causal, [0, 1]), b.shape_vec([batch, 1, seq, total])])
        pad = b.unsqueeze(b.unsqueeze("attention_mask", [1]), [2])
        padded = b.op("Equal", [b.op("Cast", [pad], to=TensorProto.FLOAT), b.constant(0.0)])
        mask = b.op("Where", [padded, b.constant(FLOAT_MIN), causal])
        presents: list[str] = []
        for li in range(cfg["layers"]):
            with b.module("layers"), b.module(str(li)):
                h = _rms_norm(b, x, d, "input_layernorm")
                with b.module("self_attn"):
                    q = b.linear(h, d, heads * hd, "q_proj", bias=False)
                    k = b.linear(h, d, kvh * hd, "k_proj", bias=False)
                    v = b.linear(h, d, kvh * hd, "v_proj", bias=False)
                    q = b.op(
                        "Transpose", [b.op("Reshape", [q, b.shape_vec([batch, seq, heads, hd])])], perm=[0, 2, 1, 3]
                    )
                    k = b.op("Transpose", [b.op("Reshape", [k, b.shape_vec([batch, seq, kvh, hd])])], perm=[0, 2, 1, 3])
                    v = b.op("Transpose", [b.op("Reshape", [v, b.shape_vec([batch, seq, kvh, hd])])], perm=[0, 2, 1, 3])
                    c, s_ = b.unsqueeze(cos, [1]), b.unsqueeze(sin, [1])
                    q = b.op("Add", [b.op("Mul", [q, c]), b.op("Mul", [_rotate_half(b, q), s_])])
                    k = b.op("Add", [b.op("Mul", [k, c]), b.op("Mul", [_rotate_half(b, k), s_])])
                    k = b.op("Concat", [f"past_key_values.{li}.key", k], axis=-2, out=[f"present.{li}.key"])
                    v = b.op("Concat", [f"past_key_values.{li}.value", v], axis=-2, out=[f"present.{li}.value"])
                    presents += [k, v]
                    rep = []
                    for t in (k, v):  # repeat_kv
                        lengths = [b.dim(t, 0), kvh, groups, b.dim(t, 2), hd]
                        wide = b.op("Expand", [b.unsqueeze(t, [2]), b.shape_vec(lengths)])
                        rep.append(b.op("Reshape", [wide, b.shape_vec([lengths[0], heads, lengths[3], hd])]))
                    w = b.op("MatMul", [q, b.op("Transpose", [rep[0]], perm=[0, 1, 3, 2])])
                    w = b.op("Add", [b.op("Div", [w, b.constant(math.sqrt(hd))]), mask])
                    p = b.op("Cast", [b.op("Softmax", [w], axis=-1)], to=TensorProto.FLOAT)
                    a = b.op("Transpose", [b.op("MatMul", [p, rep[1]])], perm=[0, 2, 1, 3])
                    a = b.op("Reshape", [a, b.shape_vec([batch, seq, d])])
                    a = b.linear(a, heads * hd, d, "o_proj", bias=False)
                x = b.op("Add", [x, a])
                h = _rms_norm(b, x, d, "post_attention_layernorm")
                with b.module("mlp"):
                    gate = b.silu(b.linear(h, d, cfg["inter"], "gate_proj", bias=False))
                    up = b.linear(h, d, cfg["inter"], "up_proj", bias=False)
                    h = b.linear(b.op("Mul", [gate, up]), cfg["inter"], d, "down_proj", bias=False)
                x = b.op("Add", [x, h])
        x = _rms_norm(b, x, d, "norm")
    with b.module("lm_head"):
        b._n_matmul += 1
        w = b.init(f"onnx::MatMul_{b._n_matmul}", b._randn((d, cfg["vocab"]), 1.0 / math.sqrt(d)))
        b.op("MatMul", [x, w], out=["logits"])
    text = ["batch_size", "sequence_length"]
    full_len = "past_sequence_length + sequence_length"
    inputs = [
        _vi("input_ids", TensorProto.INT64, text),
        _vi("attention_mask", TensorProto.INT64, ["batch_size", full_len]),
        _vi("position_ids", TensorProto.INT64, text),
    ]
    pkv = ["batch_size", kvh, "past_sequence_length", hd]
    inputs += [
        _vi(f"past_key_values.{i}.{kind}", TensorProto.FLOAT, pkv)
        for i in range(cfg["layers"])
        for kind in ("key", "value")
    ]
    outputs = [_vi("logits", TensorProto.FLOAT, [*text, cfg["vocab"]])]
    outputs += [_vi(p, TensorProto.FLOAT, ["batch_size", kvh, full_len, hd]) for p in presents]
    return b.model(f"llama_opset{opset}_with_past", inputs, outputs)


# =========================================================================================
# timm ViT: patch Conv, class token via Expand, fused qkv, pre-norm blocks, token head
# =========================================================================================
VIT = {"image": 32, "patch": 8, "dim": 32, "heads": 4, "depth": 2, "mlp": 64, "classes": 10}


def vit(opset: int = 18, seed: int = 0, dynamo: bool = False, cfg: dict[str, int] | None = None) -> onnx.ModelProto:
    """TorchScript style (opset 17-18): traced Shape/Gather/Concat reshapes, ``expand(B, -1, -1)``
    through ConstantOfShape/Equal/Where, qkv unbind as Split(num_outputs) + Squeeze, and the
    un-named output dims torch writes (``LayerNormalizationlast_hidden_state_dim_1``). Dynamo
    style (torch >= 2.9, IR 10): Shape(start, end), constant Reshape targets with allowzero=1,
    unbind as Slice + Squeeze, LayerNormalization stash_type=1."""
    cfg = cfg or VIT
    d, heads = cfg["dim"], cfg["heads"]
    hd = d // heads
    n_tok = (cfg["image"] // cfg["patch"]) ** 2 + 1
    b = Builder(seed, opset)
    i64 = np.int64
    with b.module("patch_embed"), b.module("proj"):
        w = b.param("weight", (d, 3, cfg["patch"], cfg["patch"]))
        x = b.op(
            "Conv",
            ["pixel_values", w, b.bias("bias", d)],
            dilations=[1, 1],
            group=1,
            kernel_shape=[cfg["patch"]] * 2,
            pads=[0, 0, 0, 0],
            strides=[cfg["patch"]] * 2,
        )
    cls = b.init("cls_token", (b.rng.standard_normal((1, 1, d)) * 0.5).astype(np.float32))
    with b.module("patch_embed"):
        if dynamo:
            batch = b.op("Shape", ["pixel_values"], start=0, end=1)
            x = b.op("Reshape", [x, b.constant([-1, d, n_tok - 1], i64)], allowzero=1)
        else:
            # x.flatten(2): Reshape to x.shape[:2] + (-1,)
            head = b.op("Slice", [b.op("Shape", [x]), b.constant([0], i64), b.constant([2], i64), b.constant([0], i64)])
            x = b.op("Reshape", [x, b.op("Concat", [head, b.constant([-1], i64)], axis=0)])
        x = b.op("Transpose", [x], perm=[0, 2, 1])
    if dynamo:
        cls = b.op("Expand", [cls, b.op("Concat", [batch, b.constant([1], i64), b.constant([1], i64)], axis=0)])
    else:
        # cls_token.expand(B, -1, -1): torch writes the -1s through Equal/Where against ones.
        shape = b.shape_vec([b.dim(x, 0), -1, -1])
        ones = b.op("ConstantOfShape", [b.constant([3], i64)], value=numpy_helper.from_array(np.array([1], dtype=i64)))
        neg = b.op("Mul", [ones, b.constant(-1, i64)])
        shape = b.op("Where", [b.op("Equal", [shape, neg]), ones, shape])
        cls = b.op("Expand", [cls, shape])
    x = b.op("Concat", [cls, x], axis=1)
    x = b.op("Add", [x, b.init("pos_embed", (b.rng.standard_normal((1, n_tok, d)) * 0.5).astype(np.float32))])

    def norm(x: str, name: str, out: str | None = None) -> str:
        with b.module(name):
            gamma = b.init(b.pname("weight"), b.rng.uniform(0.8, 1.2, d).astype(np.float32))
            beta = b.init(b.pname("bias"), (b.rng.standard_normal(d) * 0.1).astype(np.float32))
            extra = {"stash_type": 1} if dynamo else {}
            return b.op(
                "LayerNormalization", [x, gamma, beta], out=[out] if out else None, axis=-1, epsilon=1e-6, **extra
            )

    def reshape(x: str, like: str, tail: Sequence[int]) -> str:
        if dynamo:
            return b.op("Reshape", [x, b.constant([-1, n_tok, *tail], i64)], allowzero=1)
        return b.op("Reshape", [x, b.shape_vec([b.dim(like, 0), b.dim(like, 1), *tail])])

    for li in range(cfg["depth"]):
        with b.module("blocks"), b.module(str(li)):
            h = norm(x, "norm1")
            with b.module("attn"):
                qkv = b.op(
                    "Transpose", [reshape(b.linear(h, d, 3 * d, "qkv"), h, [3, heads, hd])], perm=[2, 0, 3, 1, 4]
                )
                if dynamo:  # unbind(0) as three Slices
                    parts = [
                        b.op("Slice", [qkv, b.constant([j], i64), b.constant([j + 1], i64), b.constant([0], i64)])
                        for j in range(3)
                    ]
                elif b.opset >= 18:
                    parts = b.op("Split", [qkv], 3, axis=0, num_outputs=3)
                else:
                    parts = b.split(qkv, [1, 1, 1], axis=0)
                q, k, v = (b.squeeze(t, [0]) for t in parts)
                q = b.op("Mul", [q, b.constant(hd**-0.5)])
                p = b.op("Softmax", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])], axis=-1)
                a = b.op("Transpose", [b.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
                a = b.linear(reshape(a, h, [d]), d, d, "proj")
            x = b.op("Add", [x, a])
            h = norm(x, "norm2")
            with b.module("mlp"):
                h = b.linear(h, d, cfg["mlp"], "fc1")
                with b.module("act"):
                    h = b.gelu_erf(h)
                h = b.linear(h, cfg["mlp"], d, "fc2")
            x = b.op("Add", [x, h])
    x = norm(x, "norm", out="last_hidden_state")
    if dynamo:
        tok = b.op("Gather", [x, b.constant(0, i64)], axis=1)
    else:
        # x[:, 0:1] then x[:, 0]: the class token, through a Slice and a Gather.
        tok = b.op("Slice", [x, b.constant([0], i64), b.constant([1], i64), b.constant([1], i64)])
        tok = b.op("Gather", [tok, b.constant(0, i64)], axis=1)
    with b.module("head"):
        w = b.param("weight", (cfg["classes"], d))
        b.op("Gemm", [tok, w, b.bias("bias", cfg["classes"])], out=["logits"], alpha=1.0, beta=1.0, transB=1)
    # TorchScript names the dims of an output missing from dynamic_axes after its producer, even
    # where they are static; onnxruntime reports the inferred 17 and 32 for them.
    hidden = [n_tok, d] if dynamo else [f"LayerNormalizationlast_hidden_state_dim_{i}" for i in (1, 2)]
    return b.model(
        "main_graph" if dynamo else "torch_jit",
        [_vi("pixel_values", TensorProto.FLOAT, ["batch_size", 3, cfg["image"], cfg["image"]])],
        [
            _vi("logits", TensorProto.FLOAT, ["batch_size", cfg["classes"]]),
            _vi("last_hidden_state", TensorProto.FLOAT, ["batch_size", *hidden]),
        ],
        ir_version=10 if dynamo else None,
        value_info=dynamo,
    )


# =========================================================================================
# torch dynamo exporter (torch.onnx.dynamo_export, torch 2.1-2.5): one function per module
# =========================================================================================
TORCH_DOMAIN = "pkg.torch.2.3.0"
LIB_DOMAIN = "pkg.onnxscript.torch_lib"


def _fn(
    name: str,
    domain: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    nodes: Sequence[onnx.NodeProto],
    attributes: Sequence[str] = (),
    attribute_proto: Sequence[onnx.AttributeProto] = (),
) -> onnx.FunctionProto:
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(LIB_DOMAIN, 1), helper.make_opsetid(TORCH_DOMAIN, 1)]
    fn = helper.make_function(domain, name, list(inputs), list(outputs), list(nodes), opsets, list(attributes))
    fn.attribute_proto.extend(attribute_proto)
    return fn


def _ref_attr(name: str, ref: str, kind: int) -> onnx.AttributeProto:
    a = onnx.AttributeProto()
    a.name, a.ref_attr_name, a.type = name, ref, kind
    return a


def _c(name: str, value: Any, dtype: Any = np.float32) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype=dtype)))


def _dynamo_functions() -> list[onnx.FunctionProto]:
    n = helper.make_node
    fns = []
    # torch_lib ops: traced onnxscript functions, attributes bound through ref_attr_name.
    fns.append(
        _fn(
            "_aten_gelu_approximate_none",
            LIB_DOMAIN,
            ["self"],
            ["result"],
            [
                _c("sqrt2", 1.4142135381698608),
                n("CastLike", ["sqrt2", "self"], ["sqrt2_c"]),
                n("Div", ["self", "sqrt2_c"], ["inner"]),
                n("Erf", ["inner"], ["erf"]),
                _c("one", 1.0),
                n("CastLike", ["one", "self"], ["one_c"]),
                n("Add", ["erf", "one_c"], ["erf1"]),
                n("Mul", ["self", "erf1"], ["xe"]),
                _c("half", 0.5),
                n("CastLike", ["half", "self"], ["half_c"]),
                n("Mul", ["xe", "half_c"], ["result"]),
            ],
        )
    )
    fns.append(
        _fn(
            "aten_gelu",
            LIB_DOMAIN,
            ["self"],
            ["result"],
            [n("_aten_gelu_approximate_none", ["self"], ["result"], domain=LIB_DOMAIN)],
            attribute_proto=[helper.make_attribute("approximate", "none")],
        )
    )
    softmax = n("Softmax", ["self"], ["result"])
    softmax.attribute.append(_ref_attr("axis", "dim", onnx.AttributeProto.INT))
    fns.append(_fn("aten_softmax_no_dtype", LIB_DOMAIN, ["self"], ["result"], [softmax], attributes=["dim"]))
    ln = n("LayerNormalization", ["input", "weight", "bias"], ["result"], axis=-1)
    ln.attribute.append(_ref_attr("epsilon", "eps", onnx.AttributeProto.FLOAT))
    fns.append(
        _fn(
            "aten_layer_norm",
            LIB_DOMAIN,
            ["input", "weight", "bias"],
            ["result"],
            [ln],
            attribute_proto=[helper.make_attribute("eps", 1e-5)],
        )
    )
    mean = n("ReduceMean", ["self", "dims"], ["result"])
    mean.attribute.append(_ref_attr("keepdims", "keepdim", onnx.AttributeProto.INT))
    fns.append(
        _fn(
            "aten_mean_dim",
            LIB_DOMAIN,
            ["self"],
            ["result"],
            [_c("dims", [1], np.int64), mean],
            attribute_proto=[helper.make_attribute("keepdim", 0)],
        )
    )
    # Module functions: parameters arrive as inputs, as dynamo_export wrote them.
    for k in (1, 2, 3):
        fns.append(
            _fn(
                f"torch_nn_modules_linear_Linear_fc{k}_1",
                TORCH_DOMAIN,
                ["l_x_", "weight", "bias"],
                ["addmm"],
                [
                    n("Transpose", ["weight"], ["t"], perm=[1, 0]),
                    n("MatMul", ["l_x_", "t"], ["mm"]),
                    n("Add", ["mm", "bias"], ["addmm"]),
                ],
            )
        )
    for k in (1, 2):
        fns.append(
            _fn(
                f"torch_nn_modules_activation_GELU_act{k}_1",
                TORCH_DOMAIN,
                ["l_x_"],
                ["gelu"],
                [n("aten_gelu", ["l_x_"], ["gelu"], domain=LIB_DOMAIN, approximate="none")],
            )
        )
    fns.append(
        _fn(
            "torch_nn_modules_normalization_LayerNorm_norm_1",
            TORCH_DOMAIN,
            ["l_x_", "weight", "bias"],
            ["layer_norm"],
            # eps left at the function's default (1e-5).
            [n("aten_layer_norm", ["l_x_", "weight", "bias"], ["layer_norm"], domain=LIB_DOMAIN)],
        )
    )
    return fns


def dynamo_mlp(seed: int = 0) -> onnx.ModelProto:
    """An MLP over tokens, each module a model-local function: fc1 -> GELU -> LayerNorm -> fc2
    -> GELU (residual) -> mean over tokens -> fc3 -> softmax."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    dims = {"fc1": (32, 16), "fc2": (32, 32), "fc3": (10, 32)}
    inits = {}
    for k, (o, i) in dims.items():
        inits[f"{k}.weight"] = (rng.standard_normal((o, i)) / math.sqrt(i)).astype(np.float32)
        inits[f"{k}.bias"] = (rng.standard_normal(o) * 0.1).astype(np.float32)
    inits["norm.weight"] = rng.uniform(0.8, 1.2, 32).astype(np.float32)
    inits["norm.bias"] = (rng.standard_normal(32) * 0.1).astype(np.float32)
    nodes = [
        n("torch_nn_modules_linear_Linear_fc1_1", ["l_x_", "fc1.weight", "fc1.bias"], ["fc1_1"], domain=TORCH_DOMAIN),
        n("torch_nn_modules_activation_GELU_act1_1", ["fc1_1"], ["act1_1"], domain=TORCH_DOMAIN),
        n(
            "torch_nn_modules_normalization_LayerNorm_norm_1",
            ["act1_1", "norm.weight", "norm.bias"],
            ["norm_1"],
            domain=TORCH_DOMAIN,
        ),
        n("torch_nn_modules_linear_Linear_fc2_1", ["norm_1", "fc2.weight", "fc2.bias"], ["fc2_1"], domain=TORCH_DOMAIN),
        n("torch_nn_modules_activation_GELU_act2_1", ["fc2_1"], ["act2_1"], domain=TORCH_DOMAIN),
        n("Add", ["act2_1", "norm_1"], ["add"], name="aten_add_5"),
        n("aten_mean_dim", ["add"], ["mean"], domain=LIB_DOMAIN),
        n("torch_nn_modules_linear_Linear_fc3_1", ["mean", "fc3.weight", "fc3.bias"], ["fc3_1"], domain=TORCH_DOMAIN),
        n("aten_softmax_no_dtype", ["fc3_1"], ["softmax"], domain=LIB_DOMAIN, dim=-1),
    ]
    for i, node in enumerate(nodes):
        node.name = node.name or f"{node.op_type}_{i}"
    graph = helper.make_graph(
        nodes,
        "main_graph",
        [_vi("l_x_", TensorProto.FLOAT, ["s0", "s1", 16])],
        [_vi("fc3_1", TensorProto.FLOAT, ["s0", 10]), _vi("softmax", TensorProto.FLOAT, ["s0", 10])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 18),
            helper.make_opsetid(TORCH_DOMAIN, 1),
            helper.make_opsetid(LIB_DOMAIN, 1),
        ],
        functions=_dynamo_functions(),
    )
    model.ir_version = 9
    model.producer_name, model.producer_version = "pytorch", "2.3.0"
    return model


# =========================================================================================
# registry
# =========================================================================================
@dataclass(frozen=True)
class ZooModel:
    build: Callable[[], onnx.ModelProto]
    feeds: Callable[[int, int, np.random.Generator], dict[str, np.ndarray]]
    text: bool = False  # has a dynamic sequence axis


def _image_feeds(name: str, size: int) -> Callable[[int, int, np.random.Generator], dict[str, np.ndarray]]:
    def feeds(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {name: rng.standard_normal((batch, 3, size, size)).astype(np.float32)}

    return feeds


def _padding_mask(batch: int, seq: int) -> np.ndarray:
    """Ones, with the last row right-padded (a quarter of its tokens masked) when batch > 1."""
    mask = np.ones((batch, seq), dtype=np.int64)
    if batch > 1:
        mask[-1, seq - max(1, seq // 4) :] = 0
    return mask


def _bert_feeds(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    types = np.zeros((batch, seq), dtype=np.int64)
    types[:, seq // 2 :] = 1
    mask = _padding_mask(batch, seq)
    if batch > 1 and seq >= 16:
        # An empty text in the batch: every key masked (SDPA's IsNaN guard has work to do).
        mask[-1] = 0
    return {
        "input_ids": rng.integers(0, BERT["vocab"], (batch, seq), dtype=np.int64),
        "attention_mask": mask,
        "token_type_ids": types,
    }


def _gpt2_feeds(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "input_ids": rng.integers(0, GPT2["vocab"], (batch, seq), dtype=np.int64),
        "attention_mask": _padding_mask(batch, seq),
    }


def _gpt2_past_feeds(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``seq`` tokens in all: one new token after seq - 1 cached ones (seq < 10), else 4 new;
    the last row left-padded as in batched generation."""
    new = 1 if seq < 10 else 4
    past = seq - new
    mask = np.ones((batch, seq), dtype=np.int64)
    if batch > 1:
        mask[-1, : max(1, past // 3)] = 0
    hd = GPT2["embd"] // GPT2["heads"]
    feeds = {"input_ids": rng.integers(0, GPT2["vocab"], (batch, new), dtype=np.int64), "attention_mask": mask}
    for i in range(GPT2["layers"]):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal((batch, GPT2["heads"], past, hd)).astype(
                np.float32
            )
    return feeds


def llama_past_feeds(
    batch: int, seq: int, rng: np.random.Generator, cfg: dict[str, int] | None = None, new: int | None = None
) -> dict[str, np.ndarray]:
    """``seq`` tokens in all: one new token after seq - 1 cached ones (seq < 10), else 4 new
    (or ``new``); the last row left-padded as in batched generation, its positions counted
    from its first real token as transformers does."""
    cfg = cfg or LLAMA
    new = new if new is not None else (1 if seq < 10 else 4)
    past = seq - new
    mask = np.ones((batch, seq), dtype=np.int64)
    if batch > 1:
        mask[-1, : max(1, past // 3)] = 0
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, past:]
    hd = cfg["hidden"] // cfg["heads"]
    feeds = {
        "input_ids": rng.integers(0, cfg["vocab"], (batch, new), dtype=np.int64),
        "attention_mask": mask,
        "position_ids": positions.astype(np.int64),
    }
    for i in range(cfg["layers"]):
        for kind in ("key", "value"):
            shape = (batch, cfg["kv_heads"], past, hd)
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _mlp_feeds(batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"l_x_": rng.standard_normal((batch, seq, 16)).astype(np.float32)}


ZOO: dict[str, ZooModel] = {
    "resnet18_basic_opset17": ZooModel(lambda: resnet(False, 17), _image_feeds("input", 64)),
    "resnet50_bottleneck_opset15": ZooModel(lambda: resnet(True, 15, blocks=(1, 1, 1, 1)), _image_feeds("input", 64)),
    "mobilenet_v3_opset17": ZooModel(lambda: mobilenet_v3(17), _image_feeds("input", 64)),
    "mobilenet_v3_opset13": ZooModel(lambda: mobilenet_v3(13), _image_feeds("input", 64)),
    "efficientnet_b0_opset18": ZooModel(lambda: efficientnet(18), _image_feeds("input", 64)),
    "bert_opset14": ZooModel(lambda: bert(14), _bert_feeds, text=True),
    "bert_opset17": ZooModel(lambda: bert(17), _bert_feeds, text=True),
    "bert_sdpa_opset17": ZooModel(lambda: bert(17, sdpa=True), _bert_feeds, text=True),
    "gpt2_opset14": ZooModel(lambda: gpt2(14), _gpt2_feeds, text=True),
    "gpt2_opset17": ZooModel(lambda: gpt2(17), _gpt2_feeds, text=True),
    "gpt2_with_past_opset14": ZooModel(lambda: gpt2(14, past=True), _gpt2_past_feeds, text=True),
    "gpt2_with_past_opset17": ZooModel(lambda: gpt2(17, past=True), _gpt2_past_feeds, text=True),
    "llama_with_past_opset17": ZooModel(lambda: llama(17), llama_past_feeds, text=True),
    "resnet18_dynamo_opset18": ZooModel(lambda: resnet(False, 18, dynamo=True), _image_feeds("input", 64)),
    "vit_opset17": ZooModel(lambda: vit(17), _image_feeds("pixel_values", VIT["image"])),
    "vit_dynamo_opset18": ZooModel(lambda: vit(18, dynamo=True), _image_feeds("pixel_values", VIT["image"])),
    "dynamo_mlp_functions_opset18": ZooModel(dynamo_mlp, _mlp_feeds, text=True),
}
