"""Input preparation for the CLI: free dimensions, random data within valid ranges, files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxpy.tools.benchmark import geomean, latency_stats, max_difference
from onnxpy.tools.feeds import UsageError, gather_bounds, make_feeds, model_inputs, parse_assignments, resolve_shapes
from onnxpy.tools.table import format_table
from tests.helpers import make_model, vinfo


def embedding_model() -> onnx.ModelProto:
    table = np.zeros((7, 4), np.float32)
    return make_model(
        [helper.make_node("Gather", ["table", "ids"], ["emb"]), helper.make_node("Mul", ["emb", "scale"], ["y"])],
        [vinfo("ids", TensorProto.INT64, ["b", "s"]), vinfo("scale", TensorProto.FLOAT, [None, "s", 1])],
        [vinfo("y", TensorProto.FLOAT, None)],
        initializers={"table": table},
    )


def test_batch_and_named_dims() -> None:
    specs = model_inputs(embedding_model())
    r = resolve_shapes(specs, {"s": 5}, batch=3)
    assert r.shapes == {"ids": (3, 5), "scale": (3, 5, 1)}
    assert r.overrides == {"s": 5, "b": 3}
    r = resolve_shapes(specs, {}, batch=None)
    assert r.shapes == {"ids": (1, 1), "scale": (1, 1, 1)}
    assert any("'b'" in n for n in r.notes) and any("'s'" in n for n in r.notes)


def test_fixed_batch_refuses_another_batch() -> None:
    specs = model_inputs(make_model([helper.make_node("Relu", ["x"], ["y"])], [vinfo("x", shape=[1, 3])], [vinfo("y")]))
    assert resolve_shapes(specs, {}, batch=1).shapes == {"x": (1, 3)}
    with pytest.raises(UsageError, match="fixed"):
        resolve_shapes(specs, {}, batch=2)


def test_random_indices_stay_inside_the_table() -> None:
    model = embedding_model()
    assert gather_bounds(model) == {"ids": 7}
    feeds = make_feeds(model, dims={"s": 500}, batch=4, seed=1)
    ids = feeds.arrays["ids"]
    assert ids.dtype == np.int64 and ids.shape == (4, 500)
    assert ids.min() >= 0 and ids.max() < 7 and len(np.unique(ids)) > 1


def test_file_inputs_fix_the_named_dims_of_the_others(tmp_path: Path) -> None:
    ids = np.zeros((2, 9), np.int64)
    np.save(tmp_path / "ids.npy", ids)
    feeds = make_feeds(embedding_model(), files={"ids": str(tmp_path / "ids.npy")}, random=True)
    # 's' comes from the file; the unnamed first axis of 'scale' is free and defaults to 1
    assert feeds.arrays["scale"].shape == (1, 9, 1)
    assert feeds.overrides == {"b": 2, "s": 9}
    np.testing.assert_array_equal(feeds.arrays["ids"], ids)
    with pytest.raises(UsageError, match="no data for input"):
        make_feeds(embedding_model(), files={"ids": str(tmp_path / "ids.npy")}, random=False)
    with pytest.raises(UsageError, match="no such input"):
        make_feeds(embedding_model(), files={"nope": str(tmp_path / "ids.npy")})


def test_latency_stats_and_ratios() -> None:
    s = latency_stats([0.004, 0.001, 0.002, 0.003], batch=2)
    assert (s.runs, s.min_ms, s.max_ms) == (4, 1.0, 4.0)
    assert s.median_ms == pytest.approx(2.5) and s.mean_ms == pytest.approx(2.5)
    assert s.p90_ms == pytest.approx(np.percentile([1, 2, 3, 4], 90))
    assert s.throughput == pytest.approx(800.0)
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    a = [np.array([1.0, 2.0], np.float32)]
    assert max_difference(a, [np.array([1.0, 2.5], np.float32)]) == pytest.approx((0.5, 0.2))
    assert max_difference(a, [np.zeros(3, np.float32)]) == (float("inf"), float("inf"))


def test_latency_figures_keep_their_precision_in_microseconds() -> None:
    """The JSON figures of a call of tens of microseconds: six significant digits each, so the
    throughput and the mean (both rounded) still agree to well under 0.1%."""
    d = latency_stats([47.6512e-6, 47.6488e-6, 47.65e-6], batch=2).as_dict()
    assert d["mean_ms"] == pytest.approx(0.04765, rel=1e-5)
    assert d["throughput"] == pytest.approx(2e3 / d["mean_ms"], rel=1e-5)
    assert d["min_ms"] <= d["median_ms"] <= d["max_ms"]
    assert latency_stats([0.0], batch=1).as_dict()["throughput"] == float("inf")


def test_table_alignment() -> None:
    text = format_table(["name", "ms"], [["a", "1.5"], ["long name", "-"], ["b", "12.25"]])
    lines = text.splitlines()
    assert lines[1].startswith("---------")
    assert lines[2].endswith("  1.5") and lines[4].endswith("12.25")


def test_time_interleaved_settles_then_times_blocks_in_alternating_order() -> None:
    from onnxpy.tools.benchmark import Contender, time_interleaved

    log: list[str] = []
    a = Contender("a", None, 0.0, lambda: log.append("a"), [])
    b = Contender("b", None, 0.0, lambda: log.append("b"), [])
    times = time_interleaved([a, b], repeat=2, warmup=0, settle_s=0.0, block=3)
    assert {k: len(v) for k, v in times.items()} == {"a": 6, "b": 6}
    # Round 1: a settles (1 call) and runs 3 timed calls, then b; round 2 starts with b.
    assert "".join(log) == "aaaa" + "bbbb" + "bbbb" + "aaaa"


def test_time_interleaved_max_calls_cuts_the_last_block_short() -> None:
    # `onnxpy bench --repeat 3` must report 3 runs whatever block size the machine's speed chose.
    from onnxpy.tools.benchmark import Contender, time_interleaved

    log: list[str] = []
    a = Contender("a", None, 0.0, lambda: log.append("a"), [])
    b = Contender("b", None, 0.0, lambda: log.append("b"), [])
    times = time_interleaved([a, b], repeat=2, warmup=0, settle_s=0.0, block=2, max_calls=3)
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    # Round 2 settles with one call each, then times only the one call still owed.
    assert "".join(log) == "aaa" + "bbb" + "bb" + "aa"


def test_random_indices_follow_casts_and_constant_tables() -> None:
    # The ids reach the Gather through Cast and Reshape; the table is a Constant node.
    table = onnx.numpy_helper.from_array(np.zeros((5, 2), np.float32))
    model = make_model(
        [
            helper.make_node("Constant", [], ["table"], value=table),
            helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
            helper.make_node("Reshape", ["ids32", "flat"], ["ids_flat"]),
            helper.make_node("Gather", ["table", "ids_flat"], ["y"]),
        ],
        [vinfo("ids", TensorProto.INT64, [40, 10])],
        [vinfo("y", TensorProto.FLOAT, None)],
        initializers={"flat": np.array([-1], np.int64)},
    )
    assert gather_bounds(model)["ids"] == 5
    ids = make_feeds(model, seed=3).arrays["ids"]
    assert ids.min() >= 0 and ids.max() < 5 and len(np.unique(ids)) > 1


def test_the_batch_fed_is_the_one_the_files_decided(tmp_path: Path) -> None:
    np.save(tmp_path / "ids.npy", np.zeros((3, 9), np.int64))
    feeds = make_feeds(embedding_model(), files={"ids": str(tmp_path / "ids.npy")}, batch=8)
    # 'b' comes from the file (3); the unnamed first axis of 'scale' takes --batch 8
    assert feeds.arrays["scale"].shape == (8, 9, 1) and feeds.batch == 8
    fixed = make_model([helper.make_node("Relu", ["x"], ["y"])], [vinfo("x", shape=["n", 3])], [vinfo("y")])
    np.save(tmp_path / "x.npy", np.zeros((4, 3), np.float32))
    feeds = make_feeds(fixed, files={"x": str(tmp_path / "x.npy")}, batch=8)
    assert feeds.batch == 4 and any("--batch 8 ignored" in n for n in feeds.notes)
    scalar = make_model([helper.make_node("Relu", ["x"], ["y"])], [vinfo("x", shape=[])], [vinfo("y")])
    assert make_feeds(scalar, batch=8).batch is None
    assert make_feeds(scalar).batch is None


def test_assignments_split_at_the_first_equals_unless_a_name_holds_one() -> None:
    assert parse_assignments(["x=a=b.npy"], "--input") == {"x": "a=b.npy"}
    assert parse_assignments(["a=b=x.npy"], "--input", ["a=b"]) == {"a=b": "x.npy"}
    with pytest.raises(UsageError, match="NAME=VALUE"):
        parse_assignments(["x="], "--input")


def test_compare_outputs_states_agreement_against_a_tolerance() -> None:
    from onnxpy.tools.benchmark import compare_outputs

    a = np.array([1.0, 2.0, 100.0], np.float32)
    assert compare_outputs([a], [a + 1e-3]).agree  # 1e-5 of the largest value
    c = compare_outputs([a], [a + 1.0])
    assert not c.agree and c.max_abs == pytest.approx(1.0)
    nan = np.array([1.0, np.nan, 3.0], np.float32)
    c = compare_outputs([nan], [np.array([1.0, 2.0, 3.0], np.float32)])
    assert c.nan_mismatches == 1 and not c.agree
    assert compare_outputs([nan], [nan.copy()]).agree
    c = compare_outputs([a], [a.astype(np.float64)], ["y"])
    assert c.problems == ["y: dtype float32 vs float64"] and not c.agree
    c = compare_outputs([np.array([1, 2], np.int64)], [np.array([1, 3], np.int64)], ["i"])
    assert c.problems == ["i: 1 of 2 values differ"]
    assert compare_outputs([np.zeros(2)], [np.zeros(3)], ["z"]).problems == ["z: shape [2] vs [3]"]
    inf = np.array([np.inf, 1.0])
    assert compare_outputs([inf], [inf.copy()]).agree
    assert max_difference([nan], [np.array([1.0, 2.0, 3.0], np.float32)]) == (float("inf"), float("inf"))


def test_machine_summary_names_the_cpu_its_vectors_and_l2(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxpy.tools import benchmark as bm

    monkeypatch.setattr(bm, "_cpu_model", lambda: "Some CPU")
    monkeypatch.setattr(bm, "_vector_level", lambda: "AVX-512")
    monkeypatch.setattr(bm, "_l2_size", lambda: "2048K")
    assert bm.machine_summary() == "Some CPU, AVX-512, L2 2048K"
    monkeypatch.setattr(bm, "_vector_level", lambda: "")
    monkeypatch.setattr(bm, "_l2_size", lambda: "")
    assert bm.machine_summary() == "Some CPU"


def test_vector_level_is_what_numpy_found() -> None:
    from numpy._core._multiarray_umath import __cpu_features__ as features  # numpy >= 2.1, a dependency

    from onnxpy.tools.benchmark import _vector_level

    level = _vector_level()
    expected = {"AVX-512": "AVX512F", "AVX2": "AVX2", "SSE4.2": "SSE42", "NEON": "ASIMD"}
    if level:
        assert features.get(expected[level])
    wider = {"AVX2": ["AVX512F"], "SSE4.2": ["AVX512F", "AVX2"]}.get(level, [])
    assert not any(features.get(w) for w in wider)
