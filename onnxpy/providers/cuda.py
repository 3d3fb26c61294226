"""The CUDA provider: CuPy arrays in device memory. CuPy is imported only when CUDA is asked for.

Streams. Each provider owns one CUDA stream and queues all of its work there: kernels of a run,
host <-> device copies, ``update_inplace``. The stream is created *blocking* (it synchronizes
with the legacy default stream), so work that CuPy or torch queued on their default stream
before a run is finished before the run reads it, and work they queue after it waits for the
run. A session given ``user_compute_stream`` runs on that stream instead (a provider object of
its own). Copies to the host are synchronous; ``synchronize()`` waits for the whole device and
``synchronize_stream()`` for this provider's stream only.

CUDA graphs. ``capture(fn)`` records what ``fn`` queues into a CUDA graph, on a private stream
and with a private memory pool that lives as long as the graph, so that memory the graph uses
as scratch is never handed to anyone else; ``CapturedGraph.replay()`` launches it on the
provider's stream.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .base import Provider

# Ops left to the CPU on a device provider (they fall back with copies around them): kernels
# over host-side Python objects (text, encoded images, n-gram tables) or sequential host loops
# (NonMaxSuppression), and data-dependent outputs where CuPy's routine differs (Unique's order).
# Values of element types CuPy cannot hold (strings, bfloat16, float8, int4...) are kept on the
# host by their type, whatever the op (see runtime/placement.py).
HOST_ONLY_OPS: frozenset[tuple[str, str]] = frozenset(
    {
        ("", "StringNormalizer"),
        ("", "StringConcat"),
        ("", "StringSplit"),
        ("", "RegexFullMatch"),
        ("", "TfIdfVectorizer"),
        ("", "ImageDecoder"),
        ("", "NonMaxSuppression"),
        ("", "Unique"),
        ("com.microsoft", "Tokenizer"),
    }
)
# Classical ML (ai.onnx.ml): small models over dicts, strings and label tables; no GPU gain.
HOST_ONLY_DOMAINS: frozenset[str] = frozenset({"ai.onnx.ml"})


def device_supports(op_type: str, domain: str) -> bool:
    """Whether a device provider (CUDA, or a test double standing for it) runs this op."""
    return domain not in HOST_ONLY_DOMAINS and (domain, op_type) not in HOST_ONLY_OPS


def device_supports_dtype(dtype: Any) -> bool:
    """CuPy holds bool, integers, IEEE floats (float16 included) and complex; not strings,
    objects or the ml_dtypes types (bfloat16, float8, int4...)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return False
    return dt.kind in "biufc" and dt.type.__module__ == "numpy"


@functools.cache
def _probe() -> tuple[Any, str]:
    try:
        import cupy  # noqa: PLC0415 - optional dependency
    except Exception as e:  # noqa: BLE001 - any import failure means no CUDA
        return None, f"CuPy is not installed ({type(e).__name__}: {e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        return None, f"no CUDA device is visible ({type(e).__name__}: {e})"
    if count < 1:
        return None, "no CUDA device is visible"
    return cupy, ""


def is_available() -> bool:
    return _probe()[0] is not None


def unavailable_reason() -> str:
    return _probe()[1]


class _StreamHandle:
    """A raw cudaStream_t presented through the CUDA stream protocol (``__cuda_stream__``)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


@dataclass
class CapturedGraph:
    """A CUDA graph with everything its replays touch: the private memory pool holding its
    scratch memory and the values ``fn`` returned while it was captured."""

    provider: CUDAProvider
    graph: Any
    pool: Any
    result: Any
    keep: list[Any] = field(default_factory=list)

    def replay(self) -> Any:
        with self.provider.activate():
            self.graph.launch(stream=self.provider.current_stream())
        return self.result


class CUDAProvider(Provider):
    name = "CUDAExecutionProvider"
    device_type = "cuda"

    def __init__(self, device_id: int = 0, user_stream: int | None = None) -> None:
        cupy, why = _probe()
        if cupy is None:
            raise RuntimeError(f"CUDAExecutionProvider is not available: {why}")
        count = cupy.cuda.runtime.getDeviceCount()
        if not 0 <= device_id < count:
            raise RuntimeError(f"CUDA device {device_id} does not exist ({count} visible)")
        self.device_id = device_id
        self.xp = cupy
        self._cupy = cupy
        self._user_stream = user_stream
        self._stream: Any = None
        self._lock = threading.Lock()
        self._local = threading.local()  # per-thread stream override (graph capture)

    # -- streams -----------------------------------------------------------------------------
    def device(self) -> Any:
        return self._cupy.cuda.Device(self.device_id)

    @property
    def stream(self) -> Any:
        """The stream this provider queues its work on (created on first use)."""
        if self._stream is None:
            with self._lock:
                if self._stream is None:
                    self._stream = self._make_stream()
        return self._stream

    def _make_stream(self) -> Any:
        cuda = self._cupy.cuda
        with self.device():
            if self._user_stream is None:
                return cuda.Stream(non_blocking=False)
            if self._user_stream == 0:
                return cuda.Stream.null
            from_external = getattr(cuda.Stream, "from_external", None)
            if from_external is not None:  # CuPy >= 14
                return from_external(_StreamHandle(self._user_stream))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return cuda.ExternalStream(self._user_stream, self.device_id)

    def current_stream(self) -> Any:
        override = getattr(self._local, "stream", None)
        return override if override is not None else self.stream

    @contextlib.contextmanager
    def use_stream(self, stream: Any) -> Iterator[None]:
        """Queue this thread's work for this provider on ``stream`` inside the block."""
        previous = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = previous

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """Make this provider's device and stream CuPy's current ones (for a run, a copy...)."""
        with self.device(), self.current_stream():
            yield

    def synchronize(self) -> None:
        """Wait for all work queued on the device, by anyone (inputs written by other libraries)."""
        self.device().synchronize()

    def synchronize_stream(self) -> None:
        """Wait for the work this provider queued (a run's results)."""
        self.current_stream().synchronize()

    # -- moving data -------------------------------------------------------------------------
    def from_host(self, array: np.ndarray) -> Any:
        """A device copy of ``array``; arrays of element types CuPy cannot hold (strings,
        bfloat16, float8...) stay on the host, where the nodes reading them run."""
        if not isinstance(array, np.ndarray):
            array = np.asarray(array)
        if not device_supports_dtype(array.dtype):
            return array
        with self.activate():
            try:
                # Synchronous: the caller may change or free the host array right after.
                return self._cupy.asarray(array, blocking=True)
            except TypeError:  # CuPy without the blocking keyword
                out = self._cupy.asarray(array)
                self.current_stream().synchronize()
                return out

    def to_host(self, array: Any) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array
        if not isinstance(array, self._cupy.ndarray):
            return np.asarray(array)
        with self.activate():
            return array.get(stream=self.current_stream())

    def copy_to_host(self, dst: np.ndarray, src: Any) -> None:
        """Write a device array into a preallocated host array (no temporary when contiguous)."""
        with self.activate():
            if dst.flags.c_contiguous and src.flags.c_contiguous and dst.shape == src.shape:
                src.get(stream=self.current_stream(), out=dst)
            else:
                np.copyto(dst, src.get(stream=self.current_stream()))

    def wrap_pointer(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, owner: Any = None) -> Any:
        cupy = self._cupy
        dtype = np.dtype(dtype)
        if not device_supports_dtype(dtype):
            raise TypeError(f"{dtype} tensors cannot live on CUDA with CuPy; bind them on 'cpu'")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        nbytes = count * dtype.itemsize
        if nbytes == 0:
            with self.activate():
                return cupy.empty(shape, dtype=dtype)
        if not ptr:
            raise ValueError(f"buffer_ptr is 0 (null) but shape {list(shape)} needs {nbytes} bytes")
        self._check_device_pointer(int(ptr))
        mem = cupy.cuda.UnownedMemory(int(ptr), nbytes, owner, self.device_id)
        return cupy.ndarray(tuple(shape), dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))

    def _check_device_pointer(self, ptr: int) -> None:
        """Refuse host memory or another GPU's memory: a kernel reading it would fault and
        leave the CUDA context unusable."""
        rt = self._cupy.cuda.runtime
        try:
            attrs = rt.pointerGetAttributes(ptr)
        except Exception as e:  # noqa: BLE001 - CUDARuntimeError: an address CUDA does not know
            raise ValueError(
                f"address {ptr:#x} is not CUDA memory ({e}); bind host memory with device_type 'cpu'"
            ) from None
        kind = int(attrs.type)
        if kind == rt.memoryTypeManaged:
            return
        if kind != rt.memoryTypeDevice:
            raise ValueError(
                f"address {ptr:#x} is host memory (CUDA memory type {kind}), not memory of cuda:{self.device_id}; "
                "bind it with device_type 'cpu'"
            )
        if int(attrs.device) != self.device_id:
            raise ValueError(f"address {ptr:#x} is memory of cuda:{int(attrs.device)}, not of cuda:{self.device_id}")

    def from_dlpack(self, obj: Any) -> Any:
        # The producer is asked to make this provider's stream wait for its pending work.
        with self.activate():
            return self._cupy.from_dlpack(obj)

    def is_device_array(self, obj: Any) -> bool:
        return isinstance(obj, self._cupy.ndarray)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        if not device_supports_dtype(dtype):
            raise TypeError(f"{np.dtype(dtype)} tensors cannot live on CUDA with CuPy; allocate them on 'cpu'")
        with self.activate():
            return self._cupy.empty(shape, dtype=dtype)

    def copy_into(self, dst: Any, src: Any) -> None:
        with self.activate():
            if isinstance(src, np.ndarray):
                src = self._cupy.asarray(np.ascontiguousarray(src), blocking=True)
            self._cupy.copyto(dst, src)

    def data_ptr(self, array: Any) -> int:
        return int(array.data.ptr) if array.size else 0

    def may_share_memory(self, a: Any, b: Any) -> bool:
        if not (isinstance(a, self._cupy.ndarray) and isinstance(b, self._cupy.ndarray)):
            return False
        return bool(self._cupy.may_share_memory(a, b))

    def supports(self, op_type: str, domain: str) -> bool:
        return device_supports(op_type, domain)

    def supports_dtype(self, dtype: Any) -> bool:
        return device_supports_dtype(dtype)

    # -- CUDA graphs -------------------------------------------------------------------------
    def capture(self, fn: Callable[[], Any]) -> CapturedGraph:
        """Record the device work ``fn`` queues into a CUDA graph (nothing runs now).

        ``fn`` must not read device data on the host (a shape computed from values, a CPU node):
        CUDA refuses synchronizing calls during capture and this raises.
        """
        cupy = self._cupy
        pool = cupy.cuda.MemoryPool()
        with self.device():
            capture_stream = cupy.cuda.Stream(non_blocking=True)
        self.synchronize_stream()  # what the graph reads must be ready before it is recorded
        with self.device(), cupy.cuda.using_allocator(pool.malloc), self.use_stream(capture_stream), capture_stream:
            capture_stream.begin_capture()
            try:
                result = fn()
            except BaseException:
                with contextlib.suppress(Exception):
                    capture_stream.end_capture()
                raise
            graph = capture_stream.end_capture()
        return CapturedGraph(self, graph, pool, result, keep=[capture_stream])
