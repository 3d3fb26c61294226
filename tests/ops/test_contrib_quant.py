"""com.microsoft quantized kernels (onnxpy/ops/contrib/quant.py) against onnxruntime: one-node
models on random data (uint8 / int8, broadcasting, per-tensor and per-column parameters, layout
and attribute variants), a numpy oracle where onnxruntime's CPU provider has no kernel
(QLinearReduceMean), error messages, and CNN+MLP / MatMul models quantized by onnxruntime's own
quantizers."""

from __future__ import annotations

import zlib
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from tests.helpers import CONTRIB_ORACLE, CONTRIB_SKIP_REASON, onnxruntime_older_than, quantize_static_model

pytestmark = pytest.mark.skipif(onnxruntime_older_than(CONTRIB_ORACLE), reason=CONTRIB_SKIP_REASON)

F = TensorProto.FLOAT
MS = "com.microsoft"
RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _seeded_per_test(request: pytest.FixtureRequest) -> None:
    """Each test draws from its own seed: the data must not depend on which tests ran before it
    in the same process (pytest-xdist splits them differently from run to run)."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


BYTES = [np.uint8, np.int8]


# -- helpers -------------------------------------------------------------------------------------


def _model(
    op_type: str,
    inputs: dict[str, Any],
    outputs: dict[str, int],
    consts: dict[str, np.ndarray] | None = None,
    **attrs: Any,
) -> tuple[bytes, dict[str, np.ndarray]]:
    """One com.microsoft node: ``inputs`` fed (None: an omitted optional input), then ``consts``
    as initializers; ``outputs`` name -> ONNX element type."""
    names, vis, feeds, inits = [], [], {}, []
    for name, value in inputs.items():
        if value is None:
            names.append("")
            continue
        value = np.asarray(value)
        names.append(name)
        vis.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
        feeds[name] = value
    for name, value in (consts or {}).items():
        names.append(name)
        inits.append(numpy_helper.from_array(np.asarray(value), name))
    node = helper.make_node(op_type, names, list(outputs), domain=MS, **attrs)
    outs = [helper.make_tensor_value_info(n, e, None) for n, e in outputs.items()]
    graph = helper.make_graph([node], f"test_{op_type}", vis, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model.SerializeToString(), feeds


def _run(model: bytes, feeds: dict[str, np.ndarray]) -> tuple[list[Any], list[Any]]:
    """(onnxpy's outputs, onnxruntime's outputs)."""
    got = onnxpy.InferenceSession(model).run(None, feeds)
    want = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, want


def _both(op_type: str, inputs: dict[str, Any], outputs: dict[str, int], **kw: Any) -> tuple[Any, Any]:
    got, want = _run(*_model(op_type, inputs, outputs, **kw))
    return got[0], want[0]


def _assert_quantized(got: Any, want: Any, off_by_one: float = 0.0) -> None:
    """Same shape and type; equal, or at most one quantization step apart in at most a
    fraction ``off_by_one`` of the elements."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    d = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert d.max(initial=0) <= (1 if off_by_one else 0), f"max diff {d.max()}"
    assert (d > 0).mean() <= off_by_one, f"{(d > 0).mean():.2e} of the elements off by one"


def _ints(dt: Any, shape: Any) -> np.ndarray:
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max + 1, shape).astype(dt)


def _mid(dt: Any) -> int:
    return 0 if np.dtype(dt).kind == "i" else 128


def _scales(n: int, lo: float = 0.001, hi: float = 0.1) -> list[np.float32]:
    return [np.float32(v) for v in RNG.uniform(lo, hi, n)]


def _etype(dt: Any) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def _error(op_type: str, inputs: dict[str, Any], outputs: dict[str, int], **attrs: Any) -> str:
    model, feeds = _model(op_type, inputs, outputs, **attrs)
    with pytest.raises(Exception) as info:  # noqa: PT011 - the message is what we check
        onnxpy.InferenceSession(model).run(None, feeds)
    return str(info.value)


# -- QLinearAdd / QLinearMul ---------------------------------------------------------------------

BROADCASTS = [((2, 3, 40), (2, 3, 40)), ((4, 5, 60), (5, 1)), ((50,), (3, 4, 50)), ((3, 7, 9), ())]


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", BYTES)
@pytest.mark.parametrize(("shape_a", "shape_b"), BROADCASTS)
def test_qlinear_binary(op_type: str, dt: Any, shape_a: tuple, shape_b: tuple) -> None:
    sa, sb = _scales(2)
    # Outputs spread over C's range (neither all saturated nor all in a few steps).
    sc = np.float32(sa * sb * RNG.uniform(20, 60) if op_type == "QLinearMul" else (sa + sb) * RNG.uniform(0.8, 1.6))
    za, zb, zc = np.asarray(_mid(dt) + RNG.integers(-20, 21, 3)).astype(dt)
    inputs = dict(a=_ints(dt, shape_a), sa=sa, za=za, b=_ints(dt, shape_b), sb=sb, zb=zb, sc=sc, zc=zc)
    got, want = _both(op_type, inputs, {"c": _etype(dt)})
    assert len(np.unique(want)) > 20  # not a saturated, trivial output
    # onnxruntime's vectorized float32 expression rounds a handful of near-ties (about 5 in a
    # million elements, seen for QLinearAdd) differently from ours; never by more than one step.
    _assert_quantized(got, want, off_by_one=1e-3)


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", BYTES)
def test_qlinear_binary_exact_ties(op_type: str, dt: Any) -> None:
    """Scales 0.1, 0.1 -> 0.2 make exact halves only when each operand is rescaled straight to
    the output's grid (A_scale / C_scale = 0.5 exactly); dequantizing first misses ~8% of them."""
    sc = np.float32(0.2 if op_type == "QLinearAdd" else 0.1 * 0.1 * 64)
    z = dt(0)
    a, b = _ints(dt, (64, 64)), _ints(dt, (64, 64))
    inputs = dict(a=a, sa=np.float32(0.1), za=z, b=b, sb=np.float32(0.1), zb=z, sc=sc, zc=z)
    got, want = _both(op_type, inputs, {"c": _etype(dt)})
    _assert_quantized(got, want)


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_omitted_zero_points_are_zero(op_type: str) -> None:
    # onnxruntime refuses the omitted form at type inference: compare with explicit zeros.
    a, b = _ints(np.int8, (3, 8)), _ints(np.int8, (8,))
    s = np.float32(0.05)
    z = np.int8(0)
    omitted = _model(
        op_type, dict(a=a, sa=s, za=None, b=b, sb=s, zb=None, sc=np.float32(0.07)), {"c": TensorProto.INT8}
    )
    explicit = _both(
        op_type, dict(a=a, sa=s, za=z, b=b, sb=s, zb=z, sc=np.float32(0.07), zc=z), {"c": TensorProto.INT8}
    )
    got = onnxpy.InferenceSession(omitted[0]).run(None, omitted[1])[0]
    _assert_quantized(got, explicit[1])


# -- unary maps ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", BYTES)
@pytest.mark.parametrize(
    ("op_type", "attrs"), [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.3}), ("QLinearLeakyRelu", {})]
)
def test_qlinear_unary(dt: Any, op_type: str, attrs: dict) -> None:
    x = np.arange(np.iinfo(dt).min, np.iinfo(dt).max + 1).astype(dt).reshape(4, 64)  # every input value
    mid = dt(_mid(dt))
    sx = np.float32(0.06)
    sy = np.float32(1 / 256) if op_type == "QLinearSigmoid" else np.float32(0.05)
    zy = dt(np.iinfo(dt).min) if op_type == "QLinearSigmoid" else mid
    got, want = _both(op_type, dict(x=x, sx=sx, zx=mid + dt(3), sy=sy, zy=zy), {"y": _etype(dt)}, **attrs)
    assert len(np.unique(want)) > 50
    _assert_quantized(got, want)


# -- pooling -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", BYTES)
@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 2], "count_include_pad": 1},
        {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"},
        {"kernel_shape": [2, 2], "strides": [2, 2], "channels_last": 1},
    ],
)
def test_qlinear_average_pool(dt: Any, attrs: dict) -> None:
    (sx, sy), (zx, zy) = _scales(2), _ints(dt, 2)
    x = _ints(dt, (2, 4, 9, 11))
    got, want = _both("QLinearAveragePool", dict(x=x, sx=sx, zx=zx, sy=sy, zy=zy), {"y": _etype(dt)}, **attrs)
    _assert_quantized(got, want)


@pytest.mark.parametrize("dt", BYTES)
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("shape", [(2, 8, 7, 7), (3, 5, 9), (1, 4, 2, 3, 5)])
def test_qlinear_global_average_pool(dt: Any, channels_last: int, shape: tuple) -> None:
    (sx, sy), (zx, zy) = _scales(2), _ints(dt, 2)
    inputs = dict(x=_ints(dt, shape), sx=sx, zx=zx, sy=sy, zy=zy)
    got, want = _both("QLinearGlobalAveragePool", inputs, {"y": _etype(dt)}, channels_last=channels_last)
    _assert_quantized(got, want)


# -- concat / softmax / where --------------------------------------------------------------------


@pytest.mark.parametrize("dt", BYTES)
@pytest.mark.parametrize(("axis", "shapes"), [(1, [(2, 3, 5), (2, 4, 5), (2, 1, 5)]), (-1, [(3, 2), (3, 6), (3, 1)])])
def test_qlinear_concat(dt: Any, axis: int, shapes: list) -> None:
    (sy, s1, s3), (zy, z1, z3) = _scales(3), _ints(dt, 3)
    # The middle input already has the output's parameters: it is copied unchanged.
    inputs = dict(sy=sy, zy=zy, x1=_ints(dt, shapes[0]), s1=s1, z1=z1, x2=_ints(dt, shapes[1]), s2=sy, z2=zy)
    inputs.update(x3=_ints(dt, shapes[2]), s3=s3, z3=z3)
    got, want = _both("QLinearConcat", inputs, {"y": _etype(dt)}, axis=axis)
    _assert_quantized(got, want)


@pytest.mark.parametrize("dt", BYTES)
@pytest.mark.parametrize(
    ("opset", "axis", "shape"), [(13, -1, (4, 10)), (13, 1, (2, 5, 7)), (11, 1, (2, 5, 7)), (13, -1, (3, 300))]
)
def test_qlinear_softmax(dt: Any, opset: int, axis: int, shape: tuple) -> None:
    zy = dt(np.iinfo(dt).min)  # the quantizer's choice for a [0, 1] output
    inputs = dict(x=_ints(dt, shape), sx=np.float32(0.05), zx=_ints(dt, ()), sy=np.float32(1 / 256), zy=zy)
    got, want = _both("QLinearSoftmax", inputs, {"y": _etype(dt)}, opset=opset, axis=axis)
    _assert_quantized(got, want)


@pytest.mark.parametrize("dt", BYTES)
def test_qlinear_where(dt: Any) -> None:
    (sx, sy, sz), (zx, zy, zz) = _scales(3), _ints(dt, 3)
    inputs = dict(
        c=RNG.random((4, 1, 6)) > 0.5, x=_ints(dt, (5, 6)), sx=sx, zx=zx, y=_ints(dt, (4, 5, 1)), sy=sy, zy=zy
    )
    got, want = _both("QLinearWhere", {**inputs, "sz": sz, "zz": zz}, {"z": _etype(dt)})
    _assert_quantized(got, want)


@pytest.mark.parametrize("dt", BYTES)
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 1), ([0, -1], 0), ([0, 1, 2], 0)])
def test_qlinear_reduce_mean_matches_its_definition(dt: Any, axes: list, keepdims: int) -> None:
    """onnxruntime's CPU provider has no kernel: the documented dequantize -> mean -> quantize."""
    x = _ints(dt, (3, 4, 50))
    (sx, sy), (zx, zy) = _scales(2), _ints(dt, 2)
    model, feeds = _model(
        "QLinearReduceMean", dict(x=x, sx=sx, zx=zx, sy=sy, zy=zy), {"y": _etype(dt)}, axes=axes, keepdims=keepdims
    )
    got = onnxpy.InferenceSession(model).run(None, feeds)[0]
    mean = ((x.astype(np.float32) - np.float32(zx)) * sx).mean(axis=tuple(axes), keepdims=bool(keepdims))
    info = np.iinfo(dt)
    want = np.clip(np.rint(mean.astype(np.float32) / sy) + zy, info.min, info.max).astype(dt)
    _assert_quantized(got, np.asarray(want))


# -- QGemm ---------------------------------------------------------------------------------------


# onnxruntime's kernels: A/B types (u8,u8), (u8,s8), (s8,s8); a quantized Y has A's type.
@pytest.mark.parametrize(("ta", "tb"), [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("quantized_y", [False, True])
@pytest.mark.parametrize(("per_column", "trans", "with_c"), [(False, 0, True), (True, 1, True), (True, 0, False)])
def test_qgemm(ta: Any, tb: Any, quantized_y: bool, per_column: bool, trans: int, with_c: bool) -> None:
    m, k, n = 7, 40, 6
    a = _ints(ta, (k, m) if trans else (m, k))
    b = _ints(tb, (n, k) if trans else (k, n))
    sb = RNG.uniform(0.001, 0.01, n if per_column else ()).astype(np.float32)
    # Zero points near the middle of the range, as calibration gives for centred data.
    za = np.asarray(_mid(ta) + RNG.integers(-9, 9)).astype(ta)
    zb = (_mid(tb) + RNG.integers(-9, 9, sb.shape)).astype(tb)
    inputs = dict(a=a, sa=np.float32(0.02), za=za, b=b, sb=sb, zb=zb)
    inputs["c"] = RNG.integers(-5000, 5000, (n,)).astype(np.int32) if with_c else None
    if quantized_y:
        inputs.update(sy=np.float32(0.05), zy=ta(_mid(ta)))
    got, want = _both("QGemm", inputs, {"y": _etype(ta) if quantized_y else F}, alpha=0.7, transA=trans, transB=trans)
    if quantized_y:
        assert len(np.unique(want)) > 5
        _assert_quantized(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


# -- QuantizeLinear / DequantizeLinear -----------------------------------------------------------


@pytest.mark.parametrize("dt", [np.uint8, np.int8, np.uint16, np.int16])
@pytest.mark.parametrize("ft", [np.float32, np.float16])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_dequantize(dt: Any, ft: Any, per_axis: bool) -> None:
    x = (RNG.standard_normal((3, 4, 5)) * 50).astype(ft)
    x[0, 0, :3] = [0.5, 1.5, -2.5]  # ties round to even
    s = RNG.uniform(0.01, 0.1, 4 if per_axis else ()).astype(ft)
    z = _ints(dt, s.shape)
    attrs = {"axis": 1} if per_axis else {}
    got, want = _both("QuantizeLinear", dict(x=x, s=s, z=z), {"y": _etype(dt)}, **attrs)
    _assert_quantized(got, want)
    q = _ints(dt, x.shape)
    if np.dtype(dt).itemsize == 2 and ft == np.float16:
        q = (q // 8).astype(dt)  # keep (q - z) * s inside float16's range
        z = (z // 8).astype(dt)
    got, want = _both("DequantizeLinear", dict(q=q, s=s, z=z), {"y": _etype(ft)}, **attrs)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-3 if ft == np.float16 else 1e-6)


@pytest.mark.parametrize("dt", [ml_dtypes.int4, ml_dtypes.uint4])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_dequantize_4bit(dt: Any, per_axis: bool) -> None:
    """onnxruntime's Python API takes no 4-bit arrays: quantize then dequantize inside the model,
    and dequantize a 4-bit initializer."""
    info = ml_dtypes.iinfo(dt)
    s = RNG.uniform(0.1, 0.6, 4 if per_axis else ()).astype(np.float32)
    z = RNG.integers(info.min, info.max + 1, s.shape).astype(dt)
    w = RNG.integers(info.min, info.max + 1, (3, 4, 5)).astype(dt)
    x = (RNG.standard_normal((3, 4, 5)) * 3).astype(np.float32)
    attrs = {"axis": 1} if per_axis else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=MS, **attrs),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS, **attrs),
        helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y2"], domain=MS, **attrs),
    ]
    graph = helper.make_graph(
        nodes,
        "q4",
        [helper.make_tensor_value_info("x", F, x.shape)],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("y2", F, None)],
        initializer=[numpy_helper.from_array(a, n) for a, n in ((s, "s"), (z, "z"), (w, "w"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    got, want = _run(model.SerializeToString(), {"x": x})
    assert len(np.unique(want[0])) > 8  # saturation at both ends, values between
    for g, w_ in zip(got, want):
        np.testing.assert_array_equal(g, w_)


# -- float-output integer matrix products --------------------------------------------------------


@pytest.mark.parametrize("tb", BYTES)
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("a_shape", [(7, 33), (2, 3, 33)])
def test_dynamic_quantize_matmul_and_matmul_integer_to_float(tb: Any, per_column: bool, a_shape: tuple) -> None:
    n = 5
    b = _ints(tb, (33, n))
    sb = RNG.uniform(0.001, 0.01, n if per_column else ()).astype(np.float32)
    zb = _ints(tb, sb.shape)
    bias = RNG.standard_normal(n).astype(np.float32)
    a = RNG.standard_normal(a_shape).astype(np.float32)
    got, want = _both("DynamicQuantizeMatMul", dict(a=a, b=b, sb=sb, zb=zb, bias=bias), {"y": F})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    # onnxruntime has no (int8 A, uint8 B) kernel.
    ta = np.uint8 if tb == np.uint8 else np.int8
    aq = _ints(ta, a_shape)
    inputs = dict(a=aq, b=b, sa=np.float32(0.03), sb=sb, za=_ints(ta, ()), zb=zb, bias=bias)
    got, want = _both("MatMulIntegerToFloat", inputs, {"y": F})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-4)


# onnxruntime's CPU kernel refuses 8-bit weights with float zero points: that pair is left out.
@pytest.mark.parametrize(
    ("bits", "zero_points"),
    [(b, z) for b in (2, 4, 8) for z in ("default", "packed", "float") if (b, z) != (8, "float")],
)
@pytest.mark.parametrize(("k", "n", "block"), [(64, 8, 32), (50, 6, 16)])
def test_matmul_nbits(bits: int, zero_points: str, k: int, n: int, block: int) -> None:
    blocks = -(-k // block)
    inputs: dict[str, Any] = dict(
        a=RNG.standard_normal((3, k)).astype(np.float32),
        b=RNG.integers(0, 256, (n, blocks, block * bits // 8)).astype(np.uint8),
        s=RNG.uniform(0, 0.1, (n, blocks)).astype(np.float32),
        z=None,
    )
    if zero_points == "packed":
        inputs["z"] = RNG.integers(0, 256, (n, -(-blocks * bits // 8))).astype(np.uint8)
    elif zero_points == "float":
        inputs["z"] = RNG.uniform(0, 1 << bits, (n, blocks)).astype(np.float32)
    inputs.update(g_idx=None, bias=RNG.standard_normal(n).astype(np.float32))
    got, want = _both("MatMulNBits", inputs, {"y": F}, K=k, N=n, bits=bits, block_size=block)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_matmul_nbits_dequantizes_constant_weights_once() -> None:
    # Constant weights are dequantized once per session (unpacking 4096 x 4096 at every run took
    # 75x onnxruntime's time); weights fed at run time are read afresh at every run.
    from onnxpy.ops import _derived

    k, n, block = 64, 8, 32
    a = RNG.standard_normal((2, k)).astype(np.float32)
    b = RNG.integers(0, 256, (n, 2, block // 2)).astype(np.uint8)
    s = RNG.uniform(0, 0.1, (n, 2)).astype(np.float32)
    attrs = dict(K=k, N=n, bits=4, block_size=block)
    model, feeds = _model("MatMulNBits", dict(a=a), {"y": F}, consts=dict(b=b, s=s), **attrs)
    sess = onnxpy.InferenceSession(model)
    before = {id(v) for v in _derived.cached_values()}
    first = sess.run(None, feeds)[0]
    cached = {id(v) for v in _derived.cached_values()}
    second = sess.run(None, feeds)[0]
    # Built once (one new form, whichever keys find it), then reused.
    assert len(cached - before) == 1 and {id(v) for v in _derived.cached_values()} == cached
    np.testing.assert_array_equal(first, second)
    got, want = _both("MatMulNBits", dict(a=a, b=b, s=s), {"y": F}, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, first, rtol=1e-6, atol=1e-6)
    fed_model, fed = _model("MatMulNBits", dict(a=a, b=b, s=s), {"y": F}, **attrs)
    fed_sess = onnxpy.InferenceSession(fed_model)
    fed_sess.run(None, fed)
    fed["b"][0] ^= 0xFF  # the fed array's values change between runs: read afresh
    changed = fed_sess.run(None, fed)[0]
    assert not np.allclose(changed[:, 0], first[:, 0])
    np.testing.assert_allclose(changed[:, 1:], first[:, 1:], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("symmetric", [False, True])
def test_matmul_nbits_from_the_quantizer(symmetric: bool) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    w = numpy_helper.from_array((RNG.standard_normal((72, 24)) * 0.2).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", F, [None, 72])],
        [helper.make_tensor_value_info("y", F, [None, 24])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=32, is_symmetric=symmetric)  # K=72: a partial block
    quantizer.process()
    qmodel = quantizer.model.model
    assert [node.op_type for node in qmodel.graph.node] == ["MatMulNBits"]
    x = RNG.standard_normal((5, 72)).astype(np.float32)
    got, want = _run(qmodel.SerializeToString(), {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


# -- errors --------------------------------------------------------------------------------------


def _add_inputs(**overrides: Any) -> dict[str, Any]:
    z = np.uint8(3)
    s = np.float32(0.1)
    inputs = dict(a=_ints(np.uint8, (4,)), sa=s, za=z, b=_ints(np.uint8, (4,)), sb=s, zb=z, sc=s, zc=z)
    return {**inputs, **overrides}


def test_errors_name_what_is_wrong() -> None:
    u8 = TensorProto.UINT8
    msg = _error("QLinearAdd", _add_inputs(sa=np.ones(2, np.float32)), {"c": u8})
    assert "A's scale must be a scalar" in msg and "[2]" in msg
    msg = _error("QLinearMul", _add_inputs(b=_ints(np.int8, (4,)), zb=np.int8(0)), {"c": u8})
    assert "uint8 or all int8" in msg and "int8[4]" in msg
    concat = dict(sy=np.float32(0.1), zy=np.uint8(0), x1=_ints(np.uint8, (2, 2)), s1=np.float32(0.1))
    assert "triples" in _error("QLinearConcat", concat, {"y": u8}, axis=0)
    gemm = dict(a=_ints(np.uint8, (3, 4)), sa=np.float32(0.1), za=np.uint8(0), b=_ints(np.uint8, (5, 6)))
    gemm.update(sb=np.float32(0.1), zb=np.uint8(0))
    assert "different K" in _error("QGemm", gemm, {"y": F})
    gemm.update(b=_ints(np.uint8, (4, 6)), sb=np.ones(5, np.float32))
    assert "b_scale must be a scalar or a 1-D tensor of 6 values" in _error("QGemm", gemm, {"y": F})


# -- end to end: models quantized by onnxruntime's quantizer -------------------------------------


def _cnn_mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def w(name: str, *shape: int, s: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    inits = [
        w("c1w", 8, 3, 3, 3), w("c1b", 8, s=0.1), w("c2w", 8, 8, 3, 3, s=0.15), w("c2b", 8, s=0.1),
        w("c3w", 8, 8, 1, 1), w("c3b", 8, s=0.1), w("mulc", 1, 8, 1, 1, s=1.0),
        w("g1w", 16, 32, s=0.2), w("g1b", 32, s=0.1), w("g2w", 32, 10, s=0.3), w("g2b", 10, s=0.1),
    ]  # fmt: skip
    mk = helper.make_node
    nodes = [
        mk("Conv", ["x", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]),
        mk("Relu", ["c1"], ["r1"]),
        mk("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        mk("Conv", ["p1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1]),
        mk("Relu", ["c2"], ["r2"]),
        mk("Add", ["r2", "p1"], ["a2"]),  # residual
        mk("Conv", ["a2", "c3w", "c3b"], ["c3"]),
        mk("Sigmoid", ["c3"], ["s3"]),
        mk("Mul", ["a2", "s3"], ["m3"]),  # gating
        mk("Mul", ["m3", "mulc"], ["m4"]),  # per-channel scale, broadcast
        mk("AveragePool", ["m4"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        mk("GlobalAveragePool", ["ap"], ["gap"]),
        mk("GlobalAveragePool", ["m3"], ["gap2"]),
        mk("Concat", ["gap", "gap2"], ["cat"], axis=1),
        mk("Flatten", ["cat"], ["flat"]),
        mk("Gemm", ["flat", "g1w", "g1b"], ["g1"]),
        mk("LeakyRelu", ["g1"], ["gr"], alpha=0.1),
        mk("Gemm", ["gr", "g2w", "g2b"], ["g2"]),
        mk("Softmax", ["g2"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn_mlp",
        [helper.make_tensor_value_info("x", F, [None, 3, 16, 16])],
        [helper.make_tensor_value_info("y", F, [None, 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _quantize_static(tmp_path: Any, fmt: str, activations: str, weights: str, **extra: Any) -> onnx.ModelProto:
    """_cnn_mlp quantized by onnxruntime's quantize_static, calibrated on four random batches."""
    return quantize_static_model(tmp_path, _cnn_mlp(), fmt, activations, weights, **extra)


@pytest.mark.parametrize("activations", ["QUInt8", "QInt8"])
def test_quantize_static_qoperator_cnn_mlp(tmp_path: Any, activations: str) -> None:
    qmodel = _quantize_static(tmp_path, "QOperator", activations, "QInt8")
    contrib = {n.op_type for n in qmodel.graph.node if n.domain == MS}
    expected = {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool"}
    expected |= {"QLinearGlobalAveragePool", "QLinearConcat", "QGemm", "QLinearSoftmax"}
    assert expected <= contrib, expected - contrib
    x = RNG.standard_normal((16, 3, 16, 16)).astype(np.float32)
    got, want = _run(qmodel.SerializeToString(), {"x": x})
    step = 1 / 256  # the quantizer's output scale for Softmax's [0, 1] range
    assert np.abs(got[0] - want[0]).max() <= 3 * step
    assert (got[0].argmax(1) == want[0].argmax(1)).all()


@pytest.mark.parametrize(
    ("activations", "weights", "step"),
    [("QUInt16", "QInt8", 1 / 65535), ("QInt16", "QInt16", 1 / 65535), ("QUInt8", "QInt4", 1 / 255)],
)
def test_quantize_static_qdq_contrib_types(tmp_path: Any, activations: str, weights: str, step: float) -> None:
    """16-bit activations and 4-bit weights: QDQ format through com.microsoft Quantize/DequantizeLinear."""
    qmodel = _quantize_static(tmp_path, "QDQ", activations, weights, UseQDQContribOps=True)
    contrib = {n.op_type for n in qmodel.graph.node if n.domain == MS}
    assert contrib == {"QuantizeLinear", "DequantizeLinear"}
    x = RNG.standard_normal((8, 3, 16, 16)).astype(np.float32)
    model = qmodel.SerializeToString()
    got = onnxpy.InferenceSession(model).run(None, {"x": x})[0]
    # Unoptimized, onnxruntime runs the same dequantize -> float op -> quantize graph; its
    # default optimizations fuse groups into integer kernels that round a little differently.
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got - want).max() <= 2 * step
    fused = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert (got.argmax(1) == fused.argmax(1)).all()
