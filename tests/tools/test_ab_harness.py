"""benchmarks/ab.py: two checkouts compared in fresh processes, on the tiny MLP. No timing
assertions: the figures' shape, the sides really imported, revisions checked out and removed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AB = REPO / "benchmarks" / "ab.py"


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "ab.json"
    done = subprocess.run(
        [sys.executable, str(AB), *args, "--models", "tiny_mlp", "--rounds", "2", "--repeat", "2"]
        + ["--warmup", "1", "--no-light", "--no-shared", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done, json.loads(out.read_text())


def test_two_checkout_directories_in_both_contexts(tmp_path: Path) -> None:
    done, result = _run(tmp_path, str(REPO), str(REPO))
    assert set(result["ms"]) == {"alone", "sequence"}
    for context in ("alone", "sequence"):
        times = result["ms"][context]["tiny_mlp"]
        assert len(times["A"]) == len(times["B"]) == 2  # one figure per side and round
        assert all(0 < t < 1000 for t in times["A"] + times["B"])
    rows = {(r["context"], r["model"]): r for r in result["summary"]}
    row = rows[("alone", "tiny_mlp")]
    assert row["ratio"] == pytest.approx(row["b_ms"] / row["a_ms"])
    assert 0 <= row["b_faster"] <= 2
    assert "sequence: geometric mean of B / A over 1 models" in done.stdout


def _git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not _git_checkout(),
    reason="the tests run from a tree that is not a git checkout (an sdist or an exported copy), or "
    "without git: there is no revision for ab.py to check out; sides given as directories are "
    "tested above, and CI and every clone run this test",
)
def test_a_revision_is_checked_out_and_removed(tmp_path: Path) -> None:
    before = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True).stdout
    done, result = _run(tmp_path, "HEAD", "--context", "alone")
    assert result["base"] == "HEAD" and set(result["ms"]) == {"alone"}
    after = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True).stdout
    assert after == before  # the temporary worktree is gone


def test_a_side_that_is_neither_checkout_nor_revision_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(AB), "no-such-revision-xyz", "--models", "tiny_mlp", "--no-light", "--no-shared"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "is neither an onnxpy checkout nor a revision" in done.stderr


def test_shared_models_are_collected_with_their_inputs(tmp_path: Path) -> None:
    # The shared-models branch of bench.collect_models reads options ab.py does not offer (it
    # once failed there with an AttributeError); a shared directory holding one model runs it.
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import ab
        import bench
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    shared = tmp_path / "shared"
    shared.mkdir()
    import onnx

    onnx.save(bench.tiny_mlp(seed=0), str(shared / "mlp_copy.onnx"))
    args = ab.parse_args(["HEAD", "--no-light", "--shared-dir", str(shared)])
    work = tmp_path / "work"
    work.mkdir()
    models = ab.prepare_models(args, str(work))
    assert [m[0] for m in models] == ["mlp_copy", "tiny_mlp"]
    for _, model_path, feeds_path in models:
        assert Path(model_path).is_file() and Path(feeds_path).is_file()
