"""A fake GPU: a device provider backed by numpy that behaves like CuPy where it matters.

It lets the device logic (placement and copies, IOBinding and OrtValue device paths, streams)
run on a machine without a GPU. Its arrays (:class:`FakeArray`) hold their values in host
memory but refuse to mix with numpy the way CuPy arrays do:

- ``np.asarray(fake)`` raises TypeError (CuPy: "Implicit conversion to a NumPy array is not
  allowed"); ``.get()`` is the explicit copy to the host;
- a numpy array given to a device function, ufunc or operator raises :class:`FakeDeviceError`
  (CuPy refuses numpy operands); numpy scalars and Python numbers are fine;
- the namespace (``FAKE_XP``) offers only the names CuPy 14 has (tests/gpu/cupy_names.py),
  reductions return 0-d arrays rather than numpy scalars, and arrays have no ``__index__``;
- element types CuPy cannot hold (strings, objects, bfloat16, float8...) raise;
- device work outside the provider's ``activate()`` scope is counted in
  ``FakeGPUProvider.outside_scope``, so a test can check that every run's work was queued on the
  provider's stream.

``install()`` registers the provider as "FakeGPUExecutionProvider" on device type "fakegpu";
``uninstall()`` removes it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from onnxpy.providers import CPU, register_provider, unregister_provider
from onnxpy.providers.base import Provider
from onnxpy.providers.cuda import device_supports, device_supports_dtype

from . import cupy_names

NAME = "FakeGPUExecutionProvider"
DEVICE = "fakegpu"


class FakeDeviceError(TypeError):
    """Host and device data were mixed (CuPy raises TypeError for the same mistakes)."""


_state = threading.local()


def _active_provider() -> FakeGPUProvider | None:
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


def _device_op() -> None:
    """Note one piece of device work; outside an ``activate()`` scope it is counted as a stray."""
    if _active_provider() is None:
        FakeGPUProvider.outside_scope += 1


def _no_sync(what: str) -> None:
    """CUDA refuses synchronizing calls while a stream is being captured; so does the fake."""
    if getattr(_state, "capturing", False):
        raise RuntimeError(f"{what} synchronizes with the device, which is not allowed during CUDA graph capture")


def _check_dtype(dt: np.dtype) -> None:
    if not device_supports_dtype(dt):
        raise FakeDeviceError(f"the fake device cannot hold {dt} (CuPy cannot)")


# -- wrapping --------------------------------------------------------------------------------


def _wrap(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return FakeArray(obj)
    if isinstance(obj, np.generic):
        return FakeArray(np.asarray(obj))  # CuPy returns 0-d arrays, not scalars
    if isinstance(obj, tuple):
        return tuple(_wrap(o) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o) for o in obj]
    return obj


def _unwrap(obj: Any, strict: bool, what: str = "", scalars: bool = False) -> Any:
    if isinstance(obj, FakeArray):
        return obj._a
    if isinstance(obj, np.ndarray):
        if strict and not (scalars and obj.size == 1):
            raise FakeDeviceError(
                f"a numpy (host) array {obj.dtype}{list(obj.shape)} was given to device code{what}; "
                "CuPy refuses host arrays: copy it to the device first"
            )
        return obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap(o, strict, what, scalars) for o in obj)
    if isinstance(obj, dict):
        return {k: _unwrap(v, strict, what, scalars) for k, v in obj.items()}
    return obj


class _Flags:
    """CuPy's flags: contiguity and ownership only (no 'writeable')."""

    def __init__(self, a: np.ndarray) -> None:
        self.c_contiguous = bool(a.flags.c_contiguous)
        self.f_contiguous = bool(a.flags.f_contiguous)
        self.owndata = bool(a.flags.owndata)


class _Pointer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class FakeArray:
    """An array on the fake device (values in host memory, CuPy's manners)."""

    __slots__ = ("_a", "__weakref__")
    __array_priority__ = 1000
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, a: np.ndarray) -> None:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"FakeArray wraps a numpy array, got {type(a).__name__}")
        _check_dtype(a.dtype)
        self._a = a

    # -- numpy interop, refused like CuPy's -----------------------------------------------------
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed (fake device, as in CuPy). "
            "Please use `.get()` to construct a NumPy array explicitly."
        )

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _call_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        name = func.__name__
        if name not in cupy_names.TOP:
            return NotImplemented
        return getattr(FAKE_XP, name)(*args, **kwargs)

    # -- attributes ---------------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    T = property(lambda self: FakeArray(self._a.T))
    mT = property(lambda self: FakeArray(np.swapaxes(self._a, -1, -2)))
    real = property(lambda self: FakeArray(self._a.real))
    imag = property(lambda self: FakeArray(self._a.imag))
    flags = property(lambda self: _Flags(self._a))
    data = property(lambda self: _Pointer(int(self._a.__array_interface__["data"][0])))

    @property
    def base(self) -> Any:
        return None if self._a.base is None else _wrap(self._a.base) if isinstance(self._a.base, np.ndarray) else None

    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None, blocking: bool = True) -> Any:
        _device_op()
        _no_sync("ndarray.get()")
        if out is not None:
            np.copyto(out, self._a)
            return out
        return np.array(self._a, order=order, copy=True)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        _device_op()
        np.copyto(self._a, np.asarray(arr))

    def item(self) -> Any:
        _no_sync("ndarray.item()")
        return self._a.item()

    def tolist(self) -> Any:
        _no_sync("ndarray.tolist()")
        return self._a.tolist()

    def __getattr__(self, name: str) -> Any:
        if name not in cupy_names.NDARRAY or name.startswith("_"):
            raise AttributeError(f"'cupy.ndarray' object has no attribute '{name}' (fake device)")
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)

        def method(*args: Any, **kwargs: Any) -> Any:
            _device_op()
            out = kwargs.get("out")
            result = attr(*_unwrap(args, True, f" (ndarray.{name})"), **_unwrap(kwargs, True, f" (ndarray.{name})"))
            if out is not None and result is _unwrap(out, True):
                return out
            return _wrap(result)

        return method

    # -- indexing ------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        return _wrap(self._a[_unwrap(key, False)])

    def __setitem__(self, key: Any, value: Any) -> None:
        _device_op()
        self._a[_unwrap(key, False)] = _unwrap(value, False)

    # -- Python protocol ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Iterator[Any]:
        for row in self._a:
            yield _wrap(row)

    def __bool__(self) -> bool:
        _no_sync("bool(array)")
        return bool(self._a)

    def __int__(self) -> int:
        _no_sync("int(array)")
        return int(self._a)

    def __float__(self) -> float:
        _no_sync("float(array)")
        return float(self._a)

    def __complex__(self) -> complex:
        return complex(self._a)

    def __repr__(self) -> str:
        return f"FakeArray({self._a!r})"

    def __copy__(self) -> FakeArray:
        return FakeArray(self._a.copy())

    def __deepcopy__(self, memo: Any) -> FakeArray:
        return FakeArray(self._a.copy())


def _binop(name: str) -> Any:
    def op(self: FakeArray, other: Any) -> Any:
        _device_op()
        result = getattr(self._a, name)(_unwrap(other, True, f" ({name})"))
        return result if result is NotImplemented else _wrap(result)

    op.__name__ = name
    return op


def _inplace(name: str) -> Any:
    def op(self: FakeArray, other: Any) -> Any:
        _device_op()
        getattr(self._a, name)(_unwrap(other, True, f" ({name})"))
        return self

    op.__name__ = name
    return op


def _unary(name: str) -> Any:
    def op(self: FakeArray) -> Any:
        _device_op()
        return _wrap(getattr(self._a, name)())

    op.__name__ = name
    return op


for _n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift", "rshift"):
    setattr(FakeArray, f"__{_n}__", _binop(f"__{_n}__"))
    setattr(FakeArray, f"__r{_n}__", _binop(f"__r{_n}__"))
    setattr(FakeArray, f"__i{_n}__", _inplace(f"__i{_n}__"))
for _n in ("eq", "ne", "lt", "le", "gt", "ge", "divmod"):
    setattr(FakeArray, f"__{_n}__", _binop(f"__{_n}__"))
for _n in ("neg", "pos", "abs", "invert"):
    setattr(FakeArray, f"__{_n}__", _unary(f"__{_n}__"))


def _call_ufunc(ufunc: Any, method: str, inputs: Any, kwargs: dict[str, Any]) -> Any:
    if ufunc.__name__ not in cupy_names.TOP:
        raise AttributeError(f"CuPy has no ufunc '{ufunc.__name__}' (fake device)")
    _device_op()
    what = f" (ufunc {ufunc.__name__}.{method})" if method != "__call__" else f" (ufunc {ufunc.__name__})"
    out = kwargs.pop("out", None)
    args = _unwrap(tuple(inputs), True, what)
    kw = _unwrap(kwargs, True, what)
    if out is not None:
        outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            if o is not None and not isinstance(o, FakeArray):
                raise FakeDeviceError(f"out= must be a device array{what}, got {type(o).__name__}")
        kw["out"] = tuple(None if o is None else o._a for o in outs)
    result = getattr(ufunc, method)(*args, **kw)
    if out is not None:
        outs = out if isinstance(out, tuple) else (out,)
        return outs[0] if len(outs) == 1 else outs
    return _wrap(result)


# -- the namespace -----------------------------------------------------------------------------

_CONSTRUCTORS = frozenset({"array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray"})
# CuPy's copyto (and full / full_like through it) take a one-element numpy array as a scalar.
_SCALAR_ARRAYS_OK = frozenset({"copyto", "full", "full_like"})


class _Ufunc:
    def __init__(self, ufunc: Any) -> None:
        self._u = ufunc
        self.__name__ = ufunc.__name__
        self.nin = ufunc.nin
        self.nout = ufunc.nout

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call_ufunc(self._u, "__call__", args, kwargs)

    def __getattr__(self, method: str) -> Any:
        if method not in cupy_names.UFUNC_METHODS:
            raise AttributeError(f"CuPy ufuncs have no '{method}' (fake device)")
        return lambda *args, **kwargs: _call_ufunc(self._u, method, args, kwargs)


class _Function:
    def __init__(self, fn: Any, name: str) -> None:
        self._fn = fn
        self.__name__ = name
        self._constructor = name in _CONSTRUCTORS

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _device_op()
        if self._constructor:
            kwargs.pop("blocking", None)  # CuPy's asarray(..., blocking=True)
            args = _unwrap(args, False)
            kwargs = _unwrap(kwargs, False)
            result = self._fn(*args, **kwargs)
            if isinstance(result, np.ndarray) and args and isinstance(args[0], np.ndarray) and result is args[0]:
                result = result.copy()  # host -> device is always a copy
            return _wrap(result)
        out = kwargs.get("out")
        what = f" ({self.__name__})"
        ok = self.__name__ in _SCALAR_ARRAYS_OK
        result = self._fn(*_unwrap(args, True, what, ok), **_unwrap(kwargs, True, what, ok))
        if isinstance(out, FakeArray) and result is out._a:
            return out
        return _wrap(result)


class _Proxy:
    """Methods of an object (a random Generator) with device arrays in and out."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._obj, name)
        if not callable(attr):
            return _wrap(attr)
        return lambda *a, **k: _wrap(attr(*_unwrap(a, True), **_unwrap(k, True)))


class _Namespace:
    def __init__(self, module: Any, names: frozenset[str], label: str) -> None:
        self._module = module
        self._names = names
        self._label = label
        self._cache: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        hit = self._cache.get(name)
        if hit is not None:
            return hit
        value = self._resolve(name)
        self._cache[name] = value
        return value

    def _resolve(self, name: str) -> Any:
        if name not in self._names:
            raise AttributeError(f"module '{self._label}' has no attribute '{name}' (numpy has it, CuPy does not)")
        obj = getattr(self._module, name, None)
        if obj is None:
            raise AttributeError(f"the fake device does not imitate {self._label}.{name}")
        if isinstance(obj, np.ufunc):
            return _Ufunc(obj)
        if isinstance(obj, type) or not callable(obj):
            return obj
        if name == "default_rng":
            return lambda *a, **k: _Proxy(obj(*_unwrap(a, True), **_unwrap(k, True)))
        return _Function(obj, name)


class _FakeXP(_Namespace):
    """``xp`` of the fake device: numpy restricted to CuPy's names, with CuPy's manners."""

    __name__ = "fakecupy"
    ndarray = FakeArray

    def __init__(self) -> None:
        super().__init__(np, cupy_names.TOP, "cupy")
        self.linalg = _Namespace(np.linalg, cupy_names.LINALG, "cupy.linalg")
        self.fft = _Namespace(np.fft, cupy_names.FFT, "cupy.fft")
        self.random = _Namespace(np.random, cupy_names.RANDOM, "cupy.random")
        self.lib = _Lib()

    def asnumpy(self, a: Any, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True) -> Any:
        if isinstance(a, FakeArray):
            return a.get(order=order, out=out)
        return np.asarray(a)

    def get_array_module(self, *args: Any) -> Any:
        return self if any(isinstance(a, FakeArray) for a in args) else np


class _StrideTricks:
    def as_strided(self, x: Any, shape: Any = None, strides: Any = None) -> Any:
        # CuPy's signature: no 'writeable' or 'subok'
        return FakeArray(np.lib.stride_tricks.as_strided(_unwrap(x, True), shape=shape, strides=strides))

    def sliding_window_view(self, x: Any, window_shape: Any, axis: Any = None, **kwargs: Any) -> Any:
        return FakeArray(np.lib.stride_tricks.sliding_window_view(_unwrap(x, True), window_shape, axis, **kwargs))


class _Lib:
    stride_tricks = _StrideTricks()


FAKE_XP = _FakeXP()


# -- the provider ------------------------------------------------------------------------------


class FakeGPUProvider(Provider):
    """A device provider over :class:`FakeArray`; supports the same ops and dtypes as CUDA."""

    name = NAME
    device_type = DEVICE
    xp = FAKE_XP
    #: device work seen outside any activate() scope (class-wide: stray work has no provider)
    outside_scope = 0
    _ids = itertools.count()

    def __init__(self, device_id: int = 0) -> None:
        self.device_id = device_id
        self.uid = next(self._ids)
        self.activations = 0
        self.device_syncs = 0
        self.stream_syncs = 0
        self.uploads = 0
        self.downloads = 0
        self.captures = 0
        self.replays = 0

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        stack = getattr(_state, "stack", None)
        if stack is None:
            stack = _state.stack = []
        stack.append(self)
        self.activations += 1
        try:
            yield
        finally:
            stack.pop()

    def synchronize(self) -> None:
        self.device_syncs += 1

    def synchronize_stream(self) -> None:
        self.stream_syncs += 1

    def from_host(self, array: np.ndarray) -> FakeArray:
        if isinstance(array, FakeArray):
            raise FakeDeviceError("from_host was given a device array")
        arr = np.asarray(array)
        if not device_supports_dtype(arr.dtype):
            return arr  # like CUDAProvider: types the device cannot hold stay on the host
        self.uploads += 1
        with self.activate():
            return FakeArray(np.array(arr, copy=True))

    def to_host(self, array: Any) -> np.ndarray:
        if isinstance(array, np.ndarray) and not device_supports_dtype(array.dtype):
            return array  # a host-only type, never on the device
        if not isinstance(array, FakeArray):
            raise FakeDeviceError(f"to_host expected a device array, got {type(array).__name__}")
        self.downloads += 1
        with self.activate():
            return array.get()

    def copy_to_host(self, dst: np.ndarray, src: Any) -> None:
        if not isinstance(src, FakeArray):
            raise FakeDeviceError(f"copy_to_host expected a device array, got {type(src).__name__}")
        self.downloads += 1
        with self.activate():
            np.copyto(dst, src._a)

    def wrap_pointer(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, owner: Any = None) -> FakeArray:
        _check_dtype(np.dtype(dtype))
        return FakeArray(CPU.wrap_pointer(ptr, shape, dtype, owner))

    def from_dlpack(self, obj: Any) -> Any:
        raise TypeError("the fake device has no DLPack device type")

    def is_device_array(self, obj: Any) -> bool:
        return isinstance(obj, FakeArray)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> FakeArray:
        with self.activate():
            return FakeArray(np.empty(shape, dtype=dtype))

    def copy_into(self, dst: Any, src: Any) -> None:
        """Like CUDAProvider.copy_into: into a device array, from a device or a host array."""
        if not isinstance(dst, FakeArray):
            raise FakeDeviceError(f"copy_into needs a device destination, got {type(dst).__name__}")
        if isinstance(src, np.ndarray):
            self.uploads += 1
        elif not isinstance(src, FakeArray):
            raise FakeDeviceError(f"copy_into got a {type(src).__name__} source")
        with self.activate():
            np.copyto(dst._a, src._a if isinstance(src, FakeArray) else src)

    def data_ptr(self, array: Any) -> int:
        return int(array._a.__array_interface__["data"][0]) if array.size else 0

    def may_share_memory(self, a: Any, b: Any) -> bool:
        if not (isinstance(a, FakeArray) and isinstance(b, FakeArray)):
            return False
        return bool(np.may_share_memory(a._a, b._a))

    def supports(self, op_type: str, domain: str) -> bool:
        return device_supports(op_type, domain)

    def supports_dtype(self, dtype: Any) -> bool:
        return device_supports_dtype(dtype)

    def capture(self, fn: Any) -> _FakeGraph:
        """Like CUDAProvider.capture, as far as a CPU can: ``fn`` runs now (the fake cannot defer
        work) with synchronizing calls refused, and replays run it again, writing the new
        results into the captured arrays (a replayed CUDA graph reuses its addresses)."""
        self.captures += 1
        _state.capturing = True
        try:
            result = fn()
        finally:
            _state.capturing = False
        return _FakeGraph(self, fn, result)


class _FakeGraph:
    def __init__(self, provider: FakeGPUProvider, fn: Any, result: Any) -> None:
        self.provider = provider
        self.fn = fn
        self.result = result

    def replay(self) -> Any:
        self.provider.replays += 1
        fresh = self.fn()
        for old, new in zip(self.result, fresh):
            a, b = getattr(old, "_value", old), getattr(new, "_value", new)
            if isinstance(a, FakeArray) and isinstance(b, FakeArray) and a is not b:
                np.copyto(a._a, b._a)
        return self.result


def install() -> None:
    register_provider(NAME, DEVICE, FakeGPUProvider)


def uninstall() -> None:
    unregister_provider(NAME)


def host(a: Any) -> np.ndarray:
    """The values of a device array, for assertions."""
    return a.get() if isinstance(a, FakeArray) else np.asarray(a)
