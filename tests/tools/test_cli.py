"""Each `onnxpy` verb run as a subprocess on a real model, its output checked."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.helpers import DEMO_MODEL, LIGHT_DIR, make_model, vinfo

REPO = Path(__file__).resolve().parents[2]


def onnxpy_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "onnxpy", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=300,
    )


def ort_outputs(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray], names: list[str] | None = None):
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(names, feeds)


def with_outputs(model_path: Path, names: list[str]) -> onnx.ModelProto:
    """The model with intermediate values added as graph outputs (the onnxruntime way)."""
    m = onnx.load(str(model_path))
    for n in names:
        m.graph.output.append(onnx.ValueInfoProto(name=n))
    return m


def test_no_arguments_runs_the_demo() -> None:
    r = onnxpy_cli()
    assert r.returncode == 0, r.stderr
    assert "demo model demo.onnx" in r.stdout
    assert "output probabilities" in r.stdout and "latency: median" in r.stdout


def test_info_describes_the_demo_model() -> None:
    r = onnxpy_cli("info", str(DEMO_MODEL))
    assert r.returncode == 0, r.stderr
    m = onnx.load(str(DEMO_MODEL))
    out = r.stdout
    assert f"ir_version  {m.ir_version}" in out
    assert f"ai.onnx {m.opset_import[0].version}" in out
    assert m.producer_name in out
    assert "input  tensor(float)  [batch, 3, 32, 32]" in out
    # the operator histogram: every op type with its count
    for op, count in collections.Counter(n.op_type for n in m.graph.node).items():
        line = next(x for x in out.splitlines() if x.strip().startswith(op + " "))
        assert str(count) in line.split(), line
    n_params = sum(int(np.prod(t.dims)) for t in m.graph.initializer)
    assert f"parameters: {n_params:,} values" in out
    assert "onnxpy cannot run: none" in out


def test_info_names_operators_onnxpy_cannot_run(tmp_path: Path) -> None:
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("FancyOp", ["r"], ["y"], domain="com.example"),
        ],
        [vinfo("x", TensorProto.FLOAT, [2])],
        [vinfo("y", TensorProto.FLOAT, [2])],
        extra_opsets={"com.example": 1},
    )
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    r = onnxpy_cli("info", str(path))
    assert r.returncode == 0, r.stderr
    assert "onnxpy cannot run: com.example::FancyOp" in r.stdout
    r = onnxpy_cli("info", str(path), "--json")
    info = json.loads(r.stdout)
    assert info["missing"] == ["com.example::FancyOp"]
    assert info["opsets"] == {"": 17, "com.example": 1}


def test_info_on_a_light_model_counts_computed_weights() -> None:
    path = LIGHT_DIR / "light_squeezenet.onnx"
    r = onnxpy_cli("info", str(path), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    m = onnx.load(str(path))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    cos = [n for n in m.graph.node if n.op_type == "ConstantOfShape" and n.input[0] in inits]
    assert info["computed_weights"] == [len(cos), int(sum(np.prod(inits[n.input[0]]) for n in cos))]
    assert info["nodes"] == len(m.graph.node)


def test_run_with_input_file_saves_outputs_equal_to_onnxruntime(tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((3, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = onnxpy_cli("run", str(DEMO_MODEL), "--input", f"input={tmp_path / 'x.npy'}", "--output", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out" / "probabilities.npy")
    (want,) = ort_outputs(DEMO_MODEL, {"input": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    row = next(line for line in r.stdout.splitlines() if line.startswith("probabilities"))
    assert "3x10" in row and f"{want.max():.6g}" in row


def test_run_fetches_an_intermediate_value(tmp_path: Path) -> None:
    x = np.random.default_rng(2).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    name = "stem.bn.out"  # BatchNormalization output, folded into the Conv by the optimizer
    r = onnxpy_cli(
        "run", str(DEMO_MODEL), "--input", f"input={tmp_path / 'x.npy'}", "--fetch", name, "--output", str(tmp_path)
    )
    assert r.returncode == 0, r.stderr
    (want,) = ort_outputs(with_outputs(DEMO_MODEL, [name]), {"input": x}, [name])
    np.testing.assert_allclose(np.load(tmp_path / "stem.bn.out.npy"), want, rtol=1e-4, atol=1e-5)


def test_run_needs_inputs_or_random() -> None:
    r = onnxpy_cli("run", str(DEMO_MODEL))
    assert r.returncode == 2
    assert "--random" in r.stderr and "'input'" in r.stderr


def test_unknown_dim_and_fixed_batch_are_usage_errors() -> None:
    r = onnxpy_cli("run", str(DEMO_MODEL), "--random", "--dim", "seq=4")
    assert r.returncode == 2 and "no dimension of that name" in r.stderr and "batch" in r.stderr
    r = onnxpy_cli("bench", str(LIGHT_DIR / "light_squeezenet.onnx"), "--batch", "4", "--repeat", "1")
    assert r.returncode == 2 and "fixed" in r.stderr


def test_bench_compare_json() -> None:
    r = onnxpy_cli(
        "bench", str(DEMO_MODEL), "--repeat", "3", "--batch", "2", "--compare", "onnxruntime", "--json", "--iobinding"
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["inputs"] == {"input": {"dtype": "float32", "shape": [2, 3, 32, 32]}}
    assert res["settings"]["iobinding"] is True and res["settings"]["interleaved"] is True
    a, b = res["runtimes"]["onnxpy"], res["runtimes"]["onnxruntime"]
    for s in (a, b):
        assert s["runs"] == 3
        assert s["min_ms"] <= s["median_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]
        assert s["throughput"] == pytest.approx(2 * 1e3 / s["mean_ms"], rel=1e-3)
    ratio = res["ratio_onnxpy_over_onnxruntime"]["median"]
    assert ratio == pytest.approx(a["median_ms"] / b["median_ms"], rel=1e-2)
    assert res["outputs_max_rel_diff"] < 1e-4


def test_bench_table() -> None:
    r = onnxpy_cli("bench", str(DEMO_MODEL), "--duration", "0.2", "--opt-level", "disable", "--threads", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(line for line in lines if line.startswith("runtime"))
    for col in ("min ms", "median ms", "p90 ms", "p99 ms", "samples/s"):
        assert col in header
    assert any(line.startswith("onnxpy ") for line in lines)
    assert "opt-level disable, threads 1" in r.stdout


def test_profile_writes_a_trace_and_prints_time_per_op(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    r = onnxpy_cli("profile", str(DEMO_MODEL), "-o", str(trace), "--repeat", "3", "--opt-level", "disable")
    assert r.returncode == 0, r.stderr
    events = json.loads(trace.read_text())
    nodes = [e for e in events if e["cat"] == "Node"]
    n_nodes = len(onnx.load(str(DEMO_MODEL)).graph.node)
    assert len(nodes) == 3 * n_nodes
    per_op = collections.Counter(e["args"]["op_name"] for e in nodes)
    table = r.stdout.split("op_type", 1)[1]
    for op, calls in per_op.items():
        line = next(x for x in table.splitlines() if x.startswith(op + " "))
        assert line.split()[1] == f"{calls / 3:g}"
    assert "slowest nodes" in r.stdout
    assert "3 profiled after 1 warm-up" in r.stdout


def test_profile_leaves_the_warm_up_runs_out(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    r = onnxpy_cli("profile", str(DEMO_MODEL), "-o", str(trace), "--repeat", "2", "--warmup", "3")
    assert r.returncode == 0, r.stderr
    events = json.loads(trace.read_text())
    assert len([e for e in events if e.get("name") == "model_run"]) == 2
    assert "2 profiled after 3 warm-up" in r.stdout
    bad = onnxpy_cli("profile", str(DEMO_MODEL), "--warmup", "-1")
    assert bad.returncode != 0 and "--warmup must be >= 0" in bad.stderr
