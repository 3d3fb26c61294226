"""Debugging: any graph value by name, ONNXPY_DEBUG tracing, NaN/Inf detection."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from tests.helpers import DEMO_MODEL, SHARED_MODELS, make_model, vinfo

X = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)


def ort_with_outputs(model: onnx.ModelProto, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's way to see intermediates: add them as graph outputs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    existing = {o.name for o in m.graph.output}
    for n in names:
        if n not in existing:
            m.graph.output.append(onnx.ValueInfoProto(name=n))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(names, feeds)


@pytest.mark.parametrize("level", ["ORT_ENABLE_ALL", "ORT_DISABLE_ALL"])
def test_every_intermediate_value_matches_onnxruntime(level: str) -> None:
    model = onnx.load(str(DEMO_MODEL))
    names = [o for n in model.graph.node for o in n.output]
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = getattr(onnxpy.GraphOptimizationLevel, level)
    sess = onnxpy.InferenceSession(str(DEMO_MODEL), so)
    want = ort_with_outputs(model, names, {"input": X})
    # one at a time (values the optimizer fused away included) and all at once
    # Winograd convolutions round to about 1e-5 of a value's scale: tolerances scale with it.
    for name, w in zip(names, want):
        (got,) = sess.run([name], {"input": X})
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())), err_msg=name)
    for name, got, w in zip(names, sess.run(names, {"input": X}), want):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())), err_msg=name)
    # asking for intermediates leaves the normal outputs unchanged
    np.testing.assert_allclose(sess.run(None, {"input": X})[0], want[-1], rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(
    not (SHARED_MODELS / "bert_l2_h128.onnx").exists(),
    reason="../shared/models is not beside this clone (CI has it; a fresh clone does not)",
)
def test_intermediate_values_of_a_transformer_match_onnxruntime() -> None:
    path = SHARED_MODELS / "bert_l2_h128.onnx"
    model = onnx.load(str(path))
    kinds = {"MatMul", "Softmax", "LayerNormalization", "Erf", "Where"}
    names = [n.output[0] for n in model.graph.node if n.op_type in kinds][:12]
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 100, (2, 16)), "attention_mask": np.ones((2, 16), np.int64)}
    want = ort_with_outputs(model, names, feeds)
    got = onnxpy.InferenceSession(str(path)).run(names, feeds)
    for name, g, w in zip(names, got, want):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4, err_msg=name)


def test_unknown_name_is_an_invalid_argument() -> None:
    sess = onnxpy.InferenceSession(str(DEMO_MODEL))
    with pytest.raises(onnxpy.InvalidArgument, match="no_such_value"):
        sess.run(["no_such_value"], {"input": X})


def _debug_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, level: str) -> tuple[str, np.ndarray]:
    monkeypatch.setenv("ONNXPY_DEBUG", level)
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxpy.InferenceSession(str(DEMO_MODEL), so)
    capsys.readouterr()
    (out,) = sess.run(None, {"input": X})
    return capsys.readouterr().err, out


def test_debug_1_prints_each_node_as_it_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    err, _ = _debug_run(monkeypatch, capsys, "1")
    model = onnx.load(str(DEMO_MODEL))
    lines = [line for line in err.splitlines() if line.startswith("[onnxpy]")]
    assert len(lines) == len(model.graph.node)
    total = len(model.graph.node)
    seen = []
    for i, line in enumerate(lines):
        m = re.fullmatch(r"\[onnxpy\] (\d+)/(\d+) (\w+) '([^']+)'", line)
        assert m, line
        assert (int(m[1]), int(m[2])) == (i + 1, total)
        seen.append((m[4], m[3]))
    assert sorted(seen) == sorted((n.name, n.op_type) for n in model.graph.node)
    assert "min=" not in err


def test_debug_2_prints_shapes_and_statistics(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    err, out = _debug_run(monkeypatch, capsys, "2")
    line = next(x for x in err.splitlines() if "out probabilities:" in x)
    m = re.search(r"float32\[2, 10\] min=(\S+) max=(\S+) mean=(\S+)", line)
    assert m, line
    assert float(m[1]) == pytest.approx(out.min(), rel=1e-5)
    assert float(m[2]) == pytest.approx(out.max(), rel=1e-5)
    assert float(m[3]) == pytest.approx(out.astype(np.float64).mean(), rel=1e-5)
    x_line = next(x for x in err.splitlines() if "in  input:" in x)
    assert f"min={X.min():.6g}" in x_line
    assert re.search(r"^\[onnxpy\]\s+\d+\.\d{3} ms$", err, re.M)


def test_debug_level_from_session_config(capsys: pytest.CaptureFixture) -> None:
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("session.debug_level", "1")
    sess = onnxpy.InferenceSession(str(DEMO_MODEL), so)
    capsys.readouterr()
    sess.run(None, {"input": X})
    assert "[onnxpy] 1/" in capsys.readouterr().err


def nan_model() -> onnx.ModelProto:
    return make_model(
        [
            helper.make_node("Mul", ["x", "two"], ["doubled"], name="double"),
            helper.make_node("Log", ["doubled"], ["logged"], name="the_log"),
            helper.make_node("Div", ["logged", "x"], ["ratio"], name="the_div"),
            helper.make_node("Relu", ["ratio"], ["y"], name="relu"),
        ],
        [vinfo("x", TensorProto.FLOAT, [4])],
        [vinfo("y", TensorProto.FLOAT, [4])],
        initializers={"two": np.array(2.0, np.float32)},
    )


def checked_session(tmp_path: Path, on: bool = True) -> onnxpy.InferenceSession:
    path = tmp_path / "nan.onnx"
    onnx.save(nan_model(), str(path))
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    if on:
        so.add_session_config_entry("session.check_nan_inf", "1")
    return onnxpy.InferenceSession(str(path), so)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_check_names_the_first_node_with_nan(tmp_path: Path) -> None:
    sess = checked_session(tmp_path)
    with pytest.raises(onnxpy.RuntimeException) as e:
        sess.run(None, {"x": np.array([1.0, -1.0, 2.0, 3.0], np.float32)})
    msg = str(e.value)
    assert "the_log" in msg and "NaN" in msg and "'logged'" in msg
    assert "the_div" not in msg


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_inf_check_names_the_node(tmp_path: Path) -> None:
    # log(2*0) = -inf at the Log node
    sess = checked_session(tmp_path)
    with pytest.raises(onnxpy.RuntimeException, match=r"the_log.*Inf"):
        sess.run(None, {"x": np.array([1.0, 0.0, 2.0, 3.0], np.float32)})


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_finite_values_pass_and_the_check_is_off_by_default(tmp_path: Path) -> None:
    x = np.array([1.0, 0.5, 2.0, 3.0], np.float32)
    (y,) = checked_session(tmp_path).run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(np.log(2 * x) / x, 0), rtol=1e-6)
    (y,) = checked_session(tmp_path, on=False).run(None, {"x": np.array([1.0, -1.0, 2.0, 3.0], np.float32)})
    assert np.isnan(y[1])
