"""Placement: which provider runs each node, and explicit copies where values cross devices.

A graph compiled for a device provider (CUDA) keeps its boundary on that device: graph inputs,
outer-scope values and graph outputs live there. Each node runs on the device unless

- the provider cannot run it: ``provider.supports(op_type, domain)`` is false (string ops, the
  ai.onnx.ml domain, host random generators...) or a value it reads or writes has an element
  type the device cannot hold (strings, bfloat16, float8...); it falls back to the CPU, and the
  fallback is logged on the "onnxpy" logger when the session is created;
- it reads only shapes: Shape and Size run on the CPU without copying their input (they look at
  ``.shape`` only), and the small integer computations fed by them (Gather, Concat, Unsqueeze...
  over shape vectors) follow them to the CPU, so a Reshape's shape arrives on the host without
  a device round trip — as onnxruntime places shape subgraphs.

Where a value made on one side is read on the other, a copy node is inserted (onnxpy.fused
MemcpyToHost / MemcpyFromHost, run by the device provider), one per value and direction, just
before its first reader. Inputs a kernel reads on the host (``OpDef.host_inputs``: Reshape's
shape, Slice's starts...) are read wherever they are: a host value is read directly, a device
value through ``ops._compat.host_ints`` (a synchronizing device-to-host copy). Initializers are
uploaded to the device only if a device node reads them as data; those read only on the host
stay in host memory (both, when both happen).

The pass edits the graph it is given (a session's private clone) and returns a
:class:`Placement`: the provider of each node, in the graph's new node order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..ir.graph import Graph, Node, free_names_of_subgraphs
from ..model import dtypes
from ..ops import registry
from ..providers import CPU
from ..providers.base import Provider

LOG = logging.getLogger("onnxpy")

FUSED_DOMAIN = "onnxpy.fused"
TO_HOST = "MemcpyToHost"
FROM_HOST = "MemcpyFromHost"

HOST = "host"
DEVICE = "device"

#: inputs a kernel reads only for their shape: a CPU node reads them wherever they live
METADATA_INPUTS: dict[tuple[str, str], tuple[int, ...]] = {("", "Shape"): (0,), ("", "Size"): (0,)}

#: cheap ops of shape computations: on the CPU when all they read is on the host already
SHAPE_OPS = frozenset(
    {
        "Gather",
        "GatherElements",
        "Unsqueeze",
        "Squeeze",
        "Concat",
        "Slice",
        "Cast",
        "Identity",
        "Reshape",
        "Flatten",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Mod",
        "Neg",
        "Abs",
        "Min",
        "Max",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "Not",
        "And",
        "Or",
        "Where",
        "ReduceProd",
        "ReduceSum",
        "ReduceMin",
        "ReduceMax",
        "Range",
    }
)
#: a shape computation's outputs are small integer vectors; larger values stay on the device
SHAPE_VALUE_LIMIT = 1024
_SHAPE_ELEM_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL})


@dataclass
class Placement:
    """Where each node of a graph runs (aligned with ``graph.nodes`` after the pass)."""

    primary: Provider
    providers: list[Provider]
    #: nodes the primary provider cannot run, with the reason: "node 'x' (Op): why"
    fallback: list[str] = field(default_factory=list)
    #: shape computations moved to the CPU
    host_preferred: list[str] = field(default_factory=list)
    #: names of the copy nodes inserted
    copies: list[str] = field(default_factory=list)
    #: initializers kept in host memory (every other initializer goes to the primary device)
    host_constants: frozenset[str] = frozenset()

    @property
    def mixed(self) -> bool:
        """Whether some node runs on another provider than the primary one."""
        return any(p is not self.primary for p in self.providers)

    def constant_provider(self, name: str) -> Provider:
        return CPU if name in self.host_constants else self.primary

    def summary(self) -> str:
        on = sum(p is self.primary for p in self.providers)
        return (
            f"{on} of {len(self.providers)} nodes on {self.primary.name} ({len(self.copies)} copies), "
            f"{len(self.fallback)} fallen back to the CPU, {len(self.host_preferred)} shape nodes on the CPU"
        )


def run_scope(provider: Provider) -> AbstractContextManager[Any]:
    """The context a run on ``provider`` executes in: its device and stream made current."""
    activate = getattr(provider, "activate", None)
    return activate() if activate is not None else nullcontext()


def to_provider(value: Any, provider: Provider) -> Any:
    """A value (tensor, sequence, None) on ``provider``'s device, copied only if it is elsewhere."""
    if value is None:
        return None
    if isinstance(value, list):
        return [to_provider(v, provider) for v in value]
    if provider.is_device_array(value):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        return provider.from_host(np.asarray(value))
    return provider.from_host(host_copy(value))


def host_copy(value: Any) -> np.ndarray:
    """A host array of an array of any provider namespace (CuPy's has .get(); numpy's is itself)."""
    if isinstance(value, np.ndarray):
        return value
    get = getattr(value, "get", None)
    return get() if callable(get) else np.asarray(value)


def place(graph: Graph, primary: Provider, outer: Sequence[str] = (), host: Provider = CPU) -> Placement:
    """Assign a provider to every node of ``graph`` and insert the copies; see the module doc."""
    if primary.device_type == host.device_type:
        return Placement(primary, [primary] * len(graph.nodes))
    return _Placer(graph, primary, host, outer).run()


class _Placer:
    def __init__(self, graph: Graph, primary: Provider, host: Provider, outer: Sequence[str]) -> None:
        self.g = graph
        self.primary = primary
        self.host = host
        self.outer = list(outer)
        self.supports_dtype = getattr(primary, "supports_dtype", None)
        self.taken = _all_names(graph) | set(outer)
        self.inputs = set(graph.inputs)
        self.consts = {k for k in graph.initializers if k not in self.inputs}
        # Boundary values live on the device, except those of element types it cannot hold
        # (strings, bfloat16...): the provider's from_host leaves those on the host.
        self.loc: dict[str, str] = {n: DEVICE if self._device_ok(n) else HOST for n in [*graph.inputs, *outer]}
        self.on_device: dict[int, bool] = {}
        self.nodes: list[Node] = []
        self.node_provider: dict[int, Provider] = {}
        self.copy_of: dict[tuple[str, str], str] = {}
        self.pending: dict[str, Node] = {}
        self.const_needs: dict[str, set[str]] = {}
        self.const_host_readers: dict[str, list[tuple[Node, int | None]]] = {}
        self.result = Placement(primary, [])

    # -- decisions ----------------------------------------------------------------------------
    def run(self) -> Placement:
        self._assign()
        self._route_outputs()
        for n in self.g.nodes:
            self._route_inputs(n)
            self.nodes.append(n)
            self.node_provider[id(n)] = self.primary if self.on_device[id(n)] else self.host
        for node in self.pending.values():  # graph-output copies no device node read earlier
            self._emit(node)
        self.pending.clear()
        self._place_constants()
        self.g.nodes = self.nodes
        self.result.providers = [self.node_provider[id(n)] for n in self.nodes]
        self._log()
        return self.result

    def _assign(self) -> None:
        """Decide device or host per node; record where each value is made."""
        for n in self.g.nodes:
            why = self._unsupported(n)
            dev = why is None
            if why is not None:
                self.result.fallback.append(f"{n.describe()}: {why}")
            elif (n.domain, n.op_type) in METADATA_INPUTS or self._shape_computation(n):
                dev = False
                self.result.host_preferred.append(n.describe())
            self.on_device[id(n)] = dev
            for o in n.outputs:
                if o:
                    self.loc[o] = DEVICE if dev else HOST

    def _device_ok(self, name: str) -> bool:
        if self.supports_dtype is None:
            return True
        return all(dt is not None and self.supports_dtype(dt) for dt in self._dtypes(name))

    def _unsupported(self, n: Node) -> str | None:
        if not self.primary.supports(n.op_type, n.domain):
            return f"{self.primary.name} does not run {n.domain + '.' if n.domain else ''}{n.op_type}"
        if self.supports_dtype is None:
            return None
        for name in [*n.inputs, *n.outputs]:
            if not name:
                continue
            for dt in self._dtypes(name):
                if dt is None:
                    return f"'{name}' is a map, a host object"
                if not self.supports_dtype(dt):
                    return f"'{name}' holds {dt}, which {self.primary.name} cannot hold"
        return None

    def _dtypes(self, name: str) -> Iterable[np.dtype | None]:
        """Element dtypes of a value (None for a map); nothing when unknown."""
        if name in self.g.initializers:
            yield self.g.initializers[name].dtype
            return
        tp = self.g.types.get(name)
        while tp is not None:
            kind = tp.WhichOneof("value")
            if kind == "tensor_type":
                if tp.tensor_type.elem_type:
                    try:
                        yield dtypes.np_dtype(tp.tensor_type.elem_type)
                    except ValueError:
                        yield np.dtype(object)
                return
            if kind == "sequence_type":
                tp = tp.sequence_type.elem_type
            elif kind == "optional_type":
                tp = tp.optional_type.elem_type
            elif kind == "map_type":
                yield None
                return
            else:
                return

    def _shape_computation(self, n: Node) -> bool:
        """A small integer op over values already on the host (shape vectors): run it there."""
        if n.domain or n.op_type not in SHAPE_OPS or any(True for _ in n.subgraphs()):
            return False
        ins = [i for i in n.inputs if i]
        if not ins or not all(i in self.consts or self.loc.get(i) == HOST for i in ins):
            return False
        if not any(self.loc.get(i) == HOST for i in ins if i not in self.consts):
            return False
        for o in n.outputs:
            if not o:
                continue
            if self.g.elem_type(o) not in _SHAPE_ELEM_TYPES:
                return False
            shape = self.g.shape(o)
            if shape is not None and all(isinstance(d, int) for d in shape) and int(np.prod(shape)) > SHAPE_VALUE_LIMIT:
                return False
        return True

    # -- routing ------------------------------------------------------------------------------
    def _route_outputs(self) -> None:
        """Graph outputs end on the device: a host-made output is renamed and copied back."""
        producers = self.g.producers()
        for v in dict.fromkeys(self.g.outputs):
            if v in self.consts:
                self._need_const(v, DEVICE, None, None)
                continue
            if self.loc.get(v) != HOST or v not in producers or not self._device_ok(v):
                continue  # already on the device, or of a type only the host holds
            h = self._fresh(f"{v}__host")
            prod = producers[v]
            prod.outputs = [h if o == v else o for o in prod.outputs]
            for n in self.g.nodes:
                n.inputs = [h if i == v else i for i in n.inputs]
                for sub in n.subgraphs():
                    _rename_free(sub, v, h)
            self._copy_type(v, h)
            self.loc[h] = HOST
            self.loc[v] = DEVICE
            copy = self._copy_node(h, v, DEVICE)
            self.copy_of[(h, DEVICE)] = v
            self.pending[v] = copy

    def _route_inputs(self, n: Node) -> None:
        dev = self.on_device[id(n)]
        need = DEVICE if dev else HOST
        if dev:
            opdef = registry.resolve(n.domain, n.op_type, n.opset, self.primary.name)
            flexible = set(opdef.host_inputs) if opdef is not None else set()
        else:
            flexible = set(METADATA_INPUTS.get((n.domain, n.op_type), ()))
        for idx, name in enumerate(n.inputs):
            if not name:
                continue
            if name in self.consts:
                self._need_const(name, HOST if (not dev or idx in flexible) else DEVICE, n, idx)
                continue
            have = self.loc.get(name)
            if have is None or have == need or idx in flexible:
                continue
            n.inputs[idx] = self._copy(name, need)
        for name in sorted(free_names_of_subgraphs(n)):
            if name in self.consts:
                self._need_const(name, need, n, None)
                continue
            have = self.loc.get(name)
            if have is None or have == need:
                continue
            new = self._copy(name, need)
            for sub in n.subgraphs():
                _rename_free(sub, name, new)

    def _need_const(self, name: str, where: str, reader: Node | None, idx: int | None) -> None:
        self.const_needs.setdefault(name, set()).add(where)
        if where == HOST and reader is not None:
            self.const_host_readers.setdefault(name, []).append((reader, idx))

    def _place_constants(self) -> None:
        host_consts: set[str] = set()
        for name, needs in self.const_needs.items():
            if needs == {HOST}:
                host_consts.add(name)
            elif HOST in needs:
                alias = self._fresh(f"{name}__host")
                self.g.initializers[alias] = self.g.initializers[name]
                self._copy_type(name, alias)
                host_consts.add(alias)
                for node, idx in self.const_host_readers.get(name, []):
                    if idx is None:
                        for sub in node.subgraphs():
                            _rename_free(sub, name, alias)
                    else:
                        node.inputs[idx] = alias
        self.result.host_constants = frozenset(host_consts)

    def _copy(self, name: str, need: str) -> str:
        """The name holding ``name``'s value on the ``need`` side, adding the copy on first use."""
        key = (name, need)
        out = self.copy_of.get(key)
        if out is not None:
            pending = self.pending.pop(out, None)
            if pending is not None:
                self._emit(pending)
            return out
        out = self._fresh(f"{name}__to_{need}")
        self._copy_type(name, out)
        self.loc[out] = need
        self.copy_of[key] = out
        self._emit(self._copy_node(name, out, need))
        return out

    def _copy_node(self, src: str, dst: str, need: str) -> Node:
        op_type = TO_HOST if need == HOST else FROM_HOST
        return Node(op_type, [src], [dst], name=f"{op_type}:{dst}", domain=FUSED_DOMAIN, opset=1)

    def _emit(self, node: Node) -> None:
        self.nodes.append(node)
        self.node_provider[id(node)] = self.primary
        self.on_device[id(node)] = True
        self.result.copies.append(node.name)

    def _fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}{k}"
        self.taken.add(name)
        return name

    def _copy_type(self, src: str, dst: str) -> None:
        tp = self.g.types.get(src)
        if tp is not None:
            self.g.types[dst] = tp

    def _log(self) -> None:
        r = self.result
        where = f"graph '{self.g.name}'" if self.g.name else "the graph"
        if r.fallback:
            shown = "; ".join(r.fallback[:20]) + (
                f"; ... ({len(r.fallback) - 20} more)" if len(r.fallback) > 20 else ""
            )
            LOG.warning(
                "%d node(s) of %s run on %s because %s cannot run them (%d copies inserted): %s",
                len(r.fallback),
                where,
                self.host.name,
                self.primary.name,
                len(r.copies),
                shown,
            )
        if r.host_preferred:
            LOG.info("%s: %d shape computation node(s) run on the CPU", where, len(r.host_preferred))
        LOG.debug("%s: %s", where, r.summary())


def _all_names(graph: Graph) -> set[str]:
    names = set(graph.inputs) | set(graph.outputs) | set(graph.initializers)
    for n in graph.nodes:
        names.update(i for i in n.inputs if i)
        names.update(o for o in n.outputs if o)
        for sub in n.subgraphs():
            names |= _all_names(sub)
    return names


def _rename_free(g: Graph, old: str, new: str) -> None:
    """Make a subgraph (and its nested ones) read outer value ``new`` where it read ``old``."""
    if old in g.defined_names():
        return  # a local value of that name (shadowing is invalid ONNX; never rename it)
    for n in g.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]
        for sub in n.subgraphs():
            _rename_free(sub, old, new)
    g.outputs = [new if o == old else o for o in g.outputs]
