"""benchmarks/ops.py: single operators as one-node models against onnxruntime. No timing
assertions: every case's model is valid and agrees with onnxruntime, the rows and summary
have their shape, and nonsense arguments are refused."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import onnxruntime as ort
import pytest

import onnxpy
from onnxpy.tools.benchmark import compare_outputs
from tests.helpers import load_benchmark

REPO = Path(__file__).resolve().parents[2]
OPS = REPO / "benchmarks" / "ops.py"


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    return load_benchmark("ops")


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "ops.json"
    done = subprocess.run(
        [sys.executable, str(OPS), "--tiny", "--rounds", "1", "--block", "1", "--json", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, json.loads(out.read_text()) if out.exists() else None


def test_every_case_is_a_valid_model_that_agrees_with_onnxruntime(ops: ModuleType) -> None:
    names = [c.name for c in ops.CASES]
    assert len(names) == len(set(names)) >= 60
    for case in ops.CASES:
        model, feeds = ops.build(case, ops.TINY)
        mine = onnxpy.InferenceSession(model).run(None, feeds)
        theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        assert len(mine) == case.outputs
        check = compare_outputs(mine, theirs)
        assert check.agree, (case.name, check)


def test_the_working_sizes_are_the_shapes_the_docstring_names(ops: ModuleType) -> None:
    model, feeds = ops.build(next(c for c in ops.CASES if c.name == "Conv depthwise 3x3"), ops.FULL)
    assert feeds["x"].shape == (1, 64, 56, 56)
    model, feeds = ops.build(next(c for c in ops.CASES if c.name == "Softmax"), ops.FULL)
    assert feeds["x"].shape == (128, 512)


def test_rows_and_summary(tmp_path: Path, ops: ModuleType) -> None:
    done, result = _run(tmp_path, "--ops", "Erf", "Cast to")
    assert done.returncode == 0, done.stderr
    assert result is not None and result["tiny"] is True
    assert [r["case"] for r in result["rows"]] == ["Erf", "Cast to float16", "Cast to int64"]
    for r in result["rows"]:
        assert r["agree"] and r["onnxpy_ms"] > 0 and r["onnxruntime_ms"] > 0
        assert r["ratio"] == pytest.approx(r["onnxpy_ms"] / r["onnxruntime_ms"])
    mean = ops.geometric_mean([r["ratio"] for r in result["rows"]])
    assert f"3 cases: geometric mean of ratios {mean:.2f}x" in done.stdout
    assert "onnxruntime's time:" in done.stdout
    assert result["machine"] and f"machine: {result['machine']}\n" in done.stdout


def test_geometric_mean(ops: ModuleType) -> None:
    assert ops.geometric_mean([2.0, 0.5, 1.0]) == pytest.approx(1.0)
    assert ops.geometric_mean([4.0]) == pytest.approx(4.0)
    assert math.isnan(ops.geometric_mean([]))


def test_nonsense_arguments_are_refused(tmp_path: Path) -> None:
    done, result = _run(tmp_path, "--rounds", "0")
    assert done.returncode == 2 and result is None
    assert "--rounds and --block must be at least 1" in done.stderr
    done, result = _run(tmp_path, "--ops", "NoSuchOp")
    assert done.returncode == 2 and result is None
    assert "no case matches" in done.stderr


def test_an_earlier_run_stands_beside(tmp_path: Path) -> None:
    earlier = tmp_path / "earlier.json"
    rows = [{"case": "Erf", "ratio": 4.0}, {"case": "Gone", "ratio": 9.0}]
    earlier.write_text(json.dumps({"tiny": True, "rows": rows}))
    done, result = _run(tmp_path, "--ops", "Erf", "Cast to float16", "--against", str(earlier))
    assert done.returncode == 0, done.stderr
    assert result is not None
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith(("Erf", "Cast"))}
    assert " 4.00x " in lines["Erf"] and " - " in lines["Cast"]  # no earlier figure for the Cast
    now = next(r["ratio"] for r in result["rows"] if r["case"] == "Erf")
    assert f"(1 case in both): geometric mean 4.00x then, {now:.2f}x now" in done.stdout
    (tmp_path / "bad.json").write_text("[1, 2]")
    done, _ = _run(tmp_path, "--against", str(tmp_path / "bad.json"))
    assert done.returncode == 2 and "not a JSON file this script wrote" in done.stderr
