"""optimizer/passes/half_in_float.py: float16 and bfloat16 graphs compute in float32 between
their boundaries, round once where a value leaves them, and keep the model's own Casts."""

from __future__ import annotations

import collections

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import make_model, vinfo

H, F = TensorProto.FLOAT16, TensorProto.FLOAT
RNG = np.random.default_rng(11)


def _chain(elem: int, *, explicit_cast: bool = False, fetch_middle: bool = False) -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Sigmoid * (the second conv) -> Add residual, in ``elem``; with
    ``explicit_cast`` the model itself rounds the first ReLU's output to float16 and back."""
    dt = {H: np.float16, F: np.float32, TensorProto.BFLOAT16: ml_dtypes.bfloat16}[elem]
    w1 = (RNG.standard_normal((8, 4, 3, 3)) * 0.4).astype(np.float32)
    w2 = (RNG.standard_normal((4, 8, 3, 3)) * 0.4).astype(np.float32)
    b2 = RNG.standard_normal(4).astype(np.float32)
    relu_out = "r"
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r"]),
    ]
    if explicit_cast:
        nodes += [
            helper.make_node("Cast", ["r"], ["r16"], to=H),
            helper.make_node("Cast", ["r16"], ["r_back"], to=elem),
        ]
        relu_out = "r_back"
    nodes += [
        helper.make_node("Conv", [relu_out, "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["s"]),
        helper.make_node("Mul", ["s", "c2"], ["m"]),
        helper.make_node("Add", ["m", "x"], ["y"]),
    ]
    outputs = [vinfo("y", elem, [1, 4, 10, 10])]
    if fetch_middle:
        outputs.append(vinfo("c2", elem, [1, 4, 10, 10]))
    return make_model(
        nodes,
        [vinfo("x", elem, [1, 4, 10, 10])],
        outputs,
        initializers={"w1": w1.astype(dt), "w2": w2.astype(dt), "b2": b2.astype(dt)},
    )


def _float_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model in float32, with the half weights' exact float32 values."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    g = twin.graph
    for i, t in enumerate(g.initializer):
        arr = onnx.numpy_helper.to_array(t)
        g.initializer[i].CopyFrom(onnx.numpy_helper.from_array(arr.astype(np.float32), t.name))
    for vi in (*g.input, *g.output):
        vi.type.tensor_type.elem_type = F
    for n in g.node:
        for a in n.attribute:
            if a.name == "to" and a.i in (H, TensorProto.BFLOAT16) and n.output[0] != "r16":
                a.i = F
    return twin


def _topo(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    done: set[str] = {"x", "w1", "w2", "b2"}
    out: list[onnx.NodeProto] = []
    while nodes:
        ready = next(n for n in nodes if all(i in done for i in n.input))
        nodes.remove(ready)
        out.append(ready)
        done.update(ready.output)
    return out


@pytest.mark.parametrize("elem", [H, TensorProto.BFLOAT16])
def test_half_graph_equals_float32_rounded_once(elem: int) -> None:
    model = _chain(elem)
    dt = np.float16 if elem == H else ml_dtypes.bfloat16
    x = RNG.standard_normal((1, 4, 10, 10)).astype(dt)
    (got,) = onnxpy.InferenceSession(model).run(None, {"x": x})
    (want,) = onnxpy.InferenceSession(_float_twin(model)).run(None, {"x": x.astype(np.float32)})
    assert got.dtype == dt
    np.testing.assert_array_equal(got, want.astype(dt))
    # Unoptimized, every node rounds to the half type: different bits, the same to its precision.
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    (plain,) = onnxpy.InferenceSession(model, plain_opts).run(None, {"x": x})
    assert not np.array_equal(plain, got)
    np.testing.assert_allclose(plain.astype(np.float32), got.astype(np.float32), rtol=0.05, atol=0.05)


def test_boundaries_and_fusions() -> None:
    model = _chain(H)
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    casts = [n for n in graph.nodes if n.op_type == "Cast"]
    # one Cast in (x, read by the first conv and the residual), one out (y); between them the
    # graph the float32 model optimizes to, fusions included
    assert sorted(int(n.attrs["to"]) for n in casts) == [F, H]
    twin = build_graph(_float_twin(model))
    optimize(twin, 99, host_only=True)
    ops = collections.Counter(n.op_type for n in graph.nodes if n.op_type != "Cast")
    # both convolutions carry their activation: Relu, and the Sigmoid * c2 as a Swish
    assert ops == collections.Counter(n.op_type for n in twin.nodes) and ops["FusedConv"] == 2
    assert all(graph.elem_type(w) == F for n in graph.nodes if n.op_type != "Cast" for w in n.inputs if w)


def test_model_cast_keeps_its_rounding_and_fetched_values_keep_their_type() -> None:
    model = _chain(H, explicit_cast=True, fetch_middle=True)
    x = RNG.standard_normal((1, 4, 10, 10)).astype(np.float16)
    y, c2 = onnxpy.InferenceSession(model).run(None, {"x": x})
    assert y.dtype == c2.dtype == np.float16
    twin = _float_twin(model)  # keeps the Cast to float16 (r16): the rounding the model asks for
    # c2 leaves the converted graph as an output: rounded there, and its readers read that
    # rounded value too (one value, one rounding)
    conv2 = next(n for n in twin.graph.node if n.output[0] == "c2")
    conv2.output[0] = "c2_raw"
    twin.graph.node.extend(
        [helper.make_node("Cast", ["c2_raw"], ["c2_16"], to=H), helper.make_node("Cast", ["c2_16"], ["c2"], to=F)]
    )
    twin = onnx.helper.make_model(
        onnx.helper.make_graph(
            _topo(list(twin.graph.node)),
            "twin",
            list(twin.graph.input),
            list(twin.graph.output),
            list(twin.graph.initializer),
        ),
        opset_imports=list(twin.opset_import),
    )
    want_y, want_c2 = onnxpy.InferenceSession(twin).run(None, {"x": x.astype(np.float32)})
    np.testing.assert_array_equal(y, want_y.astype(np.float16))
    np.testing.assert_array_equal(c2, want_c2.astype(np.float16))


def test_disabled_level_and_clip_without_bounds_are_left_alone() -> None:
    model = make_model(
        [helper.make_node("Clip", ["x", "lo"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
        [vinfo("x", H, [4])],
        [vinfo("y", H, [4])],
        initializers={"lo": np.array(-1.0, np.float16)},
    )
    graph = build_graph(model)
    assert optimize(graph, 0, host_only=True) == []
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    clip = next(n for n in graph.nodes if n.op_type == "Clip")
    assert graph.elem_type(clip.outputs[0]) == H  # its omitted max is float16's 65504, not float32's
    x = np.array([np.inf, -5, 2, 60000], np.float16)
    (got,) = onnxpy.InferenceSession(model).run(None, {"x": x})
    assert got.tolist() == [65504.0, 0.0, 2.0, 60000.0]


def test_gpu_sessions_keep_half_precision() -> None:
    graph = build_graph(_chain(H))
    optimize(graph, 99, host_only=False)
    assert not any(n.op_type == "Cast" for n in graph.nodes)


def test_close_to_onnxruntime_on_a_half_model() -> None:
    model = _chain(H)
    x = RNG.standard_normal((1, 4, 10, 10)).astype(np.float16)
    (got,) = onnxpy.InferenceSession(model).run(None, {"x": x})
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    scale = float(np.abs(want.astype(np.float32)).max())
    assert np.abs(got.astype(np.float32) - want.astype(np.float32)).max() <= 2e-3 * scale


def test_shape_of_a_half_input_reads_it_without_a_conversion() -> None:
    model = make_model(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Relu", ["s2"], ["y"])],
        [vinfo("x", H, ["n", 3]), vinfo("s2", H, [2])],
        [vinfo("s", TensorProto.INT64, [2]), vinfo("y", H, [2])],
    )
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    shape = next(n for n in graph.nodes if n.op_type == "Shape")
    assert shape.inputs == ["x"]
    assert [n.inputs for n in graph.nodes if n.op_type == "Cast"] == [["s2"], ["y_as_float"]]
    s, y = onnxpy.InferenceSession(model).run(
        None, {"x": np.ones((2, 3), np.float16), "s2": np.array([-1, 2], np.float16)}
    )
    assert s.tolist() == [2, 3] and y.tolist() == [0.0, 2.0] and y.dtype == np.float16


@pytest.mark.parametrize("middle", ["Dropout", "Cast"])
def test_a_value_seen_directly_and_through_an_unconverted_node_is_one_value(middle: str) -> None:
    # d is a in the model (Dropout at inference, a Cast to its own type): d >= a everywhere,
    # a - d == 0. The unrounded float32 a must not meet the rounded one that went through d.
    model = make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["a"]),
            helper.make_node(middle, ["a"], ["d"], **({"to": H} if middle == "Cast" else {})),
            helper.make_node("GreaterOrEqual", ["d", "a"], ["ge"]),
            helper.make_node("Sub", ["a", "d"], ["diff"]),
        ],
        [vinfo("x", H, [4, 5])],
        [vinfo("ge", TensorProto.BOOL, [4, 4]), vinfo("diff", H, [4, 4])],
        initializers={"w": RNG.standard_normal((5, 4)).astype(np.float16)},
    )
    ge, diff = onnxpy.InferenceSession(model).run(None, {"x": RNG.standard_normal((4, 5)).astype(np.float16)})
    assert ge.all() and not diff.any()


def test_isinf_sees_the_half_value() -> None:
    # 65504 + 65504 is infinite in float16 only: IsInf stays outside the converted graph
    model = make_model(
        [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("IsInf", ["s"], ["y"])],
        [vinfo("x", H, [2])],
        [vinfo("y", TensorProto.BOOL, [2])],
    )
    (got,) = onnxpy.InferenceSession(model).run(None, {"x": np.array([65504, 1], np.float16)})
    assert got.tolist() == [True, False]


def test_contrib_operators_of_the_transformer_optimizer_convert_too() -> None:
    # MatMul -> SkipLayerNormalization -> BiasGelu in float16, as onnxruntime's transformer
    # optimizer writes them (com.microsoft, with the types it records): one float32 region
    d = 8
    inits = {
        "w": (RNG.standard_normal((d, d)) * 0.3).astype(np.float16),
        "gamma": RNG.standard_normal(d).astype(np.float16),
        "beta": RNG.standard_normal(d).astype(np.float16),
        "bias": RNG.standard_normal(d).astype(np.float16),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("SkipLayerNormalization", ["m", "x", "gamma", "beta"], ["n"], domain="com.microsoft"),
        helper.make_node("BiasGelu", ["n", "bias"], ["y"], domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [vinfo("x", H, [2, 3, d])],
        [vinfo("y", H, [2, 3, d])],
        [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()],
        value_info=[vinfo("m", H, [2, 3, d]), vinfo("n", H, [2, 3, d])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    g = build_graph(model)
    optimize(g, 99, host_only=True)
    assert [n.op_type for n in g.nodes if n.op_type == "Cast"] == ["Cast", "Cast"]  # in and out only
    x = RNG.standard_normal((2, 3, d)).astype(np.float16)
    (got,) = onnxpy.InferenceSession(model).run(None, {"x": x})
    twin = _float_twin(model)
    del twin.graph.value_info[:]
    (want,) = onnxpy.InferenceSession(twin).run(None, {"x": x.astype(np.float32)})
    np.testing.assert_array_equal(got, want.astype(np.float16))
    (theirs,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got.astype(np.float32), theirs.astype(np.float32), atol=2e-2, rtol=2e-2)
