"""Random single-operator models and random CNN graphs, run by onnxpy and by onnxruntime.

A development tool, not a test: it prints each case where the two disagree (with onnx's
reference evaluator as a tie-breaker for operators), so that a person can decide who is
right. Known, deliberate differences are filtered out where they are cheap to recognise:
onnxruntime's SAME padding of dilated pools (it ignores the dilation), pools whose kernel does
not fit the padded input (onnxpy refuses them by name, onnxruntime may crash on them), windows
wholly in the padding (-inf against onnxruntime's lowest finite value on some of its paths).

    python scripts/differential_fuzz.py pool --cases 500 --seed 1
    python scripts/differential_fuzz.py binary --cases 2000
    python scripts/differential_fuzz.py conv --cases 300
    python scripts/differential_fuzz.py resize --cases 500
    python scripts/differential_fuzz.py graph --cases 200

Some disagreements left are onnxruntime's own: a source coordinate exactly on a pixel boundary
that its float32 arithmetic puts just below (Resize nearest 'floor', 5 -> 3 at scale 0.6,
half_pixel_symmetric: exactly 2.0, onnxruntime takes pixel 1), and average pools over windows
wholly in the padding, where its result changes from run to run.

Session 42 found three bugs this way (pools with no window along one axis, Resize nearest
rounding at exact ties, Pow's fast paths dropping a higher-rank exponent's shape).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

ELEM = {
    np.dtype(np.float32): onnx.TensorProto.FLOAT,
    np.dtype(np.float64): onnx.TensorProto.DOUBLE,
    np.dtype(np.float16): onnx.TensorProto.FLOAT16,
    np.dtype(np.int8): onnx.TensorProto.INT8,
    np.dtype(np.uint8): onnx.TensorProto.UINT8,
    np.dtype(np.int32): onnx.TensorProto.INT32,
    np.dtype(np.int64): onnx.TensorProto.INT64,
    np.dtype(np.uint32): onnx.TensorProto.UINT32,
    np.dtype(np.uint64): onnx.TensorProto.UINT64,
    np.dtype(np.bool_): onnx.TensorProto.BOOL,
}

Case = tuple[onnx.ModelProto, dict[str, np.ndarray], str]


def _model(nodes: list[Any], feeds: dict[str, np.ndarray], outputs: list[str], inits: list[Any], opset: int) -> Any:
    inputs = [helper.make_tensor_value_info(k, ELEM[v.dtype], list(v.shape)) for k, v in feeds.items()]
    graph = helper.make_graph(nodes, "fuzz", inputs, [onnx.ValueInfoProto(name=o) for o in outputs], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def pool_case(rng: np.random.Generator) -> Case | None:
    nd = 2 if rng.random() < 0.8 else int(rng.choice([1, 3]))
    op = str(rng.choice(["MaxPool", "AveragePool", "LpPool"]))
    kernel = [int(rng.choice([1, 2, 3, 3, 5])) for _ in range(nd)]
    strides = [int(rng.choice([1, 1, 2, 3])) for _ in range(nd)]
    sizes = [int(rng.choice([1, 3, 6, 7, 13, 14, 27, 56])) for _ in range(nd)]
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": strides}
    dilated = op != "LpPool" and rng.random() < 0.3
    if dilated:
        attrs["dilations"] = [int(rng.choice([1, 2])) for _ in range(nd)]
    if not dilated and rng.random() < 0.15 and all(k >= s for k, s in zip(kernel, strides)):
        attrs["auto_pad"] = "SAME_UPPER"  # (onnxruntime ignores dilations here; negative pads differ)
    else:
        attrs["pads"] = [int(rng.integers(0, kernel[i % nd])) if kernel[i % nd] > 1 else 0 for i in range(2 * nd)]
    if op != "LpPool" and rng.random() < 0.3:
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and rng.random() < 0.4:
        attrs["count_include_pad"] = 1
    if op == "LpPool":
        attrs["p"] = int(rng.choice([1, 2, 3]))
    pads = attrs.get("pads", [0] * (2 * nd))
    dilations = attrs.get("dilations", [1] * nd)
    if any(sizes[i] + pads[i] + pads[nd + i] < (kernel[i] - 1) * dilations[i] + 1 for i in range(nd)):
        return None  # a kernel wider than the padded input: onnxpy refuses it, onnxruntime can crash (SIGFPE)
    x = rng.standard_normal([int(rng.choice([1, 2])), int(rng.choice([1, 3, 16, 64])), *sizes]).astype(np.float32)
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, ["y"], [], 19)
    return model, {"x": x}, f"{op} {list(x.shape)} {attrs}"


_BINARY = {"Add": 14, "Sub": 14, "Mul": 14, "Div": 14, "Pow": 15, "Max": 13, "Min": 13, "Mod": 13, "Equal": 13}


def binary_case(rng: np.random.Generator) -> Case | None:
    op = str(rng.choice(list(_BINARY)))
    dt = np.dtype(rng.choice([np.float32, np.float64, np.int32, np.int64, np.float16]))
    base = [int(rng.choice([1, 2, 3, 4])) for _ in range(int(rng.integers(0, 4)))]

    def operand() -> np.ndarray:
        shape = [d if rng.random() < 0.7 else 1 for d in base][int(rng.integers(0, len(base) + 1)) :]
        if dt.kind == "f":
            return np.asarray((rng.standard_normal(shape) * float(rng.choice([1, 100]))).astype(dt))
        return np.asarray(rng.integers(-1000, 1000, shape, dtype=dt, endpoint=True))

    a, b = operand(), operand()
    attrs: dict[str, Any] = {}
    if op in ("Div", "Mod") and dt.kind == "i":
        b = np.where(b == 0, np.ones_like(b), b)
    if op == "Mod":
        attrs["fmod"] = 1 if dt.kind == "f" else int(rng.integers(0, 2))
    if op == "Pow":
        b = np.asarray(rng.integers(0, 4, b.shape).astype(rng.choice([np.float32, np.int64])))
        if dt.kind == "i":
            a = np.asarray(rng.integers(-5, 6, a.shape, dtype=dt))
    feeds = {"a": a, "b": b}
    model = _model([helper.make_node(op, ["a", "b"], ["y"], **attrs)], feeds, ["y"], [], _BINARY[op])
    return model, feeds, f"{op} {dt.name} a{list(a.shape)} b{list(b.shape)} {b.dtype.name} {attrs}"


def graph_case(rng: np.random.Generator) -> Case | None:
    """A random chain of CNN operators (convolutions, BatchNorm, activations, residual adds,
    pools, concatenations), some intermediates fetched too: what the optimizer's passes fuse."""
    n, c0, size = int(rng.choice([1, 2])), int(rng.choice([3, 8, 16])), int(rng.choice([5, 8, 14]))
    shapes: dict[str, tuple[int, ...]] = {"x": (n, c0, size, size)}
    nodes: list[Any] = []
    inits: list[Any] = []
    outputs: list[str] = []
    count = 0

    def name(prefix: str) -> str:
        nonlocal count
        count += 1
        return f"{prefix}{count}"

    def const(a: np.ndarray) -> str:
        nm = name("w")
        inits.append(numpy_helper.from_array(np.asarray(a, dtype=np.float32), nm))
        return nm

    for _ in range(int(rng.integers(3, 12))):
        src = str(rng.choice(list(shapes)))
        _, c, h, _ = shapes[src]
        kind = str(rng.choice(["conv", "conv", "dwconv", "bn", "act", "add", "pool", "concat", "gap_mul"]))
        out = name("v")
        if kind in ("conv", "dwconv"):
            k, s = int(rng.choice([1, 3, 5])), int(rng.choice([1, 1, 2]))
            p = k // 2
            group = c if kind == "dwconv" else 1
            m = c if kind == "dwconv" else int(rng.choice([4, 8, 16]))
            ins = [src, const(rng.standard_normal((m, c // group, k, k)) * 0.3)]
            if rng.random() < 0.7:
                ins.append(const(rng.standard_normal(m) * 0.1))
            attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4, "group": group}
            nodes.append(helper.make_node("Conv", ins, [out], **attrs))
            shapes[out] = (n, m, (h + 2 * p - k) // s + 1, (h + 2 * p - k) // s + 1)
        elif kind == "bn":
            params = [rng.uniform(0.5, 1.5, c), rng.standard_normal(c) * 0.1, rng.standard_normal(c) * 0.1]
            ins = [src, *(const(p_) for p_ in params), const(rng.uniform(0.5, 1.5, c))]
            nodes.append(helper.make_node("BatchNormalization", ins, [out]))
            shapes[out] = shapes[src]
        elif kind == "act":
            op = str(rng.choice(["Relu", "LeakyRelu", "Sigmoid", "HardSwish"]))
            nodes.append(helper.make_node(op, [src], [out]))
            shapes[out] = shapes[src]
        elif kind == "add":
            same = [v for v, sh in shapes.items() if sh == shapes[src]]
            nodes.append(helper.make_node("Add", [src, str(rng.choice(same))], [out]))
            shapes[out] = shapes[src]
        elif kind == "pool":
            if h < 3:
                continue
            op = str(rng.choice(["MaxPool", "AveragePool"]))
            nodes.append(helper.make_node(op, [src], [out], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
            shapes[out] = (n, c, (h - 1) // 2 + 1, (h - 1) // 2 + 1)
        elif kind == "concat":
            peers = [v for v, sh in shapes.items() if sh[2:] == shapes[src][2:]]
            picks = [src, *(str(rng.choice(peers)) for _ in range(int(rng.integers(1, 3))))]
            nodes.append(helper.make_node("Concat", picks, [out], axis=1))
            shapes[out] = (n, sum(shapes[p_][1] for p_ in picks), h, h)
        else:
            pooled = name("v")
            nodes.append(helper.make_node("GlobalAveragePool", [src], [pooled]))
            nodes.append(helper.make_node("Mul", [src, pooled], [out]))
            shapes[pooled], shapes[out] = (n, c, 1, 1), shapes[src]
        if rng.random() < 0.15:
            outputs.append(out)
    if not nodes:
        return None
    outputs.append(nodes[-1].output[0])
    x = rng.standard_normal(shapes["x"]).astype(np.float32)
    model = _model(nodes, {"x": x}, list(dict.fromkeys(outputs)), inits, 17)
    return model, {"x": x}, f"graph of {len(nodes)} nodes: {[nd.op_type for nd in nodes]}"


def conv_case(rng: np.random.Generator) -> Case | None:
    """One Conv (then an activation or a residual Add, which the optimizer fuses) over random
    geometries large enough to reach every path: tap sums, Winograd, im2col, depthwise, grouped."""
    nd = 2 if rng.random() < 0.85 else int(rng.choice([1, 3]))
    kernel = [int(rng.choice([1, 1, 2, 3, 3, 5, 7])) for _ in range(nd)]
    strides = [int(rng.choice([1, 1, 1, 2, 3])) for _ in range(nd)]
    dilations = [int(rng.choice([1, 1, 1, 2])) for _ in range(nd)]
    sizes = [int(rng.choice([1, 5, 7, 14, 28, 56])) for _ in range(nd)]
    if nd == 3:
        sizes = [min(v, 14) for v in sizes]
    group = int(rng.choice([1, 1, 2, 4, -1]))
    channels = int(rng.choice([1, 3, 8, 16, 32, 64, 128]))
    group = channels if group == -1 else group
    channels = max(channels // group, 1) * group
    out_channels = channels if group == channels and rng.random() < 0.7 else group * int(rng.choice([1, 2, 8, 16]))
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "group": group}
    pads = [int(rng.integers(0, k)) if k > 1 else 0 for k in kernel] * 2
    if rng.random() < 0.2:
        attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        pads = [0] * (2 * nd) if attrs["auto_pad"] == "VALID" else pads
        if attrs["auto_pad"] != "VALID" and any(d > 1 for d in dilations):
            return None  # onnxruntime's SAME ignores dilations
    else:
        attrs["pads"] = pads
    if any(sizes[i] + pads[i] + pads[nd + i] < (kernel[i] - 1) * dilations[i] + 1 for i in range(nd)):
        return None
    x = rng.standard_normal([int(rng.choice([1, 1, 2])), channels, *sizes]).astype(np.float32)
    inits = [
        numpy_helper.from_array(rng.standard_normal([out_channels, channels // group, *kernel]).astype(np.float32), "w")
    ]
    inputs = ["x", "w"]
    if rng.random() < 0.7:
        inits.append(numpy_helper.from_array(rng.standard_normal(out_channels).astype(np.float32), "b"))
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["c"], **attrs)]
    after = str(rng.choice(["none", "Relu", "Clip", "Sigmoid"]))
    if after != "none":
        nodes.append(helper.make_node(after, ["c"], ["y"]))
    model = _model(nodes, {"x": x}, ["y" if after != "none" else "c"], inits, 13)
    return model, {"x": x}, f"Conv {list(x.shape)} w{[out_channels, channels // group, *kernel]} {attrs} then {after}"


def resize_case(rng: np.random.Generator) -> Case | None:
    """Resize over every mode, coordinate transform, nearest rounding, antialias and cubic
    setting, with scales or sizes (tf_crop_and_resize with a random roi)."""
    rank = int(rng.choice([3, 4, 4, 5]))
    shape = [int(rng.choice([1, 2])), int(rng.choice([1, 3]))] + [
        int(rng.choice([1, 2, 3, 5, 7, 8, 13])) for _ in range(rank - 2)
    ]
    mode = str(rng.choice(["nearest", "linear", "cubic"]))
    transform = str(
        rng.choice(["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"])
    )
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": transform}
    if mode == "nearest":
        attrs["nearest_mode"] = str(rng.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    if mode == "cubic":
        attrs["cubic_coeff_a"] = float(rng.choice([-0.75, -0.5]))
        attrs["exclude_outside"] = int(rng.integers(0, 2))
    if mode != "nearest" and rng.random() < 0.3:
        attrs["antialias"] = 1
    inits = []
    if rng.random() < 0.5:
        sizes = shape[:2] + [int(rng.choice([1, 2, 3, 4, 6, 9, 15])) for _ in shape[2:]]
        inits.append(numpy_helper.from_array(np.array(sizes, dtype=np.int64), "sizes"))
        inputs = ["x", "", "", "sizes"]
    else:
        scales = [1.0, 1.0] + [float(rng.choice([0.5, 0.6, 0.75, 1.5, 2.0, 3.0])) for _ in shape[2:]]
        inits.append(numpy_helper.from_array(np.array(scales, dtype=np.float32), "scales"))
        inputs = ["x", "", "scales"]
    x = rng.standard_normal(shape).astype(np.float32)
    model = _model([helper.make_node("Resize", inputs, ["y"], **attrs)], {"x": x}, ["y"], inits, 19)
    return model, {"x": x}, f"Resize {shape} {attrs} {onnx.numpy_helper.to_array(inits[0]).tolist()}"


FAMILIES: dict[str, Callable[[np.random.Generator], Case | None]] = {
    "pool": pool_case,
    "binary": binary_case,
    "conv": conv_case,
    "resize": resize_case,
    "graph": graph_case,
}


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        # A max pool window wholly in the padding: onnxpy gives -inf (the max of nothing),
        # onnxruntime -inf or, on some paths, the lowest finite value.
        lowest = np.finfo(b.dtype).min
        a, b = np.where(a == lowest, -np.inf, a), np.where(b == lowest, -np.inf, b)
        scale = max(1.0, float(np.nanmax(np.abs(b), initial=0.0)))
        return bool(np.allclose(a, b, rtol=1e-4, atol=1e-4 * scale, equal_nan=True))
    return bool(np.array_equal(a, b))


def main() -> int:
    import onnxruntime as ort

    import onnxpy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--all", action="store_true", help="also print cases where onnx.reference agrees with onnxpy")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    ran = differ = reference_agrees = 0
    for _ in range(args.cases):
        case = FAMILIES[args.family](rng)
        if case is None:
            continue
        model, feeds, what = case
        data = model.SerializeToString()
        try:
            want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
        except Exception:  # noqa: BLE001 - cases onnxruntime refuses are not compared
            continue
        ran += 1
        with np.errstate(all="ignore"):
            try:
                got = onnxpy.InferenceSession(data).run(None, feeds)
            except Exception as e:  # noqa: BLE001 - reported
                if "larger than the padded input" not in str(e):
                    differ += 1
                    print(f"onnxpy raised: {what}\n    {type(e).__name__}: {str(e)[-300:]}")
                continue
        if all(_same(g, w) for g, w in zip(got, want)):
            continue
        verdict, explained = "", False
        if args.family != "graph":
            from onnx.reference import ReferenceEvaluator

            try:
                ref = ReferenceEvaluator(model).run(None, feeds)
                if all(_same(g, r) for g, r in zip(got, ref)):
                    reference_agrees += 1
                    if not args.all:
                        continue
                    verdict, explained = " (onnx.reference agrees with onnxpy)", True
            except Exception:  # noqa: BLE001 - the reference does not cover everything
                verdict = " (onnx.reference cannot run it)"
        if not explained:
            differ += 1
        shapes = [(np.shape(g), np.shape(w)) for g, w in zip(got, want)]
        print(f"differs{verdict}: {what}\n    shapes onnxpy/onnxruntime {shapes}")
    print(
        f"{ran} cases run, {differ} differ from onnxruntime without onnx.reference siding with onnxpy "
        f"({reference_agrees} more where it does)"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
