"""DLPack: OrtValue.from_dlpack and OrtValue.__dlpack__ with numpy, torch and JAX, without copies."""

from __future__ import annotations

import gc

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto

import onnxpy as ort
from tests.helpers import skip_before_onnxruntime

TORCH_REASON = "torch is not installed (pip install torch to run the DLPack tests with torch)"
JAX_REASON = "jax is not installed (the JAX DLPack tests need it)"


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# -- numpy -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int64, np.uint16, np.float16, np.bool_])
def test_from_dlpack_numpy_is_zero_copy(dtype):
    skip_before_onnxruntime((1, 24), "has no OrtValue.from_dlpack to compare with")
    a = np.ones((2, 3), dtype=dtype)
    v = ort.OrtValue.from_dlpack(a)
    assert v.data_ptr() == _ptr(a)
    assert v.numpy().dtype == np.dtype(dtype)
    theirs = onnxruntime.OrtValue.from_dlpack(a)
    assert v.data_type() == theirs.data_type() and v.shape() == theirs.shape()


def test_numpy_reads_an_ortvalue_through_dlpack():
    skip_before_onnxruntime((1, 24), "has no OrtValue.__dlpack_device__ to compare with")
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    assert v.__dlpack_device__() == onnxruntime.OrtValue.ortvalue_from_numpy(a).__dlpack_device__() == (1, 0)
    back = np.from_dlpack(v)
    assert _ptr(back) == _ptr(a)
    np.testing.assert_array_equal(back, a)


def test_bool_stays_bool_and_uint8_can_be_read_as_bool():
    b = np.array([True, False, True])
    v = ort.OrtValue.from_dlpack(b)
    assert v.element_type() == TensorProto.BOOL and v.numpy().dtype == np.bool_
    assert np.from_dlpack(v).dtype == np.bool_
    u = np.array([1, 0, 1], np.uint8)
    as_bool = ort.OrtValue.from_dlpack(u, is_bool_tensor=True)
    assert as_bool.data_type() == "tensor(bool)" and as_bool.data_ptr() == _ptr(u)
    assert ort.OrtValue.from_dlpack(u).data_type() == "tensor(uint8)"


def test_from_dlpack_rejects_other_objects():
    with pytest.raises(ort.InvalidArgument, match="__dlpack__"):
        ort.OrtValue.from_dlpack([1, 2, 3])


def test_from_dlpack_value_binds_and_runs(neg_session):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    io = neg_session.io_binding()
    io.bind_ortvalue_input("x", ort.OrtValue.from_dlpack(a))
    io.bind_output("y")
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), -a)


# -- torch -----------------------------------------------------------------------------------------


def test_torch_tensor_imported_without_copy():
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    v = ort.OrtValue.from_dlpack(t)
    assert v.data_ptr() == t.data_ptr()
    assert v.shape() == [3, 4] and v.data_type() == "tensor(float)"
    t[0, 0] = 99.0
    assert v.numpy()[0, 0] == 99.0


def test_torch_bool_stays_bool():
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    t = torch.tensor([True, False, True])
    v = ort.OrtValue.from_dlpack(t)
    assert v.data_type() == "tensor(bool)" and v.numpy().dtype == np.bool_
    assert onnxruntime.OrtValue.from_dlpack(t).data_type() == "tensor(bool)"
    back = torch.from_dlpack(v)
    assert back.dtype == torch.bool and back.tolist() == [True, False, True]


def test_torch_reads_an_ortvalue_without_copy():
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    t = torch.from_dlpack(v)
    assert t.data_ptr() == _ptr(a) and t.dtype == torch.float64
    np.testing.assert_array_equal(t.numpy(), a)


def test_torch_capsule_is_accepted_once():
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    from torch.utils.dlpack import to_dlpack

    t = torch.arange(5, dtype=torch.int64)
    capsule = to_dlpack(t)
    v = ort.OrtValue.from_dlpack(capsule)
    assert v.data_ptr() == t.data_ptr() and v.numpy().tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ort.InvalidArgument, match="only once"):
        ort.OrtValue.from_dlpack(capsule)


def test_temporary_torch_tensor_stays_alive_while_bound(neg_session):
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    io = neg_session.io_binding()
    io.bind_ortvalue_input("x", ort.OrtValue.from_dlpack(torch.full((64, 3), 1.5)))
    io.bind_output("y")
    gc.collect()
    _junk = [torch.full((64, 3), 7.0) for _ in range(50)]  # would reuse freed memory
    neg_session.run_with_iobinding(io)
    np.testing.assert_array_equal(io.get_outputs()[0].numpy(), np.full((64, 3), -1.5, np.float32))


def test_torch_unsupported_dtype_is_a_clear_error():
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    with pytest.raises(ort.InvalidArgument, match="from_dlpack"):
        ort.OrtValue.from_dlpack(torch.zeros(3, dtype=torch.bfloat16))


# -- JAX -------------------------------------------------------------------------------------------


def test_jax_array_round_trip():
    jnp = pytest.importorskip("jax.numpy", reason=JAX_REASON)
    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    v = ort.OrtValue.from_dlpack(x)
    np.testing.assert_array_equal(v.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    b = ort.OrtValue.from_dlpack(jnp.array([True, False]))
    assert b.data_type() == "tensor(bool)"
    back = jnp.from_dlpack(ort.OrtValue.ortvalue_from_numpy(np.arange(3, dtype=np.int32)))
    assert back.tolist() == [0, 1, 2]
