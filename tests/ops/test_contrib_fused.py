"""com.microsoft operators onnxruntime's graph optimizer writes into the optimized models it saves
(onnxpy/ops/contrib/fused.py) against onnxruntime: one-node models for FusedConv, FusedGemm,
NhwcFusedConv, NhwcMaxPool, channels-last QLinearConv and DynamicQuantizeLSTM, their error
messages, and a small CNN saved by onnxruntime at ORT_ENABLE_EXTENDED, run by onnxpy and compared
with onnxruntime on the original model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from tests.helpers import CONTRIB_ORACLE, CONTRIB_SKIP_REASON, onnxruntime_older_than

pytestmark = pytest.mark.skipif(onnxruntime_older_than(CONTRIB_ORACLE), reason=CONTRIB_SKIP_REASON)

F = TensorProto.FLOAT
MS = "com.microsoft"
RNG = np.random.default_rng(11)


# -- helpers -------------------------------------------------------------------------------------


def _model(
    op_type: str, inputs: dict[str, Any], fed: tuple[str, ...] | None = None, n_outputs: int = 1, **attrs: Any
) -> tuple[bytes, dict[str, np.ndarray]]:
    """One com.microsoft node over ``inputs`` in order (None: an omitted optional input): those
    named in ``fed`` (by default the first) are graph inputs, the others initializers."""
    fed = fed or (next(iter(inputs)),)
    names, vis, feeds, inits = [], [], {}, []
    for name, value in inputs.items():
        names.append("" if value is None else name)
        if value is None:
            continue
        value = np.asarray(value)
        if name in fed:
            vis.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
            feeds[name] = value
        else:
            inits.append(numpy_helper.from_array(value, name))
    while names and names[-1] == "":
        names.pop()
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=MS, **attrs)
    graph = helper.make_graph(
        [node], f"test_{op_type}", vis, [helper.make_empty_tensor_value_info(n) for n in outs], initializer=inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model.SerializeToString(), feeds


def _ort(model: bytes) -> onnxruntime.InferenceSession:
    # One thread: onnxruntime's DynamicQuantizeLSTM quantizes the hidden state per batch chunk
    # its threads take, so only a single-threaded run is the operator's own result.
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _both(op_type: str, inputs: dict[str, Any], fed: tuple[str, ...] | None = None, **kw: Any) -> tuple[list, list]:
    """(onnxpy's outputs, onnxruntime's outputs) of one node."""
    model, feeds = _model(op_type, inputs, fed, **kw)
    got = onnxpy.InferenceSession(model).run(None, feeds)
    want = _ort(model).run(None, feeds)
    return got, want


def _close(got: list, want: list, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def _error(op_type: str, inputs: dict[str, Any], fed: tuple[str, ...] | None = None, **attrs: Any) -> str:
    model, feeds = _model(op_type, inputs, fed, **attrs)
    with pytest.raises(Exception) as info:  # noqa: PT011 - the message is what we check
        onnxpy.InferenceSession(model).run(None, feeds)
    return str(info.value)


def _f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _ints(dt: Any, shape: Any) -> np.ndarray:
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max + 1, shape).astype(dt)


# -- FusedConv -----------------------------------------------------------------------------------

CONV_ACTIVATIONS = [
    ("", []),
    ("Relu", []),
    ("Tanh", []),
    ("Sigmoid", []),
    ("HardSwish", []),
    ("LeakyRelu", [0.2]),
    ("Clip", [-0.5, 1.5]),
    ("HardSigmoid", [0.3, 0.6]),
]


def _act_attrs(activation: str, params: list[float]) -> dict[str, Any]:
    attrs: dict[str, Any] = {"activation": activation} if activation else {}
    if params:
        attrs["activation_params"] = params
    return attrs


@pytest.mark.parametrize(("activation", "params"), CONV_ACTIVATIONS)
def test_fused_conv_activations(activation: str, params: list[float]) -> None:
    x = _f32(2, 3, 9, 9)
    w = _f32(4, 3, 3, 3, scale=0.3)
    b = _f32(4)
    got, want = _both("FusedConv", {"X": x, "W": w, "B": b}, pads=[1, 1, 1, 1], **_act_attrs(activation, params))
    _close(got, want)


@pytest.mark.parametrize(
    "attrs",
    [
        {"strides": [2, 2], "pads": [1, 0, 2, 1]},
        {"group": 2, "dilations": [2, 1]},
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
        {"kernel_shape": [1, 1]},
    ],
)
def test_fused_conv_geometry_with_residual(attrs: dict[str, Any]) -> None:
    """Conv + B + Z then the activation, Z fed at run time (the executor may hand its buffer over)."""
    k = attrs.get("kernel_shape", [3, 3])
    x = _f32(1, 4, 10, 8)
    w = _f32(6, 4 // attrs.get("group", 1), *k, scale=0.3)
    b = _f32(6)
    y_shape = _ort(_model("FusedConv", {"X": x, "W": w, "B": b}, **attrs)[0]).run(None, {"X": x})[0].shape
    z = _f32(*y_shape)
    got, want = _both("FusedConv", {"X": x, "W": w, "B": b, "Z": z}, ("X", "Z"), activation="Relu", **attrs)
    _close(got, want)
    # Z without B: the optional input left empty.
    got, want = _both("FusedConv", {"X": x, "W": w, "B": None, "Z": z}, ("X", "Z"), activation="LeakyRelu",
                      activation_params=[0.1], **attrs)  # fmt: skip
    _close(got, want)


def test_fused_conv_1d_and_3d() -> None:
    for x, w in ((_f32(2, 3, 11), _f32(5, 3, 3)), (_f32(1, 2, 5, 6, 4), _f32(3, 2, 3, 3, 2))):
        got, want = _both("FusedConv", {"X": x, "W": w}, activation="Sigmoid")
        _close(got, want)


def test_fused_conv_errors() -> None:
    x, w = _f32(1, 3, 5, 5), _f32(2, 3, 3, 3)
    msg = _error("FusedConv", {"X": x, "W": w}, activation="LeakyRelu")
    assert "LeakyRelu" in msg and "activation_params" in msg
    msg = _error("FusedConv", {"X": x, "W": w}, activation="Elu", activation_params=[1.0])
    assert "Elu" in msg and "Relu" in msg
    msg = _error("FusedConv", {"X": x, "W": w, "B": None, "Z": _f32(1, 2, 1, 1)}, ("X", "Z"), activation="Relu")
    assert "Z" in msg and "[1, 2, 1, 1]" in msg and "[1, 2, 3, 3]" in msg


# -- NhwcFusedConv (no onnxruntime CPU kernel: FusedConv on transposed data is the oracle) ----------


def test_nhwc_fused_conv_matches_fused_conv() -> None:
    x = _f32(2, 3, 8, 7)
    w = _f32(4, 3, 3, 3, scale=0.3)
    b = _f32(4)
    attrs = {"strides": [2, 1], "pads": [1, 1, 0, 1], "activation": "Clip", "activation_params": [-1.0, 1.0]}
    (ref,), _ = _both("FusedConv", {"X": x, "W": w, "B": b}, **attrs)
    z = _f32(*ref.shape)
    (ref,), _ = _both("FusedConv", {"X": x, "W": w, "B": b, "Z": z}, ("X", "Z"), **attrs)
    model, feeds = _model(
        "NhwcFusedConv",
        {"X": x.transpose(0, 2, 3, 1), "W": w, "B": b, "Z": z.transpose(0, 2, 3, 1)},
        ("X", "Z"),
        **attrs,
    )
    (got,) = onnxpy.InferenceSession(model).run(None, feeds)
    np.testing.assert_allclose(got, ref.transpose(0, 2, 3, 1), rtol=1e-6, atol=1e-6)


# -- FusedGemm -----------------------------------------------------------------------------------

GEMM_ACTIVATIONS = [
    ("Relu", {}),
    ("Tanh", {}),
    ("Sigmoid", {}),
    ("Softsign", {}),
    ("Softplus", {}),
    ("LeakyRelu", {"activation_alpha": 0.2}),
    ("Elu", {"activation_alpha": 0.7}),
    ("ThresholdedRelu", {"activation_alpha": 0.4}),
    ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.6}),
    ("ScaledTanh", {"activation_alpha": 0.8, "activation_beta": 0.5}),
    ("ParametricSoftplus", {"activation_alpha": 0.3, "activation_beta": 1.7}),
    ("Selu", {"activation_alpha": 1.67, "activation_gamma": 1.05}),
]


@pytest.mark.parametrize(("activation", "params"), GEMM_ACTIVATIONS)
def test_fused_gemm_activations(activation: str, params: dict[str, float]) -> None:
    a, b, c = _f32(5, 6, scale=2.0), _f32(6, 7), _f32(7)
    # Unused parameters are accepted and ignored, as onnxruntime does.
    got, want = _both(
        "FusedGemm", {"A": a, "B": b, "C": c}, activation=activation, **{"activation_gamma": 3.0, **params}
    )
    _close(got, want)


def test_fused_gemm_transposes_and_scalars() -> None:
    a, b = _f32(6, 5), _f32(7, 6)
    for c in (None, _f32(1), _f32(5, 1), _f32(5, 7)):
        got, want = _both(
            "FusedGemm", {"A": a, "B": b, "C": c}, activation="LeakyRelu", activation_alpha=0.05,
            alpha=0.5, beta=2.0, transA=1, transB=1,
        )  # fmt: skip
        _close(got, want)


def test_fused_gemm_errors() -> None:
    a, b = _f32(2, 3), _f32(3, 4)
    msg = _error("FusedGemm", {"A": a, "B": b}, activation="HardSigmoid", activation_alpha=0.2)
    assert "HardSigmoid" in msg and "activation_beta" in msg
    msg = _error("FusedGemm", {"A": a, "B": b}, activation="Gelu")
    assert "Gelu" in msg and "unsupported" in msg
    msg = _error("FusedGemm", {"A": a, "B": _f32(4, 4)}, activation="Relu")
    assert "[2, 3]" in msg and "[4, 4]" in msg


# -- channels-last quantized operators -----------------------------------------------------------


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_nhwc_max_pool(dt: Any) -> None:
    x = _ints(dt, (2, 9, 8, 5))
    for attrs in (
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [2, 3], "pads": [1, 0, 1, 2], "dilations": [1, 2]},
        {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    ):
        got, want = _both("NhwcMaxPool", {"x": x}, **attrs)
        _close(got, want, rtol=0, atol=0)


def test_nhwc_max_pool_errors() -> None:
    assert "kernel_shape" in _error("NhwcMaxPool", {"x": _ints(np.uint8, (1, 4, 4, 3))}, kernel_shape=[2])
    assert "uint8" in _error("NhwcMaxPool", {"x": _f32(1, 4, 4, 3)}, kernel_shape=[2, 2])


@pytest.mark.parametrize(("xdt", "wdt"), [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_conv(xdt: Any, wdt: Any, channels_last: int) -> None:
    m, c = 6, 4
    x = _ints(xdt, (2, 7, 9, c) if channels_last else (2, c, 7, 9))
    w = _ints(wdt, (m, c // 2, 3, 3))
    per_channel = wdt == np.int8
    consts = {
        "x_scale": np.float32(0.02),
        "x_zero_point": np.array(5 if xdt == np.uint8 else -3, dtype=xdt),
        "w": w,
        "w_scale": RNG.uniform(0.002, 0.01, m).astype(np.float32) if per_channel else np.float32(0.004),
        "w_zero_point": np.zeros(m, wdt) if per_channel else np.array(7, dtype=wdt),
        "y_scale": np.float32(0.05),
        "y_zero_point": np.array(120 if xdt == np.uint8 else 4, dtype=xdt),
        "B": RNG.integers(-500, 500, m).astype(np.int32),
    }
    got, want = _both(
        "QLinearConv", {"x": x, **consts}, channels_last=channels_last, group=2, strides=[2, 1], pads=[1, 1, 0, 1]
    )
    assert got[0].shape == want[0].shape and got[0].dtype == want[0].dtype
    d = np.abs(got[0].astype(np.int32) - want[0].astype(np.int32))
    assert d.max() <= 1 and (d > 0).mean() < 0.01  # a rounding tie may land one step apart


# -- DynamicQuantizeLSTM -------------------------------------------------------------------------


def _lstm_consts(dirs: int, inp: int, hid: int, per_column: bool, dt: Any) -> dict[str, Any]:
    cols = 4 * hid
    shape = (dirs, cols) if per_column else (dirs,)
    mid = 0 if dt == np.int8 else 128
    return {
        "W": _ints(dt, (dirs, inp, cols)),
        "R": _ints(dt, (dirs, hid, cols)),
        "B": _f32(dirs, 2 * cols, scale=0.1),
        "W_scale": RNG.uniform(0.001, 0.004, shape).astype(np.float32),
        # onnxruntime needs one zero point for all of W (and of R); this one is not the midpoint.
        "W_zero_point": np.full(shape, mid if dt == np.int8 else 131, dt),
        "R_scale": RNG.uniform(0.001, 0.004, shape).astype(np.float32),
        "R_zero_point": np.full(shape, mid, dt),
    }


def _lstm_run(
    x: np.ndarray, consts: dict[str, Any], states: dict[str, Any] | None = None, **attrs: Any
) -> tuple[list, list]:
    states = states or {}
    inputs = {
        "X": x,
        "W": consts["W"],
        "R": consts["R"],
        "B": consts["B"],
        "sequence_lens": states.get("sequence_lens"),
        "initial_h": states.get("initial_h"),
        "initial_c": states.get("initial_c"),
        "P": states.get("P"),
        **{k: consts[k] for k in ("W_scale", "W_zero_point", "R_scale", "R_zero_point")},
    }
    return _both("DynamicQuantizeLSTM", inputs, n_outputs=3, **attrs)


@pytest.mark.parametrize(
    ("direction", "per_column", "dt"),
    [("forward", False, np.int8), ("reverse", True, np.int8), ("bidirectional", True, np.uint8)],
)
def test_dynamic_quantize_lstm(direction: str, per_column: bool, dt: Any) -> None:
    dirs, inp, hid = (2 if direction == "bidirectional" else 1), 6, 5
    consts = _lstm_consts(dirs, inp, hid, per_column, dt)
    x = _f32(7, 3, inp)
    got, want = _lstm_run(x, consts, hidden_size=hid, direction=direction)
    _close(got, want, rtol=1e-4, atol=1e-5)


def test_dynamic_quantize_lstm_states_and_options() -> None:
    inp, hid = 4, 3
    consts = _lstm_consts(1, inp, hid, True, np.int8)
    x = _f32(5, 2, inp)
    states = {"initial_h": _f32(1, 2, hid), "initial_c": _f32(1, 2, hid), "P": _f32(1, 3 * hid, scale=0.2)}
    got, want = _lstm_run(x, consts, states, hidden_size=hid, clip=0.8, input_forget=1)
    _close(got, want, rtol=1e-4, atol=1e-5)
    got, want = _lstm_run(x, consts, states, hidden_size=hid, activations=["HardSigmoid", "Tanh", "Softsign"],
                          activation_alpha=[0.3], activation_beta=[0.4])  # fmt: skip
    _close(got, want, rtol=1e-4, atol=1e-5)


def test_dynamic_quantize_lstm_sequence_lens() -> None:
    inp, hid = 4, 3
    consts = _lstm_consts(1, inp, hid, False, np.int8)
    x = _f32(6, 3, inp)
    # With sequences of different lengths onnxruntime quantizes the hidden state over a range that
    # is neither all entries' nor the active ones' (unspecified): ~1e-4 apart, a looser tolerance.
    got, want = _lstm_run(x, consts, {"sequence_lens": np.array([6, 6, 6], np.int32)}, hidden_size=hid)
    _close(got, want, rtol=1e-4, atol=1e-5)
    got, want = _lstm_run(x, consts, {"sequence_lens": np.array([6, 2, 4], np.int32)}, hidden_size=hid)
    _close(got, want, rtol=0, atol=1e-3)


def test_dynamic_quantize_lstm_errors() -> None:
    consts = _lstm_consts(1, 4, 3, False, np.int8)
    bad = dict(consts, W=consts["W"].transpose(0, 2, 1).copy())
    order = ["W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    order += ["W_scale", "W_zero_point", "R_scale", "R_zero_point"]
    msg = _error("DynamicQuantizeLSTM", {"X": _f32(2, 1, 4), **{k: bad.get(k) for k in order}})
    assert "W" in msg and "[1, 12, 4]" in msg and "4*hidden_size" in msg
    wrong = dict(consts, W_scale=np.ones((1, 5), np.float32))
    msg = _error("DynamicQuantizeLSTM", {"X": _f32(2, 1, 4), **{k: wrong.get(k) for k in order}})
    assert "W_scale" in msg and "[1, 5]" in msg and "[1, 12]" in msg


# -- onnxruntime's optimized model, end to end ---------------------------------------------------


def _cnn() -> onnx.ModelProto:
    """Conv+BatchNormalization+Relu, Conv+BN+Clip, a residual Add+Relu, depthwise Conv+Sigmoid, MaxPool,
    Flatten, Gemm+Relu and Gemm: what ORT_ENABLE_EXTENDED fuses into FusedConv / FusedGemm."""
    inits = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def bn(name: str, c: int) -> list[str]:
        return [
            const(f"{name}_s", RNG.uniform(0.5, 1.5, c)),
            const(f"{name}_b", RNG.standard_normal(c) * 0.1),
            const(f"{name}_m", RNG.standard_normal(c) * 0.1),
            const(f"{name}_v", RNG.uniform(0.5, 1.5, c)),
        ]

    mk = helper.make_node
    nodes = [
        mk("Conv", ["x", const("w1", RNG.standard_normal((8, 3, 3, 3)) * 0.3)], ["c1"], pads=[1, 1, 1, 1]),
        mk("BatchNormalization", ["c1", *bn("bn1", 8)], ["n1"]),
        mk("Relu", ["n1"], ["r1"]),
        mk(
            "Conv",
            ["r1", const("w2", RNG.standard_normal((8, 8, 3, 3)) * 0.2), const("b2", RNG.standard_normal(8))],
            ["c2"],
            pads=[1, 1, 1, 1],
        ),  # fmt: skip
        mk("BatchNormalization", ["c2", *bn("bn2", 8)], ["n2"]),
        mk("Clip", ["n2", const("lo", np.array(0.0)), const("hi", np.array(6.0))], ["r2"]),
        mk(
            "Conv",
            ["r2", const("w3", RNG.standard_normal((8, 8, 1, 1)) * 0.3), const("b3", RNG.standard_normal(8))],
            ["c3"],
        ),  # fmt: skip
        mk("Add", ["c3", "r1"], ["s3"]),
        mk("Relu", ["s3"], ["r3"]),
        mk("Conv", ["r3", const("w4", RNG.standard_normal((8, 1, 3, 3)) * 0.3)], ["c4"], group=8, pads=[1, 1, 1, 1]),
        mk("Sigmoid", ["c4"], ["r4"]),
        mk("MaxPool", ["r4"], ["p4"], kernel_shape=[2, 2], strides=[2, 2]),
        mk("Flatten", ["p4"], ["f"]),
        mk(
            "Gemm",
            ["f", const("g1", RNG.standard_normal((16, 8 * 6 * 6)) * 0.1), const("gb1", RNG.standard_normal(16))],
            ["h1"],
            transB=1,
        ),  # fmt: skip
        mk("Relu", ["h1"], ["a1"]),
        mk(
            "Gemm", ["a1", const("g2", RNG.standard_normal((16, 5)) * 0.3), const("gb2", RNG.standard_normal(5))], ["y"]
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", F, ["n", 3, 12, 12])],
        [helper.make_tensor_value_info("y", F, ["n", 5])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_onnxruntime_extended_optimized_cnn(tmp_path: Path) -> None:
    original = _cnn().SerializeToString()
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    onnxruntime.InferenceSession(original, so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "opt.onnx"))
    ms_ops = [(n.op_type, {a.name: helper.get_attribute_value(a) for a in n.attribute}, len(n.input))
              for n in optimized.graph.node if n.domain == MS]  # fmt: skip
    kinds = {op for op, _, _ in ms_ops}
    # The optimized model really holds the fused operators (the test cannot pass vacuously).
    # (At this level onnxruntime leaves Conv + Add + Relu unfused: FusedConv's residual input Z
    # is covered by the one-node tests.)
    assert {"FusedConv", "FusedGemm"} <= kinds, kinds
    conv_acts = {a.get("activation", b"").decode() for op, a, _ in ms_ops if op == "FusedConv"}
    assert {"Relu", "Clip", "Sigmoid"} <= conv_acts, conv_acts
    assert not any(n.op_type == "BatchNormalization" for n in optimized.graph.node)

    x = _f32(3, 3, 12, 12)
    want = onnxruntime.InferenceSession(original, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    session = onnxpy.InferenceSession(str(tmp_path / "opt.onnx"))
    for _ in range(2):  # a second run: buffers the executor reuses
        got = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_nchwc_operator_is_refused_with_what_to_do_instead() -> None:
    # ORT_ENABLE_ALL's blocked layout depends on the CPU it ran on: refused, naming the fix.
    node = helper.make_node("ReorderInput", ["x"], ["y"], domain="com.microsoft.nchwc")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft.nchwc", 1)]
    )
    with pytest.raises(onnxpy.NotImplemented, match="ReorderInput.*ORT_ENABLE_EXTENDED"):
        onnxpy.InferenceSession(model.SerializeToString())
