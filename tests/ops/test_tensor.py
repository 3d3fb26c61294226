"""Shape, layout and casting kernels (onnxpy/ops/tensor.py) against onnxruntime, or numpy where
onnxruntime lacks the case: negative axes, empty tensors, old attribute forms, every Pad mode with
negative pads, Split forms, Slice clamping, Cast between exotic types and strings, Range details.

The small single-node helpers here are shared with the other tests of tests/ops that I own."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from onnxpy.model import dtypes
from tests.helpers import make_model, skip_before_onnxruntime, vinfo

F, I64, I32, BOOL, STR = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL, TensorProto.STRING


# -- helpers -------------------------------------------------------------------------------------


def node_model(
    op_type: str,
    inputs: dict[str, Any],
    outputs: dict[str, int],
    *,
    opset: int = 21,
    consts: dict[str, np.ndarray] | None = None,
    **attrs: Any,
) -> tuple[bytes, dict[str, Any]]:
    """One ``op_type`` node. ``inputs``: name -> array (fed), list of arrays (a sequence feed) or
    None (omitted optional input); ``consts``: inputs stored as initializers, placed after
    ``inputs``; ``outputs``: name -> ONNX element type. Returns (model bytes, feeds)."""
    names: list[str] = []
    vis = []
    feeds: dict[str, Any] = {}
    for name, value in inputs.items():
        if value is None:
            names.append("")
            continue
        names.append(name)
        if isinstance(value, list):
            tp = helper.make_sequence_type_proto(helper.make_tensor_type_proto(dtypes.elem_type(value[0].dtype), None))
            vis.append(helper.make_value_info(name, tp))
        else:
            value = np.asarray(value)
            vis.append(helper.make_tensor_value_info(name, dtypes.elem_type(value.dtype), list(value.shape)))
        feeds[name] = value
    inits = []
    for name, value in (consts or {}).items():
        names.append(name)
        inits.append(numpy_helper.from_array(np.asarray(value), name))
    node = helper.make_node(op_type, names, list(outputs), **attrs)
    outs = [helper.make_tensor_value_info(n, e, None) for n, e in outputs.items()]
    graph = helper.make_graph([node], f"test_{op_type}", vis, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model.SerializeToString(), feeds


def run_onnxpy(model: bytes, feeds: dict[str, Any]) -> list[Any]:
    return onnxpy.InferenceSession(model).run(None, feeds)


def run_ort(model: bytes, feeds: dict[str, Any]) -> list[Any]:
    import onnxruntime

    return onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_same(got: Any, want: Any, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Same shape and dtype; exact for integers, bool and strings, close for floats (NaN == NaN)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype.kind in "OUS":
        # onnxruntime returns every string tensor as an object array; so must onnxpy
        assert got.dtype.kind in ("O" if want.dtype.kind == "O" else "OUS"), f"dtype {got.dtype} != {want.dtype}"
        assert got.tolist() == want.tolist()
        return
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind in "fc" or (want.dtype.kind == "V" and "int" not in str(want.dtype)):
        g = got.astype(np.complex128 if want.dtype.kind == "c" else np.float64)
        w = want.astype(np.complex128 if want.dtype.kind == "c" else np.float64)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


def vs_ort(op_type: str, inputs: dict[str, Any], outputs: dict[str, int], **kw: Any) -> list[Any]:
    """Run one node through onnxpy and onnxruntime; assert equal outputs; return onnxpy's."""
    model, feeds = node_model(op_type, inputs, outputs, **kw)
    got = run_onnxpy(model, feeds)
    want = run_ort(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same(g, w)
    return got


def onnxpy_only(op_type: str, inputs: dict[str, Any], outputs: dict[str, int], **kw: Any) -> list[Any]:
    model, feeds = node_model(op_type, inputs, outputs, **kw)
    return run_onnxpy(model, feeds)


def run_error(op_type: str, inputs: dict[str, Any], outputs: dict[str, int], **kw: Any) -> str:
    """The message of the error onnxpy raises (at creation or run) for this node."""
    model, feeds = node_model(op_type, inputs, outputs, **kw)
    with pytest.raises(Exception) as info:  # noqa: PT011 - the message is what we check
        run_onnxpy(model, feeds)
    return str(info.value)


RNG = np.random.default_rng(0)
X34 = np.arange(12, dtype=np.float32).reshape(3, 4)
X234 = RNG.standard_normal((2, 3, 4)).astype(np.float32)


# -- views ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "allowzero"),
    [([4, -1], 0), ([0, -1], 0), ([-1], 0), ([2, 0, -1], 0), ([4, 3, 2], 0), ([1, 24], 1)],
)
def test_reshape(shape: list[int], allowzero: int) -> None:
    vs_ort("Reshape", {"x": X234, "s": np.array(shape, dtype=np.int64)}, {"y": F}, allowzero=allowzero)


def test_reshape_allowzero_keeps_zero() -> None:
    x = np.zeros((0, 3), dtype=np.float32)
    vs_ort("Reshape", {"x": x, "s": np.array([3, 0], dtype=np.int64)}, {"y": F}, allowzero=1)


def test_reshape_bad_size_names_shapes() -> None:
    msg = run_error("Reshape", {"x": X234, "s": np.array([5, -1], dtype=np.int64)}, {"y": F})
    assert "[2, 3, 4]" in msg and "[5, -1]" in msg


def test_reshape_targets_remembered_per_input_shape() -> None:
    # the kernel remembers each node's (input shape, requested shape) target: the same request
    # on another input shape gets its own, and an impossible one raises on every run
    m = make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [vinfo("x", F, ["n", "m", 4]), vinfo("s", TensorProto.INT64, [2])],
        [vinfo("y", F, None)],
    )
    sess = onnxpy.InferenceSession(m.SerializeToString())
    request = np.array([0, -1], dtype=np.int64)
    for _ in range(2):
        for shape, want in (((2, 3, 4), (2, 12)), ((4, 6, 4), (4, 24)), ((2, 3, 4), (2, 12))):
            x = RNG.standard_normal(shape).astype(np.float32)
            (y,) = sess.run(None, {"x": x, "s": request})
            assert y.shape == want and np.array_equal(y, x.reshape(want))
        with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.RuntimeException, match="cannot reshape"):
            sess.run(None, {"x": X234, "s": np.array([5, -1], dtype=np.int64)})


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis: int) -> None:
    vs_ort("Flatten", {"x": X234}, {"y": F}, axis=axis)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0, -2], [-1], None])
def test_squeeze(opset: int, axes: list[int] | None) -> None:
    x = RNG.standard_normal((1, 3, 1, 1)).astype(np.float32)
    if axes is None:
        vs_ort("Squeeze", {"x": x}, {"y": F}, opset=opset)
    elif opset < 13:
        vs_ort("Squeeze", {"x": x}, {"y": F}, opset=opset, axes=axes)
    else:
        vs_ort("Squeeze", {"x": x, "a": np.array(axes, dtype=np.int64)}, {"y": F}, opset=opset)


def test_squeeze_non_one_axis_raises() -> None:
    msg = run_error("Squeeze", {"x": X34, "a": np.array([0], dtype=np.int64)}, {"y": F}, opset=13)
    assert "axis 0" in msg


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0], [-1], [0, 3], [-1, 1]])
def test_unsqueeze(opset: int, axes: list[int]) -> None:
    if opset < 13:
        vs_ort("Unsqueeze", {"x": X34}, {"y": F}, opset=opset, axes=axes)
    else:
        vs_ort("Unsqueeze", {"x": X34, "a": np.array(axes, dtype=np.int64)}, {"y": F}, opset=opset)


def test_unsqueeze_scalar() -> None:
    vs_ort("Unsqueeze", {"x": np.float32(3.0), "a": np.array([0, 1], dtype=np.int64)}, {"y": F}, opset=13)


@pytest.mark.parametrize("perm", [None, [2, 0, 1], [0, 1, 2]])
def test_transpose(perm: list[int] | None) -> None:
    kw = {} if perm is None else {"perm": perm}
    vs_ort("Transpose", {"x": X234}, {"y": F}, **kw)


def test_transpose_bad_perm() -> None:
    assert "perm" in run_error("Transpose", {"x": X234}, {"y": F}, perm=[0, 0, 1])


def test_identity_sequence_and_strings() -> None:
    seq = [np.ones(2, np.float32), np.zeros(3, np.float32)]
    model, feeds = node_model("Identity", {"x": seq}, {"y": F}, opset=16)
    # Declare the output as a sequence too.
    import onnx

    m = onnx.load_from_string(model)
    m.graph.output[0].type.CopyFrom(m.graph.input[0].type)
    got = run_onnxpy(m.SerializeToString(), feeds)[0]
    assert isinstance(got, list) and len(got) == 2
    np.testing.assert_array_equal(got[1], seq[1])
    s = np.array(["a", "bc"], dtype=object)
    assert_same(onnxpy_only("Identity", {"x": s}, {"y": STR})[0], s)


# -- joining and splitting -----------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis: int) -> None:
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    b = RNG.standard_normal((2, 3)).astype(np.float32)
    vs_ort("Concat", {"a": a, "b": b}, {"y": F}, axis=axis)


def test_concat_with_empty_input() -> None:
    vs_ort("Concat", {"a": X34, "b": np.zeros((0, 4), np.float32)}, {"y": F}, axis=0)


def test_concat_refuses_scalars() -> None:
    # onnxruntime refuses at load (axis out of range for rank 0); onnxpy gave numpy's message.
    x = np.array(1.0, np.float32)
    model, feeds = node_model("Concat", {"a": x, "b": x}, {"y": F}, axis=0)
    with pytest.raises(Exception, match="rank"):  # noqa: PT011 - onnxruntime's Fail
        run_ort(model, feeds)
    msg = run_error("Concat", {"a": x, "b": x}, {"y": F}, axis=0)
    assert "Concat: inputs must have rank >= 1, got rank 0" in msg


@pytest.mark.parametrize("layouts", [("cl", "cl"), ("cl", "nchw"), ("nchw", "cl"), ("cl", "nchw", "nchw")])
def test_concat_of_channels_last_inputs(layouts: tuple[str, ...]) -> None:
    """Channels-last inputs holding at least half the channels are joined in channels-last
    memory (the result stays channels-last); otherwise the plain NCHW join. Values either way."""
    from onnxpy.ops._layout import is_channels_last
    from onnxpy.ops.tensor import concat

    rng = np.random.default_rng(11)
    parts = []
    for i, layout in enumerate(layouts):
        a = rng.standard_normal((2, 3 + i, 4, 5)).astype(np.float32)
        parts.append(np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if layout == "cl" else a)
    got = concat(np, *parts, axis=1)
    np.testing.assert_array_equal(got, np.concatenate([np.ascontiguousarray(p) for p in parts], axis=1))
    cl_channels = sum(p.shape[1] for p, layout in zip(parts, layouts) if layout == "cl")
    assert is_channels_last(got) == (2 * cl_channels >= got.shape[1])


def test_concat_strings() -> None:
    a = np.array(["x", "y"], dtype=object)
    got = onnxpy_only("Concat", {"a": a, "b": a[:1]}, {"y": STR}, axis=0)[0]
    assert got.tolist() == ["x", "y", "x"]


@pytest.mark.parametrize(
    ("opset", "shape", "kw", "n"),
    [
        (11, (3, 4), {"axis": 1}, 2),
        (11, (3, 4), {"axis": -1, "split": [1, 3]}, 2),
        (13, (6, 2), {"axis": 0}, 3),
        (18, (2, 5), {"axis": 1, "num_outputs": 3}, 3),  # uneven: 2, 2, 1
        (18, (6, 2), {"axis": -2, "num_outputs": 2}, 2),
    ],
)
def test_split(opset: int, shape: tuple[int, ...], kw: dict[str, Any], n: int) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    vs_ort("Split", {"x": x}, {f"y{i}": F for i in range(n)}, opset=opset, **kw)


def test_split_sizes_input() -> None:
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    vs_ort("Split", {"x": x, "s": np.array([1, 0, 5], dtype=np.int64)}, {"a": F, "b": F, "c": F}, axis=-1, opset=13)


def test_split_wrong_sizes_raise() -> None:
    x = RNG.standard_normal((2, 6)).astype(np.float32)
    msg = run_error("Split", {"x": x, "s": np.array([1, 2], dtype=np.int64)}, {"a": F, "b": F}, axis=1, opset=13)
    assert "6" in msg


@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [
        ([0, 1], [2, 3], [0, 1], [1, 1]),
        ([-1], [-100], [1], [-1]),
        ([10], [-10], [-1], [-2]),
        ([1], [1000], [0], [2]),
        ([-100], [100], [1], None),
        ([2, 0], [0, 4], [0, 1], [-1, 3]),
        ([0], [-1], None, None),
    ],
)
def test_slice(starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None) -> None:
    inputs: dict[str, Any] = {
        "x": X34,
        "s": np.array(starts, dtype=np.int64),
        "e": np.array(ends, dtype=np.int64),
        "a": None if axes is None else np.array(axes, dtype=np.int64),
        "st": None if steps is None else np.array(steps, dtype=np.int64),
    }
    if axes is None and steps is None:
        inputs = {k: v for k, v in inputs.items() if k not in ("a", "st")}
    elif steps is None:
        del inputs["st"]
    vs_ort("Slice", inputs, {"y": F}, opset=13)


def test_slice_attribute_form() -> None:
    vs_ort("Slice", {"x": X34}, {"y": F}, opset=9, starts=[1, -3], ends=[100, -1], axes=[0, 1])


def test_slice_int64_extremes() -> None:
    big = np.iinfo(np.int64)
    s = np.array([big.max], dtype=np.int64)
    e = np.array([big.min], dtype=np.int64)
    vs_ort("Slice", {"x": X34, "s": s, "e": e, "a": np.array([1]), "st": np.array([-1])}, {"y": F}, opset=13)


# -- shapes and constants ------------------------------------------------------------------------


@pytest.mark.parametrize(("start", "end"), [(None, None), (1, None), (-1, None), (0, -1), (-10, 10), (2, 1)])
def test_shape(start: int | None, end: int | None) -> None:
    kw = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    vs_ort("Shape", {"x": X234}, {"y": I64}, opset=21, **kw)


@pytest.mark.parametrize("x", [X234, np.zeros((0, 3), np.float32), np.float32(1.0)])
def test_size(x: np.ndarray) -> None:
    vs_ort("Size", {"x": x}, {"y": I64})


@pytest.mark.parametrize(
    "value",
    [None, numpy_helper.from_array(np.array([7], np.int32)), numpy_helper.from_array(np.array([1.5], np.float64))],
)
def test_constant_of_shape(value: Any) -> None:
    kw = {} if value is None else {"value": value}
    elem = F if value is None else value.data_type
    vs_ort("ConstantOfShape", {"s": np.array([2, 3], np.int64)}, {"y": elem}, **kw)
    vs_ort("ConstantOfShape", {"s": np.array([], np.int64)}, {"y": elem}, **kw)


@pytest.mark.parametrize(
    ("attr", "value", "elem"),
    [
        ("value_float", 1.5, F),
        ("value_floats", [1.0, 2.0], F),
        ("value_int", 3, I64),
        ("value_ints", [1, 2, 3], I64),
        ("value", numpy_helper.from_array(np.arange(6, dtype=np.int16).reshape(2, 3)), TensorProto.INT16),
    ],
)
def test_constant(attr: str, value: Any, elem: int) -> None:
    vs_ort("Constant", {}, {"y": elem}, **{attr: value})


def test_constant_strings_and_sparse() -> None:
    assert onnxpy_only("Constant", {}, {"y": STR}, value_strings=["a", "b"])[0].tolist() == ["a", "b"]
    assert onnxpy_only("Constant", {}, {"y": STR}, value_string="hi")[0].tolist() == "hi"
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5.0, 6.0], np.float32)), numpy_helper.from_array(np.array([1, 4])), [2, 3]
    )
    got = onnxpy_only("Constant", {}, {"y": F}, sparse_value=sparse)[0]
    want = np.zeros(6, np.float32)
    want[[1, 4]] = [5, 6]
    assert_same(got, want.reshape(2, 3))


# -- casting -------------------------------------------------------------------------------------

NUMERIC = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64, np.bool_]


@pytest.mark.parametrize("src", NUMERIC)
@pytest.mark.parametrize("dst", NUMERIC)
def test_cast_numeric(src: Any, dst: Any) -> None:
    x = np.array([0, 1, -1, 2.5, -3.5, 100, 127, -128, 255], dtype=np.float64)
    if np.dtype(src).kind == "u":
        x = np.abs(x)
    xs = x.astype(src)
    vs_ort("Cast", {"x": xs}, {"y": dtypes.elem_type(dst)}, to=dtypes.elem_type(dst))


@pytest.mark.parametrize(
    "dst", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz]
)
@pytest.mark.parametrize("src", [np.float32, np.float16, np.int32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_float8_saturation(dst: Any, src: Any, saturate: int) -> None:
    x = np.array([0.0, 1.0, -2.5, 300.0, 1000.0, -60000.0, 0.001], dtype=np.float64)
    xs = x.astype(src)
    got = onnxpy_only("Cast", {"x": xs}, {"y": dtypes.elem_type(dst)}, to=dtypes.elem_type(dst), saturate=saturate)[0]
    limit = float(ml_dtypes.finfo(dst).max)
    ref = xs.astype(np.float64)
    want = np.clip(ref, -limit, limit).astype(dst) if saturate else ref.astype(dst)
    assert got.dtype == np.dtype(dst)
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
    if saturate:
        assert np.isfinite(got.astype(np.float64)).all()


@pytest.mark.parametrize("dst", [ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.float4_e2m1fn])
def test_cast_4bit_round_trip(dst: Any) -> None:
    info = ml_dtypes.iinfo(dst) if "int" in str(np.dtype(dst)) else None
    vals = np.arange(info.min, info.max + 1) if info else np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -6, -0.5])
    x = vals.astype(np.float32)
    q = onnxpy_only("Cast", {"x": x}, {"y": dtypes.elem_type(dst)}, to=dtypes.elem_type(dst))[0]
    assert q.dtype == np.dtype(dst)
    back = onnxpy_only("Cast", {"x": q}, {"y": F}, to=F)[0]
    assert_same(back, x)


def test_cast_int4_wraps_like_fixed_point() -> None:
    x = np.array([20, -9, 7, 8], dtype=np.int32)
    got = onnxpy_only("Cast", {"x": x}, {"y": TensorProto.INT4}, to=TensorProto.INT4)[0]
    # Keep the low 4 bits, read as two's complement: 20 -> 4, -9 -> 7, 8 -> -8.
    assert got.astype(np.int32).tolist() == [4, 7, 7, -8]


E8M0_CASES = [0.0, 2.0**-130, 2.0**-127, 0.124, 0.25, 1.1, 1.5, 1.49, 3.0, 2.0**127, 2.0**128, np.inf, np.nan]


def _e8m0_oracle(v: float, saturate: int, mode: str) -> int:
    """Independent per-value rounding by log2 for the e8m0 code (255 = NaN)."""
    if np.isnan(v):
        return 255
    if v == 0 or np.isinf(v):
        if saturate:
            return 0 if v == 0 else 254
        return 255
    lo = int(np.floor(np.log2(v)))
    exact = 2.0**lo == v
    k = {"up": lo if exact else lo + 1, "down": lo, "nearest": lo + 1 if v >= 1.5 * 2.0**lo else lo}[mode]
    code = k + 127
    if code > 254:
        return 254 if saturate else 255
    if code < 0:
        return 0 if saturate or mode == "up" else 255
    return code


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_cast_e8m0(saturate: int, mode: str) -> None:
    x = np.array(E8M0_CASES, dtype=np.float64)
    got = onnxpy_only("Cast", {"x": x}, {"y": 24}, opset=24, to=24, saturate=saturate, round_mode=mode)[0]
    assert got.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
    assert got.view(np.uint8).tolist() == [_e8m0_oracle(float(v), saturate, mode) for v in x]


def test_cast_numbers_to_strings_like_onnxruntime() -> None:
    f32 = np.array([0.1, 1e10, 3.0, np.nan, np.inf, -np.inf, 1.5e-7, -0.0, 123456789, 1 / 3], dtype=np.float32)
    vs_ort("Cast", {"x": f32}, {"y": STR}, to=STR)
    vs_ort("Cast", {"x": f32.astype(np.float64)}, {"y": STR}, to=STR)
    vs_ort("Cast", {"x": np.array([0.1, 65504, -2], np.float16)}, {"y": STR}, to=STR)
    vs_ort("Cast", {"x": np.array([True, False])}, {"y": STR}, to=STR)
    vs_ort("Cast", {"x": np.array([-5, 2**62], np.int64)}, {"y": STR}, to=STR)
    vs_ort("Cast", {"x": np.array([0, 255], np.uint8)}, {"y": STR}, to=STR)


def test_cast_strings_to_numbers() -> None:
    s = np.array(["1.5", "INF", "-inf", "+Inf", "NaN", "1e-5", " 7"], dtype=object)
    vs_ort("Cast", {"x": s}, {"y": F}, to=F)
    vs_ort("Cast", {"x": s}, {"y": TensorProto.DOUBLE}, to=TensorProto.DOUBLE)
    vs_ort("Cast", {"x": np.array(["15", "-3", "9223372036854775807"], dtype=object)}, {"y": I64}, to=I64)
    got = onnxpy_only("Cast", {"x": np.array(["1", "0", "2.5"], dtype=object)}, {"y": BOOL}, to=BOOL)[0]
    assert got.tolist() == [True, False, True]
    got = onnxpy_only("Cast", {"x": np.array(["1000", "-1"], dtype=object)}, {"y": 17}, to=17)[0]
    assert got.astype(np.float32).tolist() == [448.0, -1.0]


def test_cast_bad_string_names_it() -> None:
    assert "hello" in run_error("Cast", {"x": np.array(["hello"], dtype=object)}, {"y": F}, to=F)


@pytest.mark.parametrize("text", ["abc", "e5", "1.5f", "1d2", "deadbeef", "0b11", "1_000", "\u0663", "\uff11\uff12"])
@pytest.mark.parametrize("to", [F, I64, BOOL])
def test_cast_refuses_strings_that_are_not_numbers(text: str, to: int) -> None:
    # Python's float() and float.fromhex() read these ('abc' as 0xabc = 2748, '1_000' as 1000,
    # Arabic-Indic digits as 3): silent wrong values. Only the spec's forms (plain, scientific)
    # and C's inf / nan / 0x... are numbers.
    assert text in run_error("Cast", {"x": np.array([text], dtype=object)}, {"y": to}, to=to)


def test_cast_reads_the_number_forms_c_reads() -> None:
    s = np.array([" 12 ", ".5", "5.", "+3", "-0", "1E8", "infinity", "-NAN", "0x10", "0x1.8p1"], dtype=object)
    got = onnxpy_only("Cast", {"x": s}, {"y": TensorProto.DOUBLE}, to=TensorProto.DOUBLE)[0]
    np.testing.assert_array_equal(got, [12, 0.5, 5, 3, -0.0, 1e8, np.inf, np.nan, 16, 3.0])
    got = onnxpy_only("Cast", {"x": np.array(["42", " -7", "1e3", "7.9"], dtype=object)}, {"y": I64}, to=I64)[0]
    assert got.tolist() == [42, -7, 1000, 7]


def test_castlike() -> None:
    x = np.array([1.7, -2.2, 1000], np.float32)
    vs_ort("CastLike", {"x": x, "t": np.zeros(1, np.int16)}, {"y": TensorProto.INT16})
    vs_ort("CastLike", {"x": x, "t": np.zeros(1, np.float16)}, {"y": TensorProto.FLOAT16})
    got = onnxpy_only("CastLike", {"x": x, "t": np.zeros(1, ml_dtypes.float8_e4m3fn)}, {"y": 17}, saturate=0)[0]
    assert np.isnan(got.astype(np.float32)[2])


# -- generators and broadcasting -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "limit", "delta", "dt"),
    [
        (3, 9, 3, np.int32),
        (10, 4, -2, np.int64),
        (0, 0, 1, np.int16),
        (5, 1, 1, np.int64),
        (0.0, 1.0, 0.1, np.float32),
        (1.0, -2.0, -0.3, np.float64),
        (-(2**62), 2**62, 2**61, np.int64),
    ],
)
def test_range(start: Any, limit: Any, delta: Any, dt: Any) -> None:
    if dt == np.int64 and abs(int(limit) - int(start)) >= 2**63:
        skip_before_onnxruntime((1, 24), "returns no values where limit - start overflows int64 (it holds 4)")
    vs_ort(
        "Range",
        {"s": np.array(start, dt), "l": np.array(limit, dt), "d": np.array(delta, dt)},
        {"y": dtypes.elem_type(dt)},
        opset=11,
    )


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("stash", [1, None])
def test_range_half_types_stash(dt: Any, stash: int | None) -> None:
    kw = {} if stash is None else {"stash_type": stash}
    s, lim, d = np.array(1, dt), np.array(300, dt), np.array(1, dt)
    got = onnxpy_only("Range", {"s": s, "l": lim, "d": d}, {"y": dtypes.elem_type(dt)}, opset=27, **kw)[0]
    # Successive additions in float32, then rounded to the half type.
    want = (np.float32(1) + np.arange(299, dtype=np.float32)).astype(dt)
    assert got.dtype == np.dtype(dt)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_range_half_stash_in_own_type_stalls() -> None:
    dt = ml_dtypes.bfloat16
    s, lim, d = np.array(1, dt), np.array(300, dt), np.array(1, dt)
    got = onnxpy_only("Range", {"s": s, "l": lim, "d": d}, {"y": 16}, opset=27, stash_type=16)[0]
    # bfloat16 has 8 significant bits: adding 1 to 256 gives 256 again.
    assert float(got[-1]) == 256.0


def test_range_zero_delta_raises() -> None:
    msg = run_error("Range", {"s": np.int64(0), "l": np.int64(3), "d": np.int64(0)}, {"y": I64}, opset=11)
    assert "delta" in msg


@pytest.mark.parametrize(("xshape", "shape"), [((3, 1), [2, 1, 6]), ((1,), [4]), ((2, 3), [1]), ((0, 1), [0, 5])])
def test_expand(xshape: tuple[int, ...], shape: list[int]) -> None:
    x = RNG.standard_normal(xshape).astype(np.float32)
    vs_ort("Expand", {"x": x, "s": np.array(shape, np.int64)}, {"y": F})


def test_expand_to_its_own_shape_hands_back_no_alias_of_the_feed() -> None:
    # The kernel returns a view (no copy) when nothing broadcasts; the caller still gets an
    # array of its own, as from onnxruntime.
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    model = make_model(
        [helper.make_node("Expand", ["x", "s"], ["y"])],
        [vinfo("x", F, [2, 3])],
        [vinfo("y", F, None)],
        initializers={"s": np.array([2, 3], np.int64)},
    )
    (y,) = onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(y, x)
    assert not np.shares_memory(y, x)
    vs_ort("Expand", {"x": x, "s": np.array([2, 3], np.int64)}, {"y": F})


def test_expand_incompatible_raises() -> None:
    msg = run_error("Expand", {"x": X34, "s": np.array([3, 5], np.int64)}, {"y": F})
    assert "[3, 4]" in msg


@pytest.mark.parametrize("reps", [[1, 1], [2, 3], [0, 2]])
def test_tile(reps: list[int]) -> None:
    vs_ort("Tile", {"x": X34, "r": np.array(reps, np.int64)}, {"y": F})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[0, 2, 0, 0], [1, 1, 2, 2], [-1, 2, 1, -1], [0, -2, 0, 3], [2, 1, 1, 1]])
def test_pad_modes(mode: str, pads: list[int]) -> None:
    if mode == "reflect" and pads == [0, -2, 0, 3]:
        # Cropping leaves 2 columns: reflecting 3 would reach past the other end; both refuse.
        msg = run_error("Pad", {"x": X34, "p": np.array(pads, np.int64)}, {"y": F}, opset=19, mode=mode)
        assert "axis 1" in msg
        return
    vs_ort("Pad", {"x": X34, "p": np.array(pads, np.int64)}, {"y": F}, opset=19, mode=mode)


@pytest.mark.parametrize("mode", ["edge", "wrap"])
def test_pad_copying_modes_refuse_an_empty_axis(mode: str) -> None:
    # Nothing to copy from an empty axis: onnxruntime refuses too (edge: "Cannot use 'edge' mode
    # to pad dimension with a value of 0"); onnxpy gave numpy's message.
    x = np.zeros((0, 3), np.float32)
    p = np.array([1, 0, 1, 0], np.int64)
    model, feeds = node_model("Pad", {"x": x, "p": p}, {"y": F}, opset=19, mode=mode)
    with pytest.raises(Exception):  # noqa: B017, PT011 - onnxruntime's Fail
        run_ort(model, feeds)
    msg = run_error("Pad", {"x": x, "p": p}, {"y": F}, opset=19, mode=mode)
    assert f"Pad {mode}: cannot pad axis 0 by (1, 1): it has size 0" in msg
    # Padding only the non-empty axis still works (an empty result), as in onnxruntime.
    if mode == "edge":
        vs_ort("Pad", {"x": x, "p": np.array([0, 1, 0, 1], np.int64)}, {"y": F}, opset=19, mode=mode)


def test_pad_of_a_scalar_is_the_scalar() -> None:
    # A rank-0 tensor takes 2 * 0 pads: the spec's shape inference gives shape [] (onnxruntime and
    # onnx.reference both fail here; onnxpy gave numpy's "pad_width must be of integral type").
    x = np.array(2.5, np.float32)
    (got,) = onnxpy_only("Pad", {"x": x, "p": np.zeros(0, np.int64)}, {"y": F}, opset=19, mode="edge")
    assert got.shape == () and got.dtype == np.float32 and float(got) == 2.5


def test_pad_constant_value_and_axes() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    vs_ort(
        "Pad",
        {"x": x, "p": np.array([1, 2, 0, 1], np.int64), "c": np.array(-5.0, np.float32), "a": np.array([-1, 0])},
        {"y": F},
        opset=18,
    )


def test_pad_attribute_form() -> None:
    vs_ort("Pad", {"x": X34}, {"y": F}, opset=10, pads=[1, 0, 0, 2], value=3.0)


def test_pad_strings_default_empty() -> None:
    x = np.array(["a", "b"], dtype=object)
    got = onnxpy_only("Pad", {"x": x, "p": np.array([1, 1], np.int64)}, {"y": STR}, opset=13)[0]
    assert got.tolist() == ["", "a", "b", ""]


def test_split_num_outputs_must_match_outputs() -> None:
    msg = run_error("Split", {"x": X34}, {"a": F, "b": F}, axis=1, num_outputs=3, opset=18)
    assert "3" in msg and "2 outputs" in msg


def test_cast_nan_to_int_is_quiet() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = onnxpy_only("Cast", {"x": np.array([np.nan, 1e20, 2.0], np.float32)}, {"y": I32}, to=I32)[0]
    assert got.dtype == np.int32 and got[2] == 2


# Pads and axis sizes where negative pads meet empty axes or reach past the data (found by a
# dtype/shape fuzzer against onnxruntime).
PAD_EDGE_CASES = [
    ((0,), [2, -1], "constant"),  # the crop reaches into the other side's padding: (1,)
    ((4, 0), [0, 2, -1, -1], "constant"),  # (3, 1)
    ((3, 0), [-1, 1, 0, -1], "constant"),  # an empty result: (2, 0)
    ((3, 0), [-1, 1, 0, -1], "edge"),  # empty in any mode, though edge cannot extend an empty axis
    ((3, 0), [-1, 1, 0, -1], "reflect"),
    ((2, 3), [0, -3, 0, 0], "constant"),  # (2, 0)
    ((2, 3), [1, 2, -1, -2], "edge"),  # crops within the data: unchanged path
]


@pytest.mark.parametrize("shape,pads,mode", PAD_EDGE_CASES)
def test_pad_with_negative_pads_on_small_and_empty_axes(shape: tuple[int, ...], pads: list[int], mode: str) -> None:
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1
    feeds = {"x": x, "pads": np.array(pads, np.int64)}
    model = make_model(
        [helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)],
        [vinfo("x", TensorProto.FLOAT, list(shape)), vinfo("pads", TensorProto.INT64, [len(pads)])],
        [vinfo("y", TensorProto.FLOAT, None)],
        opset=18,
    ).SerializeToString()
    want = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = onnxpy.InferenceSession(model).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,pads", [((1, 2), [-1, 0, -1, 0]), ((2, 3), [0, -3, 0, -1])])
def test_pad_to_a_negative_size_is_refused(shape: tuple[int, ...], pads: list[int]) -> None:
    feeds = {"x": np.ones(shape, np.float32), "pads": np.array(pads, np.int64)}
    model = make_model(
        [helper.make_node("Pad", ["x", "pads"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, list(shape)), vinfo("pads", TensorProto.INT64, [len(pads)])],
        [vinfo("y", TensorProto.FLOAT, None)],
        opset=18,
    ).SerializeToString()
    with pytest.raises(onnxpy.RuntimeException, match="negative size -1"):
        onnxpy.InferenceSession(model).run(None, feeds)


def test_slice_of_a_scalar_is_refused() -> None:
    model = make_model(
        [helper.make_node("Slice", ["x", "e", "e"], ["y"])],
        [vinfo("x", TensorProto.FLOAT, []), vinfo("e", TensorProto.INT64, [0])],
        [vinfo("y", TensorProto.FLOAT, None)],
    ).SerializeToString()
    with pytest.raises(onnxpy.RuntimeException, match="scalar"):
        onnxpy.InferenceSession(model).run(None, {"x": np.array(1.0, np.float32), "e": np.zeros(0, np.int64)})
