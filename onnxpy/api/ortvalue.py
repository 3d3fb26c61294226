"""OrtValue and OrtDevice: a value (tensor, sequence or empty optional) that lives on a device.

On the CPU an OrtValue made from a C-contiguous numpy array of a supported dtype wraps that
array without copying (``data_ptr()`` equals the array's address and later changes to the array
are seen by the next run, as in onnxruntime). An OrtValue keeps whatever owns its memory alive.

On "cuda" an OrtValue holds a CuPy array: ``ortvalue_from_numpy`` copies to the device (the copy
is complete when it returns), ``numpy()`` copies back, ``data_ptr()`` is the device address and
``ortvalue_from_shape_and_type`` allocates device memory. Device work is queued on the provider's
stream; ``__dlpack__(stream=s)`` makes the consumer's stream ``s`` wait for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from ..model import dtypes
from ..providers import CPU, Provider, provider_for_device
from . import unsupported
from .errors import Fail, InvalidArgument

# onnxruntime's OrtDevice constants
_DEVICE_TYPES = {"cpu": 0, "cuda": 1, "gpu": 1}


class OrtDevice:
    """A device: type (0 CPU, 1 GPU), id, memory type (0 default) and vendor id."""

    CPU = 0
    GPU = 1
    NPU = 3

    def __init__(self, device_type: int = 0, memory_type: int = 0, vendor_id: int = 0, device_id: int = 0) -> None:
        self._type = int(device_type)
        self._mem = int(memory_type)
        self._vendor = int(vendor_id)
        self._id = int(device_id)

    @staticmethod
    def make(ort_device_name: str, device_id: int, vendor_id: int = -1) -> OrtDevice:
        name = str(ort_device_name).lower()
        if name not in _DEVICE_TYPES:
            raise InvalidArgument(f"unsupported device '{ort_device_name}': expected one of 'cpu', 'cuda'")
        kind = _DEVICE_TYPES[name]
        vendor = vendor_id if vendor_id >= 0 else (0x10DE if kind == 1 else 0)
        return OrtDevice(kind, 0, vendor, int(device_id))

    def device_type(self) -> int:
        return self._type

    def device_id(self) -> int:
        return self._id

    def device_mem_type(self) -> int:
        return self._mem

    def device_vendor_id(self) -> int:
        return self._vendor

    def name(self) -> str:
        return "cuda" if self._type == 1 else "cpu"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrtDevice) and (self._type, self._id, self._mem) == (
            other._type,
            other._id,
            other._mem,
        )

    def __hash__(self) -> int:
        return hash((self._type, self._id, self._mem))

    def __repr__(self) -> str:
        return f"OrtDevice({self.name()}:{self._id}, mem={self._mem})"


def as_host_array(obj: Any, what: str) -> np.ndarray:
    """A numpy array for user data; lists and scalars are converted, str arrays become object,
    byte-swapped (big-endian) data native, by value."""
    if isinstance(obj, np.ndarray):
        # A new array object over the same memory: the caller reassigning the array's shape or
        # dtype afterwards must not change what was bound; a subclass (np.matrix keeps two
        # dimensions through every reduction) is read as a plain array.
        arr = obj.view(np.ndarray)
    else:
        try:
            arr = np.asarray(obj)
        except Exception as e:  # noqa: BLE001
            raise InvalidArgument(f"{what}: cannot convert {type(obj).__name__} to a numpy array: {e}") from None
    if arr.dtype.kind in ("U", "S"):
        arr = arr.astype(object)
    elif arr.dtype.hasobject:
        arr = _as_strings(arr)
    elif not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def _as_strings(arr: np.ndarray) -> np.ndarray:
    """An object array as string tensor data: str and bytes values stay, any other value becomes
    its str(), as onnxruntime converts it (None -> 'None')."""
    if all(isinstance(v, (str, bytes)) for v in arr.flat):
        return arr
    out = np.empty(arr.shape, dtype=object)
    out.flat[:] = [v if isinstance(v, (str, bytes)) else str(v) for v in arr.flat]
    return out


def _supported(dtype: np.dtype) -> bool:
    try:
        dtypes.elem_type(dtype)
        return True
    except ValueError:
        return False


class OrtValue:
    """A tensor, a sequence of tensors, or an empty optional, on a device."""

    __slots__ = ("_value", "_provider", "_owner", "__weakref__")

    def __init__(self, value: Any, provider: Provider = CPU, owner: Any = None) -> None:
        self._value = value
        self._provider = provider
        # Whatever owns the memory (numpy array, DLPack producer, user buffer holder).
        self._owner = owner

    # -- construction ---------------------------------------------------------------------------
    @staticmethod
    def ortvalue_from_numpy(
        numpy_obj: Any, device_type: str = "cpu", device_id: int = 0, vendor_id: int = -1
    ) -> OrtValue:
        """An OrtValue holding ``numpy_obj`` on a device.

        On the CPU a C-contiguous, aligned, native-byte-order array is wrapped without copying
        (``data_ptr()`` is the array's address; the OrtValue keeps the array alive); anything
        else is converted once.
        """
        if numpy_obj is None:
            raise InvalidArgument("ortvalue_from_numpy: got None; expected a numpy array (or data convertible to one)")
        arr = as_host_array(numpy_obj, "ortvalue_from_numpy")
        if not _supported(arr.dtype):
            raise InvalidArgument(f"ortvalue_from_numpy: numpy dtype {arr.dtype} has no ONNX element type")
        provider = provider_for_device(device_type, device_id)
        if provider.device_type == "cpu":
            if arr.flags.c_contiguous and arr.flags.aligned:
                return OrtValue(arr, provider, owner=numpy_obj)
            return OrtValue(np.ascontiguousarray(arr), provider)
        value = provider.from_host(np.ascontiguousarray(arr))
        if not provider.is_device_array(value):
            raise InvalidArgument(
                f"ortvalue_from_numpy: {dtypes.dtype_string(arr.dtype)} tensors cannot live on "
                f"'{provider.device_type}' (CuPy has no such element type); keep them on 'cpu'"
            )
        return OrtValue(value, provider)

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(data: Any, onnx_element_type: int) -> OrtValue:
        """Wrap ``data`` as the ONNX element type given, reinterpreting bits when sizes match
        (e.g. uint16 data as bfloat16)."""
        arr = as_host_array(data, "ortvalue_from_numpy_with_onnx_type")
        target = dtypes.to_np_dtype(onnx_element_type)
        if arr.dtype != target:
            if arr.dtype.itemsize != target.itemsize or target.hasobject or arr.dtype.hasobject:
                raise InvalidArgument(
                    f"ortvalue_from_numpy_with_onnx_type: data of dtype {arr.dtype} ({arr.dtype.itemsize} bytes) "
                    f"cannot hold {dtypes.tensor_type_string(dtypes.elem_type(target))} ({target.itemsize} bytes)"
                )
            arr = np.ascontiguousarray(arr).view(target)
        return OrtValue.ortvalue_from_numpy(arr)

    @staticmethod
    def ortvalue_from_shape_and_type(
        shape: Sequence[int],
        element_type: Any,
        device_type: str = "cpu",
        device_id: int = 0,
        vendor_id: int = -1,
        memory_info: Any = None,
    ) -> OrtValue:
        """A tensor of ``shape`` and ``element_type`` (uninitialized; strings start empty) on the
        device. ``memory_info`` (onnxruntime's allocator choice) is refused: onnxpy has none."""
        if memory_info is not None:
            unsupported.refuse("ortvalue_from_shape_and_type(memory_info=...)", unsupported.ALLOCATOR)
        dt = _element_dtype(element_type)
        dims = _check_shape(shape, "ortvalue_from_shape_and_type")
        provider = provider_for_device(device_type, device_id)
        if dt.hasobject:
            if provider.device_type != "cpu":
                raise InvalidArgument(f"ortvalue_from_shape_and_type: string tensors cannot live on '{device_type}'")
            return OrtValue(np.full(dims, "", dtype=object), provider)
        try:
            return OrtValue(provider.empty(dims, dt), provider)
        except TypeError as e:  # an element type the device cannot hold
            raise InvalidArgument(f"ortvalue_from_shape_and_type: {e}") from None
        except (MemoryError, ValueError) as e:  # more than the machine (or numpy) can hold
            nbytes = math.prod(dims) * dt.itemsize
            raise Fail(
                f"ortvalue_from_shape_and_type: cannot allocate {nbytes} bytes for shape {list(dims)} of "
                f"{dtypes.dtype_string(dt)} on '{device_type}': {type(e).__name__}: {e}"
            ) from None

    @staticmethod
    def from_dlpack(data: Any, is_bool_tensor: bool = False) -> OrtValue:
        """Import a tensor from torch, CuPy, JAX, numpy... through DLPack, without copying."""
        from .dlpack import import_dlpack

        value, provider = import_dlpack(data, is_bool_tensor)
        return OrtValue(value, provider, owner=data)

    @staticmethod
    def ort_value_from_sparse_tensor(sparse_tensor: Any) -> OrtValue:
        unsupported.refuse("OrtValue.ort_value_from_sparse_tensor", unsupported.SPARSE)

    def as_sparse_tensor(self) -> Any:
        unsupported.refuse("OrtValue.as_sparse_tensor", unsupported.SPARSE)

    # -- queries --------------------------------------------------------------------------------
    def _tensor(self, what: str) -> Any:
        if not self.is_tensor():
            kind = "an empty optional" if self._value is None else "a sequence"
            raise InvalidArgument(f"{what}() needs a tensor OrtValue, this one holds {kind}")
        return self._value

    def data_ptr(self) -> int:
        return self._provider.data_ptr(self._tensor("data_ptr"))

    def device_name(self) -> str:
        return self._provider.device_type

    def device(self) -> OrtDevice:
        kind = self._provider.device_type
        if kind in _DEVICE_TYPES:
            return OrtDevice.make(kind, self._provider.device_id)
        return OrtDevice(OrtDevice.GPU, 0, 0, self._provider.device_id)  # a registered device provider

    def shape(self) -> list[int]:
        return [int(d) for d in self._tensor("shape").shape]

    def element_type(self) -> int:
        v = self._value
        if isinstance(v, list):  # a sequence: its tensors' type, as onnxruntime reports it
            return dtypes.elem_type(v[0].dtype) if v else onnx.TensorProto.FLOAT
        return dtypes.elem_type(self._tensor("element_type").dtype)

    def data_type(self) -> str:
        v = self._value
        if v is None:
            return "optional"
        if isinstance(v, list):
            inner = dtypes.dtype_string(v[0].dtype) if v else "tensor(float)"
            return f"seq({inner})"
        return dtypes.dtype_string(v.dtype)

    def tensor_size_in_bytes(self) -> int:
        t = self._tensor("tensor_size_in_bytes")
        return int(t.size) * int(t.dtype.itemsize)

    def has_value(self) -> bool:
        return self._value is not None

    def is_tensor(self) -> bool:
        return self._value is not None and not isinstance(self._value, list)

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def is_sparse_tensor(self) -> bool:
        return False

    def numpy(self) -> Any:
        """The value on the host: the array itself on the CPU (no copy), a copy from a device."""
        v = self._value
        if v is None:
            return None
        if isinstance(v, list):
            return [self._provider.to_host(x) for x in v]
        host = self._provider.to_host(v)
        # A new array object over the same memory, as onnxruntime hands out: reassigning its
        # shape must not reshape this value.
        return host.view() if host is v and type(host) is np.ndarray else host

    def update_inplace(self, data: Any) -> None:
        """Overwrite this tensor's values in place with a numpy array or another OrtValue.

        The source needs the same dtype and element count (its shape may differ). The memory (and
        so ``data_ptr()``) stays the same; unlike onnxruntime, a different dtype is an error
        rather than a reinterpretation of bytes.
        """
        t = self._tensor("update_inplace")
        if isinstance(data, OrtValue):
            src_provider = data._provider
            src = data._tensor("update_inplace source")
        else:
            src_provider = CPU
            src = as_host_array(data, "update_inplace")
        if src.dtype != t.dtype:
            raise InvalidArgument(f"update_inplace: got dtype {src.dtype}, the OrtValue holds {t.dtype}")
        if src.size != t.size:
            raise InvalidArgument(
                f"update_inplace: got {src.size} elements (shape {list(src.shape)}), "
                f"the OrtValue holds {t.size} (shape {list(t.shape)})"
            )
        if not self._provider.writeable(t):
            raise InvalidArgument("update_inplace: this OrtValue's memory is read-only")
        same_device = (src_provider.device_type, src_provider.device_id) == (
            self._provider.device_type,
            self._provider.device_id,
        )
        if not same_device:
            # One host -> device (or device -> host) copy straight into this OrtValue's memory.
            src = np.ascontiguousarray(src_provider.to_host(src))
            if self._provider.device_type == "cpu":
                np.copyto(t, src.reshape(t.shape))
                return
        self._provider.copy_into(t, src.reshape(t.shape))

    # -- interop -------------------------------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self._provider.to_host(self._tensor("__array__"))
        on_host = self._provider.device_type == "cpu"
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"converting {arr.dtype} to {np.dtype(dtype)} needs a copy, but copy=False")
            return arr.astype(dtype)
        if copy is False and not on_host:
            raise ValueError(f"this OrtValue lives on {self.device_name()}; reading it on the host needs a copy")
        if copy and on_host:
            return arr.copy()
        return arr

    def __dlpack__(
        self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: bool | None = None
    ) -> Any:
        t = self._tensor("__dlpack__")
        if self._provider.device_type != "cpu":
            # The producer side is this provider's stream: with it current, CuPy makes the
            # consumer's ``stream`` wait for the work queued there (DLPack's stream contract).
            activate = getattr(self._provider, "activate", None)
            if activate is not None:
                with activate():
                    return self._export_dlpack(t, stream, max_version, dl_device, copy)
        return self._export_dlpack(t, stream, max_version, dl_device, copy)

    @staticmethod
    def _export_dlpack(t: Any, stream: Any, max_version: Any, dl_device: Any, copy: bool | None) -> Any:
        kwargs: dict[str, Any] = {}
        if stream is not None:
            kwargs["stream"] = stream
        if max_version is not None:
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        try:
            return t.__dlpack__(**kwargs)
        except TypeError:
            # Older producers do not take the newer keywords.
            return t.__dlpack__(stream=stream) if stream is not None else t.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._tensor("__dlpack_device__").__dlpack_device__()

    def to_dlpack(self) -> Any:
        return self.__dlpack__()

    def __repr__(self) -> str:
        if self.is_tensor():
            return f"OrtValue({self.data_type()}, shape={self.shape()}, device={self.device_name()})"
        return f"OrtValue({self.data_type()}, device={self.device_name()})"


def _element_dtype(element_type: Any) -> np.dtype:
    if element_type in (str, bytes, np.str_, np.bytes_, object) or (
        isinstance(element_type, np.dtype) and element_type.kind in "USO"
    ):
        return np.dtype(object)  # string tensors hold Python strings, not fixed-width numpy text
    try:
        dt = dtypes.to_np_dtype(element_type)
        dtypes.elem_type(dt)
        return dt
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"unsupported element_type {element_type!r}: {e}") from None


def _items(obj: Any) -> list[Any]:
    try:
        return list(obj)
    except TypeError:
        return [None]  # not a sequence: fails the int check


def _check_shape(shape: Any, what: str) -> tuple[int, ...]:
    # Integers only: int() would turn 2.5 into 2 and the string '23' into (2, 3) silently.
    if isinstance(shape, (str, bytes)) or not all(isinstance(d, (int, np.integer)) for d in _items(shape)):
        raise InvalidArgument(f"{what}: shape must be a sequence of ints, got {shape!r}")
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"{what}: shape {list(dims)} has a negative dimension")
    return dims


def copy_tensors(src: Sequence[OrtValue], dst: Sequence[OrtValue], stream: Any = None) -> None:
    """Copy each tensor of ``src`` into the tensor of ``dst`` at the same position, across
    devices as onnxruntime's ``copy_tensors`` does (whose data transfers come from execution
    providers: between two CPU values it raises, here it copies). Each pair needs the same
    element type and shape; all sources live on one device and all destinations on one device.
    Every pair is checked before anything is written."""
    if stream is not None:
        raise InvalidArgument("copy_tensors: onnxpy has no OrtSyncStream; copies are synchronous, pass stream=None")
    sources, targets = list(src), list(dst)
    if len(sources) != len(targets):
        raise InvalidArgument(f"copy_tensors: got {len(sources)} source tensors and {len(targets)} destinations")
    for side, values in (("source", sources), ("destination", targets)):
        for i, v in enumerate(values):
            if not isinstance(v, OrtValue):
                raise InvalidArgument(f"copy_tensors: {side} {i} is a {type(v).__name__}, expected an OrtValue")
            if not v.is_tensor():
                raise InvalidArgument(f"copy_tensors: {side} {i} holds {v.data_type()}, expected a tensor")
        devices = sorted({(v._provider.device_type, v._provider.device_id) for v in values})
        if len(devices) > 1:
            raise InvalidArgument(f"copy_tensors: the {side} tensors live on several devices {devices}, expected one")
    for i, (s, d) in enumerate(zip(sources, targets)):
        a, b = s._value, d._value
        if a.dtype != b.dtype or a.shape != b.shape:
            raise InvalidArgument(
                f"copy_tensors: pair {i}: source {a.dtype}{list(a.shape)} and destination "
                f"{b.dtype}{list(b.shape)} differ; expected the same element type and shape"
            )
        if not d._provider.writeable(b):
            raise InvalidArgument(f"copy_tensors: destination {i} is read-only")
    for s, d in zip(sources, targets):
        d.update_inplace(s)
