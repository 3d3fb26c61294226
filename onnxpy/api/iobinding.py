"""IOBinding: inputs and outputs bound to the caller's memory, reused across runs.

An IOBinding is per-caller state (one per thread); the session it belongs to holds none.
Inputs bound from host arrays or pointers are read in place at every run (a change to the
array between runs is seen by the next run). Outputs bound to a buffer (``buffer_ptr`` or an
OrtValue) are written in place: every bound output's shape and dtype are checked before the
first byte is written, so a failed run leaves all of them untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..model import dtypes
from ..providers import CPU, Provider, provider_for_device
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


class IOBinding:
    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self._inputs: dict[str, OrtValue] = {}
        self._outputs: dict[str, _BoundOutput] = {}
        self._results: list[OrtValue] = []

    # -- inputs ---------------------------------------------------------------------------------
    def _check_input_name(self, name: str) -> None:
        if name not in self._session._input_specs:
            raise InvalidArgument(
                f"cannot bind input '{name}': the model has no such input. Valid inputs: "
                f"{[a.name for a in self._session.get_inputs()]}"
                + (
                    f"; overridable initializers: {[a.name for a in self._session.get_overridable_initializers()]}"
                    if self._session.get_overridable_initializers()
                    else ""
                )
            )

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        """Bind a host array; read in place at each run when it is C-contiguous, converted once otherwise."""
        self._check_input_name(name)
        self._inputs[name] = OrtValue.ortvalue_from_numpy(as_host_array(arr_on_cpu, f"bind_cpu_input('{name}')"))

    def bind_input(
        self,
        name: str,
        device_type: str,
        device_id: int,
        element_type: Any,
        shape: Sequence[int],
        buffer_ptr: int,
    ) -> None:
        """Bind ``shape`` elements of ``element_type`` at ``buffer_ptr`` on a device, read in place."""
        self._check_input_name(name)
        dt = _element_dtype(element_type)
        dims = _check_shape(shape, f"bind_input('{name}')")
        provider = provider_for_device(device_type, device_id)
        try:
            arr = provider.wrap_pointer(int(buffer_ptr or 0), dims, dt)
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"bind_input('{name}'): {e}") from None
        self._inputs[name] = OrtValue(arr, provider)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        self._check_input_name(name)
        if not isinstance(ortvalue, OrtValue):
            raise InvalidArgument(f"bind_ortvalue_input('{name}') needs an OrtValue, got {type(ortvalue).__name__}")
        self._inputs[name] = ortvalue

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def synchronize_inputs(self) -> None:
        """Wait for pending work on the devices holding bound inputs (no-op on the CPU)."""
        for v in self._inputs.values():
            v._provider.synchronize()

    # -- outputs --------------------------------------------------------------------------------
    def _check_output_name(self, name: str) -> None:
        names = self._session._output_names
        if name in names:
            return
        if name in self._session._base_graph.defined_names():
            return  # an intermediate value, fetchable by name
        raise InvalidArgument(f"cannot bind output '{name}': the model has no such output. Valid outputs: {names}")

    def bind_output(
        self,
        name: str,
        device_type: str = "cpu",
        device_id: int = 0,
        element_type: Any = None,
        shape: Sequence[int] | None = None,
        buffer_ptr: int | None = None,
    ) -> None:
        """Bind an output to a device; with ``buffer_ptr`` the result is written into that memory."""
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
            arr = provider.wrap_pointer(int(buffer_ptr), dims, dt)
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"bind_output('{name}'): {e}") from None
        self._outputs[name] = _BoundOutput(provider, OrtValue(arr, provider))

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an output to an OrtValue; the result is written into its memory."""
        self._check_output_name(name)
        if not isinstance(ortvalue, OrtValue) or not ortvalue.is_tensor():
            raise InvalidArgument(f"bind_ortvalue_output('{name}') needs a tensor OrtValue, got {ortvalue!r}")
        self._check_declared(name, ortvalue._value.dtype, tuple(ortvalue.shape()))
        self._outputs[name] = _BoundOutput(ortvalue._provider, ortvalue)

    def _check_declared(self, name: str, dt: np.dtype, dims: tuple[int, ...]) -> None:
        """Reject a buffer that can never fit what the model declares for this output."""
        for arg in self._session.get_outputs():
            if arg.name != name:
                continue
            want = arg.type
            if want.startswith("tensor(") and dtypes.dtype_string(dt) != want:
                raise InvalidArgument(
                    f"bind_output('{name}'): buffer is {dtypes.dtype_string(dt)}, the model's output is {want}"
                )
            if arg.shape and len(arg.shape) != len(dims):
                raise InvalidArgument(
                    f"bind_output('{name}'): buffer shape {list(dims)} has rank {len(dims)}, the model's output has shape {arg.shape}"
                )
            for i, (d, w) in enumerate(zip(dims, arg.shape)):
                if isinstance(w, int) and d != w:
                    raise InvalidArgument(
                        f"bind_output('{name}'): buffer shape {list(dims)} differs at index {i} from the model's output shape {arg.shape}"
                    )

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results = []

    def synchronize_outputs(self) -> None:
        """Wait until the last run's results are complete on their devices."""
        self._session._provider.synchronize()
        for b in self._outputs.values():
            b.provider.synchronize()

    # -- results --------------------------------------------------------------------------------
    def get_outputs(self) -> list[OrtValue]:
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> list[OrtValue]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[Any]:
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
            raise InvalidArgument("run_with_iobinding: no output is bound; call bind_output for each output you need")
        feeds = {name: sess._prepare_feed(name, v) for name, v in self._inputs.items()}
        names = list(self._outputs)
        values = sess._run_device(names, feeds, run_options)
        # Check every preallocated destination before writing any of them.
        for name, value in zip(names, values):
            target = self._outputs[name].target
            if target is None:
                continue
            if value is None or isinstance(value, list):
                raise InvalidArgument(f"output '{name}' is not a tensor; it cannot be written into a bound buffer")
            t = target._value
            if tuple(value.shape) != tuple(t.shape) or value.dtype != t.dtype:
                raise InvalidArgument(
                    f"output '{name}' is {dtypes.dtype_string(value.dtype)} {list(value.shape)}, but the bound buffer is "
                    f"{dtypes.dtype_string(t.dtype)} {list(t.shape)}; nothing was written"
                )
        results: list[OrtValue] = []
        src_provider = sess._provider
        for name, value in zip(names, values):
            bound = self._outputs[name]
            if bound.target is not None:
                _copy_into(bound.target, value, src_provider)
                results.append(bound.target)
            else:
                results.append(_wrap_result(value, src_provider, bound.provider, feeds))
        self._results = results


def _copy_into(target: OrtValue, value: Any, src: Provider) -> None:
    t = target._value
    dst = target._provider
    if dst.data_ptr(t) == src.data_ptr(value) and t.size:
        return  # the kernel already wrote into the bound buffer
    if dst is src or dst.device_type == src.device_type == "cpu":
        dst.copy_into(t, value)
    elif dst.device_type == "cpu":
        np.copyto(t, src.to_host(value))
    else:
        dst.copy_into(t, dst.from_host(src.to_host(value)))


def _wrap_result(value: Any, src: Provider, dst: Provider, feeds: dict[str, Any]) -> OrtValue:
    if value is None:
        return OrtValue(None, dst)
    if isinstance(value, list):
        return OrtValue([_move(v, src, dst) for v in value], dst)
    moved = _move(value, src, dst)
    if moved is value and dst is CPU or (moved is value and dst.device_type == "cpu"):
        # Never hand out a constant (read-only) or a view of a bound input: the caller owns outputs.
        if isinstance(moved, np.ndarray) and (
            not moved.flags.writeable
            or any(isinstance(f, np.ndarray) and np.may_share_memory(moved, f) for f in feeds.values())
        ):
            moved = moved.copy()
    return OrtValue(moved, dst)


def _move(value: Any, src: Provider, dst: Provider) -> Any:
    if src is dst or (src.device_type == dst.device_type == "cpu"):
        return np.asarray(value) if dst.device_type == "cpu" and not isinstance(value, np.ndarray) else value
    if dst.device_type == "cpu":
        return src.to_host(value)
    return dst.from_host(src.to_host(value))
