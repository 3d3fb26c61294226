"""InferenceSession, NodeArg and ModelMetadata with onnxruntime's names and behaviour.

The session validates what the caller gives it and delegates the work: loading to
onnxpy.model, graph building and compiling to onnxpy.runtime, device work to a provider.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..ir.graph import Graph, normalize_domain
from ..model import dtypes
from ..model.load import load_model
from ..ops._compat import quiet_floats
from ..ops._layout import contiguous_copy
from ..optimizer.manager import optimize, pass_names
from ..providers import (
    CPU,
    PROVIDER_DEVICES,
    Provider,
    available_provider_names,
    cuda_graph_option,
    provider_for_device,
    provider_for_session,
)
from ..runtime import contention, logs
from ..runtime.compile import apply_free_dimension_overrides, build_graph, prestart_shape_inference
from ..runtime.compiled import CompiledGraph
from ..runtime.executor import execute
from ..runtime.facts import SessionFacts
from ..runtime.memory import keep_freed_memory, release_free_memory
from ..runtime.placement import FROM_HOST, FUSED_DOMAIN, TO_HOST
from ..runtime.split import runner as split_runner
from ..runtime.split.runner import SplitRunner
from ..runtime.threads import pool_task
from . import devices, unsupported
from .errors import Fail, InvalidArgument, InvalidArgumentType, InvalidGraph, NoSuchFile, OnnxpyError
from .options import RunOptions, SessionOptions
from .ortvalue import OrtDevice, OrtValue, _element_dtype, as_host_array


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output: name, onnxruntime type string and shape."""

    name: str
    type: str
    shape: list[Any] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


@dataclass(frozen=True)
class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]


_UNSET_MODEL_VERSION = 2**63 - 1


def _schema_typed_output(model: onnx.ModelProto, vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """An output neither declared nor inferred (ai.onnx.ml operators have no type inference)
    typed by its producer's schema where that names one type (Scaler's Y is tensor(float)), as
    onnxruntime reports it; else unchanged."""
    versions = {normalize_domain(o.domain): o.version for o in model.opset_import}
    for node in model.graph.node:
        if vi.name not in node.output:
            continue
        domain = normalize_domain(node.domain)
        try:
            schema = onnx.defs.get_schema(node.op_type, versions.get(domain, 1), domain)
        except Exception:  # noqa: BLE001 - a contrib or custom op: nothing to read
            return vi
        idx = min(list(node.output).index(vi.name), len(schema.outputs) - 1)
        text = schema.outputs[idx].type_str if idx >= 0 else ""
        elem = dtypes.NAME_TO_ELEM.get(text[len("tensor(") : -1]) if text.startswith("tensor(") else None
        if elem is not None:
            return onnx.helper.make_value_info(vi.name, onnx.helper.make_tensor_type_proto(elem, None))
        return vi
    return vi


def _node_arg(vi: onnx.ValueInfoProto) -> NodeArg:
    shape: list[Any] = []
    tp = vi.type
    # An optional tensor reports the shape of the tensor it holds, as in onnxruntime.
    inner = tp.optional_type.elem_type if tp.HasField("optional_type") else tp
    if inner.HasField("tensor_type") and inner.tensor_type.HasField("shape"):
        for d in inner.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                shape.append(d.dim_param)
            else:
                shape.append(None)
    return NodeArg(vi.name, dtypes.type_string(tp), shape)


class _InputSpec:
    """What a feed must look like, precomputed so validation per run is a few comparisons."""

    __slots__ = ("name", "dtype", "type_str", "rank", "fixed", "kind", "inner_kind", "element_dtype", "holds_sequence")

    def __init__(self, arg: NodeArg, tp: onnx.TypeProto) -> None:
        self.name = arg.name
        self.type_str = arg.type
        self.kind = tp.WhichOneof("value")
        # What an optional holds, or what a sequence's elements are ("tensor_type", "map_type"...).
        self.inner_kind: str | None = None
        if self.kind == "optional_type":
            self.inner_kind = tp.optional_type.elem_type.WhichOneof("value")
            if self.inner_kind == "tensor_type":
                tp = tp.optional_type.elem_type  # checked like the tensor it holds
        elif self.kind == "sequence_type":
            self.inner_kind = tp.sequence_type.elem_type.WhichOneof("value")
        # A sequence of tensors: the dtype each element must have (None: not declared).
        self.element_dtype: np.dtype | None = None
        seq = tp.optional_type.elem_type if self.kind == "optional_type" else tp
        if seq.WhichOneof("value") == "sequence_type":
            inner = seq.sequence_type.elem_type
            if inner.WhichOneof("value") == "tensor_type" and inner.tensor_type.elem_type:
                try:
                    self.element_dtype = dtypes.np_dtype(inner.tensor_type.elem_type)
                except ValueError:
                    self.element_dtype = None
        self.holds_sequence = seq.WhichOneof("value") == "sequence_type"
        self.dtype: np.dtype | None = None
        self.rank: int | None = None
        self.fixed: tuple[tuple[int, int], ...] = ()
        if tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.elem_type:
            try:
                self.dtype = dtypes.np_dtype(tp.tensor_type.elem_type)
            except ValueError:
                self.dtype = None
            if tp.tensor_type.HasField("shape"):
                dims = tp.tensor_type.shape.dim
                self.rank = len(dims)
                self.fixed = tuple((i, int(d.dim_value)) for i, d in enumerate(dims) if d.HasField("dim_value"))


_LOG = logging.getLogger("onnxpy")
_ASYNC_LOCK = threading.Lock()
_ASYNC_POOL: concurrent.futures.ThreadPoolExecutor | None = None


def _async_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The worker threads of run_async, shared by every session (one per core, as
    onnxruntime's intra-op pool runs its asynchronous runs)."""
    global _ASYNC_POOL
    with _ASYNC_LOCK:
        if _ASYNC_POOL is None:
            _ASYNC_POOL = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="onnxpy-run-async"
            )
        return _ASYNC_POOL


# Plans kept for output-name lists other than the model's outputs (each a list of steps).
_MAX_CACHED_PLANS = 64


def _disabled_passes(names: Any) -> frozenset[str]:
    """InferenceSession's ``disabled_optimizers``: the names of onnxpy's optimizer passes not to
    run (``onnxpy.optimizer.manager.pass_names()``), as onnxruntime takes its optimizers' names.
    Names onnxpy has no pass for (onnxruntime's, say) are reported in a warning, not an error,
    so that code written for onnxruntime still creates its session."""
    if names is None:
        return frozenset()
    if isinstance(names, str):
        names = [names]
    try:
        listed = list(names)
    except TypeError:
        raise InvalidArgumentType(
            f"disabled_optimizers must be a list of optimizer names, got {type(names).__name__}"
        ) from None
    bad = [n for n in listed if not isinstance(n, str)]
    if bad:
        raise InvalidArgumentType(f"disabled_optimizers must hold names (str), got {bad[0]!r}")
    known = pass_names()
    unknown = sorted({n for n in listed if n not in known})
    if unknown:
        warnings.warn(
            f"disabled_optimizers: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not among onnxpy's "
            f"optimizer passes, so nothing is disabled for {'it' if len(unknown) == 1 else 'them'} "
            f"(onnxruntime's optimizer names have no meaning here). onnxpy's passes: {', '.join(known)}",
            RuntimeWarning,
            stacklevel=3,
        )
    return frozenset(n for n in listed if n in known)


class InferenceSession:
    """Loads a model once and runs it many times: ``run(output_names, input_feed)``."""

    def __init__(
        self,
        path_or_bytes: Any,
        sess_options: SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        severity, logid = -1, ""
        if isinstance(sess_options, SessionOptions):
            severity, logid = sess_options.log_severity_level, sess_options.logid
        self._disabled_passes = _disabled_passes(kwargs.get("disabled_optimizers"))
        try:
            with logs.scope(severity, logid):
                self._create(path_or_bytes, sess_options, providers, provider_options)
        except (OnnxpyError, RuntimeWarning):
            raise
        except RecursionError as e:
            raise InvalidGraph(f"the model nests too deeply to load: {e}") from e
        except Exception as e:  # noqa: BLE001 - the contract: creation fails with an onnxpy error
            raise Fail(f"session creation failed: {type(e).__name__}: {e}") from e

    def _create(
        self,
        path_or_bytes: Any,
        sess_options: SessionOptions | None,
        providers: Sequence[Any] | None,
        provider_options: Sequence[dict[str, Any]] | None,
    ) -> None:
        started = time.perf_counter()
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise InvalidArgumentType(
                f"sess_options must be an onnxpy.SessionOptions, got {type(sess_options).__name__}"
            )
        if not isinstance(path_or_bytes, (str, os.PathLike, bytes, bytearray, memoryview, onnx.ModelProto)):
            raise InvalidArgumentType(
                f"Unable to load from type '{type(path_or_bytes).__name__}': expected a path (str or os.PathLike), "
                "bytes or an onnx.ModelProto"
            )
        # The options as they are now: later changes to the caller's object do not reach this
        # session (onnxruntime copies them too), and get_session_options() reports what is used.
        self._sess_options = sess_options._snapshot() if sess_options is not None else SessionOptions()
        opts = self._sess_options
        opts._check_canceled()
        if opts.enable_cpu_mem_arena:
            keep_freed_memory()
        self._model_path = os.fspath(path_or_bytes) if isinstance(path_or_bytes, (str, os.PathLike)) else None
        self._lock = threading.Lock()
        self._plans: dict[tuple[str, ...], Any] = {}
        self._debug_compiled: CompiledGraph | None = None
        # io_binding()'s bindings, whose captured CUDA graphs release_captured_graph drops
        self._bindings: weakref.WeakSet[Any] = weakref.WeakSet()
        self._ep_dynamic_options: dict[str, str] = {}

        # The source is kept (a path, the caller's bytes or ModelProto: no copy) so the
        # unoptimized graph can be rebuilt on demand instead of holding a second set of weights.
        self._source = path_or_bytes
        prestart_shape_inference()  # the first session of a process: its start overlaps loading
        base, loaded = self._load_base_graph(describe=True)
        opts._check_canceled()
        self._value_names = frozenset(base.defined_names())
        self._opset = dict(base.opsets)
        self._facts = SessionFacts.from_options(opts)
        self._run_times = contention.RunTimes()
        self._split: SplitRunner | None = None
        split_mode = self._facts.config.get(split_runner.CONFIG_KEY, "0")
        if split_mode not in ("0", "1", "always"):
            raise InvalidArgument(f"{split_runner.CONFIG_KEY} must be '0', '1' or 'always', got '{split_mode}'")
        if split_mode != "0":
            why_not = split_runner.supported()
            if why_not is None:
                self._split = SplitRunner(None, always=split_mode == "always", severity=opts.log_severity_level)
                weakref.finalize(self, self._split.close)
            else:
                warnings.warn(f"{split_runner.CONFIG_KEY} is ignored: {why_not}", RuntimeWarning, stacklevel=3)
        if opts.has_providers():
            if providers:
                warnings.warn(
                    "Specified 'providers'/'provider_options' when creating InferenceSession but SessionOptions has "
                    "already been configured with providers. InferenceSession will only use the providers passed "
                    "to InferenceSession().",
                    UserWarning,  # as onnxruntime warns
                    stacklevel=3,
                )
            else:  # the devices, policy or policy delegate of the options choose
                providers, provider_options = opts._selected_providers(self._model_metadata()), None
        self._set_providers(providers, provider_options, base)
        del base
        release_free_memory()
        self._profiler = None
        self._profiling_start_ns = 0  # kept after end_profiling, as onnxruntime keeps it
        if opts.enable_profiling:
            from ..tools.profiler import Profiler

            # onnxruntime's session events: loading, then everything else of creation.
            self._profiler = Profiler(opts.profile_file_prefix, start=started)
            self._profiling_start_ns = self._profiler.start_ns
            loading = "model_loading_uri" if self._model_path is not None else "model_loading_array"
            self._profiler.session_event(loading, started, loaded)
            self._profiler.session_event("session_initialization", loaded, time.perf_counter())
        self.creation_seconds = time.perf_counter() - started
        _LOG.info(
            "session created in %.1f ms (model loaded in %.1f ms)",
            self.creation_seconds * 1e3,
            (loaded - started) * 1e3,
        )

    # -- creation helpers ------------------------------------------------------------------------
    def _load_base_graph(self, describe: bool = False) -> tuple[Graph, float]:
        """Load the source and build the unoptimized graph (overrides applied)."""
        opts = self._sess_options
        provided = {
            name: val.numpy() if isinstance(val, OrtValue) else as_host_array(val, f"external initializer '{name}'")
            for name, val in opts._external_initializers.items()
        }
        arrays: dict[str, np.ndarray] = {}  # weights read from external data straight into arrays
        model, _folder = load_model(
            self._source,
            opts.config("session.model_external_initializers_file_folder_path"),
            provided,
            arrays,
            opts._external_files or None,
        )
        loaded = time.perf_counter()
        if describe:
            # The model's header without its graph, for a saved optimized model to keep.
            self._header = onnx.ModelProto()
            for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
                if model.HasField(field):
                    setattr(self._header, field, getattr(model, field))
            self._header.metadata_props.extend(model.metadata_props)
            self._meta = ModelMetadata(
                producer_name=model.producer_name,
                graph_name=model.graph.name,
                domain=model.domain,
                description=model.doc_string,
                graph_description=model.graph.doc_string,
                # onnxruntime reads a model_version the model does not set as int64's maximum
                version=int(model.model_version) if model.HasField("model_version") else _UNSET_MODEL_VERSION,
                custom_metadata_map={p.key: p.value for p in model.metadata_props},
            )
        self._apply_initializer_overrides(model, arrays)
        apply_free_dimension_overrides(model, opts._free_dim_by_name, opts._free_dim_by_denotation)
        graph = build_graph(model, release_data=True, arrays=arrays)  # load_model gave us our own copy
        if describe:
            self._describe_io(model, graph)
        return graph, loaded

    def _model_metadata(self) -> dict[str, str]:
        """The model's metadata as a provider selection delegate receives it (onnxruntime's keys;
        an unset model_version reads as onnxruntime's int64 maximum)."""
        header, meta = self._header, self._meta
        version = str(meta.version)
        return {
            **meta.custom_metadata_map,
            "doc_string": meta.description,
            "domain": meta.domain,
            "graph_description": meta.graph_description,
            "graph_name": meta.graph_name,
            "model_version": version,
            "producer_name": meta.producer_name,
            "producer_version": header.producer_version,
        }

    def _apply_initializer_overrides(self, model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> None:
        overrides = self._sess_options._initializers
        if not overrides:
            return
        by_name = {t.name: t for t in model.graph.initializer}
        for name, val in overrides.items():
            if name not in by_name:
                raise InvalidArgument(
                    f"add_initializer: the model has no initializer named '{name}'; it has {sorted(by_name)[:20]}"
                )
            arr = val.numpy() if isinstance(val, OrtValue) else as_host_array(val, f"initializer '{name}'")
            old = by_name[name]
            if tuple(old.dims) != arr.shape or old.data_type != dtypes.elem_type(arr.dtype):
                raise InvalidArgument(
                    f"add_initializer '{name}': got {dtypes.dtype_string(arr.dtype)} {list(arr.shape)}, the model's "
                    f"initializer is {dtypes.tensor_type_string(old.data_type)} {list(old.dims)}"
                )
            old.CopyFrom(onnx.numpy_helper.from_array(arr, name))
            arrays.pop(name, None)  # the override, not what was read from the model's file

    def _describe_io(self, model: onnx.ModelProto, graph: Graph) -> None:
        inits = {t.name for t in model.graph.initializer} | {s.values.name for s in model.graph.sparse_initializer}
        self._inputs = [_node_arg(vi) for vi in model.graph.input if vi.name not in inits]
        # Before IR 4 initializers were listed as inputs by rule, not to be overridden.
        self._overridable = [_node_arg(vi) for vi in model.graph.input if vi.name in inits and model.ir_version >= 4]
        # Outputs declared without a shape report the inferred one, as onnxruntime does.
        self._outputs = []
        for vi in model.graph.output:
            if vi.name in graph.types:  # declared and inferred shapes merged (ir.graph.merge_shapes)
                vi = onnx.helper.make_value_info(vi.name, graph.types[vi.name])
            if vi.type.WhichOneof("value") is None:
                vi = _schema_typed_output(model, vi)
            self._outputs.append(_node_arg(vi))
        types = {vi.name: vi.type for vi in model.graph.input}
        self._input_specs = {a.name: _InputSpec(a, types[a.name]) for a in self._inputs + self._overridable}
        # An optional-typed input may be left out: it runs as an empty optional (onnxruntime too).
        self._optional_inputs = [a.name for a in self._inputs if self._input_specs[a.name].kind == "optional_type"]
        self._required = [a.name for a in self._inputs if a.name not in self._optional_inputs]
        self._input_names = frozenset(a.name for a in self._inputs)
        self._output_names = [a.name for a in self._outputs]
        self._output_tuple = tuple(self._output_names)
        # Tensor outputs' declared element types, checked after each run (see _check_declared).
        self._declared: dict[str, np.dtype] = {}
        for vi in model.graph.output:
            et = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
            if et:
                try:
                    self._declared[vi.name] = dtypes.np_dtype(et)
                except ValueError:
                    pass

    def _set_providers(
        self,
        providers: Sequence[Any] | None,
        provider_options: Sequence[dict[str, Any]] | None,
        base: Graph | None = None,
    ) -> None:
        names, options = _normalize_providers(providers, provider_options)
        chosen: list[str] = []
        chosen_opts: list[dict[str, Any]] = []
        available = available_provider_names()
        for name, opt in zip(names, options):
            if name not in PROVIDER_DEVICES and name not in ONNXRUNTIME_PROVIDERS:
                raise InvalidArgument(
                    f"Unknown execution provider '{name}'. onnxpy knows {sorted(PROVIDER_DEVICES)}; available here: {available}"
                )
            if name not in available:
                # onnxruntime's own providers onnxpy lacks (TensorRT, OpenVINO...) are skipped with
                # its warning, as onnxruntime skips those of another build: the usual
                # ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"] works.
                warnings.warn(
                    f"Specified provider '{name}' is not in available provider names. Available providers: "
                    f"'{', '.join(available)}'. Falling back to the next provider.",
                    UserWarning,  # as onnxruntime warns
                    stacklevel=3,
                )
                continue
            if name not in chosen:
                chosen.append(name)
                chosen_opts.append({str(k): str(v) for k, v in opt.items()})
        if "CPUExecutionProvider" not in chosen:
            chosen.append("CPUExecutionProvider")
            chosen_opts.append({})
        try:  # the primary provider, configured by its options (device_id, user_compute_stream...)
            provider = provider_for_session(chosen[0], chosen_opts[0])
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        self._sess_options._check_canceled()
        graph = base if base is not None else self._load_base_graph()[0]
        self._sess_options._check_canceled()
        nodes_before = len(graph.nodes)
        level = self._sess_options.graph_optimization_level
        self._applied_passes = optimize(
            graph, int(level), host_only=provider.name == "CPUExecutionProvider", disabled=self._disabled_passes
        )
        _LOG.info(
            "graph '%s': %d nodes, %d after optimization at %s, on %s",
            graph.name,
            nodes_before,
            len(graph.nodes),
            level.name,
            provider.name,
        )
        if self._applied_passes:
            counts = collections.Counter(self._applied_passes)
            _LOG.debug("optimizer passes that changed the graph: %s", ", ".join(f"{k} x{v}" for k, v in counts.items()))
        if self._sess_options.optimized_model_filepath:
            from ..ir.export import EXTERNAL_FILE_KEY, EXTERNAL_MIN_SIZE_KEY, save_graph

            opts = self._sess_options
            external = None
            if opts.config(EXTERNAL_FILE_KEY):
                min_size = opts.config(EXTERNAL_MIN_SIZE_KEY) or "1024"
                try:
                    external = (opts.config(EXTERNAL_FILE_KEY), int(min_size))
                except ValueError:
                    raise InvalidArgument(
                        f"session config '{EXTERNAL_MIN_SIZE_KEY}' must be an integer, got '{min_size}'"
                    ) from None
            save_graph(graph, opts.optimized_model_filepath, self._model_path, self._header, external)
        self._sess_options._check_canceled()
        compiled = CompiledGraph(graph, provider, self._facts)
        with self._lock:
            self._providers = chosen
            self._provider_options = chosen_opts
            self._provider: Provider = provider
            self._compiled = compiled
            self._plans = {}
            self._debug_compiled = None

    # -- onnxruntime's query API -----------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_modelmeta(self) -> ModelMetadata:
        return self._meta

    def get_providers(self) -> list[str]:
        return list(self._providers)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Each provider's options as it runs with them (see ``_reported_options``)."""
        return {n: _reported_options(n, o) for n, o in zip(self._providers, self._provider_options)}

    def get_session_options(self) -> SessionOptions:
        return self._sess_options._snapshot()  # a copy, as onnxruntime returns

    def set_providers(
        self, providers: Sequence[Any] | None = None, provider_options: Sequence[dict[str, Any]] | None = None
    ) -> None:
        with logs.scope(self._sess_options.log_severity_level, self._sess_options.logid):
            self._set_providers(providers, provider_options)

    def get_tuning_results(self) -> list[dict[str, Any]]:
        """onnxpy has no tunable kernels: there are never tuning results."""
        return []

    def set_tuning_results(self, results: Sequence[dict[str, Any]], error_on_invalid: bool = False) -> None:
        """Accepted for compatibility: onnxpy has no tunable kernels to give them to."""

    def get_input_memory_infos(self) -> list[Any]:
        unsupported.refuse("InferenceSession.get_input_memory_infos", unsupported.ALLOCATOR)

    def get_output_memory_infos(self) -> list[Any]:
        unsupported.refuse("InferenceSession.get_output_memory_infos", unsupported.ALLOCATOR)

    def get_input_epdevices(self) -> list[devices.OrtEpDevice]:
        """The device each input of get_inputs() is fed on, in order: the device of the session's
        provider (an onnxpy session keeps its graph inputs on its provider's device)."""
        provider = self._provider
        device = devices.device_of_provider(provider.name, provider.device_type, provider.device_id)
        return [device] * len(self._inputs)

    def get_provider_graph_assignment_info(self) -> list[devices.OrtEpAssignedSubgraph]:
        """The nodes of the graph as this session runs it (after optimization), each with the
        provider that runs it, one OrtEpAssignedSubgraph per node as onnxruntime's CPU provider
        reports them: the nodes of subgraphs (If, Loop, Scan bodies) first, then the main
        graph's. The copies onnxpy inserts between devices are left out. Needs the session
        config entry 'session.record_ep_graph_assignment_info' set to '1', as in onnxruntime."""
        if self._sess_options.config(RECORD_ASSIGNMENT_KEY) != "1":
            raise Fail(
                f"Session configuration entry '{RECORD_ASSIGNMENT_KEY}' must be set to \"1\" to retrieve EP graph "
                "assignment information."
            )
        with self._lock:
            compiled = self._compiled
        return _assignment(compiled.graph, compiled.bound, [p.name for p in compiled.placement.providers])

    def set_ep_dynamic_options(self, options: dict[str, str]) -> None:
        """Accepted and kept, no effect: none of onnxpy's providers has options that change while
        a session lives (onnxruntime's CPU provider also accepts any key and ignores it). An empty
        dict is refused, as in onnxruntime."""
        if not isinstance(options, dict):
            raise InvalidArgumentType(
                f"set_ep_dynamic_options takes a dict of str to str, got {type(options).__name__}"
            )
        if not options:
            raise InvalidArgument("set_ep_dynamic_options: No options were provided")
        for key, value in options.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise InvalidArgumentType(f"set_ep_dynamic_options takes a dict of str to str, got {key!r}: {value!r}")
        with self._lock:
            self._ep_dynamic_options.update(options)

    def release_captured_graph(self, graph_annotation_id: int = 0) -> None:
        """Drop the CUDA graphs captured for this session's IOBindings (provider option
        enable_cuda_graph): their next run captures again. onnxpy captures under annotation id 0
        only (it does not read the run config 'gpu_graph_id'), so other ids, and sessions
        without captured graphs, have nothing to release, as in onnxruntime."""
        if isinstance(graph_annotation_id, bool) or not isinstance(graph_annotation_id, (int, np.integer)):
            raise InvalidArgumentType(
                f"release_captured_graph: graph_annotation_id must be an int, got {graph_annotation_id!r}"
            )
        if graph_annotation_id != 0:
            return
        for binding in list(self._bindings):
            state = binding._graph
            if state is not None and state.captured is not None:
                binding._graph = None

    def create_ortvalue_from_shape_and_type(
        self,
        shape: Sequence[int],
        element_type: Any,
        device_type: str,
        device_id: int = 0,
        vendor_id: int = -1,
    ) -> OrtValue:
        """An uninitialized tensor of ``shape`` and ``element_type`` (a numpy type, or an ONNX
        element type as an int) on a device this session allocates on: the CPU, or the device of
        its provider. Numeric types only, as in onnxruntime. Unlike onnxruntime's, the value is
        not tied to this session: its memory is numpy's or CuPy's, not the session's allocator."""
        what = "create_ortvalue_from_shape_and_type"
        if isinstance(vendor_id, bool) or not isinstance(vendor_id, (int, np.integer)):
            raise InvalidArgumentType(f"{what}: vendor_id must be an int, got {vendor_id!r}")
        if not isinstance(device_type, str):
            raise InvalidArgumentType(f"{what}: device_type must be a string such as 'cpu', got {device_type!r}")
        if isinstance(device_id, bool) or not isinstance(device_id, (int, np.integer)):
            raise InvalidArgumentType(f"{what}: device_id must be an int, got {device_id!r}")
        dt = _element_dtype(element_type)
        if dt.hasobject:
            raise InvalidArgument(
                f"{what}: Creation of OrtValues is currently only supported for numeric tensor types, got "
                f"{element_type!r}"
            )
        kind = device_type.lower()
        kind = "cuda" if kind == "gpu" else kind
        provider = self._provider
        here = [("cpu", 0), (provider.device_type, provider.device_id)]
        if (kind, int(device_id)) not in here:
            raise InvalidArgument(
                f"{what}: No session allocator found for device '{device_type}:{device_id}': this session "
                f"({provider.name}) allocates on {sorted({f'{k}:{i}' for k, i in here})}"
            )
        return OrtValue.ortvalue_from_shape_and_type(shape, dt, kind, int(device_id))

    def disable_fallback(self) -> None:
        """Accepted for compatibility: onnxpy never silently changes provider during a run."""

    def enable_fallback(self) -> None:
        """Accepted for compatibility."""

    @property
    def _model_opset(self) -> dict[str, int]:
        return dict(self._opset)

    # -- running ---------------------------------------------------------------------------------
    def run(
        self, output_names: Sequence[str] | None, input_feed: dict[str, Any], run_options: RunOptions | None = None
    ) -> list[Any]:
        """Run the model; returns numpy arrays (lists for sequences, None for empty optionals)."""
        if run_options is None and not output_names and input_feed.__class__ is dict:
            out = self._run_plain(input_feed)
            if out is not None:
                return out
        if not isinstance(input_feed, dict):
            raise InvalidArgumentType(
                f"input_feed must be a dict of input name -> array, got {type(input_feed).__name__}"
            )
        feeds = {name: self._prepare_feed(name, value) for name, value in input_feed.items()}
        values = self._run_device(output_names, feeds, run_options)
        return self._to_user_all(values, feeds)

    def _run_plain(self, input_feed: dict[str, Any]) -> list[Any] | None:
        """The common call, with less ceremony: host arrays of the declared tensor types into a
        CPU session without profiling, debugging or a thread cap. None when anything is less
        plain; the general path then runs (and reports problems)."""
        compiled = self._compiled
        if (
            self._profiler is not None
            or self._facts.intra_op_threads
            or self._facts.check_nan_inf
            or self._facts.debug_level
            or compiled.provider.device_type != "cpu"
        ):
            return None
        if compiled._mixed is None:
            compiled._mixed = compiled.placement.mixed
        if compiled._mixed:
            return None
        specs = self._input_specs
        for name, value in input_feed.items():
            spec = specs.get(name)
            if spec is None or value.__class__ is not np.ndarray or spec.kind != "tensor_type":
                return None
            if value.dtype.kind in ("U", "S", "O") or not value.dtype.isnative:
                return None  # converted by the general path
            self._check_tensor(spec, value)
        for name in self._required:
            if name not in input_feed:
                return None
        if self._optional_inputs:
            return None  # the general path fills the optional inputs left out
        plan = compiled.plan
        feed_ids = plan.feed_ids
        try:
            with quiet_floats():
                feeds = {feed_ids[n]: v for n, v in input_feed.items()}
                out = None if self._split is None else self._split_runner(plan).run(feeds)
                if out is None:
                    out = contention.WATCH.call(self._run_times, execute, plan, feeds)
        except RecursionError as e:
            raise InvalidGraph(f"the model nests too deeply to run: {e}") from e
        self._check_declared(self._output_tuple, out)
        return self._to_user_all(out, input_feed)

    def _split_device_run(self, compiled: CompiledGraph, plan: Any, feeds: dict[str, Any]) -> list[Any] | None:
        """A split run for the general path (output names, run options, IOBinding) where it can
        be one: host arrays into a CPU session without a thread cap. None otherwise."""
        if self._facts.intra_op_threads or compiled.provider.device_type != "cpu" or compiled.placement.mixed:
            return None
        if any(v.__class__ is not np.ndarray for v in feeds.values()):
            return None
        return self._split_runner(plan).run({plan.feed_ids[n]: v for n, v in feeds.items()})

    def _split_runner(self, plan: Any) -> SplitRunner:
        """The row-split runner of ``plan`` (a new plan, after set_providers, starts afresh)."""
        split = self._split
        assert split is not None
        split.serve(plan)
        return split

    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: dict[str, Any],
        callback: Any,
        user_data: Any,
        run_options: RunOptions | None = None,
    ) -> None:
        """Run the model on a worker thread, then call ``callback(results, user_data, err)`` there:
        the results of ``run`` and ``""``, or ``[]`` and the error's message. Returns at once.

        As in onnxruntime, the input arrays are read while the run goes on: do not change them
        before the callback. A callback that raises is reported through threading.excepthook."""
        if not callable(callback):
            raise InvalidArgumentType(f"run_async: callback must be callable, got {type(callback).__name__}")
        if not isinstance(input_feed, dict):
            raise InvalidArgumentType(
                f"input_feed must be a dict of input name -> array, got {type(input_feed).__name__}"
            )
        missing = [n for n in self._required if n not in input_feed]
        if missing:
            raise InvalidArgument(f"Required inputs ({missing}) are missing from input feed ({list(input_feed)}).")
        if run_options is not None:
            _check_run_options(run_options)
        # Copies of the containers (not the arrays): the caller may reuse them meanwhile.
        names = None if output_names is None else list(output_names)
        feeds = dict(input_feed)

        def work() -> None:
            with pool_task():  # between tasks this thread is parked (runtime/threads.py)
                try:
                    results, err = self.run(names, feeds, run_options), ""
                except Exception as e:  # noqa: BLE001 - handed to the callback, as onnxruntime does
                    results, err = [], str(e) or type(e).__name__
                try:
                    callback(results, user_data, err)
                except BaseException:  # noqa: BLE001 - nobody to raise to on a worker thread
                    threading.excepthook(threading.ExceptHookArgs((*sys.exc_info(), threading.current_thread())))

        try:
            _async_pool().submit(work)
        except RuntimeError as e:  # the interpreter is shutting down: no thread can start
            raise Fail(f"run_async: cannot start a run now ({e})") from e

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: dict[str, OrtValue],
        run_options: RunOptions | None = None,
    ) -> list[OrtValue]:
        feeds = {}
        for name, v in input_dict_ort_values.items():
            if not isinstance(v, OrtValue):
                raise InvalidArgumentType(
                    f"run_with_ort_values: input '{name}' must be an OrtValue, got {type(v).__name__}"
                )
            feeds[name] = self._prepare_feed(name, v)
        values = self._run_device(output_names, feeds, run_options)
        provider = self._provider
        results: list[Any] = []
        for v in values:
            v = provider.contiguous(v)
            if provider.is_device_array(v) and _aliased(provider, v, feeds.values(), results):
                v = provider.xp.array(v, copy=True)  # the caller's input, or another result
            results.append(v)
        return [OrtValue(v, provider) for v in results]

    def run_with_ortvaluevector(
        self,
        run_options: RunOptions | None,
        feed_names: Sequence[str],
        feeds: Sequence[OrtValue],
        fetch_names: Sequence[str],
        fetches: list[OrtValue],
        fetch_devices: Sequence[OrtDevice],
    ) -> None:
        """Run with inputs and outputs as parallel lists, filling ``fetches`` in place as
        onnxruntime fills its OrtValueVector: an empty list gets one OrtValue per fetch name
        (on the device ``fetch_devices`` gives for it); a list of one tensor OrtValue per fetch
        name has the results written into their memory (checked for shape and type first,
        nothing written when one does not fit).

        onnxruntime takes its native OrtValueVector here; onnxpy takes Python lists (or any
        sequence for the feeds) of its OrtValues. ``run_options`` may be None."""
        what = "run_with_ortvaluevector"
        feed_names, feeds = _sequence(feed_names, f"{what}: feed_names"), _sequence(feeds, f"{what}: feeds")
        fetch_names = _sequence(fetch_names, f"{what}: fetch_names")
        devs = _sequence(fetch_devices, f"{what}: fetch_devices")
        if not isinstance(fetches, list):
            raise InvalidArgumentType(
                f"{what}: fetches must be a list (filled in place with the results), got {type(fetches).__name__}"
            )
        if len(feed_names) != len(feeds):
            raise InvalidArgument(f"feed names has {len(feed_names)} elements, but feed has {len(feeds)} elements.")
        if not fetch_names:
            raise InvalidArgument("At least one output should be requested.")
        if fetches and len(fetches) != len(fetch_names):
            raise InvalidArgument(
                f"fetch names has {len(fetch_names)} elements, but fetch has {len(fetches)} elements."
            )
        if len(devs) < len(fetch_names):
            raise InvalidArgument(
                f"{what}: fetch_devices has {len(devs)} elements, but fetch names has {len(fetch_names)}: give "
                "one OrtDevice per fetch name"
            )
        for d in devs[: len(fetch_names)]:
            if not isinstance(d, OrtDevice):
                raise InvalidArgumentType(f"{what}: fetch_devices must hold OrtDevice instances, got {d!r}")
        for f in fetches:
            if not isinstance(f, OrtValue) or not f.is_tensor():
                raise InvalidArgumentType(
                    f"{what}: fetches must be empty or hold one tensor OrtValue per name, got {f!r}"
                )
        inputs: dict[str, OrtValue] = {}
        for name, value in zip(feed_names, feeds):
            if not isinstance(name, str):
                raise InvalidArgumentType(f"{what}: feed names must be strings, got {name!r}")
            inputs[name] = value
        for name in fetch_names:
            if not isinstance(name, str):
                raise InvalidArgumentType(f"{what}: fetch names must be strings, got {name!r}")
            if name not in self._value_names:
                raise InvalidArgument(f"Invalid output name:{name}")
        results = self.run_with_ort_values(list(fetch_names), inputs, run_options)
        if fetches:
            _write_into(fetches, results, list(fetch_names))
            return
        placed = []
        for value, device in zip(results, devs):
            target = provider_for_device(device.name(), device.device_id())
            placed.append(value if _same_device(value._provider, target) else _moved(value, target))
        fetches.extend(placed)

    def run_with_iobinding(self, iobinding: Any, run_options: RunOptions | None = None) -> None:
        from .iobinding import IOBinding

        if not isinstance(iobinding, IOBinding):
            raise InvalidArgumentType(
                f"run_with_iobinding needs an IOBinding from this session's io_binding(), got {type(iobinding).__name__}"
            )
        if iobinding._session is not self:
            raise InvalidArgument(
                "run_with_iobinding: this IOBinding was created by another session; use this session's io_binding()"
            )
        if run_options is not None:
            _check_run_options(run_options)
        iobinding._run(run_options)

    def io_binding(self) -> Any:
        from .iobinding import IOBinding

        binding = IOBinding(self)
        self._bindings.add(binding)
        return binding

    def end_profiling(self) -> str:
        """Stop profiling and write the trace; returns its path ('' when profiling is off)."""
        if self._profiler is None:
            return ""
        try:
            path = self._profiler.write()
        except OSError as e:
            raise NoSuchFile(
                f"end_profiling could not write the trace (profile_file_prefix "
                f"{self._sess_options.profile_file_prefix!r}): {type(e).__name__}: {e}"
            ) from e
        self._profiler = None
        return path

    def get_profiling_start_time_ns(self) -> int:
        return self._profiling_start_ns

    # -- internals shared with IOBinding ---------------------------------------------------------
    def _prepare_feed(self, name: str, value: Any) -> Any:
        """Check one feed against the model's declaration and put it on the session's device."""
        spec = self._input_specs.get(name)
        if spec is None:
            raise InvalidArgument(
                f"Invalid input name: '{name}'. The model's inputs are: {[a.name for a in self._inputs]}"
                + (f"; overridable initializers: {[a.name for a in self._overridable]}" if self._overridable else "")
            )
        provider = self._provider
        if isinstance(value, OrtValue):
            if not value.has_value():
                return None
            src = value._provider
            same_device = src is provider or (src.device_type, src.device_id) == (
                provider.device_type,
                provider.device_id,
            )
            if value.is_tensor_sequence():
                if not spec.holds_sequence:
                    raise InvalidArgument(
                        f"input '{name}' is {spec.type_str}: got an OrtValue holding a sequence ({value.data_type()})"
                    )
                items = list(value._value)
                if not same_device:
                    items = [provider.from_host(src.to_host(x)) for x in items]
                return self._check_sequence(spec, items)
            if spec.holds_sequence or spec.kind == "map_type":
                raise InvalidArgument(
                    f"input '{name}' is {spec.type_str}: got an OrtValue holding a tensor ({value.data_type()})"
                )
            if not same_device:
                arr = provider.from_host(value._provider.to_host(value._value))
            else:
                arr = value._value
        elif spec.kind == "optional_type" and value is None:
            return None
        elif spec.holds_sequence:
            if not isinstance(value, (list, tuple)):
                raise InvalidArgument(
                    f"input '{name}' is {spec.type_str}: expected a list of arrays, got {type(value).__name__}"
                )
            if spec.inner_kind == "map_type" or any(isinstance(v, dict) for v in value):
                return list(value)  # a sequence of maps (ai.onnx.ml) stays Python objects
            return self._check_sequence(spec, [provider.from_host(as_host_array(v, f"input '{name}'")) for v in value])
        elif spec.kind == "map_type":
            if not isinstance(value, dict):
                raise InvalidArgument(f"input '{name}' is {spec.type_str}: expected a dict, got {type(value).__name__}")
            return value
        elif isinstance(value, np.ndarray) and (
            value.dtype.kind in ("U", "S", "O") or not value.dtype.isnative or type(value) is not np.ndarray
        ):
            # str, object (non-str values become their str()), byte-swapped data, or a subclass
            # (np.matrix keeps two dimensions through every reduction): as a plain array.
            arr = provider.from_host(as_host_array(value, f"input '{name}'"))
        elif provider.is_device_array(value):
            arr = value
        elif value is None:
            raise InvalidArgument(f"input '{name}' is None: expected a {spec.type_str} value (a numpy array)")
        else:
            arr = provider.from_host(_python_feed(value, spec))
        if isinstance(arr, list):
            return arr
        self._check_tensor(spec, arr)
        return arr

    @staticmethod
    def _check_sequence(spec: _InputSpec, items: list[Any]) -> list[Any]:
        want = spec.element_dtype
        for i, item in enumerate(items):
            if want is not None and item.dtype != want:
                raise InvalidArgument(
                    f"Unexpected data type for element {i} of input '{spec.name}'. Actual: "
                    f"({_type_string(item.dtype)}), expected: ({spec.type_str})"
                )
        return items

    def _check_tensor(self, spec: _InputSpec, arr: Any) -> None:
        if spec.dtype is not None and arr.dtype != spec.dtype:
            raise InvalidArgument(
                f"Unexpected input data type for input '{spec.name}'. Actual: ({_type_string(arr.dtype)}), "
                f"expected: ({spec.type_str})"
            )
        if spec.rank is not None:
            if arr.ndim != spec.rank:
                raise InvalidArgument(
                    f"Invalid rank for input: {spec.name} Got: {arr.ndim} Expected: {spec.rank} "
                    f"(got shape {list(arr.shape)}). Please fix either the inputs or the model."
                )
            shape = arr.shape
            for i, d in spec.fixed:  # a loop, not a list built on every run: the common case is no mismatch
                if shape[i] != d:
                    bad = [(i, shape[i], d) for i, d in spec.fixed if shape[i] != d]
                    detail = "; ".join(f"index: {i} Got: {g} Expected: {d}" for i, g, d in bad)
                    raise InvalidArgument(
                        f"Got invalid dimensions for input: {spec.name} for the following indices: {detail} "
                        f"(got shape {list(shape)}). Please fix either the inputs or the model."
                    )

    def _resolve_outputs(self, output_names: Sequence[str] | None) -> tuple[tuple[str, ...], CompiledGraph, Any]:
        """Which compiled graph and plan serve these output names (cached per name tuple)."""
        compiled = self._compiled
        if isinstance(output_names, str):
            raise InvalidArgumentType(
                f"output_names must be a list of names (or None for all), got the string {output_names!r}; "
                f"write [{output_names!r}]"
            )
        if not output_names:
            return self._output_tuple, compiled, compiled.plan
        names = tuple(output_names)
        if names == self._output_tuple:
            return names, compiled, compiled.plan
        key = names
        with self._lock:
            hit = self._plans.get(key)
        if hit is not None:
            return names, hit[0], hit[1]
        for n in names:
            if not isinstance(n, str):
                raise InvalidArgumentType(f"output names must be strings, got {n!r}")
        if all(n in self._output_names or n in self._input_names for n in names):
            target = compiled
        else:
            # Intermediate values come from the unoptimized graph: the optimizer may have fused a
            # value away, or kept its name while changing what it holds (a bias moved into the
            # next convolution, a ReLU turned into a per-channel floor, a pool swapped with the
            # 1x1 convolution after it), which only the graph's outputs are promised to survive.
            target = self._unoptimized()
            known = target.graph.defined_names()
            unknown = [n for n in names if n not in known]
            if unknown:
                raise InvalidArgument(
                    f"Invalid output name(s): {unknown}. The model's outputs are: {self._output_names} "
                    "(any intermediate value of the graph may also be requested by name)"
                )
        plan = target.plan_for(list(names))
        with self._lock:
            if len(self._plans) >= _MAX_CACHED_PLANS:
                # Oldest first (dicts keep insertion order): a loop fetching every intermediate
                # value in turn would otherwise keep a plan per name for the session's life.
                del self._plans[next(iter(self._plans))]
            self._plans[key] = (target, plan)
        return names, target, plan

    def _unoptimized(self) -> CompiledGraph:
        with self._lock:
            if self._debug_compiled is None:
                self._debug_compiled = CompiledGraph(self._load_base_graph()[0], self._provider, self._facts)
            return self._debug_compiled

    def _run_device(
        self, output_names: Sequence[str] | None, feeds: dict[str, Any], run_options: RunOptions | None
    ) -> list[Any]:
        """Validate the feed set, run, and return device values (no host conversion)."""
        missing = [n for n in self._required if n not in feeds]
        if missing:
            raise InvalidArgument(f"Required inputs ({missing}) are missing from input feed ({list(feeds)}).")
        for name in self._optional_inputs:
            if name not in feeds:
                feeds = {**feeds, name: None}
        names, compiled, plan = self._resolve_outputs(output_names)
        terminate = None
        if run_options is not None:
            _check_run_options(run_options)
            if run_options.terminate:
                raise Fail("Exiting due to terminate flag being set to true.")
            terminate = lambda: run_options.terminate  # noqa: E731
        observer = self._facts.make_observer(self._profiler)
        started = time.perf_counter() if self._profiler is not None else 0.0
        try:
            # Kernels follow IEEE semantics (log(0) = -inf...) silently, as onnxruntime does.
            with self._facts.thread_limit(), quiet_floats():
                out = None
                if self._split is not None and terminate is None and observer is None and plan is compiled.plan:
                    out = self._split_device_run(compiled, plan, feeds)
                if out is None:
                    executing = time.perf_counter() if self._profiler is not None else 0.0
                    if self._facts.intra_op_threads or compiled.provider.device_type != "cpu":
                        out = compiled.run(feeds, plan=plan, terminate=terminate, observer=observer)
                    else:
                        watch = contention.WATCH
                        out = watch.call(self._run_times, compiled.run, feeds, plan, None, terminate, observer)
                    if self._profiler is not None:
                        self._profiler.session_event("SequentialExecutor::Execute", executing, time.perf_counter())
        except OnnxpyError:
            raise
        except RecursionError as e:
            raise InvalidGraph(f"the model nests too deeply to run: {e}") from e
        if self._profiler is not None:
            self._profiler.session_event("model_run", started, time.perf_counter())
        self._check_declared(names, out)
        return out

    def _check_declared(self, names: Sequence[str], values: list[Any]) -> None:
        """A graph output of another element type than the model declares is an error, not a
        result: onnxruntime refuses such a model when loading it (a Cast to int64 declared
        float), and numpy's type promotion must not hide it."""
        declared = self._declared
        for name, value in zip(names, values):
            want = declared.get(name)
            dt = getattr(value, "dtype", None)
            if want is None or dt is None or dt == want or isinstance(value, list):
                continue
            if not (dtypes.is_string_dtype(want) and dtypes.is_string_dtype(np.dtype(dt))):  # str or object
                raise InvalidGraph(
                    f"Type Error: the model declares output '{name}' as {dtypes.dtype_string(want)}, but its graph "
                    f"computes {_type_string(np.dtype(dt))}. Fix the output's declared type or the graph"
                )

    def _to_user_all(self, values: list[Any], feeds: dict[str, Any]) -> list[Any]:
        """Device values -> what run() returns. Each result is an array only the caller holds:
        never one of the caller's inputs, a constant, or memory another result also uses (an
        Identity output and its source, an output fetched twice), as in onnxruntime."""
        results: list[Any] = []
        for v in values:
            results.append(v if _fresh(v, feeds, results) else self._to_user(v, feeds, results))
        return results

    def _sequence_to_user(self, value: list[Any], feeds: dict[str, Any], earlier: list[Any]) -> list[Any]:
        """A sequence's elements as arrays the caller alone holds. Elements are often views
        of one tensor (SplitToSequence): each view is copied, and the arrays that own their
        memory are told apart by identity, so a long sequence costs no pairwise checks."""
        outside = [*_flat(list(feeds.values())), *_flat(earlier)]
        seen: set[int] = set()
        inner: list[Any] = []
        for v in value:
            if isinstance(v, list) or v is None or isinstance(v, dict):
                inner.append(self._to_user(v, feeds, [*earlier, *inner]))
                continue
            arr = self._provider.to_host(v)
            if not isinstance(arr, np.ndarray):
                arr = np.asarray(arr)
            elif (
                not (arr.flags.owndata and arr.flags.writeable)  # a view, or a constant
                or not arr.flags.c_contiguous
                or id(arr) in seen
                or _aliased(CPU, arr, outside, [])
            ):
                arr = np.array(arr, order="C", copy=True)
            seen.add(id(arr))
            inner.append(arr)
        return inner

    def _to_user(self, value: Any, feeds: dict[str, Any], earlier: list[Any]) -> Any:
        """One device value -> a numpy array the caller owns (``earlier``: the results so far)."""
        if value is None:
            return None
        if isinstance(value, list):
            return self._sequence_to_user(value, feeds, earlier)
        if isinstance(value, dict):
            return value  # a map (ai.onnx.ml ZipMap, DictVectorizer inputs...)
        arr = self._provider.to_host(value)
        if not isinstance(arr, np.ndarray):
            return np.asarray(arr)
        if arr.dtype.kind in "US":
            return arr.astype(object)  # string tensors are object arrays, as onnxruntime returns them
        if not arr.flags.c_contiguous:
            # A view in another layout (a transpose, a channels-last kernel result): callers of
            # onnxruntime get C-contiguous arrays, and this copy is one they own.
            return contiguous_copy(arr)
        if not arr.flags.writeable or _aliased(CPU, arr, feeds.values(), earlier):
            return arr.copy()  # a constant, the caller's input, or another result's memory
        return arr


def _fresh(v: Any, feeds: dict[str, Any], earlier: list[Any]) -> bool:
    """Whether ``v`` is a host array the caller may have as it is: numeric, C-contiguous,
    writeable, its memory its own or a whole private buffer's (a kernel's result reshaped, as
    products are), and neither a feed nor an earlier result nor a view of that memory. Such an
    array overlaps another only by sharing its memory's owner, so identity checks decide
    (``_to_user``'s general checks cost about 1 us a call more, and a reshaped first result
    sent every later one there: GPT-2's logits before its four present tensors). False, for
    those checks to decide, where a feed or an earlier result is not an array whose memory's
    owner is known (a sequence, a view of a view)."""
    if v.__class__ is not np.ndarray or v.dtype.kind in "USO":
        return False
    flags = v.flags
    if not (flags.writeable and flags.c_contiguous):
        return False
    memory = v if flags.owndata else v.base
    if memory is not v and (
        memory.__class__ is not np.ndarray or not memory.flags.owndata or memory.nbytes != v.nbytes
    ):
        return False
    for other in (*feeds.values(), *earlier):
        if other.__class__ is not np.ndarray or other is v or other is memory:
            return False
        if (
            not other.flags.owndata
            and other.base is not None
            and (other.base is memory or other.base is v or other.base.__class__ is not np.ndarray)
        ):
            return False
    return True


def _aliased(provider: Any, arr: Any, feeds: Any, earlier: list[Any]) -> bool:
    """Whether ``arr`` is, or may overlap, one of the ``feeds`` or an ``earlier`` result. An
    array owning its memory overlaps another owner only by being it, so the common case (fresh
    kernel outputs) costs identity checks only."""
    owner = getattr(getattr(arr, "flags", None), "owndata", False)
    for other in (*_flat(list(feeds)), *_flat(earlier)):
        if other is arr:
            return True
        if not provider.is_device_array(other):
            continue
        if owner and getattr(other.flags, "owndata", False):
            continue
        if provider.may_share_memory(arr, other):
            return True
    return False


def _flat(results: list[Any]) -> list[Any]:
    """The arrays among results, sequences unpacked."""
    out: list[Any] = []
    for r in results:
        if isinstance(r, list):
            out.extend(_flat(r))
        elif r is not None and not isinstance(r, dict):
            out.append(r)
    return out


RECORD_ASSIGNMENT_KEY = "session.record_ep_graph_assignment_info"


def _assignment(graph: Graph, bound: Sequence[Any], providers: Sequence[str]) -> list[devices.OrtEpAssignedSubgraph]:
    """get_provider_graph_assignment_info of a compiled graph: the nodes of its subgraphs
    (attributes in name order, as onnxruntime walks them) first, then its own."""
    nested: list[devices.OrtEpAssignedSubgraph] = []
    own: list[devices.OrtEpAssignedSubgraph] = []
    for i, node in enumerate(graph.nodes):
        if node.domain == FUSED_DOMAIN and node.op_type in (TO_HOST, FROM_HOST):
            continue  # a copy placement inserted, not a node of the model
        provider = providers[i] if i < len(providers) else providers[0]
        keywords = getattr(getattr(bound[i], "fn", None), "keywords", None) if i < len(bound) else None
        for key in sorted(node.attrs):
            value = node.attrs[key]
            subgraphs = [value] if isinstance(value, Graph) else value if isinstance(value, list) else []
            subgraphs = [g for g in subgraphs if isinstance(g, Graph)]
            if not subgraphs:
                continue
            compiled = keywords.get(key) if isinstance(keywords, dict) else None
            compiled_list = compiled if isinstance(compiled, list) else [compiled]
            for g, sub in zip(subgraphs, compiled_list + [None] * len(subgraphs)):
                inner = getattr(sub, "compiled", None)
                if isinstance(inner, CompiledGraph):
                    names = [p.name for p in inner.placement.providers]
                    nested.extend(_assignment(inner.graph, inner.bound, names))
                else:  # not compiled apart: its nodes run where the node runs
                    nested.extend(_assignment(g, [], [provider]))
        node_info = devices.OrtEpAssignedNode(node.name, node.domain, node.op_type)
        own.append(devices.OrtEpAssignedSubgraph(provider, [node_info]))
    return nested + own


def _sequence(items: Any, what: str) -> list[Any]:
    if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
        raise InvalidArgumentType(f"{what} must be a list, got {type(items).__name__}")
    return list(items)


def _same_device(a: Provider, b: Provider) -> bool:
    return a is b or (a.device_type, a.device_id) == (b.device_type, b.device_id)


def _moved(value: OrtValue, target: Provider) -> OrtValue:
    """``value`` on ``target``'s device (a fetch_devices entry other than the session's)."""
    src = value._provider
    v = value._value
    if v is None:
        return OrtValue(None, target)
    if isinstance(v, list):
        return OrtValue([target.from_host(src.to_host(x)) for x in v], target)
    host = src.to_host(v)
    return OrtValue(host if target.device_type == "cpu" else target.from_host(host), target)


def _write_into(fetches: list[OrtValue], results: list[OrtValue], names: list[str]) -> None:
    """Write each result into the preallocated fetch of its name: every one is checked before
    the first is written, so a mismatch leaves them all as they were."""
    for name, target, result in zip(names, fetches, results):
        if not result.is_tensor():
            raise InvalidArgument(
                f"output '{name}' is {result.data_type()}: it cannot be written into a tensor OrtValue"
            )
        got, want = target._value, result._value
        if got.dtype != want.dtype:
            raise InvalidArgument(
                f"Unexpected output data type for output '{name}'. Actual: ({_type_string(got.dtype)}), expected: "
                f"({_type_string(want.dtype)})"
            )
        if got.ndim != want.ndim:
            raise InvalidArgument(
                f"Invalid rank for output: {name} Got: {got.ndim} Expected: {want.ndim}. Please fix either the "
                "inputs/outputs or the model."
            )
        if tuple(got.shape) != tuple(want.shape):
            raise InvalidArgument(
                f"Got invalid dimensions for output: {name}: got shape {list(got.shape)}, expected "
                f"{list(want.shape)}. Please fix either the inputs/outputs or the model."
            )
        if not target._provider.writeable(got):
            raise InvalidArgument(f"the OrtValue given for output '{name}' is read-only")
    for target, result in zip(fetches, results):
        target.update_inplace(result)


def _check_run_options(run_options: Any) -> None:
    if not isinstance(run_options, RunOptions):
        raise InvalidArgumentType(f"run_options must be a RunOptions (or None), got {type(run_options).__name__}")


def _reported_options(name: str, given: dict[str, str]) -> dict[str, str]:
    """What get_provider_options reports for a provider. The CPU provider: nothing, as
    onnxruntime's (it takes no options that change a run). CUDA: each option onnxpy's CUDA
    provider acts on, with its value or default, as strings with booleans '0'/'1' (as
    onnxruntime reports): device_id, user_compute_stream / has_user_compute_stream and
    enable_cuda_graph. The onnxruntime options it accepts and ignores (gpu_mem_limit,
    cudnn_conv_algo_search...) are left out: onnxpy does not honour them. Other providers (added
    with onnxpy.providers.register_provider): the options given."""
    if name == "CPUExecutionProvider":
        return {}
    if name != "CUDAExecutionProvider":
        return dict(given)
    stream = _int_text(given.get("user_compute_stream", "0"))
    return {
        "device_id": str(_int_text(given.get("device_id", "0"))),
        "has_user_compute_stream": "1" if "user_compute_stream" in given else "0",
        "user_compute_stream": str(stream),
        "enable_cuda_graph": "1" if cuda_graph_option(given) else "0",
    }


def _int_text(text: str) -> int:
    """An int option as the provider read it (decimal, or hex such as a stream's 0x... address)."""
    text = text.strip()
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def _python_feed(value: Any, spec: _InputSpec) -> np.ndarray:
    """A feed given as Python data (a list, a scalar) as an array of the input's declared type,
    as onnxruntime converts it: [1, 2] feeds a float input as float32, not int64."""
    want = spec.dtype
    if want is None:
        return as_host_array(value, f"input '{spec.name}'")
    try:
        if want == np.dtype(object):
            return np.array(value, dtype=str).astype(object)  # strings: numbers become their text
        return np.array(value, dtype=want)
    except (ValueError, TypeError, OverflowError) as e:
        raise InvalidArgument(
            f"input '{spec.name}': cannot convert the {type(value).__name__} given to {spec.type_str}: {e}"
        ) from None


def _type_string(dt: np.dtype) -> str:
    return dtypes.dtype_string(dt) if _known(dt) else str(dt)


def _known(dt: np.dtype) -> bool:
    try:
        dtypes.elem_type(dt)
        return True
    except ValueError:
        return False


# onnxruntime's execution providers (onnxruntime.get_all_providers() of 1.32): names a model
# script may list whatever the build. onnxpy runs CPU and CUDA; the others are unavailable here.
ONNXRUNTIME_PROVIDERS = frozenset(
    {
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider",
        "OpenVINOExecutionProvider", "DnnlExecutionProvider", "VitisAIExecutionProvider", "QNNExecutionProvider",
        "NnapiExecutionProvider", "VSINPUExecutionProvider", "JsExecutionProvider", "CoreMLExecutionProvider",
        "DmlExecutionProvider", "RknpuExecutionProvider", "WebNNExecutionProvider", "WebGpuExecutionProvider",
        "XnnpackExecutionProvider", "CANNExecutionProvider", "AzureExecutionProvider", "CPUExecutionProvider",
        "ROCMExecutionProvider", "ArmNNExecutionProvider", "ACLExecutionProvider", "SNPEExecutionProvider",
    }
)  # fmt: skip


def _normalize_providers(
    providers: Sequence[Any] | None, provider_options: Sequence[dict[str, Any]] | None
) -> tuple[list[str], list[dict[str, Any]]]:
    if isinstance(providers, str):
        raise InvalidArgument(
            f"'providers' must be a list of provider names, got the string {providers!r}; write [{providers!r}]"
        )
    if providers is None or len(providers) == 0:
        return ["CPUExecutionProvider"], [{}]
    if provider_options is not None and (
        isinstance(provider_options, (str, dict)) or not all(isinstance(o, dict) for o in provider_options)
    ):
        raise InvalidArgument(f"'provider_options' must be a list of dicts, one per provider, got {provider_options!r}")
    names: list[str] = []
    options: list[dict[str, Any]] = []
    if provider_options is not None and len(provider_options) != len(providers):
        raise InvalidArgument(
            f"'providers' and 'provider_options' should be the same length if both are given: {len(providers)} vs {len(provider_options)}"
        )
    for i, p in enumerate(providers):
        if isinstance(p, str):
            names.append(p)
            options.append(dict(provider_options[i]) if provider_options is not None else {})
        elif isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], dict):
            if provider_options is not None:
                raise InvalidArgument(
                    "give provider options either inside 'providers' tuples or in 'provider_options', not both"
                )
            names.append(p[0])
            options.append(dict(p[1]))
        else:
            raise InvalidArgument(f"'providers' entries must be a name or a (name, options dict) tuple, got {p!r}")
    return names, options
