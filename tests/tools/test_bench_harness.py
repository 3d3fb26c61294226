"""benchmarks/bench.py: a smoke run on the tiny MLP, and its model builders. No timing assertions."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnxpy.tools.feeds import model_inputs
from tests.helpers import LIGHT_DIR, load_benchmark

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "bench.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench")


def _small_cnn(after_conv: list[onnx.NodeProto], rng: np.random.Generator) -> onnx.GraphProto:
    """x (1, 3, 8, 8) -> 3x3 Conv to c (4 channels) -> ``after_conv`` -> y (1, 4, 8, 8), float32."""
    return onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), *after_conv],
        "cnn",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8, 8])],
        [
            numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        ],
    )


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_smoke_run_on_the_tiny_mlp(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--models",
            "tiny_mlp",
            "--repeat",
            "2",
            "--min-repeat",
            "1",
            "--mlp-calls",
            "2",
            "--json",
            str(out),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "tiny MLP per-call, batch 1" in r.stdout
    results = json.loads(out.read_text())["results"]
    assert [(x["model"], x["batch"], x["status"]) for x in results] == [("tiny_mlp", 1, "ok"), ("tiny_mlp", 8, "ok")]
    for x in results:
        assert x["runs"] == 2
        assert x["ratio"] == pytest.approx(x["onnxpy_ms"] / x["onnxruntime_ms"])
        assert x["max_rel_diff"] < 1e-5
        assert x["inputs"] == {"x": [x["batch"], 64]}
    # peak RSS measured once per model, in subprocesses
    assert results[0]["rss_onnxpy_mb"] > 10 and results[0]["rss_onnxruntime_mb"] > 10
    assert math.isnan(results[1]["rss_onnxpy_mb"])
    # memory touched by one warm run, where Linux exposes page reference bits
    if os.access("/proc/self/clear_refs", os.W_OK) and os.path.exists("/proc/self/smaps_rollup"):
        for key in ("touched_onnxpy_mb", "touched_onnxruntime_mb"):
            assert 0.1 < results[0][key] < results[0][key.replace("touched", "rss")]
    row = next(line for line in r.stdout.splitlines() if line.startswith("tiny_mlp") and line.split()[1] == "8")
    assert f"{results[1]['ratio']:.2f}x" in row
    # the machine the figures were taken on, in the report and the JSON alike
    machine = json.loads(out.read_text())["machine"]
    assert machine and f"machine: {machine}\n" in r.stdout


def test_tiny_mlp_computes_an_mlp(bench: ModuleType) -> None:
    model = bench.tiny_mlp(seed=3)
    onnx.checker.check_model(model)
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    h = np.maximum(x @ w["w0"] + w["b0"], 0)
    h = np.maximum(h @ w["w1"] + w["b1"], 0)
    (got,) = ort_run(model, {"x": x})
    np.testing.assert_allclose(got, h @ w["w2"] + w["b2"], rtol=1e-4, atol=1e-5)


def test_random_weights_replace_every_constant_of_shape_weight(bench: ModuleType) -> None:
    model = onnx.load(str(LIGHT_DIR / "light_squeezenet.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    targets = {n.output[0]: tuple(inits[n.input[0]]) for n in model.graph.node if n.op_type == "ConstantOfShape"}
    assert targets
    replaced = bench.randomize_weights(model, seed=1)
    assert replaced == len(targets)
    assert not [n for n in model.graph.node if n.op_type == "ConstantOfShape"]
    new = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for name, shape in targets.items():
        assert new[name].shape == shape
        assert new[name].size == 1 or new[name].std() > 0, name
    onnx.checker.check_model(model)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    (data,) = model_inputs(model)
    (y,) = ort_run(model, {data.name: x})
    assert np.isfinite(y).all() and y.std() > 0


def test_batch_8_only_where_the_batch_axis_is_free(bench: ModuleType, tmp_path: Path) -> None:
    assert not bench.free_batch_axis(str(LIGHT_DIR / "light_squeezenet.onnx"))
    path = tmp_path / "mlp.onnx"
    onnx.save(bench.tiny_mlp(), str(path))
    assert bench.free_batch_axis(str(path))


def test_tiny_mlp_gets_its_floor_of_timed_calls(bench: ModuleType, tmp_path: Path) -> None:
    """Per-call overhead needs many calls: --mlp-calls raises the MLP's timed calls above
    --repeat, and only the MLP's (another model keeps --repeat)."""
    import argparse

    path = tmp_path / "mlp.onnx"
    onnx.save(bench.tiny_mlp(), str(path))
    args = argparse.Namespace(seq=8, seed=0, opt_level="all", threads=0, repeat=2, min_repeat=1, budget=6.0)
    args.mlp_calls = 30
    mlp = bench.measure(bench.ModelEntry("tiny_mlp", "mlp", str(path)), 1, args)
    other = bench.measure(bench.ModelEntry("same_model_as_light", "light", str(path)), 1, args)
    assert (mlp.status, other.status) == ("ok", "ok")
    assert mlp.runs == 30 and other.runs == 2


def test_quantized_variants_run_in_both_runtimes(tmp_path: Path) -> None:
    """benchmarks/quantized.py: a float CNN becomes QDQ and QOperator variants, a model with an
    integer input a dynamically quantized one; each loads and runs in onnxpy and onnxruntime."""
    import onnxpy

    quantized = load_benchmark("quantized")
    rng = np.random.default_rng(0)
    cnn = _small_cnn([onnx.helper.make_node("Relu", ["c"], ["y"])], rng)
    embed = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Gather", ["table", "ids"], ["e"]),
            onnx.helper.make_node("MatMul", ["e", "w"], ["y"]),
        ],
        "embed",
        [onnx.helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 5])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 5, 8])],
        [
            numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "table"),
            numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
        ],
    )
    shared = []
    for graph in (cnn, embed):
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
        model.ir_version = 8
        shared.append(str(tmp_path / f"{graph.name}.onnx"))
        onnx.save(model, shared[-1])
    made = quantized.quantized_models(shared, str(tmp_path))
    assert [name for name, _ in made] == ["cnn QDQ", "cnn QOperator", "embed dynamic"]
    ops = {name: {n.op_type for n in onnx.load(path).graph.node} for name, path in made}
    assert "QuantizeLinear" in ops["cnn QDQ"] and "QLinearConv" in ops["cnn QOperator"]
    assert "MatMulInteger" in ops["embed dynamic"]
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    for name, path in made:
        f = feeds if name.startswith("cnn") else {"ids": np.array([[1, 2, 3, 4, 9]], np.int64)}
        got = onnxpy.InferenceSession(path).run(None, f)[0]
        want = ort_run(onnx.load(path), f)[0]
        assert got.shape == want.shape and np.abs(got - want).max() <= 0.05 * np.abs(want).max()


def test_half_variants_are_float16_models_both_runtimes_agree_on(tmp_path: Path) -> None:
    """benchmarks/half.py: weights, inputs, outputs and Casts to float become float16."""
    import onnxpy

    half = load_benchmark("half")
    rng = np.random.default_rng(0)
    graph = _small_cnn(
        [
            onnx.helper.make_node("Cast", ["c"], ["c32"], to=onnx.TensorProto.FLOAT),
            onnx.helper.make_node("Sigmoid", ["c32"], ["y"]),
        ],
        rng,
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = str(tmp_path / "cnn.onnx")
    onnx.save(model, path)
    ((name, made),) = half.half_models([path], str(tmp_path))
    m = onnx.load(made)
    assert name == "cnn_fp16"
    assert {t.data_type for t in m.graph.initializer} == {onnx.TensorProto.FLOAT16}
    assert m.graph.input[0].type.tensor_type.elem_type == m.graph.output[0].type.tensor_type.elem_type == 10
    assert m.graph.node[1].attribute[0].i == onnx.TensorProto.FLOAT16
    x = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float16)}
    got = onnxpy.InferenceSession(made).run(None, x)[0]
    want = ort_run(m, x)[0]
    assert got.dtype == want.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-3)


def test_transformer_models_are_a_decoder_step_and_prompts_both_runtimes_agree_on(
    bench: ModuleType, tmp_path: Path
) -> None:
    """--transformers: GPT-2 one token after 128 cached ones at two widths and a Llama-style step
    (the step's dims come with the entry), GPT-2, BERT and ViT at --seq tokens; onnxpy and
    onnxruntime give the same outputs."""
    import onnxpy
    from onnxpy.tools.feeds import make_feeds

    entries = bench.transformer_models(str(tmp_path), seed=0)
    assert [(e.name, e.kind) for e in entries] == [
        ("gpt2_decoder_step", "transformer"),
        ("gpt2_768_decoder_step", "transformer"),
        ("llama_decoder_step", "transformer"),
        ("gpt2_prompt", "transformer"),
        ("bert", "transformer"),
        ("vit", "transformer"),
    ]
    for entry in entries:
        model = onnx.load(entry.path)
        feeds = make_feeds(model, dims=entry.dims or bench.free_dims(model, 16), batch=1, seed=0).arrays
        if entry.name.endswith("decoder_step"):
            assert feeds["input_ids"].shape == (1, 1) and feeds["attention_mask"].shape == (1, bench.DECODER_PAST + 1)
            assert feeds["past_key_values.0.key"].shape[2] == bench.DECODER_PAST
        got = onnxpy.InferenceSession(entry.path).run(None, feeds)
        for g, w in zip(got, ort_run(model, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(w).max())))
