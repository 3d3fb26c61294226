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
    assert res["settings"]["machine"]  # the CPU the figures were taken on


def test_bench_table() -> None:
    r = onnxpy_cli("bench", str(DEMO_MODEL), "--duration", "0.2", "--opt-level", "disable", "--threads", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(line for line in lines if line.startswith("runtime"))
    for col in ("min ms", "median ms", "p90 ms", "p99 ms", "samples/s"):
        assert col in header
    assert any(line.startswith("onnxpy ") for line in lines)
    assert "opt-level disable, threads 1" in r.stdout
    assert any(line.startswith("machine   ") and len(line) > 10 for line in lines)


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
    assert bad.returncode == 2 and "argument --warmup: must be >= 0" in bad.stderr


# -- audit fixes: each test names the defect it guards against -----------------------------------


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command run in this process (faster than a subprocess): (exit status, stdout, stderr)."""
    from onnxpy.cli import main

    try:
        rc = main(list(args))
    except SystemExit as e:  # argparse's errors, --help and --version
        rc = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def save(model: onnx.ModelProto, tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    onnx.save(model, str(path))
    return str(path)


def identity_model(elem: int, shape: list[object] | None) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Identity", ["x"], ["y"])], [vinfo("x", elem, shape)], [vinfo("y", elem, shape)]
    )


def test_bench_throughput_counts_the_batch_fed_not_the_one_asked(capsys: pytest.CaptureFixture[str]) -> None:
    # --dim batch=2 fixes the batch: --batch 8 is not applied, and throughput counts 2 samples.
    rc, out, err = cli(capsys, "bench", str(DEMO_MODEL), "--batch", "8", "--dim", "batch=2", "--repeat", "2", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["inputs"]["input"]["shape"][0] == 2 and res["settings"]["batch"] == 2
    s = res["runtimes"]["onnxpy"]
    assert s["throughput"] == pytest.approx(2 * 1e3 / s["mean_ms"], rel=1e-3)
    assert "--batch 8 ignored" in err


def test_bench_leaves_throughput_out_when_no_input_has_a_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save(identity_model(TensorProto.FLOAT, []), tmp_path, "scalar.onnx")
    rc, out, err = cli(capsys, "bench", path, "--batch", "8", "--repeat", "2", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["runtimes"]["onnxpy"]["throughput"] is None and res["settings"]["batch"] is None
    assert "--batch 8 ignored: no input has a first axis" in err
    rc, out, err = cli(capsys, "bench", path, "--repeat", "2")
    assert rc == 0, err
    assert next(x for x in out.splitlines() if x.startswith("onnxpy ")).split()[-1] == "-"


def test_bench_compare_says_differ_for_random_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model(
        [helper.make_node("RandomNormalLike", ["x"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, [64])],
        [vinfo("y", TensorProto.FLOAT, [64])],
    )
    path = save(model, tmp_path, "rand.onnx")
    rc, out, err = cli(capsys, "bench", path, "--repeat", "2", "--compare", "onnxruntime")
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("outputs "))
    assert line.startswith("outputs differ (tolerance 0.0001") and "random outputs" in line, line
    rc, out, err = cli(capsys, "bench", path, "--repeat", "2", "--compare", "onnxruntime", "--json")
    res = json.loads(out)
    assert res["outputs_agree"] is False and res["random_operators"] == ["RandomNormalLike"]
    rc, out, err = cli(capsys, "bench", str(DEMO_MODEL), "--repeat", "2", "--compare", "onnxruntime")
    assert "outputs agree (tolerance 0.0001" in out


def test_bench_compare_survives_an_onnxruntime_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # onnxruntime has no complex64 Identity: onnxpy's figures stay, one line says why, exit 0.
    path = save(identity_model(TensorProto.COMPLEX64, [2, 3]), tmp_path, "c64.onnx")
    rc, out, err = cli(capsys, "bench", path, "--repeat", "2", "--compare", "onnxruntime")
    assert rc == 0, err
    assert any(x.startswith("onnxpy ") for x in out.splitlines()) and "onnxruntime " not in out
    (line,) = [x for x in err.splitlines() if "onnxruntime could not run the model" in x]
    assert "timing onnxpy alone" in line and "Traceback" not in err
    rc, out, err = cli(capsys, "bench", path, "--repeat", "2", "--compare", "onnxruntime", "--json")
    assert rc == 0 and "compare_error" in json.loads(out)


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--repeat", "0"],
        ["demo", "--repeat", "-1"],
        ["run", str(DEMO_MODEL), "--random", "--threads", "-2"],
        ["run", str(DEMO_MODEL), "--random", "--seed", "-1"],
        ["bench", str(DEMO_MODEL), "--warmup", "-1"],
        ["bench", str(DEMO_MODEL), "--repeat", "0"],
        ["bench", str(DEMO_MODEL), "--duration", "0"],
        ["run", str(DEMO_MODEL), "--random", "--batch", "0"],
        ["profile", str(DEMO_MODEL), "--top", "-1"],
        ["profile", str(DEMO_MODEL), "--warmup", "-1"],
    ],
)
def test_bad_numbers_are_usage_errors_naming_the_option(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    rc, out, err = cli(capsys, *args)
    option = next(a for a in args if a.startswith("--") and a != "--random")
    assert rc == 2 and f"argument {option}:" in err, err
    assert not out


def test_bad_input_files_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "garbage.pb").write_bytes(b"\xff\xff\xff\xff garbage")
    (tmp_path / "empty.pb").write_bytes(b"")
    np.savez(tmp_path / "x.npz", a=np.zeros(3))
    (tmp_path / "folder.npy").mkdir()
    np.save(tmp_path / "obj.npy", np.array(["a", None], dtype=object), allow_pickle=True)
    for name, says in [
        ("garbage.pb", "is not a serialized onnx TensorProto"),
        ("empty.pb", "holds no tensor"),
        ("x.npz", "is an .npz archive"),
        ("folder.npy", "is a folder"),
        ("obj.npy", "holds Python objects"),
    ]:
        file = str(tmp_path / name)
        rc, out, err = cli(capsys, "run", str(DEMO_MODEL), "--input", f"input={file}")
        assert rc == 2, (name, err)
        assert f"--input input: {file!r} {says}" in err, err


def test_unwritable_outputs_fail_before_the_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    rc, out, err = cli(capsys, "run", str(DEMO_MODEL), "--random", "--output", str(a_file))
    assert rc == 2 and "exists and is not a folder" in err and "session created" not in out
    rc, out, err = cli(capsys, "profile", str(DEMO_MODEL), "-o", str(tmp_path))
    assert rc == 2 and "is a folder" in err and not out
    rc, out, err = cli(capsys, "profile", str(DEMO_MODEL), "-o", str(a_file / "t.json"))
    assert rc == 2 and "cannot write" in err and not out


def test_output_files_of_colliding_names_are_all_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["out/a"]), helper.make_node("Neg", ["x"], ["out:a"])],
        [vinfo("x", TensorProto.FLOAT, [3])],
        [vinfo("out/a", TensorProto.FLOAT, [3]), vinfo("out:a", TensorProto.FLOAT, [3])],
    )
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    np.save(tmp_path / "x.npy", x)
    rc, out, err = cli(
        capsys, "run", save(model, tmp_path, "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path)
    )
    assert rc == 0, err
    assert "out_a.npy (out/a), out_a_1.npy (out:a)" in out
    np.testing.assert_array_equal(np.load(tmp_path / "out_a.npy"), np.maximum(x, 0))
    np.testing.assert_array_equal(np.load(tmp_path / "out_a_1.npy"), -x)


@pytest.mark.parametrize("content", [b"", b"\x08\x07"])
def test_info_refuses_files_without_a_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    path = tmp_path / "not_a_model.onnx"
    path.write_bytes(content)
    rc, out, err = cli(capsys, "info", str(path))
    assert rc == 1 and "holds no graph" in err and not out


def test_a_closed_pipe_ends_quietly() -> None:
    full_env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "onnxpy", "info", str(DEMO_MODEL)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full_env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader goes away, as `| head` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_saved_outputs_round_trip_through_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for elem, given in [
        (TensorProto.STRING, np.array(["a", "bc"], dtype=str)),
        (TensorProto.BFLOAT16, np.array([1.5, -2.0], dtype=np.float32)),
    ]:
        model = save(identity_model(elem, [2]), tmp_path, f"m{elem}.onnx")
        out_dir = tmp_path / f"out{elem}"
        if elem == TensorProto.BFLOAT16:
            rc, out, err = cli(capsys, "run", model, "--random", "--output", str(out_dir))
        else:
            np.save(tmp_path / "s.npy", given)
            rc, out, err = cli(capsys, "run", model, "--input", f"x={tmp_path / 's.npy'}", "--output", str(out_dir))
        assert rc == 0, err
        first = np.load(out_dir / "y.npy")  # no pickle needed
        rc, out, err = cli(
            capsys, "run", model, "--input", f"x={out_dir / 'y.npy'}", "--output", str(out_dir / "again")
        )
        assert rc == 0, err
        np.testing.assert_array_equal(np.load(out_dir / "again" / "y.npy"), first)
        if elem == TensorProto.STRING:
            np.testing.assert_array_equal(first, given)


def test_sequence_and_optional_inputs_from_pb_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seq_type = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    seq_model = make_model(
        [helper.make_node("SequenceLength", ["seq"], ["n"])],
        [helper.make_value_info("seq", seq_type)],
        [vinfo("n", TensorProto.INT64, [])],
    )
    opt_type = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    opt_model = make_model(
        [helper.make_node("OptionalHasElement", ["o"], ["has"])],
        [helper.make_value_info("o", opt_type)],
        [vinfo("has", TensorProto.BOOL, [])],
        opset=18,
    )
    items = [np.zeros(2, np.float32), np.ones(3, np.float32), np.ones(1, np.float32)]
    (tmp_path / "seq.pb").write_bytes(onnx.numpy_helper.from_list(items).SerializeToString())
    full = onnx.numpy_helper.from_optional(np.ones(2, np.float32))
    (tmp_path / "opt.pb").write_bytes(full.SerializeToString())
    (tmp_path / "none.pb").write_bytes(onnx.numpy_helper.from_optional(None).SerializeToString())
    seq_path, opt_path = save(seq_model, tmp_path, "seq.onnx"), save(opt_model, tmp_path, "opt.onnx")

    rc, out, err = cli(capsys, "run", seq_path, "--input", f"seq={tmp_path / 'seq.pb'}")
    assert rc == 0, err
    assert next(x for x in out.splitlines() if x.startswith("n ")).split()[3:5] == ["3", "3"]
    for file, has in [("opt.pb", "True"), ("none.pb", "False")]:
        rc, out, err = cli(capsys, "run", opt_path, "--input", f"o={tmp_path / file}")
        assert rc == 0, err
        assert next(x for x in out.splitlines() if x.startswith("has ")).split()[3] == has
    np.save(tmp_path / "x.npy", np.zeros(2, np.float32))
    rc, out, err = cli(capsys, "run", seq_path, "--input", f"seq={tmp_path / 'x.npy'}")
    assert rc == 2 and "SequenceProto .pb" in err


def test_dim_contradicting_an_input_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 3, 32, 32), np.float32))
    rc, out, err = cli(capsys, "run", str(DEMO_MODEL), "--input", f"input={tmp_path / 'x.npy'}", "--dim", "batch=2")
    assert rc == 2 and "--dim batch=2 contradicts --input input=" in err, err


def test_input_paths_may_contain_equals_signs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "k=v"
    folder.mkdir()
    np.save(folder / "x.npy", np.zeros((1, 3, 32, 32), np.float32))
    rc, out, err = cli(capsys, "run", str(DEMO_MODEL), "--input", f"input={folder / 'x.npy'}")
    assert rc == 0, err


def test_run_summary_prints_integers_exactly_and_counts_bools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model(
        [helper.make_node("Identity", ["i"], ["ints"]), helper.make_node("Identity", ["b"], ["bools"])],
        [vinfo("i", TensorProto.INT64, [2]), vinfo("b", TensorProto.BOOL, [3])],
        [vinfo("ints", TensorProto.INT64, [2]), vinfo("bools", TensorProto.BOOL, [3])],
    )
    np.save(tmp_path / "i.npy", np.array([1234567, 7654321987], np.int64))
    np.save(tmp_path / "b.npy", np.array([True, False, True]))
    path = save(model, tmp_path, "m.onnx")
    rc, out, err = cli(capsys, "run", path, "--input", f"i={tmp_path / 'i.npy'}", "--input", f"b={tmp_path / 'b.npy'}")
    assert rc == 0, err
    ints = next(x for x in out.splitlines() if x.startswith("ints "))
    assert ints.split()[3:5] == ["1234567", "7654321987"] and ints.endswith("1234567, 7654321987")
    bools = next(x for x in out.splitlines() if x.startswith("bools "))
    assert "2 True, 1 False: True, False, True" in bools


def test_version_and_help_texts(capsys: pytest.CaptureFixture[str]) -> None:
    import onnxpy

    rc, out, err = cli(capsys, "--version")
    assert rc == 0 and out.strip() == f"onnxpy {onnxpy.__version__}"
    rc, out, err = cli(capsys, "run", "--help")
    text = " ".join(out.split())
    assert "(default all)" in text and "seed of the random inputs (default 0)" in text
    assert text.count("repeatable") >= 3  # --input, --dim, --fetch
    rc, out, err = cli(capsys, "demo", "--help")
    assert "timed runs (default 20)" in out
