"""RNN / GRU / LSTM kernels against onnxruntime on attribute combinations the conformance suite
does not reach: sequence_lens with every direction, layout 1, clip, peepholes, input_forget,
linear_before_reset, parameterised activations, initial states."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy

T, BATCH, INP, HID = 5, 3, 4, 6
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _run_both(
    op_type: str, feeds: dict[str, np.ndarray], n_out: int, opset: int = 14, **attrs: Any
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    inputs = [n if n in feeds else "" for n in names]
    while inputs and not inputs[-1]:
        inputs.pop()
    outs = ["Y", "Y_h", "Y_c"][:n_out]
    node = helper.make_node(op_type, inputs, outs, **attrs)
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}
    vi = [
        helper.make_tensor_value_info(n, TensorProto.INT32 if n == "sequence_lens" else elem[v.dtype], list(v.shape))
        for n, v in feeds.items()
    ]
    out_elem = elem[feeds["X"].dtype]
    graph = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info(o, out_elem, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxpy.InferenceSession(data).run(None, feeds)
    return got, want


def _feeds(
    op_type: str,
    rng: np.random.Generator,
    dirs: int = 1,
    layout: int = 0,
    bias: bool = True,
    lens: list[int] | None = None,
    init: bool = False,
    peep: bool = False,
    dtype: Any = np.float32,
) -> dict[str, np.ndarray]:
    g = GATES[op_type]
    x_shape = (T, BATCH, INP) if layout == 0 else (BATCH, T, INP)
    st_shape = (dirs, BATCH, HID) if layout == 0 else (BATCH, dirs, HID)
    f: dict[str, np.ndarray] = {
        "X": rng.standard_normal(x_shape).astype(dtype),
        "W": (rng.standard_normal((dirs, g * HID, INP)) * 0.5).astype(dtype),
        "R": (rng.standard_normal((dirs, g * HID, HID)) * 0.5).astype(dtype),
    }
    if bias:
        f["B"] = rng.standard_normal((dirs, 2 * g * HID)).astype(dtype)
    if lens is not None:
        f["sequence_lens"] = np.array(lens, dtype=np.int32)
    if init:
        f["initial_h"] = rng.standard_normal(st_shape).astype(dtype)
        if op_type == "LSTM":
            f["initial_c"] = rng.standard_normal(st_shape).astype(dtype)
    if peep:
        f["P"] = rng.standard_normal((dirs, 3 * HID)).astype(dtype)
    return f


def _check(got: list[np.ndarray], want: list[np.ndarray], tol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


DIRECTIONS = [("forward", 1), ("reverse", 1), ("bidirectional", 2)]


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction,dirs", DIRECTIONS)
def test_sequence_lens_and_initial_state(op_type: str, direction: str, dirs: int) -> None:
    rng = np.random.default_rng(1)
    feeds = _feeds(op_type, rng, dirs=dirs, lens=[5, 2, 3], init=True, peep=op_type == "LSTM")
    n_out = 3 if op_type == "LSTM" else 2
    got, want = _run_both(op_type, feeds, n_out, hidden_size=HID, direction=direction)
    _check(got, want)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction,dirs", DIRECTIONS)
def test_layout_1(op_type: str, direction: str, dirs: int) -> None:
    # onnxruntime has no batch-major (layout 1) kernels: compare with its layout-0 result on
    # transposed inputs, transposed back.
    rng = np.random.default_rng(2)
    feeds0 = _feeds(op_type, rng, dirs=dirs, layout=0, init=True, lens=[4, 5, 1])
    n_out = 3 if op_type == "LSTM" else 2
    _, want0 = _run_both(op_type, feeds0, n_out, hidden_size=HID, direction=direction)
    feeds1 = dict(feeds0)
    feeds1["X"] = feeds0["X"].transpose(1, 0, 2).copy()
    for k in ("initial_h", "initial_c"):
        if k in feeds1:
            feeds1[k] = feeds0[k].transpose(1, 0, 2).copy()
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    inputs = [n if n in feeds1 else "" for n in names]
    while not inputs[-1]:
        inputs.pop()
    outs = ["Y", "Y_h", "Y_c"][:n_out]
    node = helper.make_node(op_type, inputs, outs, hidden_size=HID, direction=direction, layout=1)
    vi = [
        helper.make_tensor_value_info(n, TensorProto.INT32 if n == "sequence_lens" else TensorProto.FLOAT, None)
        for n in feeds1
    ]
    graph = helper.make_graph(
        [node], "g", vi, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, feeds1)
    want = [want0[0].transpose(2, 0, 1, 3)] + [w.transpose(1, 0, 2) for w in want0[1:]]
    _check(got, want)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_linear_before_reset_and_clip(linear_before_reset: int) -> None:
    rng = np.random.default_rng(3)
    feeds = _feeds("GRU", rng, dirs=2, init=True)
    feeds["X"] *= 3
    got, want = _run_both(
        "GRU",
        feeds,
        2,
        hidden_size=HID,
        direction="bidirectional",
        linear_before_reset=linear_before_reset,
        clip=1.5,
    )
    _check(got, want)


def test_lstm_peepholes_clip_input_forget() -> None:
    rng = np.random.default_rng(4)
    feeds = _feeds("LSTM", rng, dirs=1, init=True, peep=True)
    feeds["X"] *= 3
    got, want = _run_both("LSTM", feeds, 3, hidden_size=HID, clip=0.8, input_forget=1)
    _check(got, want)


def test_lstm_without_bias_opset7() -> None:
    rng = np.random.default_rng(5)
    feeds = _feeds("LSTM", rng, dirs=2, bias=False)
    got, want = _run_both("LSTM", feeds, 3, opset=7, hidden_size=HID, direction="bidirectional")
    _check(got, want)


@pytest.mark.parametrize(
    "op_type,acts,alpha,beta",
    [
        ("RNN", ["LeakyRelu"], [0.2], None),
        ("RNN", ["HardSigmoid"], [0.3], [0.4]),
        ("GRU", ["HardSigmoid", "Softsign"], [0.25], [0.6]),
        ("LSTM", ["HardSigmoid", "Tanh", "Relu"], None, None),
        ("LSTM", ["Sigmoid", "ScaledTanh", "Elu"], [0.9, 0.5], [1.1]),
        ("GRU", ["Sigmoid", "Softplus"], None, None),
        ("RNN", ["ThresholdedRelu"], [0.1], None),
        ("RNN", ["Affine"], [0.5], [0.1]),
    ],
)
def test_activations(op_type: str, acts: list[str], alpha: list[float] | None, beta: list[float] | None) -> None:
    rng = np.random.default_rng(6)
    feeds = _feeds(op_type, rng, init=True)
    attrs: dict[str, Any] = {"hidden_size": HID, "activations": acts}
    if alpha is not None:
        attrs["activation_alpha"] = alpha
    if beta is not None:
        attrs["activation_beta"] = beta
    n_out = 3 if op_type == "LSTM" else 2
    got, want = _run_both(op_type, feeds, n_out, **attrs)
    _check(got, want)


def test_double_precision() -> None:
    # onnxruntime has no double LSTM: compare with its float32 result, loosely, and check dtypes.
    rng = np.random.default_rng(7)
    feeds = _feeds("LSTM", rng, dirs=2, init=True, dtype=np.float64)
    _, want = _run_both("LSTM", {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feeds.items()}, 3,
                        hidden_size=HID, direction="bidirectional")  # fmt: skip
    names = ["X", "W", "R", "B", "", "initial_h", "initial_c"]
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], hidden_size=HID, direction="bidirectional")
    vi = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in names if n]
    outs = [helper.make_tensor_value_info(o, TensorProto.DOUBLE, None) for o in ["Y", "Y_h", "Y_c"]]
    model = helper.make_model(helper.make_graph([node], "g", vi, outs), opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    got = onnxpy.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, w in zip(got, want):
        assert g.dtype == np.float64
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_only_y_h_output() -> None:
    rng = np.random.default_rng(8)
    feeds = _feeds("LSTM", rng)
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["", "Y_h"], hidden_size=HID)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape)) for n, v in feeds.items()],
        [helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxpy.InferenceSession(data).run(None, feeds)
    _check(got, want)


def test_bad_sequence_lens_raise() -> None:
    rng = np.random.default_rng(9)
    feeds = _feeds("RNN", rng, lens=[9, 1, 1])
    node = helper.make_node("RNN", ["X", "W", "R", "B", "sequence_lens"], ["Y"], hidden_size=HID)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(n, TensorProto.INT32 if n == "sequence_lens" else TensorProto.FLOAT, None)
            for n in feeds
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    sess = onnxpy.InferenceSession(model.SerializeToString())
    with pytest.raises(Exception, match="sequence_lens"):
        sess.run(None, feeds)


def test_thresholded_relu_activation_passes_only_values_above_alpha() -> None:
    # f(x) = x if x > alpha else 0: a value equal to alpha gives 0 (onnxpy let it through).
    x = np.array([[[1.0]], [[2.0]], [[0.5]]], np.float32)
    feeds = {"X": x, "W": np.ones((1, 1, 1), np.float32), "R": np.zeros((1, 1, 1), np.float32)}
    got, want = _run_both("RNN", feeds, 1, hidden_size=1, activations=["ThresholdedRelu"], activation_alpha=[1.0])
    assert got[0].ravel().tolist() == [0.0, 2.0, 0.0]
    _check(got, want)


# -- the loops for the default activations ---------------------------------------------------------


def _model_bytes(op_type: str, feeds: dict[str, np.ndarray], n_out: int, **attrs: Any) -> bytes:
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    inputs = [n if n in feeds else "" for n in names]
    while not inputs[-1]:
        inputs.pop()
    outs = ["Y", "Y_h", "Y_c"][:n_out]
    vi = [
        helper.make_tensor_value_info(n, TensorProto.INT32 if n == "sequence_lens" else TensorProto.FLOAT, None)
        for n in feeds
    ]
    node = helper.make_node(op_type, inputs, outs, **attrs)
    graph = helper.make_graph(
        [node], "g", vi, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize(
    ("op_type", "extra"), [("LSTM", {}), ("GRU", {"linear_before_reset": 0}), ("GRU", {"linear_before_reset": 1})]
)
@pytest.mark.parametrize("direction,dirs", DIRECTIONS)
@pytest.mark.parametrize("lens", [None, [5, 1, 3]])
@pytest.mark.parametrize("init_and_bias", [True, False])
def test_default_activation_loops_match_onnxruntime_and_the_general_loop(
    op_type: str,
    extra: dict[str, int],
    direction: str,
    dirs: int,
    lens: list[int] | None,
    init_and_bias: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """All directions advance together, in place, where the activations are the defaults and
    nothing clips: the same numbers as onnxruntime and as the general per-direction loop."""
    from onnxpy.ops import rnn

    rng = np.random.default_rng(7)
    feeds = _feeds(op_type, rng, dirs=dirs, bias=init_and_bias, lens=lens, init=init_and_bias)
    n_out = 3 if op_type == "LSTM" else 2
    data = _model_bytes(op_type, feeds, n_out, hidden_size=HID, direction=direction, **extra)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    fast = "_lstm_plain_steps" if op_type == "LSTM" else "_gru_plain_steps"
    taken: list[bool] = []
    original = getattr(rnn, fast)
    monkeypatch.setattr(rnn, fast, lambda *a: taken.append(True) or original(*a))
    kept = {k: v.copy() for k, v in feeds.items()}
    sess = onnxpy.InferenceSession(data)
    got = sess.run(None, feeds)
    assert taken
    _check(got, want)
    for k, v in feeds.items():  # the loops scale copies of the weights, never the weights
        np.testing.assert_array_equal(v, kept[k])
    for a, b in zip(sess.run(None, feeds), got):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setattr(rnn, "default_activations", lambda names, defaults: False)
    general = onnxpy.InferenceSession(data).run(None, feeds)
    assert len(taken) == 2
    _check(got, general, tol=1e-6)
