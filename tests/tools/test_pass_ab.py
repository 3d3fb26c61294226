"""benchmarks/pass_ab.py: sessions with and without optimizer passes, calls alternating in one
process, on the tiny MLP. No timing assertions: the figures' shape, the outputs' check, which
passes change the graph, and refused names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PASS_AB = REPO / "benchmarks" / "pass_ab.py"


def _run(tmp_path: Path, *passes: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "pass_ab.json"
    done = subprocess.run(
        [sys.executable, str(PASS_AB), *passes, "--models", "tiny_mlp", "--no-light", "--no-shared"]
        + ["--pairs", "6", "--min-pairs", "2", "--budget", "0.05", "--warmup", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, json.loads(out.read_text()) if out.exists() else None


def test_a_pass_that_changes_the_graph_is_timed_both_ways(tmp_path: Path) -> None:
    done, result = _run(tmp_path, "fuse_patterns", "fuse_activation")
    assert done.returncode == 0, done.stderr
    assert result is not None and result["passes"] == ["fuse_patterns", "fuse_activation"]
    row = result["models"]["tiny_mlp"]
    assert row["changed"] is True
    assert 2 <= row["pairs"] <= 6
    assert 0 < row["a_ms"] < 1000 and 0 < row["b_ms"] < 1000
    assert 0 < row["pair_ratio"] and 0 <= row["b_faster"] <= 1
    assert row["max_rel_diff"] <= 1e-6  # MatMul + Add + Relu fused or not: the same numbers
    assert "geometric mean of the pair ratios over 1 models" in done.stdout


def test_a_pass_that_changes_nothing_is_not_timed(tmp_path: Path) -> None:
    done, result = _run(tmp_path, "fold_shuffle")  # the MLP has no channel shuffle
    assert done.returncode == 0, done.stderr
    assert result is not None and result["models"]["tiny_mlp"] == {"changed": False}
    assert "change nothing here" in done.stdout


@pytest.mark.parametrize("name", ["ConvActivationFusion", "no_such_pass"])
def test_names_that_are_not_passes_are_refused(tmp_path: Path, name: str) -> None:
    done, result = _run(tmp_path, name)
    assert done.returncode == 2 and result is None
    assert f"not onnxpy pass names: {name}" in done.stderr and "relu_after_pool" in done.stderr


def test_a_pass_that_only_marks_a_node_counts_as_a_change(tmp_path: Path) -> None:
    # channels_last_output changes no op type or input: it marks a convolution read by a
    # depthwise one to write channels-last.
    import numpy as np
    from onnx import TensorProto, helper

    from tests.helpers import make_model, vinfo

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import pass_ab
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["z"], group=8, pads=[1, 1, 1, 1]),
    ]
    inits = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "b1": rng.standard_normal(8).astype(np.float32),
        "w2": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
    }
    model = make_model(
        nodes,
        [vinfo("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [vinfo("z", TensorProto.FLOAT, None)],
        initializers=inits,
    )
    path = tmp_path / "stem_depthwise.onnx"
    path.write_bytes(model.SerializeToString())
    assert pass_ab._sessions(str(path), ["channels_last_output"])[2] is True
    assert pass_ab._sessions(str(path), ["fold_shuffle"])[2] is False
