"""IOBinding: every method of the founding document and the zero-copy semantics of issue 3."""

from __future__ import annotations

import gc
import threading
import weakref

import ml_dtypes
import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import onnxpy as ort
from onnxpy.ops import registry
from tests.api.conftest import (
    PASSTHROUGH_W,
    TWELVE_DTYPES,
    F,
    add_model,
    identity_model,
    model_bytes,
    sample,
    view_model,
    view_of_input_model,
)

SENTINEL = np.float32(-12345.0)


def _has_kernel(op_type: str) -> bool:
    return bool(registry.versions("", op_type))


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# -- inputs ---------------------------------------------------------------------------------------


def test_bind_cpu_input_wraps_contiguous_array_without_copy(neg_session):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    io = neg_session.io_binding()
    io.bind_cpu_input("x", x)
    assert io._inputs["x"].data_ptr() == _ptr(x)  # the bound value is the caller's memory
    io.bind_output("y")
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), -x)
    x[1, 2] = 100.0  # seen by the next run, as in onnxruntime
    neg_session.run_with_iobinding(io)
    assert io.get_outputs()[0].numpy()[1, 2] == -100.0


@pytest.mark.parametrize("kind", ["fortran", "strided", "reversed"])
def test_bind_cpu_input_converts_other_arrays_once(neg_session, kind):
    base = np.arange(12, dtype=np.float32).reshape(4, 3)
    if kind == "fortran":
        x = np.asfortranarray(base)
    elif kind == "strided":
        x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    else:
        x = base[::-1]
    expected = -np.asarray(x, dtype=np.float32)
    io = neg_session.io_binding()
    io.bind_cpu_input("x", x)
    bound = io._inputs["x"]
    assert bound._value.flags.c_contiguous
    io.bind_output("y")
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), expected)
    x[0, 0] = 99.0  # the converted copy was made at bind time, not per run
    neg_session.run_with_iobinding(io)
    assert io._inputs["x"] is bound
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), expected)


def test_bind_input_buffer_ptr_reads_callers_memory_in_place(neg_session):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    io = neg_session.io_binding()
    io.bind_input("x", "cpu", 0, np.float32, x.shape, _ptr(x))
    assert io._inputs["x"].data_ptr() == _ptr(x)
    io.bind_output("y")
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], -x)
    x *= 3  # same memory, new values
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], -x)


def test_bind_ortvalue_input_and_run_match_session_run(neg_session, neg_model):
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    io = neg_session.io_binding()
    io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x))
    io.bind_output("y")
    neg_session.run_with_iobinding(io)
    oracle = onnxruntime.InferenceSession(neg_model, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), neg_session.run(None, {"x": x})[0])
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), oracle.run(None, {"x": x})[0])


def test_bind_ortvalue_input_rejects_other_objects(neg_session):
    io = neg_session.io_binding()
    with pytest.raises(ort.InvalidArgument, match="needs an OrtValue"):
        io.bind_ortvalue_input("x", np.zeros((1, 3), np.float32))


# -- outputs written in place ----------------------------------------------------------------------


def test_bind_output_buffer_ptr_writes_in_place(neg_session):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.full((2, 3), SENTINEL)
    io = neg_session.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y", "cpu", 0, np.float32, out.shape, _ptr(out))
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(out, -x)
    result = io.get_outputs()[0]
    assert result.data_ptr() == _ptr(out)
    assert np.shares_memory(result.numpy(), out)
    # the next run writes the same memory again
    x += 1
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(out, -x)
    assert io.get_outputs()[0].data_ptr() == _ptr(out)


def test_bind_ortvalue_output_writes_in_place(neg_session):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.full((2, 3), SENTINEL)
    target = ort.OrtValue.ortvalue_from_numpy(out)
    io = neg_session.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_ortvalue_output("y", target)
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(out, -x)
    assert io.get_outputs()[0].data_ptr() == target.data_ptr() == _ptr(out)


def test_bind_ortvalue_output_from_shape_and_type(neg_session):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    target = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], TensorProto.FLOAT)
    io = neg_session.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_ortvalue_output("y", target)
    neg_session.run_with_iobinding(io)
    assert io.get_outputs()[0].data_ptr() == target.data_ptr()
    np.testing.assert_array_equal(target.numpy(), -x)


def test_declared_dtype_mismatch_raises_at_bind_and_writes_nothing(neg_session):
    out = np.full((2, 3), -7, dtype=np.int32)
    io = neg_session.io_binding()
    io.bind_cpu_input("x", np.ones((2, 3), np.float32))
    with pytest.raises(ort.InvalidArgument, match=r"tensor\(int32\).*tensor\(float\)"):
        io.bind_output("y", "cpu", 0, np.int32, out.shape, _ptr(out))
    with pytest.raises(ort.InvalidArgument, match=r"tensor\(int32\)"):
        io.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(out))
    with pytest.raises(ort.InvalidArgument, match="rank"):
        io.bind_output("y", "cpu", 0, np.float32, (6,), _ptr(out))
    with pytest.raises(ort.InvalidArgument, match="index 1"):
        io.bind_output("y", "cpu", 0, np.float32, (3, 2), _ptr(out))
    assert (out == -7).all()


def test_runtime_shape_mismatch_raises_before_any_output_is_written(two_output_session):
    x = np.array([1.0, -2.0, 3.0], dtype=np.float32)
    first = np.full(3, SENTINEL)
    second = np.full(4, SENTINEL)  # wrong length, only known to be wrong at run time
    io = two_output_session.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y1", "cpu", 0, np.float32, first.shape, _ptr(first))
    io.bind_output("y2", "cpu", 0, np.float32, second.shape, _ptr(second))
    with pytest.raises(ort.InvalidArgument, match=r"y2.*\[3\].*\[4\].*nothing was written"):
        two_output_session.run_with_iobinding(io)
    assert (first == SENTINEL).all()
    assert (second == SENTINEL).all()
    # the same binding works once the buffer fits
    second = np.full(3, SENTINEL)
    io.bind_output("y2", "cpu", 0, np.float32, second.shape, _ptr(second))
    two_output_session.run_with_iobinding(io)
    np.testing.assert_array_equal(first, -x)
    np.testing.assert_array_equal(second, np.abs(x))


def test_runtime_dtype_mismatch_on_intermediate_raises_before_writing():
    sess = ort.InferenceSession(
        model_bytes(
            [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
            [("x", F, [3])],
            [("y", F, [3])],
        )
    )
    good = np.full(3, SENTINEL)
    bad = np.full(3, -7, dtype=np.int32)
    io = sess.io_binding()
    io.bind_cpu_input("x", np.array([1, -2, 3], np.float32))
    io.bind_output("y", "cpu", 0, np.float32, good.shape, _ptr(good))
    io.bind_output("r", "cpu", 0, np.int32, bad.shape, _ptr(bad))  # an intermediate: type known at run
    with pytest.raises(ort.InvalidArgument, match=r"'r' is tensor\(float\).*tensor\(int32\)"):
        sess.run_with_iobinding(io)
    assert (good == SENTINEL).all() and (bad == -7).all()


@pytest.mark.parametrize("kind", ["Reshape", "Transpose", "Flatten"])
@pytest.mark.parametrize("of_input", [False, True], ids=["of_intermediate", "of_graph_input"])
@pytest.mark.parametrize("how", ["buffer_ptr", "ortvalue"])
def test_view_producing_last_node_writes_bound_buffer(kind, of_input, how):
    model = view_of_input_model(kind) if of_input else view_model(kind)
    sess = ort.InferenceSession(model)
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    expected = sess.run(None, {"x": x})[0]
    oracle = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(expected, oracle)
    out = np.full(expected.shape, SENTINEL)
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    if how == "buffer_ptr":
        io.bind_output("y", "cpu", 0, np.float32, out.shape, _ptr(out))
    else:
        io.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(out))
    sess.run_with_iobinding(io)
    assert io.get_outputs()[0].data_ptr() == _ptr(out)
    np.testing.assert_array_equal(out, expected)
    assert not np.shares_memory(out, x)


def test_passthrough_outputs_graph_input_and_initializer_write_bound_buffers(passthrough_session):
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    bufs = {n: np.full(3, SENTINEL) for n in ("x", "w", "s")}
    io = passthrough_session.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("x", "cpu", 0, np.float32, [3], _ptr(bufs["x"]))
    io.bind_ortvalue_output("w", ort.OrtValue.ortvalue_from_numpy(bufs["w"]))
    io.bind_output("s", "cpu", 0, TensorProto.FLOAT, [3], _ptr(bufs["s"]))
    passthrough_session.run_with_iobinding(io)
    outs = io.get_outputs()
    assert [o.data_ptr() for o in outs] == [_ptr(bufs[n]) for n in ("x", "w", "s")]
    np.testing.assert_array_equal(bufs["x"], x)
    np.testing.assert_array_equal(bufs["w"], PASSTHROUGH_W)
    np.testing.assert_array_equal(bufs["s"], x + PASSTHROUGH_W)


def test_passthrough_outputs_allocated_are_owned_by_the_caller(passthrough_session):
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    io = passthrough_session.io_binding()
    io.bind_cpu_input("x", x)
    for n in ("x", "w", "s"):
        io.bind_output(n)
    passthrough_session.run_with_iobinding(io)
    out_x, out_w, _ = (o.numpy() for o in io.get_outputs())
    # never a view of the caller's input nor a read-only constant
    assert not np.shares_memory(out_x, x)
    assert out_w.flags.writeable
    out_w[:] = 0
    passthrough_session.run_with_iobinding(io)
    np.testing.assert_array_equal(io.get_outputs()[1].numpy(), PASSTHROUGH_W)


def test_output_bound_to_the_input_buffer_runs_in_place(neg_session):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    io = neg_session.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y", "cpu", 0, np.float32, x.shape, _ptr(x))
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(x, -np.arange(6, dtype=np.float32).reshape(2, 3))


def test_transpose_into_its_own_input_buffer_is_not_mistaken_for_done():
    # Transpose's result starts at the input's address; writing it there still needs the copy.
    sess = ort.InferenceSession(
        model_bytes([helper.make_node("Transpose", ["x"], ["y"])], [("x", F, [3, 3])], [("y", F, [3, 3])])
    )
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    expected = x.T.copy()
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y", "cpu", 0, np.float32, x.shape, _ptr(x))
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(x, expected)


def test_writing_one_bound_buffer_does_not_change_another_output():
    # y1 = -x is written into x's memory; y2 = x (a view of x) must still hold the old x.
    sess = ort.InferenceSession(
        model_bytes(
            [helper.make_node("Neg", ["x"], ["y1"]), helper.make_node("Identity", ["x"], ["y2"])],
            [("x", F, [4])],
            [("y1", F, [4]), ("y2", F, [4])],
        )
    )
    original = np.array([1, 2, 3, 4], dtype=np.float32)
    for bind_y2 in (False, True):
        x = original.copy()
        y2 = np.full(4, SENTINEL)
        io = sess.io_binding()
        io.bind_cpu_input("x", x)
        io.bind_output("y1", "cpu", 0, np.float32, [4], _ptr(x))
        if bind_y2:
            io.bind_output("y2", "cpu", 0, np.float32, [4], _ptr(y2))
        else:
            io.bind_output("y2")
        sess.run_with_iobinding(io)
        np.testing.assert_array_equal(x, -original)
        np.testing.assert_array_equal(io.get_outputs()[1].numpy(), original)


def test_bind_output_with_buffer_needs_type_and_shape(neg_session):
    out = np.zeros((2, 3), np.float32)
    io = neg_session.io_binding()
    with pytest.raises(ort.InvalidArgument, match="element_type and shape are required"):
        io.bind_output("y", "cpu", 0, None, (2, 3), _ptr(out))
    with pytest.raises(ort.InvalidArgument, match="element_type and shape are required"):
        io.bind_output("y", "cpu", 0, np.float32, None, _ptr(out))


def test_bind_ortvalue_output_rejects_read_only_memory(neg_session):
    out = np.zeros((2, 3), np.float32)
    out.flags.writeable = False
    io = neg_session.io_binding()
    with pytest.raises(ort.InvalidArgument, match="read-only"):
        io.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(out))


# -- outputs allocated by the runtime --------------------------------------------------------------


def test_bind_output_without_shape_allocates_each_run(dynamic_reshape_session):
    sess = dynamic_reshape_session
    data = np.arange(12, dtype=np.float32)
    io = sess.io_binding()
    io.bind_cpu_input("data", data)
    io.bind_output("y", "cpu")
    seen = []
    for shape in ([3, 4], [2, 2, 3], [12], [-1, 6]):
        io.bind_cpu_input("shape", np.array(shape, dtype=np.int64))
        sess.run_with_iobinding(io)
        out = io.get_outputs()[0]
        seen.append((out, data.reshape(shape).copy()))
        np.testing.assert_array_equal(out.numpy(), data.reshape(shape))
    # earlier results stay valid: each run got its own memory
    for out, expected in seen:
        np.testing.assert_array_equal(out.numpy(), expected)
    assert not np.shares_memory(seen[-1][0].numpy(), data)


@pytest.mark.skipif(not _has_kernel("NonZero"), reason="the NonZero kernel is not registered yet (another issue)")
def test_data_dependent_output_nonzero():
    model = model_bytes(
        [helper.make_node("NonZero", ["x"], ["y"])], [("x", F, ["n"])], [("y", TensorProto.INT64, [1, None])]
    )
    sess = ort.InferenceSession(model)
    io = sess.io_binding()
    io.bind_output("y")
    for x in (np.array([0, 1, 0, 2], np.float32), np.zeros(3, np.float32), np.ones(5, np.float32)):
        io.bind_cpu_input("x", x)
        sess.run_with_iobinding(io)
        np.testing.assert_array_equal(io.get_outputs()[0].numpy(), np.array(np.nonzero(x), dtype=np.int64))


@pytest.mark.skipif(not _has_kernel("Unique"), reason="the Unique kernel is not registered yet (another issue)")
def test_data_dependent_output_unique():
    model = model_bytes([helper.make_node("Unique", ["x"], ["y"])], [("x", F, ["n"])], [("y", F, [None])], opset=11)
    sess = ort.InferenceSession(model)
    io = sess.io_binding()
    io.bind_output("y")
    for x in (np.array([3, 1, 3, 2, 1], np.float32), np.array([5], np.float32)):
        io.bind_cpu_input("x", x)
        sess.run_with_iobinding(io)
        expected = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_array_equal(io.get_outputs()[0].numpy(), expected)


# -- reuse, rebinding, clearing, names -------------------------------------------------------------


def test_reuse_rebind_and_repeatable_get_outputs(neg_session):
    io = neg_session.io_binding()
    a = np.ones((2, 3), np.float32)
    b = np.full((2, 3), 5, np.float32)
    io.bind_cpu_input("x", a)
    io.bind_cpu_input("x", b)  # rebinding a name replaces it
    buf1 = np.full((2, 3), SENTINEL)
    buf2 = np.full((2, 3), SENTINEL)
    io.bind_output("y", "cpu", 0, np.float32, (2, 3), _ptr(buf1))
    io.bind_output("y", "cpu", 0, np.float32, (2, 3), _ptr(buf2))
    neg_session.run_with_iobinding(io)
    assert (buf1 == SENTINEL).all()
    np.testing.assert_array_equal(buf2, -b)
    first, second = io.get_outputs(), io.get_outputs()
    assert len(first) == 1 and first[0].data_ptr() == second[0].data_ptr() == _ptr(buf2)
    np.testing.assert_array_equal(first[0].numpy(), second[0].numpy())
    assert io.get_outputs_as_ortvaluevector()[0].data_ptr() == _ptr(buf2)
    io.synchronize_inputs()
    io.synchronize_outputs()
    for i in range(5):
        x = np.full((i + 1, 3), i, np.float32)
        io.clear_binding_inputs()
        io.bind_cpu_input("x", x)
        io.bind_output("y")  # back to a runtime allocation: the shape may change
        neg_session.run_with_iobinding(io)
        np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], -x)


def test_get_outputs_keeps_binding_order_when_rebinding(two_output_session):
    x = np.array([-1.0, 2.0], np.float32)
    io = two_output_session.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y2")
    io.bind_output("y1")
    io.bind_output("y2")  # replaces in place; order stays y2, y1
    two_output_session.run_with_iobinding(io)
    got = io.copy_outputs_to_cpu()
    np.testing.assert_array_equal(got[0], np.abs(x))
    np.testing.assert_array_equal(got[1], -x)


def test_copy_outputs_to_cpu_returns_copies(neg_session):
    out = np.zeros((1, 3), np.float32)
    io = neg_session.io_binding()
    io.bind_cpu_input("x", np.ones((1, 3), np.float32))
    io.bind_output("y", "cpu", 0, np.float32, (1, 3), _ptr(out))
    neg_session.run_with_iobinding(io)
    copy = io.copy_outputs_to_cpu()[0]
    assert not np.shares_memory(copy, out)
    copy[:] = 9
    np.testing.assert_array_equal(out, -np.ones((1, 3)))


def test_clear_bindings(neg_session):
    io = neg_session.io_binding()
    io.bind_cpu_input("x", np.ones((1, 3), np.float32))
    io.bind_output("y")
    neg_session.run_with_iobinding(io)
    io.clear_binding_outputs()
    assert io.get_outputs() == []
    with pytest.raises(ort.InvalidArgument, match="at least one output"):
        neg_session.run_with_iobinding(io)
    io.bind_output("y")
    io.clear_binding_inputs()
    with pytest.raises(ort.InvalidArgument, match=r"Required inputs \(\['x'\]\) are missing"):
        neg_session.run_with_iobinding(io)


def test_unknown_names_raise_and_list_valid_names(two_output_session):
    io = two_output_session.io_binding()
    with pytest.raises(ort.InvalidArgument, match=r"'nope'.*Valid inputs: \['x'\]"):
        io.bind_cpu_input("nope", np.ones(2, np.float32))
    with pytest.raises(ort.InvalidArgument, match=r"Valid inputs: \['x'\]"):
        io.bind_input("nope", "cpu", 0, np.float32, [2], 0)
    with pytest.raises(ort.InvalidArgument, match=r"Valid inputs"):
        io.bind_ortvalue_input("nope", ort.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32)))
    with pytest.raises(ort.InvalidArgument, match=r"'nope'.*Valid outputs: \['y1', 'y2'\]"):
        io.bind_output("nope")
    with pytest.raises(ort.InvalidArgument, match=r"Valid outputs: \['y1', 'y2'\]"):
        io.bind_ortvalue_output("nope", ort.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32)))


def test_unsupported_device_is_a_clear_error(neg_session):
    io = neg_session.io_binding()
    with pytest.raises(RuntimeError, match="unsupported device type 'tpu'"):
        io.bind_output("y", "tpu")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(RuntimeError, match="'cuda:0' is not available"):
            io.bind_output("y", "cuda")


def test_run_with_iobinding_needs_an_iobinding(neg_session):
    with pytest.raises(ort.InvalidArgument, match="IOBinding"):
        neg_session.run_with_iobinding(object())


# -- lifetime --------------------------------------------------------------------------------------


def test_bound_values_keep_their_owners_alive(neg_session):
    io = neg_session.io_binding()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = -x
    alive = weakref.ref(x)
    io.bind_cpu_input("x", x)
    out = np.full((2, 3), SENTINEL)
    out_alive = weakref.ref(out)
    io.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(out))
    del x, out
    gc.collect()
    assert alive() is not None and out_alive() is not None  # owned by the binding
    np.testing.assert_array_equal(alive(), -expected)
    # overwrite freed memory if anything had been freed
    junk = [np.full((2, 3), 7, np.float32) for _ in range(100)]
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), expected)
    del junk
    io.clear_binding_inputs()
    io.clear_binding_outputs()
    gc.collect()
    assert alive() is None and out_alive() is None  # released once unbound


def test_bound_temporary_ortvalue_stays_valid(neg_session):
    io = neg_session.io_binding()
    io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(np.full((3, 3), 2.5, np.float32)))
    io.bind_output("y")
    gc.collect()
    _junk = [np.full((3, 3), 9, np.float32) for _ in range(100)]
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), np.full((3, 3), -2.5, np.float32))


def test_outputs_outlive_the_binding(neg_session):
    io = neg_session.io_binding()
    io.bind_cpu_input("x", np.ones((2, 3), np.float32))
    io.bind_output("y")
    neg_session.run_with_iobinding(io)
    result = io.get_outputs()[0]
    del io
    gc.collect()
    np.testing.assert_array_equal(result.numpy(), -np.ones((2, 3), np.float32))


# -- zero-size tensors -----------------------------------------------------------------------------


def test_zero_size_tensors_bind_and_run(neg_session, neg_model):
    empty = np.zeros((0, 3), np.float32)
    oracle = onnxruntime.InferenceSession(neg_model, providers=["CPUExecutionProvider"])
    assert oracle.run(None, {"x": empty})[0].shape == (0, 3)
    # null pointers for both the input and the output buffer
    io = neg_session.io_binding()
    io.bind_input("x", "cpu", 0, np.float32, (0, 3), 0)
    io.bind_output("y", "cpu", 0, np.float32, (0, 3), 0)
    neg_session.run_with_iobinding(io)
    out = io.get_outputs()[0]
    assert out.shape() == [0, 3] and out.tensor_size_in_bytes() == 0 and out.data_ptr() == 0
    # a numpy array and an OrtValue of size 0, output allocated by the runtime
    io = neg_session.io_binding()
    io.bind_cpu_input("x", empty)
    io.bind_output("y")
    neg_session.run_with_iobinding(io)
    assert io.copy_outputs_to_cpu()[0].shape == (0, 3)
    io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(empty))
    io.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_shape_and_type((0, 3), np.float32))
    neg_session.run_with_iobinding(io)
    assert io.get_outputs()[0].shape() == [0, 3]


def test_null_pointer_for_a_non_empty_tensor_is_rejected(neg_session):
    io = neg_session.io_binding()
    with pytest.raises(ort.InvalidArgument, match="null"):
        io.bind_input("x", "cpu", 0, np.float32, (2, 3), 0)
    with pytest.raises(ort.InvalidArgument, match="null"):
        io.bind_output("y", "cpu", 0, np.float32, (2, 3), 0)


# -- threads ---------------------------------------------------------------------------------------


def test_one_session_one_iobinding_per_thread(neg_session):
    n_threads, n_runs = 8, 40
    barrier = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            io = neg_session.io_binding()
            out = np.full((k + 1, 3), SENTINEL)
            io.bind_output("y", "cpu", 0, np.float32, out.shape, _ptr(out))
            barrier.wait()
            for r in range(n_runs):
                x = np.full((k + 1, 3), k * 1000 + r, np.float32)
                io.bind_cpu_input("x", x)
                neg_session.run_with_iobinding(io)
                if not (np.array_equal(out, -x) and io.get_outputs()[0].data_ptr() == _ptr(out)):
                    raise AssertionError(f"thread {k} run {r}: got {out[0, 0]}, expected {-x[0, 0]}")
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# -- element types ---------------------------------------------------------------------------------


@pytest.mark.parametrize("elem,dtype", TWELVE_DTYPES, ids=[str(d) for _, d in TWELVE_DTYPES])
def test_twelve_dtypes_through_ortvalue_and_pointer_bindings(elem, dtype):
    model = identity_model(elem)
    sess = ort.InferenceSession(model)
    x = sample(dtype, (3, 4), seed=elem)
    expected = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], expected)

    # bind_ortvalue_input + bind_output(buffer_ptr), element_type as a numpy dtype
    io = sess.io_binding()
    io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x))
    out = np.zeros_like(x)
    io.bind_output("y", "cpu", 0, dtype, x.shape, _ptr(out))
    sess.run_with_iobinding(io)
    assert io.get_outputs()[0].data_ptr() == _ptr(out)
    assert io.get_outputs()[0].element_type() == elem
    np.testing.assert_array_equal(out, expected)

    # bind_input(buffer_ptr) + bind_ortvalue_output, element_type as a TensorProto int
    io = sess.io_binding()
    io.bind_input("x", "cpu", 0, elem, x.shape, _ptr(x))
    target = ort.OrtValue.ortvalue_from_shape_and_type(x.shape, elem)
    io.bind_ortvalue_output("y", target)
    sess.run_with_iobinding(io)
    got = io.get_outputs()[0]
    assert got.data_ptr() == target.data_ptr()
    assert got.numpy().dtype == dtype
    np.testing.assert_array_equal(got.numpy(), expected)


@pytest.mark.parametrize("elem,dtype", [(e, d) for e, d in TWELVE_DTYPES if d != np.bool_], ids=str)
def test_arithmetic_through_bindings_matches_session_run(elem, dtype):
    sess = ort.InferenceSession(add_model(elem))
    x = sample(dtype, (2, 5), seed=1)
    c = np.array([3], dtype=dtype)
    expected = sess.run(None, {"x": x, "c": c})[0]
    np.testing.assert_array_equal(expected, x + c)
    io = sess.io_binding()
    io.bind_input("x", "cpu", 0, dtype, x.shape, _ptr(x))
    io.bind_ortvalue_input("c", ort.OrtValue.ortvalue_from_numpy(c))
    out = np.zeros_like(x)
    io.bind_output("y", "cpu", 0, elem, x.shape, _ptr(out))
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(out, expected)


NARROW_FLOATS = [
    (TensorProto.BFLOAT16, ml_dtypes.bfloat16, np.uint16),
    (TensorProto.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn, np.uint8),
    (TensorProto.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz, np.uint8),
    (TensorProto.FLOAT8E5M2, ml_dtypes.float8_e5m2, np.uint8),
    (TensorProto.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz, np.uint8),
]


@pytest.mark.parametrize("elem,mldt,bits", NARROW_FLOATS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_bfloat16_and_float8_bind_by_tensorproto_int(elem, mldt, bits):
    sess = ort.InferenceSession(identity_model(elem, opset=21))
    x = np.array([[0.5, -1.0, 2.0], [3.0, -0.25, 1.5]], dtype=np.float32).astype(mldt)
    raw = x.view(bits)  # how such data often arrives: integer bits of the same width

    io = sess.io_binding()
    io.bind_input("x", "cpu", 0, elem, raw.shape, _ptr(raw))
    out = np.zeros(raw.shape, dtype=bits)
    io.bind_output("y", "cpu", 0, elem, out.shape, _ptr(out))
    sess.run_with_iobinding(io)
    result = io.get_outputs()[0]
    assert result.element_type() == elem and result.data_ptr() == _ptr(out)
    np.testing.assert_array_equal(out, raw)
    assert result.numpy().dtype == np.dtype(mldt)

    io = sess.io_binding()
    io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, elem))
    io.bind_output("y")
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0].view(bits), raw)


def test_element_type_forms_are_equivalent(neg_session):
    x = np.ones((1, 3), np.float32)
    for form in (np.float32, np.dtype(np.float32), "float32", TensorProto.FLOAT, np.int64(TensorProto.FLOAT)):
        out = np.zeros((1, 3), np.float32)
        io = neg_session.io_binding()
        io.bind_input("x", "cpu", 0, form, (1, 3), _ptr(x))
        io.bind_output("y", "cpu", 0, form, (1, 3), _ptr(out))
        neg_session.run_with_iobinding(io)
        np.testing.assert_array_equal(out, -x)
    io = neg_session.io_binding()
    with pytest.raises(ort.InvalidArgument, match="element_type"):
        io.bind_input("x", "cpu", 0, 9999, (1, 3), _ptr(x))
    with pytest.raises(ort.InvalidArgument, match="element_type"):
        io.bind_input("x", "cpu", 0, "not-a-type", (1, 3), _ptr(x))


def test_wrong_input_dtype_is_reported_at_run(neg_session):
    x = np.ones((1, 3), np.float64)
    io = neg_session.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y")
    with pytest.raises(ort.InvalidArgument, match=r"Unexpected input data type.*tensor\(double\)"):
        neg_session.run_with_iobinding(io)


# -- the same calls behave as in onnxruntime --------------------------------------------------------


def test_same_sequence_of_calls_as_onnxruntime(neg_model):
    x = np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32)
    results = []
    for lib in (ort, onnxruntime):
        sess = lib.InferenceSession(neg_model, providers=["CPUExecutionProvider"])
        io = sess.io_binding()
        out = np.zeros((4, 3), np.float32)
        io.bind_ortvalue_input("x", lib.OrtValue.ortvalue_from_numpy(x, "cpu", 0))
        io.bind_output("y", "cpu", 0, np.float32, [4, 3], _ptr(out))
        sess.run_with_iobinding(io)
        o = io.get_outputs()[0]
        results.append((o.data_ptr() == _ptr(out), o.device_name(), o.shape(), o.data_type(), out.copy()))
    assert results[0][:4] == results[1][:4]
    np.testing.assert_array_equal(results[0][4], results[1][4])
