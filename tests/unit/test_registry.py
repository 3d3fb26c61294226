"""Every kernel's attribute defaults equal the schema's, and resolution picks versions right."""

from __future__ import annotations

import inspect

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxpy  # noqa: F401 - registers the kernels
from onnxpy.ops import registry


def _schema(opdef: registry.OpDef):
    try:
        return onnx.defs.get_schema(opdef.op_type, max_inclusive_version=opdef.since, domain=opdef.domain)
    except Exception:  # noqa: BLE001 - onnx raises SchemaError
        return None


KERNELS = [k for k in registry.all_kernels() if _schema(k) is not None]


def _same(a, b) -> bool:
    if isinstance(b, bytes):
        b = b.decode()
    if isinstance(b, list):
        b = [x.decode() if isinstance(x, bytes) else x for x in b]
    if isinstance(a, float) or isinstance(b, float):
        return np.float32(a) == np.float32(b)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


def _served_schemas(opdef: registry.OpDef) -> list:
    """The schema versions a kernel serves: from its ``since`` up to the next registration."""
    later = [v for v in registry.versions(opdef.domain, opdef.op_type) if v > opdef.since]
    stop = min(later) if later else 10_000
    out, seen = [], set()
    for v in range(opdef.since, min(stop, onnx.defs.onnx_opset_version() + 1)):
        try:
            s = onnx.defs.get_schema(opdef.op_type, max_inclusive_version=v, domain=opdef.domain)
        except Exception:  # noqa: BLE001
            continue
        if s.since_version not in seen:
            seen.add(s.since_version)
            out.append(s)
    return out


@pytest.mark.parametrize("opdef", KERNELS, ids=lambda k: f"{k.qualified_name}-{k.since}")
def test_attribute_defaults_equal_the_schema(opdef: registry.OpDef) -> None:
    schemas = _served_schemas(opdef)
    params = inspect.signature(opdef.fn).parameters
    for name in opdef.attributes:
        declared = [s.attributes[name] for s in schemas if name in s.attributes]
        if not declared:
            continue  # an attribute of a version the kernel does not serve
        default = params[name].default
        for attr in declared:
            if attr.default_value.type:
                schema_default = helper.get_attribute_value(attr.default_value)
                assert default is not inspect.Parameter.empty, (
                    f"{name}: the schema has default {schema_default!r}, the kernel requires it"
                )
                assert _same(default, schema_default), (
                    f"{name}: kernel default {default!r} != schema default {schema_default!r}"
                )
        if all(a.required for a in declared) and len(declared) == len(schemas):
            assert default is inspect.Parameter.empty, (
                f"{name} is required by the schema but the kernel defaults it to {default!r}"
            )


# Operators onnxruntime registers under ai.onnx itself, outside onnx's schemas (its transformer
# optimizer writes them): SimplifiedLayerNormalization, and LayerNormalization below opset 17.
ONNXRUNTIME_AI_ONNX = {"SimplifiedLayerNormalization", "LayerNormalization"}


def test_every_registered_op_exists_in_its_domain() -> None:
    missing = sorted(
        {
            k.qualified_name
            for k in registry.all_kernels()
            if _schema(k) is None and k.domain in ("", "ai.onnx.ml") and k.op_type not in ONNXRUNTIME_AI_ONNX
        }
    )
    assert not missing, f"kernels registered for ops onnx does not define at their version: {missing}"


def test_resolution_takes_the_highest_version_not_above_the_opset() -> None:
    fake_domain = "test.resolution"

    @registry.op("Thing", 3, domain=fake_domain)
    def thing_3(xp, x):  # noqa: ANN001, ANN202
        return x

    @registry.op("Thing", 7, domain=fake_domain)
    def thing_7(xp, x):  # noqa: ANN001, ANN202
        return x

    assert registry.resolve(fake_domain, "Thing", 2) is None
    assert registry.resolve(fake_domain, "Thing", 3).fn is thing_3
    assert registry.resolve(fake_domain, "Thing", 6).fn is thing_3
    assert registry.resolve(fake_domain, "Thing", 99).fn is thing_7
    assert registry.versions(fake_domain, "Thing") == [3, 7]
    with pytest.raises(ValueError, match="registered twice"):
        registry.op("Thing", 7, domain=fake_domain)(thing_7)


def test_provider_specific_kernel_wins_for_its_provider_only() -> None:
    dom = "test.provider"

    @registry.op("P", 1, domain=dom)
    def generic(xp, x):  # noqa: ANN001, ANN202
        return x

    @registry.op("P", 1, domain=dom, provider="CUDAExecutionProvider")
    def cuda_only(xp, x):  # noqa: ANN001, ANN202
        return x

    assert registry.resolve(dom, "P", 5, "CPUExecutionProvider").fn is generic
    assert registry.resolve(dom, "P", 5, "CUDAExecutionProvider").fn is cuda_only


def _ctx() -> registry.NodeContext:
    return registry.NodeContext("n", "Conv", "", 17, 2, 1, (True,), (1, 1), (1,), ((), ()), ((),))


def test_memoized_remembers_per_key_and_not_failures() -> None:
    ctx = _ctx()
    calls: list[int] = []

    def compute(v: int) -> int:
        calls.append(v)
        if v < 0:
            raise ValueError("negative")
        return v * 2

    assert registry.memoized(ctx, 3, lambda: compute(3)) == 6
    assert registry.memoized(ctx, 3, lambda: compute(3)) == 6
    assert registry.memoized(ctx, 4, lambda: compute(4)) == 8
    assert calls == [3, 4]
    for _ in range(2):  # an invalid input raises every time: failures are not remembered
        with pytest.raises(ValueError, match="negative"):
            registry.memoized(ctx, -1, lambda: compute(-1))
    assert calls == [3, 4, -1, -1]
    assert registry.memoized(None, 3, lambda: compute(3)) == 6  # no context: no memo
    assert calls[-1] == 3


def test_memoized_starts_afresh_past_its_size() -> None:
    ctx = _ctx()
    for k in range(registry.MEMO_ENTRIES + 5):
        registry.memoized(ctx, k, lambda k=k: k)
    assert 0 < len(ctx.memo) <= registry.MEMO_ENTRIES
