"""benchmarks/tails.py: each elementwise and row kernel on inputs of several distributions,
against onnxruntime. No timing assertions: the figures' shape, every case's model on every
input agreeing with onnxruntime, the cliff rule, and refused arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime as ort
import pytest

import onnxpy
from onnxpy.tools.benchmark import compare_outputs
from tests.helpers import load_benchmark

REPO = Path(__file__).resolve().parents[2]
TAILS = REPO / "benchmarks" / "tails.py"


@pytest.fixture(scope="module")
def tails() -> ModuleType:
    return load_benchmark("tails")


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "tails.json"
    done = subprocess.run(
        [sys.executable, str(TAILS), "--rows", "4", "--cols", "16", "--rounds", "1", "--block", "1"]
        + ["--json", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, json.loads(out.read_text()) if out.exists() else None


def test_each_input_of_each_case_is_timed_against_its_normal_one(tmp_path: Path, tails: ModuleType) -> None:
    done, result = _run(tmp_path, "--ops", "Tanh", "Softmax")
    assert done.returncode == 0, done.stderr
    assert result is not None and result["shape"] == [4, 16]
    # "Softmax" also names LogSoftmax: every distribution each of the three cases lists, in order.
    cases = [c for c in tails.CASES if c.op_type in ("Tanh", "Softmax", "LogSoftmax")]
    assert [(r["case"], r["input"]) for r in result["rows"]] == [(c.name, d) for c in cases for d in c.inputs]
    for r in result["rows"]:
        assert r["onnxpy_ms"] > 0 and r["onnxruntime_ms"] > 0
        if r["input"] == "normal":
            assert r["onnxpy_slowdown"] == 1.0 and r["onnxruntime_slowdown"] == 1.0
        assert r["agree"] and r["nan_mismatches"] == 0
        assert r["flag"] == tails.is_cliff(r["onnxpy_slowdown"], r["onnxruntime_slowdown"])
    assert "masked-inf" in {r["input"] for r in result["rows"]}
    assert "flagged" in done.stdout


def test_every_case_agrees_with_onnxruntime_on_every_input(tails: ModuleType) -> None:
    # The extreme inputs (huge values, NaN, masked rows) are where kernels part ways.
    shape = (3, 40)
    rng = np.random.default_rng(0)
    for case in tails.CASES:
        model = tails.build(case, shape)
        mine = onnxpy.InferenceSession(model)
        theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        for dist in case.inputs:
            x = tails.DISTRIBUTIONS[dist](rng, shape)
            assert x.shape == shape and x.dtype == np.float32
            check = compare_outputs(mine.run(None, {"x": x}), theirs.run(None, {"x": x}))
            assert check.agree, (case.name, dist, check)


def test_the_inputs_are_what_their_names_say(tails: ModuleType) -> None:
    rng = np.random.default_rng(0)
    shape = (64, 256)
    make = tails.DISTRIBUTIONS
    assert np.abs(make["normal"](rng, shape)).max() < 7
    assert (np.abs(make["wide"](rng, shape)) > 7).mean() > 0.2  # past GELU's exponent underflow
    assert np.abs(make["huge"](rng, shape)).max() > 1000
    assert (make["masked-min"](rng, shape) == np.finfo(np.float32).min).mean() == pytest.approx(0.25, abs=0.03)
    assert np.isneginf(make["masked-inf"](rng, shape)).any()
    assert np.isnan(make["nan"](rng, shape)).any()


def test_a_cliff_is_a_slowdown_onnxruntime_does_not_share(tails: ModuleType) -> None:
    assert tails.is_cliff(3.4, 0.9)  # the twenty-ninth night's GELU on wide inputs
    assert not tails.is_cliff(1.9, 1.0)
    assert not tails.is_cliff(1.9, 0.5)  # onnxruntime faster on that input counts as no slow-down
    assert not tails.is_cliff(3.0, 1.6)  # both slow down: the input's cost, not a kernel's
    assert tails.is_cliff(3.3, 1.6)


def test_nonsense_arguments_are_refused(tmp_path: Path) -> None:
    done, result = _run(tmp_path, "--rounds", "0")
    assert done.returncode == 2 and result is None
    assert "--rows, --cols, --rounds and --block must be at least 1" in done.stderr
    done, result = _run(tmp_path, "--ops", "NoSuchOp")
    assert done.returncode == 2 and result is None
    assert "no case matches" in done.stderr
