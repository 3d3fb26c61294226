"""IOBinding: inputs and outputs bound to the caller's memory, reused across runs.

An IOBinding is per-caller state (one per thread); the session it belongs to holds none.
Inputs bound from host arrays or pointers are read in place at every run (a change to the
array between runs is seen by the next run). Outputs bound to a buffer (``buffer_ptr`` or an
OrtValue) are written in place: every bound output's shape and dtype are checked before the
first byte is written, so a failed run leaves all of them untouched. Outputs bound to a device
only get fresh memory at every run, so OrtValues from an earlier ``get_outputs()`` stay valid
and the shape may change between runs (data-dependent outputs).

On a device (CUDA) the same holds with device memory: inputs bound by pointer or OrtValue are
read in place, outputs bound to "cuda" stay on the device, buffers (torch, CuPy, OrtValue) are
written in place. A run is queued on the session's stream and waited for before
``run_with_iobinding`` returns, unless the run option
``disable_synchronize_execution_providers`` is "1" (then ``synchronize_outputs()`` waits).
``synchronize_inputs()`` waits for work other libraries queued on the inputs' devices. With the
provider option ``enable_cuda_graph`` the first run is also captured into a CUDA graph, which
later runs replay as long as the bound addresses and shapes stay the same (docs/cuda.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..model import dtypes
from ..providers import Provider, cuda_graph_option, provider_for_device
from .errors import InvalidArgument
from .ortvalue import OrtValue, _check_shape, _element_dtype, as_host_array

if TYPE_CHECKING:
    from .options import RunOptions
    from .session import InferenceSession


@dataclass
class _BoundOutput:
    provider: Provider
    # Preallocated destination (an OrtValue viewing the caller's buffer), or None to allocate.
    target: OrtValue | None


@dataclass
class _GraphState:
    """A CUDA graph captured for one binding layout (addresses, shapes, dtypes)."""

    key: tuple[Any, ...]
    captured: Any  # CapturedGraph, or None when capture failed for this layout


class IOBinding:
    """Inputs and outputs of one session bound to memory; see the module docstring."""

    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self._inputs: dict[str, OrtValue] = {}
        # Insertion order is the order of get_outputs(); rebinding a name keeps its position.
        self._outputs: dict[str, _BoundOutput] = {}
        self._results: list[OrtValue] = []
        self._graph: _GraphState | None = None

    # -- inputs ---------------------------------------------------------------------------------
    def _check_input_name(self, name: str) -> None:
        sess = self._session
        if isinstance(name, str) and name in sess._input_specs:
            return
        overridable = [a.name for a in sess.get_overridable_initializers()]
        raise InvalidArgument(
            f"cannot bind input {name!r}: the model has no such input. Valid inputs: "
            f"{[a.name for a in sess.get_inputs()]}"
            + (f"; overridable initializers: {overridable}" if overridable else "")
        )

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        """Bind a host array: read in place at each run when it is C-contiguous, converted once otherwise."""
        self._check_input_name(name)
        value = OrtValue.ortvalue_from_numpy(as_host_array(arr_on_cpu, f"bind_cpu_input('{name}')"))
        value._owner = arr_on_cpu  # the caller's object stays alive while bound, not only its memory
        self._inputs[name] = value

    def bind_input(
        self,
        name: str,
        device_type: str,
        device_id: int,
        element_type: Any,
        shape: Sequence[int],
        buffer_ptr: int,
    ) -> None:
        """Bind ``shape`` elements of ``element_type`` at ``buffer_ptr`` on a device, read in place.

        The caller keeps that memory alive and unchanged in size while it is bound (a raw
        pointer carries no owner). ``buffer_ptr`` may be 0 for a tensor with no elements.
        """
        self._check_input_name(name)
        dt = _element_dtype(element_type)
        dims = _check_shape(shape, f"bind_input('{name}')")
        provider = provider_for_device(device_type, device_id)
        try:
            arr = provider.wrap_pointer(_pointer(buffer_ptr, f"bind_input('{name}')"), dims, dt)
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"bind_input('{name}'): {e}") from None
        self._inputs[name] = OrtValue(arr, provider)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an OrtValue; it (and whatever owns its memory) stays alive while bound."""
        self._check_input_name(name)
        if not isinstance(ortvalue, OrtValue):
            raise InvalidArgument(f"bind_ortvalue_input('{name}') needs an OrtValue, got {type(ortvalue).__name__}")
        self._inputs[name] = ortvalue

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def synchronize_inputs(self) -> None:
        """Wait until work pending on the devices of the bound inputs (and the session's device)
        is done, so the next run reads finished values whatever stream produced them (no-op on
        the CPU)."""
        seen: set[tuple[str, int]] = set()
        for p in [self._session._provider, *(v._provider for v in self._inputs.values())]:
            key = (p.device_type, p.device_id)
            if key not in seen:
                seen.add(key)
                p.synchronize()

    # -- outputs --------------------------------------------------------------------------------
    def _check_output_name(self, name: str) -> None:
        sess = self._session
        if isinstance(name, str) and (name in sess._output_names or name in sess._value_names):
            return  # a graph output, or an intermediate value fetched by name
        raise InvalidArgument(
            f"cannot bind output {name!r}: the model has no such output. Valid outputs: {sess._output_names} "
            "(an intermediate value of the graph may also be bound by name)"
        )

    def bind_output(
        self,
        name: str,
        device_type: str = "cpu",
        device_id: int = 0,
        element_type: Any = None,
        shape: Sequence[int] | None = None,
        buffer_ptr: int | None = None,
    ) -> None:
        """Bind an output to a device; with ``buffer_ptr`` the result is written into that memory.

        Without ``buffer_ptr`` the runtime allocates the output at each run (``element_type``
        and ``shape`` are then not needed and are ignored, as in onnxruntime).
        """
        self._check_output_name(name)
        provider = provider_for_device(device_type, device_id)
        if buffer_ptr is None:
            self._outputs[name] = _BoundOutput(provider, None)
            return
        if element_type is None or shape is None:
            raise InvalidArgument(
                f"bind_output('{name}'): element_type and shape are required when buffer_ptr is given"
            )
        dt = _element_dtype(element_type)
        dims = _check_shape(shape, f"bind_output('{name}')")
        self._check_declared(name, dt, dims)
        try:
            arr = provider.wrap_pointer(_pointer(buffer_ptr, f"bind_output('{name}')"), dims, dt)
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"bind_output('{name}'): {e}") from None
        self._outputs[name] = _BoundOutput(provider, OrtValue(arr, provider))

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an output to an OrtValue; the result is written into its memory at each run."""
        self._check_output_name(name)
        if not isinstance(ortvalue, OrtValue) or not ortvalue.is_tensor():
            raise InvalidArgument(f"bind_ortvalue_output('{name}') needs a tensor OrtValue, got {ortvalue!r}")
        arr = ortvalue._value
        if not ortvalue._provider.writeable(arr):
            raise InvalidArgument(f"bind_ortvalue_output('{name}'): the OrtValue's memory is read-only")
        if arr.dtype.hasobject:
            raise InvalidArgument(
                f"bind_ortvalue_output('{name}'): string tensors cannot be written in place; bind_output('{name}') instead"
            )
        self._check_declared(name, arr.dtype, tuple(int(d) for d in arr.shape))
        self._outputs[name] = _BoundOutput(ortvalue._provider, ortvalue)

    def _check_declared(self, name: str, dt: np.dtype, dims: tuple[int, ...]) -> None:
        """Reject a buffer that can never fit what the model declares for this output."""
        for arg in self._session.get_outputs():
            if arg.name != name:
                continue
            want = arg.type
            got = dtypes.dtype_string(dt)
            if want.startswith("tensor(") and got != want:
                raise InvalidArgument(f"bind_output('{name}'): buffer is {got}, the model's output is {want}")
            if not want.startswith("tensor("):
                raise InvalidArgument(f"bind_output('{name}'): the output is {want}, not a tensor; it needs no buffer")
            if arg.shape and len(arg.shape) != len(dims):
                raise InvalidArgument(
                    f"bind_output('{name}'): buffer shape {list(dims)} has rank {len(dims)}, "
                    f"the model's output has shape {arg.shape}"
                )
            for i, (d, w) in enumerate(zip(dims, arg.shape)):
                if isinstance(w, int) and d != w:
                    raise InvalidArgument(
                        f"bind_output('{name}'): buffer shape {list(dims)} differs at index {i} "
                        f"from the model's output shape {arg.shape}"
                    )

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results = []

    def synchronize_outputs(self) -> None:
        """Wait until the last run's results are complete on their devices (the work queued on
        the session's stream and the output devices' streams)."""
        for p in [self._session._provider, *(b.provider for b in self._outputs.values())]:
            _sync_stream(p)

    # -- results --------------------------------------------------------------------------------
    def get_outputs(self) -> list[OrtValue]:
        """The last run's outputs in binding order; buffer-bound ones view the bound memory."""
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> list[OrtValue]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[Any]:
        """Host copies of the last run's outputs (the caller owns them)."""
        out: list[Any] = []
        for v in self._results:
            host = v.numpy()
            if isinstance(host, list):
                out.append([np.array(x, copy=True) for x in host])
            elif host is None:
                out.append(None)
            else:
                out.append(np.array(host, copy=True))
        return out

    # -- running --------------------------------------------------------------------------------
    def _run(self, run_options: RunOptions | None) -> None:
        sess = self._session
        if not self._outputs:
            raise InvalidArgument(
                "run_with_iobinding: at least one output should be requested; call bind_output for each output you need"
            )
        src = sess._provider
        feeds = {name: sess._prepare_feed(name, self._feed_value(v, src)) for name, v in self._inputs.items()}
        key = self._graph_key(feeds) if _cuda_graph_enabled(sess) else None
        state = self._graph
        if key is not None and state is not None and state.key == key and state.captured is not None:
            self._results = state.captured.replay()
        else:
            self._results = self._run_once(feeds, run_options)
            if key is not None and (state is None or state.key != key):
                self._graph = _GraphState(key, self._capture(feeds, run_options))
        if run_options is None or run_options._config.get("disable_synchronize_execution_providers") != "1":
            _sync_stream(src)

    def _feed_value(self, v: OrtValue, src: Provider) -> Any:
        """A bound input as the session takes it: the raw device array when it lives on the
        session's device (even through another provider object, e.g. a session stream)."""
        p = v._provider
        if p is not src and v.is_tensor() and (p.device_type, p.device_id) == (src.device_type, src.device_id):
            return v._value
        return v

    def _run_once(self, feeds: dict[str, Any], run_options: RunOptions | None) -> list[OrtValue]:
        sess = self._session
        names = list(self._outputs)
        bound = list(self._outputs.values())
        values = sess._run_device(names, feeds, run_options)
        src = sess._provider

        # 1. Check every preallocated destination before writing any of them.
        n_targets = 0
        for name, b, value in zip(names, bound, values):
            if b.target is None:
                continue
            n_targets += 1
            if value is None or isinstance(value, list):
                raise InvalidArgument(f"output '{name}' is not a tensor; it cannot be written into a bound buffer")
            t = b.target._value
            if tuple(value.shape) != tuple(t.shape) or value.dtype != t.dtype:
                raise InvalidArgument(
                    f"output '{name}' is {_describe(value)}, but the bound buffer is {_describe(t)}; "
                    "nothing was written"
                )
            if not b.target._provider.writeable(t):  # made read-only since it was bound
                raise InvalidArgument(f"output '{name}': the bound buffer is read-only now; nothing was written")

        with _scope(src):  # copies below are queued on the session's stream
            # 2. Settle aliasing before any write (not needed for a single buffer-bound output).
            if n_targets != 1 or len(bound) != 1:
                values = _settle(bound, values, feeds, src)

            # 3. Write the bound buffers and wrap the rest.
            results: list[OrtValue] = []
            for b, value in zip(bound, values):
                if b.target is not None:
                    _copy_into(b.target, value, src)
                    results.append(b.target)
                else:
                    results.append(_wrap_result(value, src, b.provider))
        return results

    # -- CUDA graphs ---------------------------------------------------------------------------
    def _graph_key(self, feeds: dict[str, Any]) -> tuple[Any, ...] | None:
        """What a captured graph depends on: the compiled plan and every bound address, shape
        and dtype. None (with a warning) when this binding cannot be captured at all."""
        sess = self._session
        src = sess._provider
        _, compiled, plan = sess._resolve_outputs(list(self._outputs))
        if compiled.placement.mixed:
            self._graph_refused(
                "some nodes run on the CPU (" + "; ".join(compiled.placement.fallback[:3]) + "), "
                "and host work cannot be replayed by a CUDA graph"
            )
            return None
        parts: list[Any] = [id(compiled), id(plan)]
        for name in sorted(feeds):
            a = feeds[name]
            bound = self._inputs[name]
            if not _same_device(bound._provider, src) or not src.is_device_array(a):
                # A host input is copied to fresh device memory at every run: nothing to replay.
                self._graph_refused(f"input '{name}' is not in {src.device_type} memory; bind device memory")
                return None
            parts.append((name, src.data_ptr(a), tuple(a.shape), str(a.dtype), tuple(a.strides)))
        for name, b in self._outputs.items():
            if b.target is None:
                parts.append((name, b.provider.device_type, b.provider.device_id))
            else:
                t = b.target
                parts.append((name, t.device_name(), t.data_ptr(), tuple(t.shape()), t.data_type()))
        return tuple(parts)

    def _graph_refused(self, why: str) -> None:
        if self._graph is None or self._graph.key != ("refused", why):
            warnings.warn(
                f"enable_cuda_graph: this IOBinding runs without a CUDA graph: {why}", RuntimeWarning, stacklevel=4
            )
            self._graph = _GraphState(("refused", why), None)

    def _capture(self, feeds: dict[str, Any], run_options: RunOptions | None) -> Any:
        """Record the run into a CUDA graph (the results of this call already came from a
        regular run, which also compiled every kernel); None if the run cannot be captured."""
        provider = self._session._provider
        try:
            return provider.capture(lambda: self._run_once(feeds, run_options))
        except Exception as e:  # noqa: BLE001 - a sync during capture, an unsupported call...
            warnings.warn(
                f"enable_cuda_graph: the run could not be captured into a CUDA graph ({type(e).__name__}: {e}); "
                "this binding layout runs without one",
                RuntimeWarning,
                stacklevel=4,
            )
            return None


def _cuda_graph_enabled(sess: InferenceSession) -> bool:
    if not sess._provider_options or not hasattr(sess._provider, "capture"):
        return False
    return cuda_graph_option(sess._provider_options[0])


def _scope(provider: Provider) -> AbstractContextManager[Any]:
    activate = getattr(provider, "activate", None)
    return activate() if activate is not None else nullcontext()


def _sync_stream(provider: Provider) -> None:
    sync = getattr(provider, "synchronize_stream", None)
    if sync is not None:
        sync()


def _settle(bound: list[_BoundOutput], values: list[Any], feeds: dict[str, Any], src: Provider) -> list[Any]:
    """Copy the results that writing the bound buffers would corrupt or that the caller must own.

    A result overlapping a bound buffer other than its own would change when that buffer is
    written, so it is copied first. A runtime-allocated result never views a caller's input, a
    read-only constant or another result.
    """
    targets = [b.target._value for b in bound if b.target is not None and b.target._value.size]
    shared = [a for f in feeds.values() for a in (f if isinstance(f, list) else [f]) if _is_array(a)]
    handed_out: list[Any] = []

    def settle(value: Any, own: Any) -> Any:
        if not _is_array(value):
            return value
        if not src.is_device_array(value):
            value = src.xp.asarray(value)  # e.g. a scalar some kernel returned
        if not value.size:
            return value
        overlaps = [t for t in targets if t is not own]
        if own is None:
            overlaps += shared + handed_out
        if (own is None and not src.writeable(value)) or any(src.may_share_memory(value, o) for o in overlaps):
            value = value.copy()
        if own is None:
            handed_out.append(value)
        return value

    staged: list[Any] = []
    for b, value in zip(bound, values):
        if isinstance(value, list):
            staged.append([settle(v, None) for v in value])
        else:
            staged.append(settle(value, b.target._value if b.target is not None else None))
    return staged


def _pointer(buffer_ptr: Any, what: str) -> int:
    try:
        ptr = int(buffer_ptr or 0)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{what}: buffer_ptr must be an integer address, got {buffer_ptr!r}") from None
    if ptr < 0:
        raise InvalidArgument(f"{what}: buffer_ptr {ptr} is negative")
    return ptr


def _is_array(value: Any) -> bool:
    return value is not None and not isinstance(value, list) and hasattr(value, "shape")


def _describe(arr: Any) -> str:
    try:
        kind = dtypes.dtype_string(arr.dtype)
    except ValueError:
        kind = str(arr.dtype)
    return f"{kind} {list(arr.shape)}"


def _same_device(a: Provider, b: Provider) -> bool:
    return a is b or (a.device_type, a.device_id) == (b.device_type, b.device_id)


def _copy_into(target: OrtValue, value: Any, src: Provider) -> None:
    """Write ``value`` into the bound buffer once (nothing to do if it already is that buffer)."""
    t = target._value
    dst = target._provider
    if value is t or not t.size:
        return
    if _same_device(dst, src):
        if src.may_share_memory(t, value) and _same_memory(src, t, value):
            return  # the kernel already wrote there (or the bound input is the bound output)
        src.copy_into(t, value)  # on the session's stream; a partial overlap is handled by the copy
    elif dst.device_type == "cpu":
        to_host_into = getattr(src, "copy_to_host", None)
        if to_host_into is not None:
            to_host_into(t, value)  # device -> the bound host buffer, no temporary
        else:
            np.copyto(t, src.to_host(value))
    else:
        dst.copy_into(t, src.to_host(value))  # host (or another device) -> the bound device buffer


def _same_memory(p: Provider, a: Any, b: Any) -> bool:
    """Same address, shape, dtype and strides: the two arrays are the same bytes."""
    return (
        p.data_ptr(a) == p.data_ptr(b)
        and a.shape == b.shape
        and a.dtype == b.dtype
        and tuple(a.strides) == tuple(b.strides)
    )


def _wrap_result(value: Any, src: Provider, dst: Provider) -> OrtValue:
    if _same_device(src, dst):
        dst = src  # the session's provider: its stream is the one that produced the value
    if value is None:
        return OrtValue(None, dst)
    if isinstance(value, list):
        return OrtValue([dst.contiguous(_move(v, src, dst)) for v in value], dst)
    return OrtValue(dst.contiguous(_move(value, src, dst)), dst)


def _move(value: Any, src: Provider, dst: Provider) -> Any:
    if _same_device(src, dst):
        return value
    if dst.device_type == "cpu":
        return src.to_host(value)
    return dst.from_host(src.to_host(value))
