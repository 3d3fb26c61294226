"""InferenceSession, SessionOptions, RunOptions and the module-level API, against onnxruntime's
names and behaviour."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import onnxpy
from tests.helpers import DEMO_MODEL, make_model, run_in_threads, vinfo


def _add_mul_model(dim_name: str = "n") -> onnx.ModelProto:
    nodes = [
        helper.make_node("Add", ["x", "y"], ["s"], name="add"),
        helper.make_node("Mul", ["s", "w"], ["z"], name="mul"),
        helper.make_node("Neg", ["s"], ["neg"], name="neg"),
    ]
    model = make_model(
        nodes,
        [
            vinfo("x", TensorProto.FLOAT, [dim_name, 3]),
            vinfo("y", TensorProto.FLOAT, [dim_name, 3]),
            vinfo("w", TensorProto.FLOAT, [3]),
        ],
        [vinfo("z", TensorProto.FLOAT, [dim_name, 3]), vinfo("neg", TensorProto.FLOAT, None)],
        initializers={"w": np.array([1.0, 2.0, 3.0], dtype=np.float32)},
    )
    model.graph.doc_string = "adds and scales"
    model.doc_string = "a test model"
    model.domain = "test.domain"
    model.model_version = 7
    helper.set_model_props(model, {"author": "tests", "purpose": "api"})
    return model


@pytest.fixture
def model() -> onnx.ModelProto:
    return _add_mul_model()


def _feeds(n: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    return {"x": rng.standard_normal((n, 3)).astype(np.float32), "y": rng.standard_normal((n, 3)).astype(np.float32)}


def _expected(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    s = feeds["x"] + feeds["y"]
    return [s * np.array([1, 2, 3], np.float32), -s]


# -- construction from every kind of source --------------------------------------------------


def test_accepts_path_str_pathlike_bytes_and_modelproto(model: onnx.ModelProto, tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    feeds = _feeds()
    want = _expected(feeds)
    for source in (str(path), path, model.SerializeToString(), model):
        sess = onnxpy.InferenceSession(source)
        got = sess.run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_modelproto_is_not_modified(model: onnx.ModelProto) -> None:
    before = model.SerializeToString()
    onnxpy.InferenceSession(model)
    assert model.SerializeToString() == before


# -- queries ---------------------------------------------------------------------------------


def test_inputs_outputs_and_overridable_initializers_match_onnxruntime(model: onnx.ModelProto) -> None:
    ours = onnxpy.InferenceSession(model.SerializeToString())
    ref = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for mine, theirs in ((ours.get_inputs(), ref.get_inputs()), (ours.get_outputs(), ref.get_outputs())):
        assert [(a.name, a.type, a.shape) for a in mine] == [(a.name, a.type, a.shape) for a in theirs]
    assert [(a.name, a.type, a.shape) for a in ours.get_overridable_initializers()] == [
        (a.name, a.type, a.shape) for a in ref.get_overridable_initializers()
    ]
    assert ours.get_inputs()[0].shape == ["n", 3]


def test_nodearg_shape_reports_unknown_dims_as_none() -> None:
    m = make_model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, [None, 2])],
        [vinfo("y", TensorProto.FLOAT, None)],
    )
    ours = onnxpy.InferenceSession(m)
    ref = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert ours.get_inputs()[0].shape == ref.get_inputs()[0].shape == [None, 2]


def test_modelmeta(model: onnx.ModelProto) -> None:
    meta = onnxpy.InferenceSession(model).get_modelmeta()
    ref = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).get_modelmeta()
    for field in (
        "producer_name",
        "graph_name",
        "domain",
        "description",
        "graph_description",
        "version",
        "custom_metadata_map",
    ):
        assert getattr(meta, field) == getattr(ref, field), field
    assert meta.custom_metadata_map == {"author": "tests", "purpose": "api"}


def test_providers_and_options(model: onnx.ModelProto) -> None:
    so = onnxpy.SessionOptions()
    sess = onnxpy.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    # A copy, as onnxruntime returns: changing the caller's object after creation, or the
    # returned one, does not reach the session (set_providers rebuilt with the new level).
    got = sess.get_session_options()
    assert got is not so and got.graph_optimization_level == so.graph_optimization_level
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    got.intra_op_num_threads = 3
    again = sess.get_session_options()
    assert again.graph_optimization_level == onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert again.intra_op_num_threads == 0
    sess.set_providers(["CPUExecutionProvider"])
    assert sess.run(["z"], _feeds())[0].shape == (2, 3)
    # onnxruntime's own providers onnxpy lacks are skipped with its warning, so the usual list
    # written for onnxruntime works here.
    with pytest.warns(UserWarning, match="TensorrtExecutionProvider"):
        listed = onnxpy.InferenceSession(model, providers=["TensorrtExecutionProvider", "CPUExecutionProvider"])
    assert listed.get_providers() == ["CPUExecutionProvider"]
    with pytest.warns(RuntimeWarning, match="disabled_optimizers"):
        onnxpy.InferenceSession(model, disabled_optimizers=["ConvActivationFusion"])


def test_options_refuse_attributes_they_do_not_have() -> None:
    # onnxruntime's options objects raise on a misspelt attribute; onnxpy stored it and ignored it.
    for options, name in ((onnxpy.SessionOptions(), "intra_op_num_thread"), (onnxpy.RunOptions(), "run_tag")):
        with pytest.raises(AttributeError, match=name):
            setattr(options, name, 1)


def test_free_dimension_override_by_denotation(model: onnx.ModelProto) -> None:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    dim = m.graph.input[0].type.tensor_type.shape.dim[0]
    dim.Clear()
    dim.dim_param, dim.denotation = "batch", "DATA_BATCH"
    so = onnxpy.SessionOptions()
    so.add_free_dimension_override_by_denotation("DATA_BATCH", 2)
    sess = onnxpy.InferenceSession(m, so)
    assert sess.get_inputs()[0].shape[0] == 2
    assert sess.run(["z"], _feeds())[0].shape == (2, 3)


@pytest.mark.skipif(
    "CUDAExecutionProvider" in onnxpy.get_available_providers(),
    reason="this machine has CUDA: the fallback path does not apply",
)
def test_unavailable_provider_warns_and_falls_back(model: onnx.ModelProto) -> None:
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        sess = onnxpy.InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_unknown_provider_is_an_error(model: onnx.ModelProto) -> None:
    with pytest.raises(onnxpy.InvalidArgument, match="FooExecutionProvider"):
        onnxpy.InferenceSession(model, providers=["FooExecutionProvider"])


def test_module_level_api() -> None:
    assert "CPUExecutionProvider" in onnxpy.get_available_providers()
    assert onnxpy.get_device() in ("CPU", "GPU")
    assert isinstance(onnxpy.__version__, str) and onnxpy.__version__.count(".") == 2
    for name in (
        "InferenceSession",
        "SessionOptions",
        "RunOptions",
        "OrtValue",
        "IOBinding",
        "NodeArg",
        "GraphOptimizationLevel",
        "ExecutionMode",
        "OrtDevice",
    ):
        assert hasattr(onnxpy, name) and hasattr(onnxruntime, name), name


def test_enums_match_onnxruntime() -> None:
    for ours, theirs in (
        (onnxpy.GraphOptimizationLevel, onnxruntime.GraphOptimizationLevel),
        (onnxpy.ExecutionMode, onnxruntime.ExecutionMode),
    ):
        for name, member in ours.__members__.items():
            assert int(getattr(theirs, name)) == int(member), name


def test_session_options_defaults_match_onnxruntime() -> None:
    ours, theirs = onnxpy.SessionOptions(), onnxruntime.SessionOptions()
    for field in (
        "graph_optimization_level",
        "intra_op_num_threads",
        "inter_op_num_threads",
        "execution_mode",
        "enable_profiling",
        "optimized_model_filepath",
        "log_severity_level",
        "enable_cpu_mem_arena",
        "enable_mem_pattern",
        "enable_mem_reuse",
        "use_deterministic_compute",
    ):
        assert (
            int(getattr(ours, field)) == int(getattr(theirs, field))
            if not isinstance(getattr(ours, field), str)
            else getattr(ours, field) == getattr(theirs, field)
        ), field
    ours.add_session_config_entry("session.some_key", "1")
    assert ours.get_session_config_entry("session.some_key") == "1"
    with pytest.raises(RuntimeError, match="missing_key"):
        ours.get_session_config_entry("missing_key")


def test_free_dimension_override_fixes_the_shape(model: onnx.ModelProto) -> None:
    so = onnxpy.SessionOptions()
    so.add_free_dimension_override_by_name("n", 4)
    sess = onnxpy.InferenceSession(model, so)
    assert sess.get_inputs()[0].shape == [4, 3]
    sess.run(None, _feeds(4))
    with pytest.raises(onnxpy.InvalidArgument, match="index: 0 Got: 2 Expected: 4"):
        sess.run(None, _feeds(2))


def test_add_initializer_replaces_the_models_value(model: onnx.ModelProto) -> None:
    so = onnxpy.SessionOptions()
    w = np.array([10.0, 20.0, 30.0], dtype=np.float32)
    so.add_initializer("w", onnxpy.OrtValue.ortvalue_from_numpy(w))
    sess = onnxpy.InferenceSession(model, so)
    feeds = _feeds()
    np.testing.assert_allclose(sess.run(["z"], feeds)[0], (feeds["x"] + feeds["y"]) * w, rtol=1e-6)
    so2 = onnxpy.SessionOptions()
    so2.add_initializer("w", np.zeros(4, np.float32))
    with pytest.raises(onnxpy.InvalidArgument, match="add_initializer 'w'"):
        onnxpy.InferenceSession(model, so2)


# -- running ---------------------------------------------------------------------------------


def test_run_output_selection_and_order(model: onnx.ModelProto) -> None:
    sess = onnxpy.InferenceSession(model)
    feeds = _feeds()
    z, neg = _expected(feeds)
    both = sess.run(None, feeds)
    np.testing.assert_allclose(both[0], z, rtol=1e-6)
    np.testing.assert_allclose(both[1], neg, rtol=1e-6)
    swapped = sess.run(["neg", "z"], feeds)
    np.testing.assert_allclose(swapped[0], neg, rtol=1e-6)
    np.testing.assert_allclose(swapped[1], z, rtol=1e-6)
    assert len(sess.run([], feeds)) == 2


def test_overridable_initializer_can_be_fed(model: onnx.ModelProto) -> None:
    sess = onnxpy.InferenceSession(model)
    feeds = _feeds()
    feeds["w"] = np.array([0.0, 0.0, 1.0], dtype=np.float32)
    z = sess.run(["z"], feeds)[0]
    np.testing.assert_allclose(z, (feeds["x"] + feeds["y"]) * feeds["w"], rtol=1e-6)
    # The next run without the override uses the model's initializer again.
    feeds.pop("w")
    np.testing.assert_allclose(sess.run(["z"], feeds)[0], _expected(feeds)[0], rtol=1e-6)


def test_outputs_are_owned_by_the_caller() -> None:
    m = make_model(
        [helper.make_node("Identity", ["c"], ["out_c"]), helper.make_node("Reshape", ["x", "shape"], ["out_x"])],
        [vinfo("x", TensorProto.FLOAT, [2, 3])],
        [vinfo("out_c", TensorProto.FLOAT, [3]), vinfo("out_x", TensorProto.FLOAT, [6])],
        initializers={"c": np.ones(3, np.float32), "shape": np.array([6], np.int64)},
    )
    sess = onnxpy.InferenceSession(m)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out_c, out_x = sess.run(None, {"x": x})
    out_c[:] = 7  # writable, and not the session's constant
    out_x[:] = -1  # not a view of the caller's input
    assert np.all(x == np.arange(6).reshape(2, 3))
    again = sess.run(None, {"x": x})
    assert np.all(again[0] == 1)


def test_run_with_ort_values(model: onnx.ModelProto) -> None:
    sess = onnxpy.InferenceSession(model)
    feeds = _feeds()
    vals = {k: onnxpy.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
    out = sess.run_with_ort_values(["z"], vals)
    assert isinstance(out[0], onnxpy.OrtValue)
    np.testing.assert_allclose(out[0].numpy(), _expected(feeds)[0], rtol=1e-6)


def test_python_lists_and_scalars_are_accepted_when_types_fit() -> None:
    m = make_model(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        [vinfo("a", TensorProto.INT64, [2]), vinfo("b", TensorProto.INT64, [])],
        [vinfo("c", TensorProto.INT64, [2])],
    )
    sess = onnxpy.InferenceSession(m)
    assert sess.run(None, {"a": [1, 2], "b": np.int64(5)})[0].tolist() == [6, 7]


def test_run_options_terminate_before_and_during_a_run() -> None:
    # A long chain of cheap nodes, so a terminate request lands between two of them.
    nodes = [helper.make_node("Sqrt", [f"v{i}"], [f"v{i + 1}"], name=f"n{i}") for i in range(3000)]
    m = make_model(nodes, [vinfo("v0", TensorProto.FLOAT, [64])], [vinfo("v3000", TensorProto.FLOAT, [64])])
    sess = onnxpy.InferenceSession(m, providers=["CPUExecutionProvider"])
    ro = onnxpy.RunOptions()
    ro.terminate = True
    with pytest.raises(onnxpy.Fail, match="terminate"):
        sess.run(None, {"v0": np.ones(64, np.float32)}, ro)
    ro2 = onnxpy.RunOptions()
    errors: list[BaseException] = []

    started = threading.Event()

    def worker() -> None:
        # Runs until terminated (or 30 s pass, which fails the test below).
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                started.set()
                sess.run(None, {"v0": np.ones(64, np.float32)}, ro2)
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    started.wait(10)
    time.sleep(0.02)
    ro2.terminate = True
    t.join(timeout=30)
    assert not t.is_alive()
    # onnxruntime's class for a terminated run, whether the flag came before or during it
    assert errors and isinstance(errors[0], onnxpy.Fail) and "terminate" in str(errors[0])
    # The session is still usable with fresh run options.
    assert sess.run(None, {"v0": np.ones(64, np.float32)})[0].shape == (64,)


def test_run_options_terminate_reaches_a_loop_body() -> None:
    # One Loop node running millions of iterations: the flag must stop it inside the body, not
    # after the last iteration (onnxruntime stops it within an iteration too).
    f, b, i64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
    body = helper.make_graph(
        [helper.make_node("Add", ["x_in", "one"], ["x_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [vinfo("i", i64, []), vinfo("c_in", b, []), vinfo("x_in", f, [1])],
        [vinfo("c_out", b, []), vinfo("x_out", f, [1])],
        [helper.make_tensor("one", f, [1], [1.0])],
    )
    m = make_model(
        [helper.make_node("Loop", ["n", "c", "x"], ["y"], body=body, name="long_loop")],
        [vinfo("n", i64, []), vinfo("c", b, []), vinfo("x", f, [1])],
        [vinfo("y", f, [1])],
    )
    sess = onnxpy.InferenceSession(m)
    feeds = {"n": np.array(50_000_000, np.int64), "c": np.array(True), "x": np.zeros(1, np.float32)}
    ro = onnxpy.RunOptions()
    outcome: list[BaseException | list] = []
    t = threading.Thread(target=lambda: outcome.append(_run_or_error(sess, feeds, ro)))
    t.start()
    time.sleep(0.3)
    ro.terminate = True
    t.join(timeout=30)
    assert not t.is_alive(), "the Loop ran on after terminate"
    assert isinstance(outcome[0], onnxpy.Fail) and "terminate" in str(outcome[0])
    assert "long_loop" in str(outcome[0])  # the message names the node that was stopped
    # Without the flag the same session runs the loop to its end.
    short = dict(feeds, n=np.array(5, np.int64))
    np.testing.assert_array_equal(sess.run(None, short)[0], [5.0])


def _run_or_error(sess: onnxpy.InferenceSession, feeds: dict, ro: onnxpy.RunOptions) -> BaseException | list:
    try:
        return sess.run(None, feeds, ro)
    except BaseException as e:  # noqa: BLE001 - returned for the assertion
        return e


def test_concurrent_runs_from_four_threads_on_one_session() -> None:
    sess = onnxpy.InferenceSession(str(DEMO_MODEL))
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((2, 3, 32, 32)).astype(np.float32) for _ in range(8)]
    expected = [sess.run(None, {"input": x})[0] for x in inputs]
    failures: list[str] = []

    def worker(tid: int) -> None:
        for i in range(30):
            k = (tid + i) % len(inputs)
            got = sess.run(None, {"input": inputs[k]})[0]
            if not np.array_equal(got, expected[k]):
                failures.append(f"thread {tid} run {i}")

    run_in_threads(worker, 4)
    assert not failures


def test_intra_op_num_threads_is_honoured_and_results_unchanged() -> None:
    from onnxpy.runtime.threads import blas_threads_supported, get_blas_threads

    so = onnxpy.SessionOptions()
    so.intra_op_num_threads = 1
    sess = onnxpy.InferenceSession(str(DEMO_MODEL), so)
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    before = get_blas_threads()
    got = sess.run(None, {"input": x})[0]
    want = onnxpy.InferenceSession(str(DEMO_MODEL)).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if blas_threads_supported():
        assert get_blas_threads() == before  # restored after the run


def test_overlapping_thread_caps_restore_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of capped sessions in several threads overlap; the pool runs at the smallest cap
    meanwhile and at its own count after the last (each restoring what it saw on entry left
    the pool capped for good). The pool here is a stand-in for numpy's BLAS setter, so the
    bookkeeping is checked on any BLAS (the real one: the test above)."""
    from onnxpy.runtime import threads
    from onnxpy.runtime.threads import blas_threads, get_blas_threads

    pool = {"threads": 2}
    monkeypatch.setattr(threads, "_find", lambda: (lambda n: pool.update(threads=n), lambda: pool["threads"]))
    before = get_blas_threads()
    first, second = blas_threads(1), blas_threads(2)
    first.__enter__()
    second.__enter__()  # entered while the first cap holds
    assert get_blas_threads() == 1
    first.__exit__(None, None, None)
    assert get_blas_threads() == 2
    second.__exit__(None, None, None)
    assert get_blas_threads() == before
    so = onnxpy.SessionOptions()
    so.intra_op_num_threads = 1
    sess = onnxpy.InferenceSession(str(DEMO_MODEL), so)
    x = np.zeros((1, 3, 32, 32), np.float32)
    run_in_threads(lambda i: [sess.run(None, {"input": x}) for _ in range(20)], 4)
    assert get_blas_threads() == before


# -- packaging -------------------------------------------------------------------------------


def test_import_pulls_in_neither_onnxruntime_nor_onnx_reference() -> None:
    code = "import sys, onnxpy; bad = [m for m in sys.modules if m.startswith(('onnxruntime', 'onnx.reference'))]; print(bad); sys.exit(1 if bad else 0)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_python_dash_m_onnxpy_runs_the_demo() -> None:
    res = subprocess.run([sys.executable, "-m", "onnxpy"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "output probabilities" in res.stdout and "latency" in res.stdout


def test_results_are_c_contiguous_whatever_layout_the_kernel_returned() -> None:
    """Transpose returns a view and depthwise convolutions a channels-last one; every way a
    result reaches the caller (run, run_with_ort_values, IOBinding outputs) hands out a dense
    C-order array, as onnxruntime does, so data_ptr() and the shape describe its memory."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]),
        helper.make_node("Conv", ["x", "w"], ["d"], group=3, pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "layouts",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 5])],
        [
            helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 3, 5, 4]),
            helper.make_tensor_value_info("d", TensorProto.FLOAT, [1, 3, 4, 5]),
        ],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = onnxpy.InferenceSession(model.SerializeToString())
    x = rng.standard_normal((1, 3, 4, 5)).astype(np.float32)
    want = sess.run(None, {"x": x})
    assert all(a.flags.c_contiguous for a in want)
    np.testing.assert_array_equal(want[0], x.transpose(0, 1, 3, 2))

    for value in sess.run_with_ort_values(None, {"x": onnxpy.OrtValue.ortvalue_from_numpy(x)}):
        arr = value.numpy()
        assert arr.flags.c_contiguous and value.data_ptr() == arr.__array_interface__["data"][0]

    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("t", "cpu")
    binding.bind_output("d", "cpu")
    sess.run_with_iobinding(binding)
    for got, expected in zip(binding.copy_outputs_to_cpu(), want):
        assert got.flags.c_contiguous
        np.testing.assert_array_equal(got, expected)
    for value in binding.get_outputs():
        assert value.numpy().flags.c_contiguous


def test_a_saved_optimized_model_keeps_the_models_header(model: onnx.ModelProto, tmp_path: Path) -> None:
    # The file dropped producer, version, doc string and metadata and took IR 14 for the
    # model's own: get_modelmeta() read differently from it. onnxruntime keeps them.
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.producer_name, m.producer_version, m.model_version, m.doc_string = "tests", "9.9", 7, "a doc"
    onnx.helper.set_model_props(m, {"author": "me"})
    so = onnxpy.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    onnxpy.InferenceSession(m, so)
    saved = onnx.load(so.optimized_model_filepath)
    assert (saved.ir_version, saved.producer_name, saved.producer_version) == (m.ir_version, "tests", "9.9")
    assert (saved.model_version, saved.doc_string) == (7, "a doc")
    assert {p.key: p.value for p in saved.metadata_props} == {"author": "me"}
    meta = onnxpy.InferenceSession(so.optimized_model_filepath).get_modelmeta()
    assert (meta.producer_name, meta.version, meta.custom_metadata_map) == ("tests", 7, {"author": "me"})
    np.testing.assert_allclose(
        onnxpy.InferenceSession(so.optimized_model_filepath).run(["z"], _feeds())[0],
        onnxpy.InferenceSession(m).run(["z"], _feeds())[0],
    )


def test_plans_for_output_name_lists_are_kept_for_a_bounded_number() -> None:
    """A loop fetching intermediate values under ever new name lists keeps at most the last
    _MAX_CACHED_PLANS plans, and every fetch stays right."""
    from onnxpy.api import session as session_module

    nodes = [helper.make_node("Relu", ["x"], ["r0"])]
    nodes += [helper.make_node("Neg", [f"r{i}"], [f"r{i + 1}"]) for i in range(80)]
    model = make_model(nodes, [vinfo("x", TensorProto.FLOAT, [3])], [vinfo("r80", TensorProto.FLOAT, [3])])
    sess = onnxpy.InferenceSession(model.SerializeToString())
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    for i in range(80):
        (got,) = sess.run([f"r{i}"], {"x": x})
        np.testing.assert_array_equal(got, np.maximum(x, 0) * (-1) ** i)
        assert len(sess._plans) <= session_module._MAX_CACHED_PLANS


def test_a_failed_run_does_not_keep_its_intermediates_alive() -> None:
    """The raised error's traceback holds the run's frame; the values it computed are dropped
    from it, so a kept exception (a retry list, a REPL's last error) pins no activations."""
    nodes = [
        helper.make_node("Relu", ["x"], ["big"]),
        helper.make_node("Reshape", ["big", "shape"], ["y"]),
    ]
    inits = {"shape": np.array([7, 7], np.int64)}
    model = make_model(nodes, [vinfo("x", TensorProto.FLOAT, [None])], [vinfo("y", TensorProto.FLOAT, None)], inits)
    sess = onnxpy.InferenceSession(model.SerializeToString())
    with pytest.raises(onnxpy.RuntimeException) as info:
        sess.run(None, {"x": np.ones(1 << 20, np.float32)})
    held = []
    tb = info.value.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("execute", "_raise_for"):
            held += [v for v in tb.tb_frame.f_locals.get("values", []) if isinstance(v, np.ndarray)]
            held += [v for v in tb.tb_frame.f_locals.get("args", []) if isinstance(v, np.ndarray)]
        tb = tb.tb_next
    assert held == []


def _weighty_model() -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    inits = {
        "w1": rng.standard_normal((64, 300)).astype(np.float32),  # 76800 bytes
        "w2": rng.standard_normal((300, 8)).astype(np.float32),  # 9600 bytes
        "b": rng.standard_normal(8).astype(np.float32),  # 32 bytes
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["y"]),
    ]
    return make_model(nodes, [vinfo("x", TensorProto.FLOAT, [None, 64])], [vinfo("y", TensorProto.FLOAT, None)], inits)


def test_a_saved_optimized_model_can_keep_its_weights_beside_it(tmp_path: Path) -> None:
    """onnxruntime's session.optimized_model_external_initializers_file_name: initializers of
    the minimum size or more go to that file beside the optimized model, which then loads in
    onnxpy and onnxruntime with the same outputs."""
    so = onnxpy.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_ENABLE_BASIC  # loadable by onnxruntime
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "opt.weights")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "4096")
    model = _weighty_model()
    x = np.random.default_rng(12).standard_normal((3, 64)).astype(np.float32)
    want = onnxpy.InferenceSession(model.SerializeToString(), so).run(None, {"x": x})[0]
    saved = onnx.load(str(tmp_path / "opt.onnx"), load_external_data=False)
    external = {t.name for t in saved.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert external == {"w1", "w2"}  # b (32 bytes) stays inline
    assert (tmp_path / "opt.weights").stat().st_size >= 76800 + 9600
    np.testing.assert_array_equal(onnxpy.InferenceSession(str(tmp_path / "opt.onnx")).run(None, {"x": x})[0], want)
    theirs = onnxruntime.InferenceSession(str(tmp_path / "opt.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(theirs.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["../out.bin", "/tmp/out.bin", "sub/out.bin", "opt.onnx", ""])
def test_the_external_weights_file_must_be_a_name_beside_the_model(tmp_path: Path, name: str) -> None:
    so = onnxpy.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", name)
    if not name:  # an empty name is no request: the weights stay inline
        onnxpy.InferenceSession(_weighty_model().SerializeToString(), so)
        assert (tmp_path / "opt.onnx").exists()
        return
    with pytest.raises(onnxpy.InvalidArgument, match="optimized_model_external_initializers_file_name"):
        onnxpy.InferenceSession(_weighty_model().SerializeToString(), so)
    assert not (tmp_path / "opt.onnx").exists()


@pytest.mark.parametrize("version", [None, 0, 7])
def test_modelmeta_version_unset_reads_as_onnxruntime_reads_it(version: int | None) -> None:
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, [2])],
        [vinfo("y", TensorProto.FLOAT, [2])],
    )
    m.ClearField("model_version")
    if version is not None:
        m.model_version = version
    ref = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).get_modelmeta()
    assert onnxpy.InferenceSession(m).get_modelmeta().version == ref.version
    assert ref.version == (2**63 - 1 if version is None else version)


@pytest.mark.parametrize(
    ("node", "attrs"),
    [
        (("FastGelu", "com.microsoft"), {}),
        (("Normalizer", "ai.onnx.ml"), {"norm": "MAX"}),
    ],
)
def test_known_domains_run_without_an_import_as_in_onnxruntime(node: tuple[str, str], attrs: dict) -> None:
    # onnxruntime's transformer optimizer writes com.microsoft nodes and imports only ai.onnx;
    # onnxruntime serves its known domains anyway (an unknown one stays an error)
    op, domain = node
    g = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], domain=domain, **attrs)],
        "g",
        [vinfo("x", TensorProto.FLOAT, [2, 3])],
        [vinfo("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    want = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = onnxpy.InferenceSession(m).run(None, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    unknown = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], domain="foo")],
        "g",
        [vinfo("x", TensorProto.FLOAT, [2, 3])],
        [vinfo("y", TensorProto.FLOAT, None)],
    )
    m2 = helper.make_model(unknown, opset_imports=[helper.make_opsetid("", 17)])
    m2.ir_version = 8
    with pytest.raises(onnxpy.InvalidGraph, match="imports no opset of domain 'foo'"):
        onnxpy.InferenceSession(m2)
