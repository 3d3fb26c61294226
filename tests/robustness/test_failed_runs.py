"""Failed runs: an error during a run leaves bound output buffers untouched or fully written
(never half written) and the session usable."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper

import onnxpy
from tests.helpers import make_model, vinfo

F, I64 = TensorProto.FLOAT, TensorProto.INT64
SENTINEL = np.float32(-777.0)


def _two_outputs() -> onnx.ModelProto:
    """'first' = relu(x), always computable; 'second' = reshape(neg(x), shape), which fails when
    'shape' does not fit x. The first output's node runs before the failing one."""
    nodes = [
        helper.make_node("Relu", ["x"], ["first"], name="relu"),
        helper.make_node("Neg", ["x"], ["nx"], name="neg"),
        helper.make_node("Reshape", ["nx", "shape"], ["second"], name="fragile"),
    ]
    return make_model(
        nodes,
        [vinfo("x", F, [2, 4]), vinfo("shape", I64, [2])],
        [vinfo("first", F, [2, 4]), vinfo("second", F, None)],
    )


X = np.arange(-4, 4, dtype=np.float32).reshape(2, 4)
GOOD = np.array([4, 2], np.int64)
BAD = np.array([3, 3], np.int64)


def _whole(buf: np.ndarray, want: np.ndarray) -> bool:
    """Untouched (all sentinel) or fully written (equal to ``want``): never a mixture."""
    return bool(np.all(buf == SENTINEL)) or bool(np.array_equal(buf, want))


def _bound(sess: onnxpy.InferenceSession) -> tuple[onnxpy.IOBinding, np.ndarray, np.ndarray]:
    first = np.full((2, 4), SENTINEL, np.float32)
    second = np.full((4, 2), SENTINEL, np.float32)
    io = sess.io_binding()
    io.bind_cpu_input("x", X)
    io.bind_ortvalue_output("first", onnxpy.OrtValue.ortvalue_from_numpy(first))
    io.bind_ortvalue_output("second", onnxpy.OrtValue.ortvalue_from_numpy(second))
    return io, first, second


def test_kernel_failure_leaves_bound_buffers_whole_and_session_usable() -> None:
    sess = onnxpy.InferenceSession(_two_outputs().SerializeToString())
    io, first, second = _bound(sess)
    io.bind_cpu_input("shape", BAD)
    with pytest.raises(onnxpy.RuntimeException, match="fragile"):
        sess.run_with_iobinding(io)
    assert _whole(first, np.maximum(X, 0)), first
    assert np.all(second == SENTINEL), second  # its producer failed: nothing may be written
    # The same binding then works...
    io.bind_cpu_input("shape", GOOD)
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(first, np.maximum(X, 0))
    np.testing.assert_array_equal(second, (-X).reshape(4, 2))
    # ...and a later failure leaves the previous results whole.
    before_first, before_second = first.copy(), second.copy()
    io.bind_cpu_input("shape", BAD)
    with pytest.raises(onnxpy.RuntimeException, match="fragile"):
        sess.run_with_iobinding(io)
    assert np.array_equal(first, before_first) and np.array_equal(second, before_second)
    # run() on the same session is unaffected.
    out = sess.run(None, {"x": X, "shape": GOOD})
    np.testing.assert_array_equal(out[1], (-X).reshape(4, 2))


def test_result_that_does_not_fit_a_bound_buffer_writes_nothing() -> None:
    """'second' comes out [2, 4] but its buffer is [4, 2]: refused before any buffer, including
    'first' whose result fits, is written."""
    sess = onnxpy.InferenceSession(_two_outputs().SerializeToString())
    io, first, second = _bound(sess)
    io.bind_cpu_input("shape", np.array([2, 4], np.int64))
    with pytest.raises(onnxpy.InvalidArgument, match="nothing was written"):
        sess.run_with_iobinding(io)
    assert np.all(first == SENTINEL) and np.all(second == SENTINEL)
    io.bind_cpu_input("shape", GOOD)
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(second, (-X).reshape(4, 2))


def test_failure_inside_a_loop_body_leaves_the_session_usable() -> None:
    """A Loop whose body divides by a carried integer that reaches zero on some inputs."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Sub", ["d_in", "one"], ["d_out"]),
            helper.make_node("Div", ["hundred", "d_out"], ["q"], name="divider"),
        ],
        "body",
        [vinfo("i", I64, []), vinfo("cond_in", TensorProto.BOOL, []), vinfo("d_in", I64, [])],
        [vinfo("cond_out", TensorProto.BOOL, []), vinfo("d_out", I64, []), vinfo("q", I64, [])],
    )
    loop = helper.make_node("Loop", ["n", "yes", "d"], ["d_final", "qs"], name="looper", body=body)
    m = make_model(
        [loop],
        [vinfo("n", I64, []), vinfo("d", I64, [])],
        [vinfo("d_final", I64, []), vinfo("qs", I64, None)],
        initializers={
            "yes": np.array(True),
            "one": np.array(1, np.int64),
            "hundred": np.array(100, np.int64),
        },
    )
    sess = onnxpy.InferenceSession(m.SerializeToString())
    with pytest.raises(onnxpy.RuntimeException, match="divider|looper"):
        sess.run(None, {"n": np.array(3, np.int64), "d": np.array(2, np.int64)})  # 100 / 0 at step 2
    d_final, qs = sess.run(None, {"n": np.array(3, np.int64), "d": np.array(10, np.int64)})
    assert int(d_final) == 7
    np.testing.assert_array_equal(qs, [100 // 9, 100 // 8, 100 // 7])


def test_terminated_run_leaves_bound_buffers_untouched() -> None:
    sess = onnxpy.InferenceSession(_two_outputs().SerializeToString())
    io, first, second = _bound(sess)
    io.bind_cpu_input("shape", GOOD)
    opts = onnxpy.RunOptions()
    opts.terminate = True
    with pytest.raises(onnxpy.OnnxpyError, match="terminate"):
        sess.run_with_iobinding(io, opts)
    assert np.all(first == SENTINEL) and np.all(second == SENTINEL)
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(first, np.maximum(X, 0))


def test_if_branch_failure_is_named_and_the_other_branch_still_runs() -> None:
    bad = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["b"], name="inner_reshape")],
        "bad",
        [],
        [vinfo("b", F, None)],
    )
    good = helper.make_graph([helper.make_node("Neg", ["x"], ["g"])], "good", [], [vinfo("g", F, None)])
    node = helper.make_node("If", ["c"], ["y"], name="chooser")
    node.attribute.extend(
        [
            helper.make_attribute("then_branch", bad),
            helper.make_attribute("else_branch", good),
        ]
    )
    assert node.attribute[0].type == AttributeProto.GRAPH
    m = make_model(
        [node],
        [vinfo("c", TensorProto.BOOL, []), vinfo("x", F, [2, 4]), vinfo("shape", I64, [2])],
        [vinfo("y", F, None)],
    )
    sess = onnxpy.InferenceSession(m.SerializeToString())
    with pytest.raises(onnxpy.RuntimeException, match="inner_reshape|chooser"):
        sess.run(None, {"c": np.array(True), "x": X, "shape": BAD})
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(False), "x": X, "shape": BAD})[0], -X)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(True), "x": X, "shape": GOOD})[0], X.reshape(4, 2))


def test_failing_runs_in_some_threads_do_not_disturb_the_others() -> None:
    import threading

    sess = onnxpy.InferenceSession(_two_outputs().SerializeToString())
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def work(fail: bool, seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            start.wait()
            for _ in range(100):
                x = rng.standard_normal((2, 4)).astype(np.float32)
                if fail:
                    with pytest.raises(onnxpy.RuntimeException, match="fragile"):
                        sess.run(None, {"x": x, "shape": BAD})
                else:
                    first, second = sess.run(None, {"x": x, "shape": GOOD})
                    np.testing.assert_array_equal(first, np.maximum(x, 0))
                    np.testing.assert_array_equal(second, (-x).reshape(4, 2))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k % 2 == 0, k)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, repr(errors[0])
