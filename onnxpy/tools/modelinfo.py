"""``onnxpy info``: what a model file holds and whether onnxpy can run all of it."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..model import dtypes
from .feeds import describe_dims, model_inputs
from .table import format_table, human_bytes, human_count


@dataclass
class OpUse:
    domain: str
    op_type: str
    opset: int
    count: int
    #: "kernel", "function" (expanded from a function body into ops that have kernels) or "missing"
    status: str
    detail: str = ""


@dataclass
class ModelInfo:
    path: str
    file_bytes: int
    ir_version: int
    producer: str
    graph_name: str
    domain: str
    model_version: int
    doc: str
    opsets: dict[str, int]
    metadata: dict[str, str]
    inputs: list[tuple[str, str, str]]
    outputs: list[tuple[str, str, str]]
    nodes: int
    ops: list[OpUse]
    param_count: int
    param_bytes: int
    param_tensors: int
    params_by_type: dict[str, tuple[int, int]]
    external_tensors: int
    #: weights a ConstantOfShape builds at run time from a constant shape: (tensors, values)
    computed_weights: tuple[int, int]
    local_functions: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[OpUse]:
        return [o for o in self.ops if o.status == "missing"]

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        d["missing"] = [f"{o.domain or 'ai.onnx'}::{o.op_type}" for o in self.missing]
        return d


def _graphs(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from _graphs(sub)


#: operators whose outputs differ from one run (and one runtime) to the next
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


def random_operators(model: onnx.ModelProto) -> list[str]:
    """The random operators the model uses (subgraphs included), sorted."""
    found = {n.op_type for g in _graphs(model.graph) for n in g.node if _norm(n.domain) == ""}
    found |= {n.op_type for f in model.functions for n in f.node if _norm(n.domain) == ""}
    return sorted(found & RANDOM_OPS)


def _norm(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _type_name(elem: int) -> str:
    return dtypes.ELEM_TO_NAME.get(elem, f"elem_type {elem}")


_PACKED_4BIT = frozenset({"int4", "uint4", "float4e2m1"})


def _tensor_bytes(elem: int, count: int) -> int:
    if _type_name(elem) in _PACKED_4BIT:  # two values a byte
        return (count + 1) // 2
    try:
        return dtypes.np_dtype(elem).itemsize * count
    except ValueError:
        return 0


def _op_status(domain: str, op_type: str, opset: int, local: set[tuple[str, str]]) -> tuple[str, str]:
    import onnxpy.ops  # noqa: F401 - registers the kernels

    from ..ops import registry

    if (domain, op_type) in local:
        return "function", "model-local function"
    if registry.resolve(domain, op_type, opset) is not None:
        return "kernel", ""
    try:
        schema = onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain=domain)
    except Exception:  # noqa: BLE001 - onnx knows no such op (custom domain, typo, newer onnx)
        schema = None
    if schema is not None:
        if any(v <= opset for v in schema.function_opset_versions) or any(
            v <= opset for v in schema.context_dependent_function_opset_versions
        ):
            return "function", "expanded from its ONNX function body"
    have = registry.versions(domain, op_type)
    if have:
        return "missing", f"onnxpy has it from opset {have[0]}, the model imports {domain or 'ai.onnx'} {opset}"
    if schema is None:
        return "missing", f"unknown operator {domain or 'ai.onnx'}::{op_type}"
    return "missing", "no kernel in onnxpy"


def inspect_model(path: str) -> ModelInfo:
    model = onnx.load(path, load_external_data=False)
    opsets = {_norm(o.domain): int(o.version) for o in model.opset_import}
    local = {(_norm(f.domain), f.name) for f in model.functions}

    hist: Counter[tuple[str, str]] = Counter()
    nodes = 0
    count = nbytes = tensors = external = 0
    by_type: dict[str, list[int]] = {}
    computed_tensors = computed_values = 0

    def add_param(elem: int, n: int) -> None:
        nonlocal count, nbytes, tensors
        b = _tensor_bytes(elem, n)
        count += n
        nbytes += b
        tensors += 1
        slot = by_type.setdefault(_type_name(elem), [0, 0])
        slot[0] += n
        slot[1] += b

    bodies = list(_graphs(model.graph))
    for g in bodies:
        shapes_of = {t.name: t for t in g.initializer}
        for t in g.initializer:
            add_param(t.data_type, int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1)
            if t.data_location == onnx.TensorProto.EXTERNAL:
                external += 1
        for sp in g.sparse_initializer:
            add_param(sp.values.data_type, int(np.prod(sp.values.dims, dtype=np.int64)) if sp.values.dims else 0)
        for n in g.node:
            nodes += 1
            hist[(_norm(n.domain), n.op_type)] += 1
            if n.op_type == "Constant" and _norm(n.domain) == "":
                for a in n.attribute:
                    if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                        add_param(a.t.data_type, int(np.prod(a.t.dims, dtype=np.int64)) if a.t.dims else 1)
            if n.op_type == "ConstantOfShape" and n.input and n.input[0] in shapes_of:
                shape_t = shapes_of[n.input[0]]
                if shape_t.data_location != onnx.TensorProto.EXTERNAL:
                    computed_tensors += 1
                    computed_values += int(np.prod(onnx.numpy_helper.to_array(shape_t), dtype=np.int64))
    for f in model.functions:
        for n in f.node:
            hist[(_norm(n.domain), n.op_type)] += 0  # listed (status checked) but not counted as graph nodes

    ops: list[OpUse] = []
    for (dom, op), c in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])):
        opset = opsets.get(dom, 0)
        if not opset:
            status, detail = (
                ("function", "model-local function")
                if (dom, op) in local
                else (
                    "missing",
                    f"the model does not import domain '{dom}'",
                )
            )
        else:
            status, detail = _op_status(dom, op, opset, local)
        ops.append(OpUse(dom, op, opset, c, status, detail))

    def io(vis: Any) -> list[tuple[str, str, str]]:
        return [(vi.name, dtypes.type_string(vi.type), _dims_of(vi)) for vi in vis]

    specs = {s.name for s in model_inputs(model)}
    return ModelInfo(
        path=path,
        file_bytes=os.path.getsize(path),
        ir_version=int(model.ir_version),
        producer=(model.producer_name + (f" {model.producer_version}" if model.producer_version else "")).strip(),
        graph_name=model.graph.name,
        domain=model.domain,
        model_version=int(model.model_version),
        doc=(model.doc_string or model.graph.doc_string).strip().splitlines()[0]
        if (model.doc_string or model.graph.doc_string).strip()
        else "",
        opsets=opsets,
        metadata={p.key: p.value for p in model.metadata_props},
        inputs=io([vi for vi in model.graph.input if vi.name in specs]),
        outputs=io(model.graph.output),
        nodes=nodes,
        ops=ops,
        param_count=count,
        param_bytes=nbytes,
        param_tensors=tensors,
        params_by_type={k: (v[0], v[1]) for k, v in sorted(by_type.items(), key=lambda kv: -kv[1][1])},
        external_tensors=external,
        computed_weights=(computed_tensors, computed_values),
        local_functions=sorted(f"{d or 'ai.onnx'}::{n}" for d, n in local),
    )


def _dims_of(vi: onnx.ValueInfoProto) -> str:
    tp = vi.type
    if not (tp.HasField("tensor_type") and tp.tensor_type.HasField("shape")):
        return "?"
    dims: list[int | str | None] = []
    for d in tp.tensor_type.shape.dim:
        dims.append(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None))
    return describe_dims(dims)


def format_info(info: ModelInfo) -> str:
    lines: list[str] = []
    head = [
        ("model", f"{info.path} ({human_bytes(info.file_bytes)})"),
        ("ir_version", str(info.ir_version)),
        ("producer", info.producer or "-"),
        ("graph", info.graph_name or "-"),
        ("opsets", ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(info.opsets.items())) or "-"),
    ]
    if info.domain or info.model_version:
        head.append(("domain/version", f"{info.domain or '-'} / {info.model_version}"))
    if info.doc:
        head.append(("doc", info.doc[:100]))
    for k, v in info.metadata.items():
        head.append((f"metadata {k}", v[:100]))
    if info.local_functions:
        head.append(("local functions", ", ".join(info.local_functions)))
    width = max(len(k) for k, _ in head)
    lines += [f"{k.ljust(width)}  {v}" for k, v in head]

    lines += ["", f"inputs ({len(info.inputs)})"]
    lines.append(format_table(["name", "type", "shape"], info.inputs, indent=2))
    lines += ["", f"outputs ({len(info.outputs)})"]
    lines.append(format_table(["name", "type", "shape"], info.outputs, indent=2))

    lines += [
        "",
        f"parameters: {info.param_count:,} values ({human_count(info.param_count)}), "
        f"{human_bytes(info.param_bytes)} in {info.param_tensors} tensors"
        + (f", {info.external_tensors} stored as external data" if info.external_tensors else ""),
    ]
    if len(info.params_by_type) > 1:
        for name, (n, b) in info.params_by_type.items():
            lines.append(f"  {name}: {n:,} values, {human_bytes(b)}")
    ct, cv = info.computed_weights
    if ct:
        lines.append(
            f"computed weights: {ct} ConstantOfShape tensors with constant shapes hold {cv:,} more values "
            f"({human_count(cv)})"
        )

    graph_ops = [o for o in info.ops if o.count]
    lines += ["", f"operators: {info.nodes} nodes, {len(graph_ops)} types"]
    rows = [
        (f"{o.domain}::{o.op_type}" if o.domain else o.op_type, o.opset or "-", o.count, o.status, o.detail)
        for o in info.ops
    ]
    headers = ["op_type", "opset", "count", "onnxpy", "note"]
    if not any(o.detail for o in info.ops):
        headers, rows = headers[:-1], [r[:-1] for r in rows]
    lines.append(format_table(headers, rows, indent=2))
    lines.append("")
    if info.missing:
        names = ", ".join(f"{o.domain or 'ai.onnx'}::{o.op_type}" for o in info.missing)
        lines.append(f"onnxpy cannot run: {names}")
    else:
        lines.append("onnxpy cannot run: none (every operator has a kernel or a function body)")
    return "\n".join(lines)
