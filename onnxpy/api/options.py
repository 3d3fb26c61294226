"""SessionOptions, RunOptions and the enums, with onnxruntime's names and defaults.

What each option does in onnxpy:

- graph_optimization_level: selects the optimizer passes (see onnxpy.optimizer.manager).
- intra_op_num_threads: caps the BLAS thread pool while this session runs (0: library default).
- enable_profiling / profile_file_prefix: Chrome-trace profiling, see InferenceSession.end_profiling.
- optimized_model_filepath: the optimized graph is written there at session creation.
- log_severity_level: 0 verbose ... 4 fatal: the least severe of this session's log records
  (logger "onnxpy") that pass, at creation and in its runs; -1 follows
  onnxpy.set_default_logger_severity (onnxpy/runtime/logs.py).
- add_free_dimension_override_by_name: fixes named input dimensions before inference.
- add_initializer: replaces an initializer of the model by the given OrtValue.
- add_external_initializers: the data of initializers stored in external files, given in memory.
- add_external_initializers_from_files_in_memory: the contents of the external data files
  themselves, by the location the model names: main-graph initializers are read from them, not
  from disk (every such initializer's file must then be given).
- set_load_cancellation_flag(True): session creation with these options (or set_providers of a
  session created with them) stops at its next stage with ModelLoadCanceled; the flag is shared
  with sessions being created, so another thread can cancel a slow load.
- add_session_config_entry: string settings; onnxpy reads the keys listed in CONFIG_KEYS.
- enable_cpu_mem_arena (default True): freed host memory is kept for the next run, by fixing
  glibc's malloc thresholds once per process (onnxpy.runtime.memory); False leaves malloc as
  it is, unless another session of the process already set them.

Every option is checked when assigned (``_Checked``): a value of the wrong type raises
InvalidArgumentType (an InvalidArgument that is a TypeError, as onnxruntime raises TypeError),
one out of range InvalidArgument, naming the option and what it takes, instead of being
coerced (an int() of 2.5, a truthy "no"). Enum options also take their int values.

Execution-provider devices (onnxpy.api.devices): add_provider, add_provider_for_devices,
set_provider_selection_policy and set_provider_selection_policy_delegate choose the provider of
a session created without ``providers``. The EPContext data read callback
(set_ep_context_data_read_func) raises NotImplemented: onnxpy has no compiling providers.

Accepted for compatibility, no effect in onnxpy (documented, not silently dropped):
inter_op_num_threads and execution_mode (nodes always run in order on one thread),
execution_order, enable_mem_pattern and enable_mem_reuse (the planner
always releases values after their last use), use_deterministic_compute (kernels are
deterministic), log_verbosity_level, and RunOptions.log_severity_level (a run's few messages
follow its session's level). register_custom_ops_library raises NotImplemented: native kernels
cannot run here. InferenceSession's disabled_optimizers takes onnxpy's pass names
(onnxpy.optimizer.manager.pass_names(): "relu_after_pool", "fuse_activation", ...) and skips
those passes; names onnxpy has no pass for (onnxruntime's optimizer names) warn and change
nothing.
optimized_model_filepath writes the model as onnxpy runs it: at the extended levels it holds
onnxpy's own fused operators (domain onnxpy.fused), which onnxpy reloads and onnxruntime does
not. use_per_session_threads = False makes the session take its intra-op thread
count from onnxpy.set_global_thread_pool_sizes; logid is the logid a log callback receives
(onnxpy.set_default_logger_callback).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import devices, errors, unsupported
from .enums import NamedIntEnum
from .errors import InvalidArgument, InvalidArgumentType


class GraphOptimizationLevel(NamedIntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(NamedIntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(NamedIntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


#: session config keys onnxpy reads, with what they do
CONFIG_KEYS = {
    "session.model_external_initializers_file_folder_path": "folder holding external data of a model given as bytes",
    "session.max_allocation_bytes": "byte budget for one data-dependent allocation (ConstantOfShape, Expand, Tile...)",
    "session.check_nan_inf": "'1': raise at the first node whose output holds NaN or Inf, naming the node",
    "session.debug_level": "'1' prints each node as it runs, '2' also its values' shapes and statistics",
    "session.split_processes": "'1' (Linux x86-64, 2+ cores): convolutions, pools and per-position steps run as "
    "two halves (of rows, or of channels on small maps) in this process and a forked helper process, for input "
    "shapes where the first runs measured that faster; 'always': for every run",
}


def _member(kind: type[NamedIntEnum], value: Any, what: str) -> Any:
    """``value`` as a member of ``kind`` (its members or their int values); a clear error for
    anything else (an int() of a string or float would hide the mistake)."""
    if isinstance(value, kind):
        return value
    valid = ", ".join(f"{m.name} ({int(m)})" for m in kind)
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise InvalidArgumentType(f"{what} must be one of {valid}, got {value!r}")
    try:
        return kind(int(value))
    except ValueError:
        raise InvalidArgument(f"{what} must be one of {valid}, got {value!r}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _count(value: Any, what: str) -> int:
    if not _is_int(value) or value < 0:
        error = InvalidArgument if _is_int(value) else InvalidArgumentType
        raise error(f"{what} must be an int >= 0 (0: the default), got {value!r}")
    return int(value)


def _severity(value: Any, what: str) -> int:
    if not _is_int(value) or not -1 <= value <= 4:
        error = InvalidArgument if _is_int(value) else InvalidArgumentType
        raise error(f"{what} must be an int from 0 (verbose) to 4 (fatal), or -1 (the default), got {value!r}")
    return int(value)


def _flag(value: Any, what: str) -> bool:
    # bools (and 0 / 1): a string such as "false" or "no" would count as true
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    error = InvalidArgument if _is_int(value) else InvalidArgumentType
    raise error(f"{what} must be True or False, got {value!r}")


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)  # type: ignore[return-value]
    raise InvalidArgumentType(f"{what} must be a string, got {value!r}")


def _dimension(name: Any, value: Any, what: str) -> tuple[str, int]:
    if not isinstance(name, str):
        raise InvalidArgumentType(f"{what}: the dimension's name must be a string, got {name!r}")
    if not _is_int(value) or value < 0:
        error = InvalidArgument if _is_int(value) else InvalidArgumentType
        raise error(f"{what}: the value for '{name}' must be an int >= 0, got {value!r}")
    return name, int(value)


class _Checked:
    """A validated attribute: assignments go through ``check(value, what)``."""

    def __init__(self, check: Any) -> None:
        self.check = check

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.what = f"{owner.__name__}.{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj.__dict__[self.name]

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = self.check(value, self.what)


class _Closed:
    """Options objects take only their own attributes: a misspelt one (intra_op_num_thread)
    raises AttributeError, as onnxruntime's do, instead of being stored and ignored."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and not hasattr(type(self), name):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        super().__setattr__(name, value)

    def _snapshot(self) -> Any:
        """A copy whose later changes the original does not see (containers copied, the values
        they hold shared): what a session keeps of the options it was created with."""
        twin = copy.copy(self)
        for key, value in vars(self).items():
            if isinstance(value, dict):
                object.__setattr__(twin, key, dict(value))
        return twin


class SessionOptions(_Closed):
    graph_optimization_level = _Checked(lambda v, what: _member(GraphOptimizationLevel, v, what))
    execution_mode = _Checked(lambda v, what: _member(ExecutionMode, v, what))
    execution_order = _Checked(lambda v, what: _member(ExecutionOrder, v, what))
    intra_op_num_threads = _Checked(_count)
    inter_op_num_threads = _Checked(_count)
    log_severity_level = _Checked(_severity)
    log_verbosity_level = _Checked(_count)
    enable_profiling = _Checked(_flag)
    enable_cpu_mem_arena = _Checked(_flag)
    enable_mem_pattern = _Checked(_flag)
    enable_mem_reuse = _Checked(_flag)
    use_deterministic_compute = _Checked(_flag)
    use_per_session_threads = _Checked(_flag)
    profile_file_prefix = _Checked(_text)
    optimized_model_filepath = _Checked(_text)
    logid = _Checked(_text)

    def __init__(self) -> None:
        self.graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.intra_op_num_threads: int = 0
        self.inter_op_num_threads: int = 0
        self.execution_mode: ExecutionMode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order: ExecutionOrder = ExecutionOrder.DEFAULT
        self.enable_profiling: bool = False
        self.profile_file_prefix: str = "onnxruntime_profile_"  # onnxruntime's default
        self.optimized_model_filepath: str = ""
        self.log_severity_level: int = -1
        self.log_verbosity_level: int = 0
        self.logid: str = ""
        self.enable_cpu_mem_arena: bool = True
        self.enable_mem_pattern: bool = True
        self.enable_mem_reuse: bool = True
        self.use_deterministic_compute: bool = False
        #: False: the intra-op thread count comes from onnxpy.set_global_thread_pool_sizes
        self.use_per_session_threads: bool = True
        self._config: dict[str, str] = {}
        self._free_dim_by_name: dict[str, int] = {}
        self._free_dim_by_denotation: dict[str, int] = {}
        self._initializers: dict[str, Any] = {}
        self._external_initializers: dict[str, Any] = {}
        # add_provider_for_devices: (provider, options) pairs; a tuple, so snapshots share it safely
        self._device_providers: tuple[tuple[str, dict[str, str]], ...] = ()
        self._device_policy: devices.OrtExecutionProviderDevicePolicy | None = None
        self._policy_delegate: Callable[..., Any] | None = None
        # add_external_initializers_from_files_in_memory: normalized location -> file contents
        self._external_files: dict[str, memoryview] = {}
        # set_load_cancellation_flag: a one-item list, so the snapshot a session takes shares it
        # (another thread may cancel a load under way) while the options stay copyable
        self._load_canceled: list[bool] = [False]

    def add_session_config_entry(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgumentType(
                f"add_session_config_entry takes a string key and a string value, got {key!r} and {value!r}"
            )
        self._config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeError(f"SessionOptions does not have configuration with key: {key}") from None

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        name, value = _dimension(dim_name, dim_value, "add_free_dimension_override_by_name")
        self._free_dim_by_name[name] = value

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        name, value = _dimension(dim_denotation, dim_value, "add_free_dimension_override_by_denotation")
        self._free_dim_by_denotation[name] = value

    def add_initializer(self, name: str, val: Any) -> None:
        """Replace the model's initializer ``name`` by an OrtValue (or numpy array) of the same type."""
        self._initializers[str(name)] = val

    def add_external_initializers(self, names: list[str], ort_values: list[Any]) -> None:
        """Provide in memory the data of initializers the model stores in external files (OrtValues,
        or numpy arrays, of their type and shape): those files are then not read."""
        names, values = list(names), list(ort_values)
        if len(names) != len(values):
            raise InvalidArgument(
                f"add_external_initializers: {len(names)} names but {len(values)} values; expecting lists of equal length"
            )
        for name in names:
            if not isinstance(name, str):
                raise InvalidArgumentType(f"add_external_initializers: names must be strings, got {name!r}")
        self._external_initializers.update(zip(names, values))

    def add_external_initializers_from_files_in_memory(
        self, names: Sequence[str], buffers: Sequence[Any], lengths: Sequence[int]
    ) -> None:
        """Provide the contents of external data files in memory: ``names`` are the files'
        names as the model's external_data locations give them, ``buffers`` any bytes-like objects
        (bytes, bytearray, memoryview, numpy arrays) and ``lengths`` the files' sizes in bytes.
        Main-graph initializers stored externally are read from these at session creation,
        instead of from disk. The buffers are referenced, not copied: keep them unchanged until
        the session is created."""
        what = "add_external_initializers_from_files_in_memory"
        names, buffers, lengths = _listed(names, what), _listed(buffers, what), _listed(lengths, what)
        if not len(names) == len(buffers) == len(lengths):
            raise InvalidArgument(
                f"{what}: got {len(names)} names, {len(buffers)} buffers and {len(lengths)} lengths; "
                "expecting lists of equal length"
            )
        files: dict[str, memoryview] = {}
        for name, buffer, length in zip(names, buffers, lengths):
            if not isinstance(name, str):
                raise InvalidArgumentType(f"{what}: file names must be strings, got {name!r}")
            if not _is_int(length):
                raise InvalidArgumentType(f"{what}: lengths must be ints, got {length!r} for '{name}'")
            if isinstance(buffer, str):
                raise InvalidArgumentType(f"{what}: the buffer of '{name}' is a str; give bytes")
            try:
                view = memoryview(buffer).cast("B")
            except (TypeError, ValueError) as e:
                raise InvalidArgumentType(
                    f"{what}: the buffer of '{name}' must be a contiguous bytes-like object, got "
                    f"{type(buffer).__name__} ({e})"
                ) from None
            if not 0 <= length <= view.nbytes:
                raise InvalidArgument(
                    f"{what}: length {length} of '{name}' is outside its buffer of {view.nbytes} bytes"
                )
            files[external_file_key(name)] = view[: int(length)]
        self._external_files.update(files)

    def register_custom_ops_library(self, library_path: str) -> None:
        """Native custom-op libraries (.so/.dll built against onnxruntime's C API) cannot run in
        onnxpy: it refuses them by name. Custom operators are Python functions registered with
        ``onnxpy.ops.registry.op`` (see the README)."""
        raise errors.NotImplemented(
            f"register_custom_ops_library('{library_path}'): onnxpy cannot load native onnxruntime custom-op "
            "libraries; register the operator's kernel in Python with onnxpy.ops.registry.op instead"
        )

    def add_provider(self, provider_name: str, provider_options: dict[str, str]) -> None:
        """Run sessions created with these options (and no ``providers``) on ``provider_name``,
        configured by ``provider_options``, in the order added (the CPU provider runs what the
        others cannot). onnxpy's providers available here are accepted; onnxruntime's others are
        refused as onnxruntime refuses those its build lacks, and unknown names as unknown."""
        from ..providers import PROVIDER_DEVICES, available_provider_names
        from .session import ONNXRUNTIME_PROVIDERS

        if not isinstance(provider_name, str):
            raise InvalidArgumentType(f"add_provider: the provider name must be a string, got {provider_name!r}")
        options = _string_map(provider_options, "add_provider: provider_options")
        if provider_name not in PROVIDER_DEVICES and provider_name not in ONNXRUNTIME_PROVIDERS:
            raise InvalidArgument(f"Unknown Provider Type: {provider_name}. onnxpy knows {sorted(PROVIDER_DEVICES)}")
        available = available_provider_names()
        if provider_name not in available:
            raise InvalidArgument(
                f"Failed to add provider of type '{provider_name}' to SessionOptions. Provider configuration is "
                f"not supported: providers available here: {available}"
            )
        self._device_providers = (*self._device_providers, (provider_name, options))

    def add_provider_for_devices(self, ep_devices: Any, ep_options: Any) -> None:
        """Run sessions created with these options (and no ``providers``) on the provider of
        ``ep_devices`` (OrtEpDevices of onnxpy.get_ep_devices(), all of one provider), configured
        by ``ep_options``. With several devices of one provider the first one is used."""
        if isinstance(ep_devices, (str, bytes)) or not hasattr(ep_devices, "__iter__"):
            raise InvalidArgumentType(f"add_provider_for_devices: expected a list of OrtEpDevice, got {ep_devices!r}")
        chosen = list(ep_devices)
        for d in chosen:
            if not isinstance(d, devices.OrtEpDevice):
                raise InvalidArgumentType(f"add_provider_for_devices: expected OrtEpDevice instances, got {d!r}")
        if not hasattr(ep_options, "items") or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in ep_options.items()
        ):
            raise InvalidArgumentType(f"add_provider_for_devices: ep_options must map str to str, got {ep_options!r}")
        if not chosen:
            raise InvalidArgument("add_provider_for_devices: Must provide one or more OrtEpDevice instances.")
        names = sorted({d.ep_name for d in chosen})
        if len(names) > 1:
            raise InvalidArgument(
                f"add_provider_for_devices: all OrtEpDevice instances must be of one provider, got {names}"
            )
        pair = devices.providers_for_devices(chosen, dict(ep_options))
        self._device_providers = (*self._device_providers, pair)

    def set_provider_selection_policy(self, policy: Any) -> None:
        """Run sessions created with these options (and no ``providers``) where ``policy``
        (an OrtExecutionProviderDevicePolicy) points: PREFER_GPU and MAX_PERFORMANCE on CUDA when
        it is available, every other policy (and those without a GPU) on the CPU."""
        self._device_policy = _member(devices.OrtExecutionProviderDevicePolicy, policy, "set_provider_selection_policy")
        self._policy_delegate = None  # the last one set decides, as in onnxruntime

    def set_provider_selection_policy_delegate(self, delegate: Callable[..., Any]) -> None:
        """Let ``delegate(ep_devices, model_metadata, runtime_metadata, max_selections)`` choose
        the devices of sessions created with these options (and no ``providers``): it gets
        onnxpy.get_ep_devices(), the model's metadata (str to str), {} and 8, and returns a list
        of the OrtEpDevices to use, most preferred first, one per provider. It replaces an
        earlier set_provider_selection_policy, and the reverse."""
        if not callable(delegate):
            raise InvalidArgumentType(
                f"set_provider_selection_policy_delegate: expected a callable, got {type(delegate).__name__}"
            )
        self._policy_delegate = delegate
        self._device_policy = None

    def set_ep_context_data_read_func(self, read_func: Callable[..., Any], max_data_size: int) -> None:
        unsupported.refuse("SessionOptions.set_ep_context_data_read_func", unsupported.COMPILE)

    def clear_ep_context_data_read_func(self) -> None:
        """Nothing to clear: onnxpy never holds an EPContext data read callback (setting one
        raises NotImplemented)."""

    def set_load_cancellation_flag(self, value: bool) -> None:
        """True: session creation with these options stops at its next stage (loading,
        optimizing, compiling) with ModelLoadCanceled, also one already under way on another
        thread; False lets sessions be created again."""
        self._load_canceled[0] = _flag(value, "set_load_cancellation_flag")

    def _check_canceled(self) -> None:
        if self._load_canceled[0]:
            raise errors.ModelLoadCanceled(
                "Model loading was canceled: SessionOptions.set_load_cancellation_flag(True) was called "
                "on the options of this session"
            )

    def has_providers(self) -> bool:
        """Whether add_provider, add_provider_for_devices, set_provider_selection_policy or its
        delegate chose providers."""
        return bool(self._device_providers) or self._device_policy is not None or self._policy_delegate is not None

    def _selected_providers(self, model_metadata: dict[str, str] | None = None) -> list[Any]:
        """The providers (names or (name, options) pairs) these options select, [] for none.
        ``model_metadata``: what a selection delegate is given about the model."""
        if self._device_providers:
            seen: set[str] = set()
            for name, _ in self._device_providers:
                if name in seen:
                    raise errors.Fail(f"Provider {name} has already been registered.")
                seen.add(name)
            return list(self._device_providers)
        if self._policy_delegate is not None:
            return devices.providers_for_delegate(self._policy_delegate, model_metadata or {})
        if self._device_policy is not None:
            return list(devices.providers_for_policy(self._device_policy))
        return []

    def config(self, key: str, default: str | None = None) -> str | None:
        """onnxpy's own accessor: a config entry or ``default``."""
        return self._config.get(key, default)

    def __repr__(self) -> str:
        return f"<SessionOptions opt_level={self.graph_optimization_level.name} config={self._config}>"


def external_file_key(name: str) -> str:
    """An external data file's name as a location names it (``./w.bin`` and ``w.bin`` alike)."""
    return os.path.normpath(name.replace("\\", "/")).replace("\\", "/")


def _listed(items: Any, what: str) -> list[Any]:
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise InvalidArgumentType(f"{what}: expected a list, got {type(items).__name__}")
    return list(items)


def _string_map(value: Any, what: str) -> dict[str, str]:
    if not hasattr(value, "items") or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidArgumentType(f"{what} must map str to str, got {value!r}")
    return dict(value.items())


class RunOptions(_Closed):
    log_severity_level = _Checked(_severity)
    log_verbosity_level = _Checked(_count)
    terminate = _Checked(_flag)
    only_execute_path_to_fetches = _Checked(_flag)
    logid = _Checked(_text)

    def __init__(self) -> None:
        self.log_severity_level: int = -1
        self.log_verbosity_level: int = 0
        self.logid: str = ""
        #: set from another thread to stop a run between two nodes
        self.terminate: bool = False
        self.only_execute_path_to_fetches: bool = False
        self._config: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgumentType(
                f"add_run_config_entry takes a string key and a string value, got {key!r} and {value!r}"
            )
        self._config[key] = value

    def add_active_adapter(self, adapter: Any) -> None:
        unsupported.refuse("RunOptions.add_active_adapter", unsupported.LORA)

    def get_run_config_entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeError(f"RunOptions does not have configuration with key: {key}") from None
