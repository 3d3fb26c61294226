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
- add_session_config_entry: string settings; onnxpy reads the keys listed in CONFIG_KEYS.
- enable_cpu_mem_arena (default True): freed host memory is kept for the next run, by fixing
  glibc's malloc thresholds once per process (onnxpy.runtime.memory); False leaves malloc as
  it is, unless another session of the process already set them.

Every option is checked when assigned (``_Checked``): a value of the wrong type raises
InvalidArgumentType (an InvalidArgument that is a TypeError, as onnxruntime raises TypeError),
one out of range InvalidArgument, naming the option and what it takes, instead of being
coerced (an int() of 2.5, a truthy "no"). Enum options also take their int values.

Execution-provider devices (onnxpy.api.devices): add_provider_for_devices and
set_provider_selection_policy choose the provider of a session created without ``providers``.

Accepted for compatibility, no effect in onnxpy (documented, not silently dropped):
inter_op_num_threads and execution_mode (nodes always run in order on one thread),
execution_order, enable_mem_pattern and enable_mem_reuse (the planner
always releases values after their last use), use_deterministic_compute (kernels are
deterministic), log_verbosity_level, and RunOptions.log_severity_level (a run's few messages
follow its session's level). register_custom_ops_library raises NotImplemented: native kernels
cannot run here. InferenceSession's disabled_optimizers (onnxruntime's optimizer names) warns
and has no effect: onnxpy's passes are its own, limited by graph_optimization_level.
optimized_model_filepath writes the model as onnxpy runs it: at the extended levels it holds
onnxpy's own fused operators (domain onnxpy.fused), which onnxpy reloads and onnxruntime does
not. use_per_session_threads = False makes the session take its intra-op thread
count from onnxpy.set_global_thread_pool_sizes; logid is the logid a log callback receives
(onnxpy.set_default_logger_callback).
"""

from __future__ import annotations

import copy
import os
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

    def register_custom_ops_library(self, library_path: str) -> None:
        """Native custom-op libraries (.so/.dll built against onnxruntime's C API) cannot run in
        onnxpy: it refuses them by name. Custom operators are Python functions registered with
        ``onnxpy.ops.registry.op`` (see the README)."""
        raise errors.NotImplemented(
            f"register_custom_ops_library('{library_path}'): onnxpy cannot load native onnxruntime custom-op "
            "libraries; register the operator's kernel in Python with onnxpy.ops.registry.op instead"
        )

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

    def has_providers(self) -> bool:
        """Whether add_provider_for_devices or set_provider_selection_policy chose providers."""
        return bool(self._device_providers) or self._device_policy is not None

    def _selected_providers(self) -> list[Any]:
        """The providers (names or (name, options) pairs) these options select, [] for none."""
        if self._device_providers:
            return list(self._device_providers)
        if self._device_policy is not None:
            return list(devices.providers_for_policy(self._device_policy))
        return []

    def config(self, key: str, default: str | None = None) -> str | None:
        """onnxpy's own accessor: a config entry or ``default``."""
        return self._config.get(key, default)

    def __repr__(self) -> str:
        return f"<SessionOptions opt_level={self.graph_optimization_level.name} config={self._config}>"


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
