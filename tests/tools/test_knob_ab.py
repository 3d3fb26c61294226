"""benchmarks/knob_ab.py: one session, calls alternating between two values of an onnxpy module
constant, on the tiny MLP. No timing assertions: the figures' shape, the per-node listing, the
constant restored, and refused settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
KNOB_AB = REPO / "benchmarks" / "knob_ab.py"


@pytest.fixture(scope="module")
def knob_ab() -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import knob_ab as module
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return module


def _run(tmp_path: Path, *settings: str, nodes: int = 0) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "knob_ab.json"
    done = subprocess.run(
        [sys.executable, str(KNOB_AB), *settings, "--models", "tiny_mlp", "--no-light", "--no-shared"]
        + ["--pairs", "6", "--min-pairs", "2", "--budget", "0.05", "--warmup", "1", "--nodes", str(nodes)]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, json.loads(out.read_text()) if out.exists() else None


def test_both_values_are_timed_alternating_with_the_nodes_that_moved(tmp_path: Path) -> None:
    # The MLP's ReLUs take numpy's maximum below _SMALL values and the clip ufunc above: with
    # _SMALL at 1 side A runs the other path, to the same numbers.
    done, result = _run(tmp_path, "onnxpy.ops._clamp._SMALL=1", nodes=3)
    assert done.returncode == 0, done.stderr
    assert result is not None
    assert result["settings"] == {"onnxpy.ops._clamp._SMALL": {"a": 1, "default": 4096}}
    row = result["models"]["tiny_mlp"]
    assert 2 <= row["pairs"] <= 6
    assert 0 < row["a_ms"] < 1000 and 0 < row["b_ms"] < 1000
    assert 0 < row["pair_ratio"] and 0 <= row["b_faster"] <= 1
    assert row["max_rel_diff"] == 0.0
    assert 1 <= len(row["nodes"]) <= 3
    for n in row["nodes"]:
        assert n["node"] and n["op_type"] and n["a_us"] > 0 and n["b_us"] > 0
    moved = [abs(n["b_us"] - n["a_us"]) for n in row["nodes"]]
    assert moved == sorted(moved, reverse=True)
    assert "A = onnxpy.ops._clamp._SMALL = 1; B = the default (4096)" in done.stdout
    assert "geometric mean of the pair ratios over 1 models" in done.stdout


def test_each_call_runs_with_its_sides_value_and_the_default_comes_back(
    knob_ab: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse
    import types

    import numpy as np

    module = types.ModuleType("onnxpy.fake_settings")
    module.BLOCK = 4096  # type: ignore[attr-defined]
    seen: list[int] = []

    class Session:  # records the value each run sees
        def __init__(self, *a: object, **k: object) -> None:
            pass

        def run(self, *a: object) -> list[np.ndarray]:
            seen.append(module.BLOCK)  # type: ignore[attr-defined]
            return [np.zeros(3, np.float32)]

    monkeypatch.setattr(knob_ab.onnxpy, "InferenceSession", Session)
    args = argparse.Namespace(warmup=1, pairs=4, min_pairs=4, budget=0.01, nodes=0)
    row = knob_ab.compare_model("unused.onnx", {}, [knob_ab.Knob(module, "BLOCK", 7)], args)
    assert module.BLOCK == 4096  # type: ignore[attr-defined]
    assert row["pairs"] == 4 and row["max_rel_diff"] == 0.0
    # The check (A, B), the warm-up (A, B), one call of A to size the pairs, then the pairs,
    # the order alternating: B first, then A first.
    assert seen[:5] == [7, 4096, 7, 4096, 7]
    assert seen[5:] == [4096, 7, 7, 4096, 4096, 7, 7, 4096]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("onnxpy.ops._clamp._SMALL", "expected module.NAME=VALUE"),
        ("numpy.e=3", "only onnxpy's own modules"),
        ("onnxpy.ops.no_such_module._X=1", "no module onnxpy.ops.no_such_module"),
        ("onnxpy.ops._clamp._NO_SUCH=1", "onnxpy.ops._clamp has no _NO_SUCH"),
        ("onnxpy.ops._clamp.floor_at=1", "floor_at is a function, not a number"),
        ("onnxpy.ops._clamp._SMALL=2.5", "_SMALL holds int 4096, not float"),
        ("onnxpy.ops._clamp._SMALL=__import__('os')", "is not a number"),
    ],
)
def test_settings_that_are_not_numbers_of_onnxpy_are_refused(tmp_path: Path, setting: str, message: str) -> None:
    done, result = _run(tmp_path, setting)
    assert done.returncode == 2 and result is None
    assert message in done.stderr


def test_values_may_be_written_as_arithmetic(knob_ab: ModuleType) -> None:
    assert knob_ab._number("10**9") == 10**9
    assert knob_ab._number("1 << 20") == 1 << 20
    assert knob_ab._number("-3") == -3
    assert knob_ab._number("2.5") == 2.5
    for text in ("x", "len([1])", "'3'", "[1]", "1 if True else 2", "9**9**9", "2**100"):
        with pytest.raises(ValueError):
            knob_ab._number(text)


def test_a_failing_run_leaves_the_default_in_place(knob_ab: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import types

    import numpy as np

    module = types.ModuleType("onnxpy.fake_settings")
    module.BLOCK = 4096  # type: ignore[attr-defined]
    calls = []

    class Session:
        def __init__(self, *a: object, **k: object) -> None:
            pass

        def run(self, *a: object) -> list[np.ndarray]:
            calls.append(module.BLOCK)  # type: ignore[attr-defined]
            if len(calls) == 3:  # the first warm-up call, with side A's value set
                raise RuntimeError("a kernel failed")
            return [np.zeros(3, np.float32)]

    monkeypatch.setattr(knob_ab.onnxpy, "InferenceSession", Session)
    args = argparse.Namespace(warmup=1, pairs=4, min_pairs=4, budget=0.01, nodes=0)
    with pytest.raises(RuntimeError, match="a kernel failed"):
        knob_ab.compare_model("unused.onnx", {}, [knob_ab.Knob(module, "BLOCK", 7)], args)
    assert calls[-1] == 7
    assert module.BLOCK == 4096  # type: ignore[attr-defined]
