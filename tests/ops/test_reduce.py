"""Reduce*, ArgMax and ArgMin kernels against onnxruntime (numpy where onnxruntime lacks the case):
attribute and input axes, keepdims, noop_with_empty_axes, empty sets, rank 0, and the dtypes the
conformance suite does not reach."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxpy
from onnxpy.model.dtypes import elem_type
from tests.helpers import skip_before_onnxruntime

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]


def axes_as_input(op: str, opset: int) -> bool:
    return opset >= (13 if op == "ReduceSum" else 18)


def node_model(op: str, inputs: dict[str, np.ndarray | None], n_outputs: int, opset: int, **attrs: Any) -> bytes:
    """A one-node model; an input given as None is omitted (empty name)."""
    names = [n if v is not None else "" for n, v in inputs.items()]
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    vis = [helper.make_tensor_value_info(n, elem_type(v.dtype), None) for n, v in inputs.items() if v is not None]
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, 0, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        for o, io in zip(model.graph.output, inferred.graph.output):
            o.type.CopyFrom(io.type)
    except Exception:  # noqa: BLE001 - a type onnx's schema rejects: type the outputs below
        pass
    first = next(v for v in inputs.values() if v is not None)
    for o in model.graph.output:
        if not o.type.tensor_type.elem_type:
            o.type.tensor_type.elem_type = elem_type(first.dtype)
    return model.SerializeToString()


def feeds_of(inputs: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    return {n: v for n, v in inputs.items() if v is not None}


def run_ours(model: bytes, inputs: dict[str, np.ndarray | None]) -> list[np.ndarray]:
    return onnxpy.InferenceSession(model).run(None, feeds_of(inputs))


# Messages onnxruntime gives for a type or op its CPU build does not implement.
_ORT_LACKS = (
    "NOT_IMPLEMENTED",
    "Type Error",
    "can't be converted",
    "No corresponding Numpy type",
    "not currently registered",
)


def run_ort(model: bytes, inputs: dict[str, np.ndarray | None]) -> list[np.ndarray] | None:
    """onnxruntime's outputs, or None when it has no kernel for the case (type not implemented)."""
    try:
        return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds_of(inputs))
    except Exception as e:  # noqa: BLE001
        if any(m in str(e) for m in _ORT_LACKS):
            return None
        raise


def assert_same(got: np.ndarray, want: np.ndarray, rtol: float | None = None) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
        return
    if rtol is None:
        rtol = {2: 4e-3, 4: 1e-5}.get(want.dtype.itemsize, 1e-12)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=rtol, equal_nan=True)


def reduce_case(op: str, x: np.ndarray, axes: list[int] | None, opset: int, **attrs: Any) -> tuple[bytes, dict]:
    if axes_as_input(op, opset):
        inputs = {"x": x, "axes": None if axes is None else np.array(axes, dtype=np.int64)}
        return node_model(op, inputs, 1, opset, **attrs), inputs
    if axes is not None:
        attrs["axes"] = axes
    inputs = {"x": x}
    return node_model(op, inputs, 1, opset, **attrs), inputs


def check_against_ort(op: str, x: np.ndarray, axes: list[int] | None, opset: int, **attrs: Any) -> np.ndarray:
    model, inputs = reduce_case(op, x, axes, opset, **attrs)
    got = run_ours(model, inputs)[0]
    want = run_ort(model, inputs)
    assert want is not None, f"onnxruntime has no {op}({opset}) for {x.dtype}"
    assert_same(got, want[0])
    return got


def data_for(op: str, shape: tuple[int, ...], dtype: Any, rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        lo = 0 if dt.kind == "u" or op == "ReduceLogSum" else -4
        return rng.integers(lo, 5, size=shape).astype(dt)
    v = rng.standard_normal(shape)
    if op == "ReduceLogSum":
        v = np.abs(v) + 0.1  # a positive sum keeps log finite
    if op == "ReduceProd":
        v = np.sign(v) * (0.5 + np.abs(v) % 1)  # products of many values stay in range
    return v.astype(dt)


AXES = [None, [1], [-1], [0, 2], [-3, -1], [2, 0, 1]]


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_axes_and_keepdims_match_onnxruntime(op: str, opset: int) -> None:
    rng = np.random.default_rng(0)
    x = data_for(op, (3, 4, 5), np.float32, rng)
    for axes in AXES:
        for keepdims in (0, 1):
            check_against_ort(op, x, axes, opset, keepdims=keepdims)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_dtypes_match_onnxruntime(op: str, dtype: Any) -> None:
    rng = np.random.default_rng(1)
    x = data_for(op, (4, 6, 3), dtype, rng)
    opset = 18
    for axes, keepdims in (([1], 1), ([-1, 0], 0), (None, 0)):
        model, inputs = reduce_case(op, x, axes, opset, keepdims=keepdims)
        got = run_ours(model, inputs)[0]
        want = run_ort(model, inputs)
        if want is None:
            # onnxruntime has no kernel for this type: compare with the float64 reduction
            want = [_numpy_reduce(op, x, axes, keepdims).astype(x.dtype)]
        assert_same(got, want[0])


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceMean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reductions_over_trailing_axes_match_onnxruntime(op: str, dtype: Any) -> None:
    # Trailing axes of up to 4096 values a row sum as one BLAS product or one einsum pass
    # (ops/reduce.py); longer rows, other axes and strided inputs keep numpy's pairwise sums.
    rng = np.random.default_rng(5)
    cases = [
        (data_for(op, (2, 8, 7, 9), dtype, rng), [2, 3]),
        (data_for(op, (3, 4, 700), dtype, rng), [-1]),
        (data_for(op, (2, 5000), dtype, rng), [1]),  # over the limit
        (data_for(op, (2, 6, 7, 9), dtype, rng)[:, ::2], [2, 3]),  # strided
    ]
    for x, axes in cases:
        for keepdims in (0, 1):
            model, inputs = reduce_case(op, x, axes, 18, keepdims=keepdims)
            got = run_ours(model, inputs)[0]
            want = run_ort(model, inputs)
            assert want is not None
            assert got.shape == want[0].shape and got.dtype == want[0].dtype
            np.testing.assert_allclose(got, want[0], rtol=2e-5 if dtype == np.float32 else 1e-12)


def _numpy_reduce(op: str, x: np.ndarray, axes: list[int] | None, keepdims: int) -> np.ndarray:
    ax = tuple(range(x.ndim)) if not axes else tuple(a % x.ndim for a in axes)
    w = x.astype(np.float64)
    kd = bool(keepdims)
    fns = {
        "ReduceSum": lambda: w.sum(axis=ax, keepdims=kd),
        "ReduceMean": lambda: w.mean(axis=ax, keepdims=kd),
        "ReduceMax": lambda: w.max(axis=ax, keepdims=kd),
        "ReduceMin": lambda: w.min(axis=ax, keepdims=kd),
        "ReduceProd": lambda: w.prod(axis=ax, keepdims=kd),
        "ReduceL1": lambda: np.abs(w).sum(axis=ax, keepdims=kd),
        "ReduceL2": lambda: np.sqrt((w * w).sum(axis=ax, keepdims=kd)),
        "ReduceLogSum": lambda: np.log(w.sum(axis=ax, keepdims=kd)),
        "ReduceLogSumExp": lambda: np.log(np.exp(w).sum(axis=ax, keepdims=kd)),
        "ReduceSumSquare": lambda: (w * w).sum(axis=ax, keepdims=kd),
    }
    return np.asarray(fns[op]())


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_bfloat16_follows_the_float32_result(op: str) -> None:
    # onnxruntime has no bfloat16 reductions on CPU: the float64 result rounded to bfloat16 is the oracle.
    rng = np.random.default_rng(2)
    x = data_for(op, (3, 8, 4), np.float32, rng).astype(ml_dtypes.bfloat16)
    for axes, keepdims in (([1], 1), ([0, -1], 0), (None, 1)):
        model, inputs = reduce_case(op, x, axes, 18, keepdims=keepdims)
        got = run_ours(model, inputs)[0]
        want = _numpy_reduce(op, x, axes, keepdims)
        assert got.dtype == ml_dtypes.bfloat16
        assert got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_noop_with_empty_axes_applies_only_the_elementwise_part(op: str) -> None:
    if op in ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceSumSquare"):
        skip_before_onnxruntime(
            (1, 24), "returns the input without the elementwise part (onnxpy matches onnx.reference)"
        )
    rng = np.random.default_rng(3)
    x = data_for(op, (2, 3), np.float32, rng)
    opset = 13 if op == "ReduceSum" else 18
    for axes in (None, []):
        got = check_against_ort(op, x, axes, opset, noop_with_empty_axes=1, keepdims=0)
        assert got.shape == x.shape
        # and without noop, empty axes reduce everything
        got = check_against_ort(op, x, axes, opset, noop_with_empty_axes=0, keepdims=0)
        assert got.shape == ()


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduction_over_an_empty_set_gives_the_identity(op: str) -> None:
    x = np.zeros((2, 0, 3), dtype=np.float32)
    for keepdims in (0, 1):
        check_against_ort(op, x, [1], 18, keepdims=keepdims)
        # reducing a non-empty axis of an empty tensor keeps it empty
        got = check_against_ort(op, x, [2], 18, keepdims=keepdims)
        assert got.size == 0


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceMean"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_empty_integer_reductions_match_onnxruntime(op: str, dtype: Any) -> None:
    if op in ("ReduceMax", "ReduceMin"):
        skip_before_onnxruntime((1, 24), "gives 0, not the identity, for an empty integer max or min")
    check_against_ort(op, np.zeros((3, 0), dtype=dtype), [1], 18, keepdims=0)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_bool_max_min(op: str) -> None:
    x = np.array([[True, False, False], [False, False, False], [True, True, True]])
    for axes in ([1], [0], None):
        check_against_ort(op, x, axes, 20, keepdims=0)
    # onnxruntime refuses an empty bool set; the spec's identity is False < True.
    model, inputs = reduce_case(op, np.zeros((2, 0), dtype=bool), [1], 20, keepdims=1)
    got = run_ours(model, inputs)[0]
    assert got.dtype == np.bool_ and got.shape == (2, 1)
    assert got.tolist() == [[op == "ReduceMin"]] * 2


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_rank_zero_input(op: str) -> None:
    x = np.array(1.5, dtype=np.float32)
    for opset in (11, 18):
        got = check_against_ort(op, x, None, opset, keepdims=1)
        assert got.shape == ()


def test_integer_mean_truncates_toward_zero() -> None:
    x = np.array([[-7, 0], [7, 0], [-1, -2], [5, -8]], dtype=np.int32)
    got = check_against_ort("ReduceMean", x, [1], 18, keepdims=0)
    assert got.tolist() == [-3, 3, -1, -1]


def test_float16_sums_accumulate_in_float32() -> None:
    x = np.full((8192,), 0.1, dtype=np.float16)
    model, inputs = reduce_case("ReduceSum", x, None, 13, keepdims=0)
    got = run_ours(model, inputs)[0]
    exact = x.astype(np.float64).sum()
    # A float16 accumulator stalls at 256 (0.1 is below half an ulp there); float32 does not.
    assert got.dtype == np.float16
    assert abs(float(got) - exact) / exact < 2e-3
    model, inputs = reduce_case("ReduceMean", x, None, 18, keepdims=0)
    assert abs(float(run_ours(model, inputs)[0]) - 0.1) < 1e-3


def test_log_sum_exp_is_stable_for_large_values() -> None:
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0], [-np.inf, -np.inf], [np.inf, 1.0]], dtype=np.float32)
    model, inputs = reduce_case("ReduceLogSumExp", x, [1], 18, keepdims=0)
    got = run_ours(model, inputs)[0]
    want = np.array([1000 + np.log(2), -1000 + np.log(2), -np.inf, np.inf], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("axes", [[3], [-4], [0, 0], [1, -2]])
def test_bad_axes_are_rejected(axes: list[int]) -> None:
    x = np.ones((2, 3, 4), dtype=np.float32)
    for opset in (11, 18):
        model, inputs = reduce_case("ReduceMax", x, axes, opset)
        with pytest.raises(Exception, match="axes"):
            run_ours(model, inputs)


def test_reduce_mean_13_takes_negative_axes_as_attribute() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    check_against_ort("ReduceMean", x, [-1], 13, keepdims=0)


# -- ArgMax / ArgMin -------------------------------------------------------------------------------


def arg_case(op: str, x: np.ndarray, opset: int, **attrs: Any) -> np.ndarray:
    inputs = {"x": x}
    model = node_model(op, inputs, 1, opset, **attrs)
    got = run_ours(model, inputs)[0]
    want = run_ort(model, inputs)
    assert want is not None, f"onnxruntime has no {op}({opset}) for {x.dtype}"
    assert_same(got, want[0])
    return got


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_attributes_with_ties_match_onnxruntime(op: str) -> None:
    rng = np.random.default_rng(4)
    x = rng.integers(0, 3, size=(3, 4, 5)).astype(np.float32)  # many ties
    for axis in (0, 1, 2, -1, -3):
        for keepdims in (0, 1):
            arg_case(op, x, 11, axis=axis, keepdims=keepdims)
            for last in (0, 1):
                arg_case(op, x, 13, axis=axis, keepdims=keepdims, select_last_index=last)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64, np.uint8, np.int8])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_dtypes(op: str, dtype: Any) -> None:
    rng = np.random.default_rng(5)
    x = rng.integers(0, 4, size=(4, 6)).astype(dtype)
    for last in (0, 1):
        inputs = {"x": x}
        model = node_model(op, inputs, 1, 13, axis=1, keepdims=0, select_last_index=last)
        got = run_ours(model, inputs)[0]
        want = run_ort(model, inputs)
        if want is None:
            fn = np.argmax if op == "ArgMax" else np.argmin
            idx = fn(x[:, ::-1], axis=1) if last else fn(x, axis=1)
            want = [(x.shape[1] - 1 - idx if last else idx).astype(np.int64)]
        assert_same(got, want[0])


def test_arg_bfloat16_and_single_element_axis() -> None:
    x = np.array([[1, 3, 3, 2], [5, 5, 0, 5]], dtype=ml_dtypes.bfloat16)
    inputs = {"x": x}
    got = run_ours(node_model("ArgMax", inputs, 1, 13, axis=1, select_last_index=1), inputs)[0]
    assert got.dtype == np.int64 and got.tolist() == [[2], [3]]
    got = run_ours(node_model("ArgMin", inputs, 1, 13, axis=-1, keepdims=0), inputs)[0]
    assert got.tolist() == [0, 2]
    arg_case("ArgMax", np.ones((3, 1), dtype=np.float32), 13, axis=1, select_last_index=1)


def test_arg_over_an_empty_axis_is_an_error() -> None:
    inputs = {"x": np.zeros((2, 0), dtype=np.float32)}
    with pytest.raises(Exception, match="empty"):
        run_ours(node_model("ArgMax", inputs, 1, 13, axis=1), inputs)


def test_opset_7_models_with_default_keepdims() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 8 + 0.5
    for op in REDUCE_OPS:
        check_against_ort(op, x, [1, 2], 7)


@pytest.mark.parametrize("shape", [(1, 1000, 13, 13), (2, 3, 80, 80)], ids=["head", "over-the-matvec-limit"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_mean_over_trailing_axes(shape: tuple[int, ...], keepdims: int) -> None:
    # SqueezeNet 1.1's head: a mean over the spatial axes, one matrix-vector product on the
    # host up to 4096 values per mean (numpy's pairwise sums beyond).
    x = np.random.default_rng(9).standard_normal(shape).astype(np.float32) + 3
    check_against_ort("ReduceMean", x, [2, 3], 18, keepdims=keepdims)


@pytest.mark.parametrize("op", ["ReduceMean", "GlobalAveragePool"])
def test_means_are_sums_divided_by_the_count(op: str) -> None:
    """Short trailing means run as one BLAS product. With weights of 1/n, rounded and fused
    into BLAS's multiply-adds, 120 values of 1.5 gave 1.5000001 (and LayerNormalization's
    expanded form a variance below 0 for constant rows). Values whose sum is exact in any
    order (quarters) must give that sum divided by n, correctly rounded."""
    x = np.full((2, 120), 1.5, np.float32)
    x[1] = np.arange(120) * 0.25 - 7
    want = (x.astype(np.float64).sum(axis=1) / 120).astype(np.float32)
    if op == "GlobalAveragePool":
        x = x.reshape(1, 2, 12, 10)
        model = node_model(op, {"x": x}, 1, 17)
    else:
        model = node_model(op, {"x": x}, 1, 17, axes=[1])
    got = run_ours(model, {"x": x})[0]
    np.testing.assert_array_equal(got.ravel(), want)


@pytest.mark.parametrize(
    "op,shape,axis,keepdims", [("ArgMax", (0, 0), 1, 1), ("ArgMin", (0, 3, 0), 0, 0), ("ArgMax", (2, 0, 0), 1, 0)]
)
def test_arg_extremes_over_an_empty_axis_with_an_empty_result(
    op: str, shape: tuple[int, ...], axis: int, keepdims: int
) -> None:
    # Nothing to index: onnxruntime returns the empty result (a non-empty one stays an error).
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims)],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT64, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    feeds = {"x": np.zeros(shape, np.float32)}
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = onnxpy.InferenceSession(data).run(None, feeds)[0]
    assert got.shape == want.shape and got.dtype == want.dtype == np.int64


def test_arg_extreme_over_an_empty_axis_with_a_nonempty_result_is_refused() -> None:
    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["x"], ["y"], axis=1)],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 0])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT64, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(onnxpy.RuntimeException, match="empty axis"):
        onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": np.zeros((3, 0), np.float32)})
