"""Kernel registry: ``@op`` registers a plain function; ``resolve`` picks one per node.

A kernel is ``fn(xp, *inputs, **attributes)``: inputs positional in spec order (None for an
omitted optional input), attributes keyword-only with the spec's exact names and defaults equal
to the schema's. It returns one array (or a list for a sequence output, None for an empty
optional), or a tuple when the node has several outputs.

A kernel may declare two extra keyword-only parameters that the runtime fills in:

- ``ctx``: a :class:`NodeContext` with facts fixed at session creation (node name, number of
  outputs, static input/output types, opset, the outer-scope names a subgraph reads).
- ``out``: a preallocated array the kernel may write its (single) result into; the kernel must
  return the array it wrote. Only passed when the planner decided it is safe.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Keyword-only parameters that are not ONNX attributes ("into": a split run's output band).
RUNTIME_PARAMS = frozenset({"ctx", "out", "into"})


@dataclass(frozen=True)
class OpDef:
    op_type: str
    domain: str
    since: int
    fn: Callable[..., Any]
    provider: str | None = None
    # {input index: output index}: the output may reuse the input's buffer when it dies here.
    may_inplace: dict[int, int] = field(default_factory=dict)
    # The kernel checks an ``out`` buffer itself (shape, dtype, whether it can use it): the
    # executor offers the may_inplace input without requiring the other inputs to broadcast
    # to it, as an elementwise kernel would (FusedConv's residual addend: X has another shape).
    out_checked: bool = False
    # {output index: input index}: the output may be a view of that input (Reshape, Squeeze...).
    alias: dict[int, int] = field(default_factory=dict)
    # Inputs the kernel reads on the host (shapes, axes...); a device provider keeps them there.
    host_inputs: tuple[int, ...] = ()
    # Attribute names the kernel accepts, and whether it wants ctx / out.
    attributes: frozenset[str] = frozenset()
    wants_ctx: bool = False
    accepts_out: bool = False
    # Accepts any attribute name (for kernels that take **attrs).
    open_attributes: bool = False

    @property
    def qualified_name(self) -> str:
        return f"{self.domain + '.' if self.domain else ''}{self.op_type}"


_REGISTRY: dict[tuple[str, str], list[OpDef]] = {}


def op(
    op_type: str,
    since: int = 1,
    *,
    domain: str = "",
    provider: str | None = None,
    may_inplace: dict[int, int] | None = None,
    alias: dict[int, int] | None = None,
    host_inputs: tuple[int, ...] = (),
    out_checked: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as the kernel of (domain, op_type) from opset ``since`` on."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        params = sig.parameters.values()
        kwonly = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        opdef = OpDef(
            op_type=op_type,
            domain="" if domain == "ai.onnx" else domain,
            since=since,
            fn=fn,
            provider=provider,
            may_inplace=dict(may_inplace or {}),
            out_checked=out_checked,
            alias=dict(alias or {}),
            host_inputs=tuple(host_inputs),
            attributes=frozenset(kwonly - RUNTIME_PARAMS),
            wants_ctx="ctx" in kwonly,
            accepts_out="out" in kwonly,
            open_attributes=any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
        )
        entries = _REGISTRY.setdefault((opdef.domain, op_type), [])
        for e in entries:
            if e.since == since and e.provider == provider:
                raise ValueError(f"kernel {opdef.qualified_name} since {since} ({provider or 'any'}) registered twice")
        entries.append(opdef)
        entries.sort(key=lambda e: e.since)
        return fn

    return register


def resolve(domain: str, op_type: str, opset: int, provider: str | None = None) -> OpDef | None:
    """The kernel with the highest ``since`` not above ``opset``; a provider's own kernel wins."""
    entries = _REGISTRY.get(("" if domain == "ai.onnx" else domain, op_type))
    if not entries:
        return None
    best: OpDef | None = None
    for e in entries:
        if e.since > opset or (e.provider is not None and e.provider != provider):
            continue
        if best is None or e.since > best.since or (e.since == best.since and e.provider is not None):
            best = e
    return best


def versions(domain: str, op_type: str) -> list[int]:
    """The ``since`` versions registered for an op (for error messages)."""
    return sorted({e.since for e in _REGISTRY.get(("" if domain == "ai.onnx" else domain, op_type), [])})


def all_kernels() -> list[OpDef]:
    return [e for entries in _REGISTRY.values() for e in entries]


@dataclass(frozen=True)
class NodeContext:
    """Facts about one node, fixed at session creation, handed to kernels that ask for ``ctx``."""

    name: str
    op_type: str
    domain: str
    opset: int
    n_inputs: int
    n_outputs: int
    # Which outputs the graph uses (an optional output may be omitted with an empty name).
    outputs_used: tuple[bool, ...]
    # Static ONNX element types (0 when unknown) of inputs and outputs.
    input_elem_types: tuple[int, ...]
    output_elem_types: tuple[int, ...]
    # Static shapes (None when unknown) of inputs and outputs.
    input_shapes: tuple[Any, ...]
    output_shapes: tuple[Any, ...]
    # Names of outer-scope values passed after the explicit inputs (nodes with subgraphs).
    implicit_inputs: tuple[str, ...] = ()
    # Session-level facts kernels may need (provider name, config entries, byte budget...).
    session: Any = None
    # Per-node results a kernel derives from input shapes alone (checked geometry, chosen
    # path), so later runs with the same shapes skip the work; see ``memoized``.
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)


# Distinct keys remembered per node before its memo starts afresh (dynamic shapes).
MEMO_ENTRIES = 16


_MISSING = object()


def memoized(ctx: Any, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, remembered in the node's ``ctx.memo`` under ``key`` (no ctx: computed each
    call). Only for results that depend on nothing but ``key`` and the node's attributes, and
    are immutable; exceptions are not remembered, so invalid inputs raise every time."""
    memo = getattr(ctx, "memo", None)
    if memo is None or key is None:
        return compute()
    hit = memo.get(key, _MISSING)
    if hit is _MISSING:  # a remembered None (PointwiseDepthwiseConv: "no fast path") is a hit
        hit = compute()
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        memo[key] = hit
    return hit
