"""benchmarks/layers.py: each convolution and pool of a model alone, against onnxruntime. No
timing assertions: which layers it finds in the demo model, the figures' shape, the outputs'
check, and refused arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx

from onnxpy.cli import demo_model_path

REPO = Path(__file__).resolve().parents[2]
LAYERS = REPO / "benchmarks" / "layers.py"


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "layers.json"
    done = subprocess.run(
        [sys.executable, str(LAYERS), "--model", str(demo_model_path()), "--pairs", "2", "--block", "2"]
        + ["--warmup", "0", "--flush-mb", "1", "--json", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, json.loads(out.read_text()) if out.exists() else None


def test_every_convolution_and_pool_of_the_demo_model_is_timed(tmp_path: Path) -> None:
    done, result = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert result is not None and result["flush_mb"] == 1
    rows = result["models"]["demo"]
    graph = onnx.load(demo_model_path()).graph
    layers = [n for n in graph.node if n.op_type in ("Conv", "MaxPool", "AveragePool")]
    # Equal geometries are timed once and counted: the counts add up to the model's layers.
    assert sum(r["count"] for r in rows) == len(layers)
    assert len(rows) < len(layers)  # the demo repeats one residual block's 3x3 convolution
    for r in rows:
        assert r["layer"].split()[0] in ("Conv", "MaxPool", "AveragePool")
        assert r["onnxpy_us"] > 0 and r["onnxruntime_us"] > 0 and r["pair_ratio"] > 0
        assert r["excess_us"] == r["count"] * (r["onnxpy_us"] - r["onnxruntime_us"])
        assert r["max_rel_diff"] <= 1e-4  # the same layer, random weights: the same numbers
    assert any("+relu" in r["layer"] for r in rows)  # a Conv read by a Relu is timed with it
    assert "demo: " in done.stdout and "all layers, each as often as the model has it" in done.stdout


def test_nonsense_arguments_are_refused(tmp_path: Path) -> None:
    done, result = _run(tmp_path, "--pairs", "0")
    assert done.returncode == 2 and result is None
    assert "--pairs, --block and --top must be at least 1" in done.stderr
