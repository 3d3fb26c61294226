"""OrtValue and OrtDevice: every method of issue 3, compared with onnxruntime where it matters."""

from __future__ import annotations

import gc
import weakref

import ml_dtypes
import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto

import onnxpy as ort
from onnxpy.api.ortvalue import OrtValue as _OrtValue
from onnxpy.providers import CPU
from tests.api.conftest import TWELVE_DTYPES, sample
from tests.helpers import skip_before_onnxruntime


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# -- construction from numpy -----------------------------------------------------------------------


def test_from_numpy_wraps_without_copy():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    assert v.data_ptr() == _ptr(a) == onnxruntime.OrtValue.ortvalue_from_numpy(a).data_ptr()
    a[0, 1] = 42.0
    assert v.numpy()[0, 1] == 42.0
    assert np.shares_memory(v.numpy(), a)
    assert np.shares_memory(np.asarray(v), a)


@pytest.mark.parametrize("kind", ["fortran", "strided", "big_endian"])
def test_from_numpy_converts_other_arrays_once(kind):
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    if kind == "fortran":
        a = np.asfortranarray(base)
    elif kind == "strided":
        a = np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2]
    else:
        a = base.astype(">f4")
    expected = np.array(a, dtype=np.float32)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    assert v.data_ptr() != _ptr(a)
    assert v.numpy().flags.c_contiguous and v.numpy().dtype == np.float32
    a[0, 0] = -1  # converted at construction: later changes are not seen
    np.testing.assert_array_equal(v.numpy(), expected)
    if kind != "big_endian":  # onnxruntime also copies these
        assert onnxruntime.OrtValue.ortvalue_from_numpy(a).data_ptr() != _ptr(a)


def test_from_numpy_keeps_the_array_alive():
    a = np.arange(1000, dtype=np.float64)
    alive = weakref.ref(a)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    del a
    gc.collect()
    assert alive() is not None
    np.testing.assert_array_equal(v.numpy(), np.arange(1000, dtype=np.float64))
    del v
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("elem,dtype", TWELVE_DTYPES, ids=[str(d) for _, d in TWELVE_DTYPES])
def test_queries_match_onnxruntime(elem, dtype):
    a = sample(dtype, (2, 3, 4), seed=elem)
    ours = ort.OrtValue.ortvalue_from_numpy(a, "cpu", 0)
    theirs = onnxruntime.OrtValue.ortvalue_from_numpy(a, "cpu", 0)
    for method in ("device_name", "shape", "data_type", "element_type", "tensor_size_in_bytes", "data_ptr"):
        assert getattr(ours, method)() == getattr(theirs, method)(), method
    for method in ("has_value", "is_tensor", "is_tensor_sequence", "is_sparse_tensor"):
        assert getattr(ours, method)() == getattr(theirs, method)(), method
    assert ours.element_type() == elem
    assert ours.numpy().dtype == theirs.numpy().dtype == dtype
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_bool_stays_bool():
    a = np.array([True, False, True])
    v = ort.OrtValue.ortvalue_from_numpy(a)
    assert v.data_type() == "tensor(bool)" and v.element_type() == TensorProto.BOOL
    assert v.numpy().dtype == np.bool_


def test_strings():
    # onnxruntime refuses string arrays here; onnxpy accepts them (string inputs can be bound)
    a = np.array(["a", "bc", ""])
    ours = ort.OrtValue.ortvalue_from_numpy(a)
    assert ours.data_type() == "tensor(string)"
    assert ours.element_type() == TensorProto.STRING
    assert ours.shape() == [3]
    assert ours.numpy().tolist() == ["a", "bc", ""]


def test_zero_size_value():
    a = np.zeros((0, 4), np.float32)
    ours, theirs = ort.OrtValue.ortvalue_from_numpy(a), onnxruntime.OrtValue.ortvalue_from_numpy(a)
    assert ours.shape() == theirs.shape() == [0, 4]
    assert ours.tensor_size_in_bytes() == theirs.tensor_size_in_bytes() == 0
    assert ours.data_ptr() == 0


def test_unsupported_numpy_dtype_is_rejected():
    with pytest.raises(ort.InvalidArgument, match="no ONNX element type"):
        ort.OrtValue.ortvalue_from_numpy(np.zeros(2, dtype="datetime64[s]"))


def test_unknown_device_is_rejected():
    with pytest.raises(RuntimeError, match="unsupported device type"):
        ort.OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32), "tpu", 0)


# -- other constructors ----------------------------------------------------------------------------


NARROW = [
    (TensorProto.BFLOAT16, np.uint16, ml_dtypes.bfloat16),
    (TensorProto.FLOAT8E4M3FN, np.uint8, ml_dtypes.float8_e4m3fn),
    (TensorProto.FLOAT8E4M3FNUZ, np.uint8, ml_dtypes.float8_e4m3fnuz),
    (TensorProto.FLOAT8E5M2, np.uint8, ml_dtypes.float8_e5m2),
    (TensorProto.FLOAT8E5M2FNUZ, np.uint8, ml_dtypes.float8_e5m2fnuz),
]


@pytest.mark.parametrize("elem,bits,mldt", NARROW, ids=lambda v: getattr(v, "__name__", str(v)))
def test_from_numpy_with_onnx_type(elem, bits, mldt):
    values = np.array([0.5, -2.0, 3.0, 0.0], dtype=np.float32).astype(mldt)
    raw = values.view(bits)
    ours = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, elem)
    theirs = onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, elem)
    assert ours.element_type() == theirs.element_type() == elem
    assert ours.data_type() == theirs.data_type()
    assert ours.shape() == theirs.shape()
    assert ours.tensor_size_in_bytes() == theirs.tensor_size_in_bytes()
    assert ours.data_ptr() == _ptr(raw)  # reinterpreted, not copied
    assert ours.numpy().dtype == np.dtype(mldt)
    np.testing.assert_array_equal(ours.numpy().astype(np.float32), values.astype(np.float32))


def test_from_numpy_with_onnx_type_same_type_and_size_mismatch():
    a = np.arange(3, dtype=np.float32)
    v = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, TensorProto.FLOAT)
    assert v.data_ptr() == _ptr(a)
    with pytest.raises(ort.InvalidArgument, match="cannot hold"):
        ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.zeros(3, np.uint8), TensorProto.BFLOAT16)


@pytest.mark.parametrize(
    "element_type",
    [np.float32, np.int64, np.bool_, np.float16, TensorProto.DOUBLE, TensorProto.UINT8, TensorProto.BFLOAT16],
    ids=str,
)
def test_from_shape_and_type(element_type):
    ours = ort.OrtValue.ortvalue_from_shape_and_type([2, 5], element_type, "cpu", 0)
    theirs = onnxruntime.OrtValue.ortvalue_from_shape_and_type([2, 5], element_type, "cpu", 0)
    assert ours.shape() == theirs.shape() == [2, 5]
    assert ours.element_type() == theirs.element_type()
    assert ours.data_type() == theirs.data_type()
    assert ours.tensor_size_in_bytes() == theirs.tensor_size_in_bytes()
    assert ours.device_name() == theirs.device_name() == "cpu"
    assert ours.numpy().flags.writeable


def test_from_shape_and_type_rejects_bad_arguments():
    with pytest.raises(ort.InvalidArgument, match="negative"):
        ort.OrtValue.ortvalue_from_shape_and_type([2, -1], np.float32)
    with pytest.raises(ort.InvalidArgument, match="element_type"):
        ort.OrtValue.ortvalue_from_shape_and_type([2], 12345)


# -- update_inplace --------------------------------------------------------------------------------


def test_update_inplace_keeps_the_memory():
    a = np.zeros((2, 3), np.float32)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    ptr = v.data_ptr()
    v.update_inplace(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert v.data_ptr() == ptr
    np.testing.assert_array_equal(a, np.arange(6).reshape(2, 3))
    # same element count, other shape: accepted, as in onnxruntime
    v.update_inplace(np.ones(6, np.float32))
    theirs = onnxruntime.OrtValue.ortvalue_from_numpy(np.zeros((2, 3), np.float32))
    theirs.update_inplace(np.ones(6, np.float32))
    np.testing.assert_array_equal(v.numpy(), theirs.numpy())


def test_update_inplace_sizes_and_types_are_checked():
    a = np.zeros((2, 3), np.float32)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    with pytest.raises(ort.InvalidArgument, match="elements"):
        v.update_inplace(np.ones(4, np.float32))
    with pytest.raises(RuntimeError, match="size"):
        onnxruntime.OrtValue.ortvalue_from_numpy(a).update_inplace(np.ones(4, np.float32))
    # onnxruntime reinterprets the bytes of another dtype; onnxpy refuses instead
    with pytest.raises(ort.InvalidArgument, match="dtype"):
        v.update_inplace(np.ones((2, 3), np.float64))
    assert (a == 0).all()
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ort.InvalidArgument, match="read-only"):
        ort.OrtValue.ortvalue_from_numpy(ro).update_inplace(np.ones(3, np.float32))


def test_update_inplace_from_another_ortvalue():
    a = np.zeros((2, 2), np.int64)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    v.update_inplace(ort.OrtValue.ortvalue_from_numpy(np.array([1, 2, 3, 4], np.int64)))
    np.testing.assert_array_equal(a, [[1, 2], [3, 4]])
    skip_before_onnxruntime((1, 24), "updates an OrtValue only from a numpy array")
    theirs = onnxruntime.OrtValue.ortvalue_from_numpy(np.zeros((2, 2), np.int64))
    theirs.update_inplace(onnxruntime.OrtValue.ortvalue_from_numpy(np.array([[1, 2], [3, 4]], np.int64)))
    np.testing.assert_array_equal(theirs.numpy(), a)


def test_update_inplace_is_seen_by_a_bound_input(neg_session):
    v = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 3), np.float32))
    io = neg_session.io_binding()
    io.bind_ortvalue_input("x", v)
    io.bind_output("y")
    v.update_inplace(np.array([[1, 2, 3]], np.float32))
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(io.copy_outputs_to_cpu()[0], [[-1, -2, -3]])


# -- copy_tensors ----------------------------------------------------------------------------------


def test_copy_tensors_copies_each_pair_into_the_destinations_memory():
    dst_a, dst_b = np.zeros((2, 3), np.float32), np.zeros(4, np.int64)
    dsts = [ort.OrtValue.ortvalue_from_numpy(dst_a), ort.OrtValue.ortvalue_from_numpy(dst_b)]
    srcs = [
        ort.OrtValue.ortvalue_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3)),
        ort.OrtValue.ortvalue_from_numpy(np.array([5, 6, 7, 8], np.int64)),
    ]
    ptrs = [d.data_ptr() for d in dsts]
    ort.copy_tensors(srcs, dsts)
    np.testing.assert_array_equal(dst_a, np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(dst_b, [5, 6, 7, 8])
    assert [d.data_ptr() for d in dsts] == ptrs
    assert ort.capi.onnxruntime_inference_collection.copy_tensors is ort.copy_tensors
    # onnxruntime's own takes its transfers from execution providers and has none between two CPU values
    with pytest.raises(RuntimeError, match="Data transfer"):
        onnxruntime.copy_tensors(
            [onnxruntime.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))],
            [onnxruntime.OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32))],
        )


@pytest.mark.parametrize(
    ("srcs", "dsts", "message"),
    [
        ([np.ones((2, 3), np.float32)], [np.zeros((3, 2), np.float32)], r"pair 0: source float32\[2, 3\]"),
        ([np.ones(3, np.float32)], [np.zeros(3, np.float64)], "same element type and shape"),
        ([np.ones(3, np.float32), np.ones(2, np.float32)], [np.zeros(3, np.float32)], "3 source tensors and 2"),
        ([np.ones(3, np.float32)], [np.zeros(3, np.float32), np.zeros(2, np.float32)], "2 source tensors and 3"),
    ],
)
def test_copy_tensors_checks_every_pair_before_writing(srcs, dsts, message):
    # the first pair would fit: nothing may be written when a later one does not
    targets = [np.zeros(3, np.float32)] + dsts
    values = [ort.OrtValue.ortvalue_from_numpy(t) for t in targets]
    sources = [ort.OrtValue.ortvalue_from_numpy(np.full(3, 9, np.float32))] + [
        ort.OrtValue.ortvalue_from_numpy(s) for s in srcs
    ]
    with pytest.raises(ort.InvalidArgument, match=message.replace("pair 0", "pair 1")):
        ort.copy_tensors(sources, values)
    assert all((t == 0).all() for t in targets)


def test_copy_tensors_refuses_what_is_not_a_writable_tensor():
    src = ort.OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ort.InvalidArgument, match="destination 0 is read-only"):
        ort.copy_tensors([src], [ort.OrtValue.ortvalue_from_numpy(ro)])
    with pytest.raises(ort.InvalidArgument, match="destination 0 is a ndarray, expected an OrtValue"):
        ort.copy_tensors([src], [np.zeros(3, np.float32)])
    seq = ort.OrtValue(None)
    with pytest.raises(ort.InvalidArgument, match="source 0 holds optional, expected a tensor"):
        ort.copy_tensors([seq], [src])
    with pytest.raises(ort.InvalidArgument, match="OrtSyncStream"):
        ort.copy_tensors([src], [ort.OrtValue.ortvalue_from_numpy(np.zeros(3, np.float32))], stream=1)


# -- numpy interop ---------------------------------------------------------------------------------


def test_array_protocol():
    a = np.arange(4, dtype=np.float32)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    assert np.shares_memory(np.asarray(v), a)
    assert not np.shares_memory(np.array(v, copy=True), a)
    np.testing.assert_array_equal(np.asarray(v, dtype=np.float64), a.astype(np.float64))
    with pytest.raises(ValueError, match="copy"):
        np.asarray(v, dtype=np.float64, copy=False)
    assert np.asarray(v, copy=False) is not None
    skip_before_onnxruntime((1, 24), "has no array protocol on OrtValue to compare with")
    np.testing.assert_array_equal(np.asarray(v), np.asarray(onnxruntime.OrtValue.ortvalue_from_numpy(a)))


# -- non-tensor values -----------------------------------------------------------------------------


def test_sequence_and_empty_optional_values():
    seq = _OrtValue([np.zeros(2, np.float32), np.ones(3, np.float32)], CPU)
    assert seq.is_tensor_sequence() and not seq.is_tensor() and seq.has_value()
    assert seq.data_type() == "seq(tensor(float))"
    assert [x.tolist() for x in seq.numpy()] == [[0, 0], [1, 1, 1]]
    with pytest.raises(ort.InvalidArgument, match="sequence"):
        seq.shape()
    none = _OrtValue(None, CPU)
    assert not none.has_value() and not none.is_tensor() and not none.is_tensor_sequence()
    assert none.numpy() is None
    with pytest.raises(ort.InvalidArgument, match="empty optional"):
        none.data_ptr()


# -- OrtDevice -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,device_id", [("cpu", 0), ("cuda", 0), ("cuda", 1)])
def test_ortdevice_make_matches_onnxruntime(name, device_id):
    if name == "cuda":
        skip_before_onnxruntime((1, 24), "gives CUDA devices vendor id 0 (later versions NVIDIA's 0x10DE)")
    ours = ort.OrtDevice.make(name, device_id)
    theirs = onnxruntime.OrtDevice.make(name, device_id)
    assert ours.device_type() == theirs.device_type()
    assert ours.device_id() == theirs.device_id()
    assert ours.device_mem_type() == theirs.device_mem_type()
    assert ours.device_vendor_id() == theirs.device_vendor_id()


def test_ortdevice_explicit_vendor_and_equality():
    d = ort.OrtDevice.make("cuda", 0, vendor_id=0x1234)
    assert d.device_vendor_id() == 0x1234 == onnxruntime.OrtDevice.make("cuda", 0, 0x1234).device_vendor_id()
    assert ort.OrtDevice.make("cpu", 0) == ort.OrtDevice.make("cpu", 0)
    assert ort.OrtDevice.make("cpu", 0) != ort.OrtDevice.make("cuda", 0)
    assert ort.OrtDevice.make("cpu", 0).device_type() == ort.OrtDevice.CPU
    assert ort.OrtDevice.make("cuda", 0).device_type() == ort.OrtDevice.GPU
    with pytest.raises(ort.InvalidArgument, match="unsupported device"):
        ort.OrtDevice.make("tpu", 0)


def test_ortvalue_device():
    v = ort.OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32))
    assert v.device() == ort.OrtDevice.make("cpu", 0)
    assert v.device_name() == "cpu"
