"""Math kernels (CumSum, CumProd, Einsum, Trilu, Hardmax, Det, TopK, LpNormalization,
MeanVarianceNormalization, EyeLike, BitCast) against onnxruntime, and numpy where onnxruntime
lacks the case: attribute combinations, dtypes and edge cases the conformance suite skips."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from onnxpy.model.dtypes import np_dtype
from tests.helpers import skip_before_onnxruntime
from tests.ops.test_reduce import assert_same, node_model, run_ort, run_ours


def both(
    op: str,
    inputs: dict[str, np.ndarray | None],
    opset: int,
    n_outputs: int = 1,
    ref: Callable[[], list[np.ndarray]] | None = None,
    **attrs: Any,
) -> list:
    """Run on onnxpy and onnxruntime (or ``ref``, a numpy oracle, for cases onnxruntime's CPU build
    does not implement); returns onnxpy's outputs after checking they match."""
    model = node_model(op, inputs, n_outputs, opset, **attrs)
    got = run_ours(model, inputs)
    want = run_ort(model, inputs)
    if want is None:
        assert ref is not None, f"onnxruntime has no {op}({opset}) for these types and the test gave no oracle"
        want = ref()
    for g, w in zip(got, want):
        assert_same(g, w)
    return got


def ours(op: str, inputs: dict[str, np.ndarray | None], opset: int, n_outputs: int = 1, **attrs: Any) -> list:
    return run_ours(node_model(op, inputs, n_outputs, opset, **attrs), inputs)


# -- CumSum / CumProd ------------------------------------------------------------------------------


def _numpy_scan(op: str, x: np.ndarray, axis: int, exclusive: int, reverse: int) -> np.ndarray:
    fn = np.cumsum if op == "CumSum" else np.cumprod
    w = np.flip(x, axis) if reverse else x
    r = fn(w.astype(np.float64), axis=axis)
    if exclusive:
        ident = np.zeros if op == "CumSum" else np.ones
        pad_shape = list(x.shape)
        pad_shape[axis] = 1
        r = np.concatenate([ident(pad_shape), np.delete(r, -1, axis=axis)], axis=axis)
    return np.flip(r, axis) if reverse else r


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_cumsum_attributes_match_onnxruntime(dtype: Any) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(-5, 6, size=(3, 4, 2)).astype(dtype)
    for axis in (0, 1, 2, -1, -3):
        for axis_dtype in (np.int32, np.int64):
            for exclusive in (0, 1):
                for reverse in (0, 1):
                    inputs = {"x": x, "axis": np.array(axis, dtype=axis_dtype)}
                    both("CumSum", inputs, 14, exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64])
def test_cumprod_attributes(dtype: Any) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(1, 4, size=(3, 5)).astype(dtype)
    for axis in (0, 1, -1):
        for exclusive in (0, 1):
            for reverse in (0, 1):
                inputs = {"x": x, "axis": np.array(axis, dtype=np.int64)}
                model = node_model("CumProd", inputs, 1, 26, exclusive=exclusive, reverse=reverse)
                got = run_ours(model, inputs)[0]
                want = run_ort(model, inputs)
                if want is None:  # onnxruntime builds without CumProd
                    want = [_numpy_scan("CumProd", x, axis, exclusive, reverse).astype(dtype)]
                assert_same(got, want[0])


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_along_a_long_middle_axis_scans_whole_rows(exclusive: int, reverse: int) -> None:
    # A long axis with wide rows after it scans whole rows in blocks (ops/math._scan_rows):
    # integers exactly as onnxruntime, n not a multiple of the block (remainder rows), the
    # axis in the middle of a 4-D input; floats within float32 rounding of a float64 scan.
    rng = np.random.default_rng(3)
    xi = rng.integers(-9, 10, size=(2, 203, 3, 40)).astype(np.int64)
    both("CumSum", {"x": xi, "axis": np.array(1, np.int64)}, 14, exclusive=exclusive, reverse=reverse)
    xf = rng.standard_normal((2, 203, 3, 40)).astype(np.float32)
    got = ours("CumSum", {"x": xf, "axis": np.array(1, np.int64)}, 14, exclusive=exclusive, reverse=reverse)[0]
    want = _numpy_scan("CumSum", xf, 1, exclusive, reverse)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_cumprod_along_a_long_middle_axis_scans_whole_rows() -> None:
    rng = np.random.default_rng(4)
    x = (1 + rng.standard_normal((3, 150, 64)) * 0.01).astype(np.float64)
    for exclusive in (0, 1):
        for reverse in (0, 1):
            got = ours("CumProd", {"x": x, "axis": np.array(-2, np.int64)}, 26, exclusive=exclusive, reverse=reverse)
            np.testing.assert_allclose(got[0], _numpy_scan("CumProd", x, 1, exclusive, reverse), rtol=1e-12)


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_scan_narrow_floats_accumulate_in_float32(op: str, dtype: Any) -> None:
    rng = np.random.default_rng(2)
    x = (rng.random((2, 300)) * 0.01 + (1.0 if op == "CumProd" else 0.1)).astype(dtype)
    for exclusive in (0, 1):
        for reverse in (0, 1):
            got = ours(op, {"x": x, "axis": np.array(1, dtype=np.int64)}, 26, exclusive=exclusive, reverse=reverse)[0]
            want = _numpy_scan(op, x, 1, exclusive, reverse)
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=8e-3)


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
def test_scan_edge_shapes(op: str) -> None:
    for x in (np.zeros((0, 3), np.float32), np.ones((3, 1), np.float32), np.arange(1, 4, dtype=np.float32)):
        for exclusive in (0, 1):
            for reverse in (0, 1):
                got = ours(op, {"x": x, "axis": np.array(-1, dtype=np.int64)}, 26, exclusive=exclusive, reverse=reverse)
                want = _numpy_scan(op, x, x.ndim - 1, exclusive, reverse).astype(np.float32)
                assert_same(got[0], want)


# -- Einsum ----------------------------------------------------------------------------------------

EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("Ab,bC->AC", [(2, 3), (3, 4)]),
    ("ij, jk ,kl -> il", [(2, 3), (3, 4), (4, 2)]),
    ("...j->...", [(2, 3, 4)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize(("equation", "shapes"), EINSUM_CASES)
def test_einsum_matches_onnxruntime(equation: str, shapes: list, dtype: Any) -> None:
    rng = np.random.default_rng(3)
    inputs = {f"x{i}": rng.integers(-3, 4, size=s).astype(dtype) for i, s in enumerate(shapes)}
    model = node_model("Einsum", inputs, 1, 12, equation=equation)
    got = run_ours(model, inputs)[0]
    want = run_ort(model, inputs)
    if want is None:
        want = [np.einsum(equation.replace(" ", ""), *inputs.values()).astype(dtype)]
    assert_same(got, want[0])


def test_einsum_float16_and_operand_count_check() -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((4, 64)).astype(np.float16)
    b = rng.standard_normal((64, 3)).astype(np.float16)
    got = ours("Einsum", {"a": a, "b": b}, 12, equation="ik,kj->ij")[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(
        got.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-2, atol=2e-2
    )
    with pytest.raises(Exception, match="terms"):
        ours("Einsum", {"a": a}, 12, equation="ik,kj->ij")


# -- Trilu -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_trilu_matches_onnxruntime(dtype: Any) -> None:
    rng = np.random.default_rng(5)
    for shape in ((4, 4), (3, 5), (5, 3), (2, 3, 4), (2, 0, 3)):
        x = (rng.integers(0, 9, size=shape) if dtype != np.bool_ else rng.random(shape) > 0.5).astype(dtype)
        for upper in (0, 1):
            both("Trilu", {"x": x, "k": None}, 14, upper=upper)
            for k in (-7, -2, -1, 0, 1, 3, 9, 2**40, -(2**40)):
                both("Trilu", {"x": x, "k": np.array(k, dtype=np.int64)}, 14, upper=upper)


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.complex64, np.int8, np.uint16, np.bool_]
)
def test_trilu_bit_mask_keeps_numpys_bits(dtype: Any) -> None:
    # From 4,096 values Trilu ANDs x's bits with a cached triangle mask: the same bits as
    # numpy's triu / tril (NaN, -0.0 and infinities kept where kept), over leading axes, on
    # transposed inputs, for every k; complex128 and small inputs keep numpy's form.
    from onnxpy.ops import math as math_ops

    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 40, 50)) * 4
    x[0, :3, :3] = [[np.nan, -0.0, np.inf], [-np.inf, np.nan, -0.0], [1e30, -1e-30, np.nan]]
    with np.errstate(all="ignore"):  # NaN and 1e30 to integers / float16: any value will do
        x = (x > 0) if dtype == np.bool_ else x.astype(dtype)
    math_ops._triangle_mask.cache_clear()
    for arr in (x, x.transpose(0, 2, 1)):
        for upper in (0, 1):
            for k in (-60, -3, 0, 2, 55):
                got = math_ops.trilu(np, arr, np.array(k), upper=upper)
                want = np.triu(arr, k) if upper else np.tril(arr, k)
                assert got.dtype == want.dtype and got.shape == want.shape
                np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))
    assert math_ops._triangle_mask.cache_info().misses == 20  # two matrix shapes, 2 x 5 triangles


def test_trilu_rejects_rank_1() -> None:
    with pytest.raises(Exception, match="rank"):
        ours("Trilu", {"x": np.ones(3, np.float32)}, 14)


# -- Hardmax ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 13])
def test_hardmax_axes_and_ties(opset: int) -> None:
    rng = np.random.default_rng(6)
    x = rng.integers(0, 3, size=(2, 3, 4)).astype(np.float32)  # ties: the first maximum wins
    for axis in (0, 1, 2, -1, -2):
        both("Hardmax", {"x": x}, opset, axis=axis)
    both("Hardmax", {"x": x}, opset)


def test_hardmax_float16_float64_and_empty() -> None:
    rng = np.random.default_rng(7)
    for dtype in (np.float16, np.float64):
        x = rng.standard_normal((3, 5)).astype(dtype)
        one_hot = (np.arange(5) == np.argmax(x, axis=1)[:, None]).astype(dtype)
        both("Hardmax", {"x": x}, 13, ref=lambda one_hot=one_hot: [one_hot])
    x = np.zeros((0, 3), np.float32)
    for opset in (11, 13):
        got = ours("Hardmax", {"x": x}, opset)[0]
        assert got.shape == (0, 3) and got.dtype == np.float32


@pytest.mark.parametrize("opset", [11, 13])
def test_hardmax_refuses_a_scalar(opset: int) -> None:
    # onnxruntime refuses at load (rank must be >= 1); opset 11 used to return 1.0 quietly.
    x = np.array(1.5, np.float32)
    model = node_model("Hardmax", {"x": x}, 1, opset, axis=-1)
    with pytest.raises(Exception, match="rank"):  # noqa: PT011 - the runtimes raise different types
        run_ort(model, {"x": x})
    with pytest.raises(Exception, match=r"Hardmax.*rank >= 1, got rank 0"):  # noqa: PT011
        run_ours(model, {"x": x})


# -- Det -------------------------------------------------------------------------------------------


def test_det_matches_onnxruntime() -> None:
    rng = np.random.default_rng(8)
    for shape in ((3, 3), (2, 4, 4), (2, 2, 1, 1), (5, 2, 2)):
        both("Det", {"x": rng.standard_normal(shape).astype(np.float32)}, 22)
    singular = np.array([[1, 2], [2, 4]], dtype=np.float32)
    both("Det", {"x": singular}, 22)
    x = rng.standard_normal((2, 3, 3))
    both("Det", {"x": x}, 22, ref=lambda: [np.linalg.det(x)])


def test_det_narrow_floats_and_bad_shape() -> None:
    x = np.array([[2, 1], [1, 3]], dtype=np.float16)
    got = ours("Det", {"x": x}, 22)[0]
    assert got.dtype == np.float16 and got.shape == () and float(got) == 5.0
    got = ours("Det", {"x": x.astype(ml_dtypes.bfloat16)}, 22)[0]
    assert got.dtype == ml_dtypes.bfloat16 and float(got) == 5.0
    with pytest.raises(Exception, match="M, M"):
        ours("Det", {"x": np.ones((2, 3), np.float32)}, 22)


# -- TopK ------------------------------------------------------------------------------------------


def _topk_inputs(x: np.ndarray, k: int) -> dict[str, np.ndarray]:
    return {"x": x, "k": np.array([k], dtype=np.int64)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.float16, np.uint8])
def test_topk_with_ties_matches_onnxruntime(dtype: Any) -> None:
    rng = np.random.default_rng(9)
    x = rng.integers(0, 4, size=(3, 6, 5)).astype(dtype)  # many ties: the lower index comes first
    for axis in (0, 1, -1):
        n = x.shape[axis]
        for k in (0, 1, 3, n):
            for largest in (0, 1):
                inputs = _topk_inputs(x, k)
                model = node_model("TopK", inputs, 2, 11, axis=axis, largest=largest, sorted=1)
                got = run_ours(model, inputs)
                want = run_ort(model, inputs)
                if want is None:
                    order = np.argsort(-x.astype(np.float64) if largest else x, axis=axis, kind="stable")
                    idx = np.take(order, np.arange(k), axis=axis).astype(np.int64)
                    want = [np.take_along_axis(x, idx, axis=axis), idx]
                assert_same(got[0], want[0])
                assert_same(got[1], want[1])


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_topk_small_k_of_a_long_axis_with_ties(dtype: Any) -> None:
    # k much smaller than the axis takes the partition path; ties must still come lowest index first
    rng = np.random.default_rng(13)
    for shape, axis in (((3, 3000), -1), ((2000, 2), 0)):
        x = rng.integers(0, 50, size=shape).astype(dtype)
        for k in (1, 7, 100, 250):
            for largest in (0, 1):
                both("TopK", _topk_inputs(x, k), 11, 2, axis=axis, largest=largest)
    skip_before_onnxruntime(
        (1, 24), "leaves NaN out of TopK's largest values (onnxpy and onnx.reference rank it first)"
    )
    x = rng.standard_normal((2, 1000)).astype(np.float32)
    x[0, 10] = np.nan
    x[1, :] = 1.0
    both("TopK", _topk_inputs(x, 5), 11, 2)


@pytest.mark.parametrize("ties", ["none", "inside", "straddling"])
@pytest.mark.parametrize("largest", [0, 1])
def test_topk_of_distinct_values_takes_the_winners_in_one_pass(ties: str, largest: int) -> None:
    # Where exactly k values per line reach the k-th (ties inside the top k included), the
    # winners come from one flatnonzero over all lines; a tie straddling the k-th in any line
    # sends the array the cumulative-count way. Both against onnxruntime, on 3-D input.
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 3, 1500)).astype(np.float32)
    sign = 1 if largest else -1
    if ties == "inside":
        x[1, 2, [5, 900]] = sign * 50.0  # two equal winners: the lower index first
    elif ties == "straddling":
        k_th = np.sort(sign * x[0, 1])[::-1][39] * sign  # the 40th best of one line
        x[0, 1, 1400] = k_th  # a copy of it: 41 values reach it, k = 40 takes the earlier
    both("TopK", _topk_inputs(x, 40), 11, 2, largest=largest)


@pytest.mark.parametrize("case", ["random", "ties", "sorted", "infinities", "two values", "sample above the rest"])
@pytest.mark.parametrize("largest", [0, 1])
def test_topk_through_a_sampled_threshold_matches_onnxruntime(case: str, largest: int) -> None:
    # Long float lines with few winners take a threshold from an evenly spaced sample of each
    # line (every 62nd value for k = 4, every 8th for k = 30) and sort only what passes it
    # (math._topk_sampled). A line where too few values pass (its sampled values above all
    # the others) or too many (two distinct values) sends the call to the partition. Both ways
    # must give onnxruntime's values and indices, ties by the lower index.
    from onnxpy.ops import math as topk_module

    rng = np.random.default_rng(19)
    x = rng.standard_normal((6, 8000)).astype(np.float32)
    sign = 1 if largest else -1
    if case == "ties":
        x = np.round(x * 2) / 2
    elif case == "sorted":
        x = np.sort(x, axis=-1)
        x[1] = x[1, ::-1]
    elif case == "infinities":
        x[:, ::97] = sign * np.inf
        x[:, 5::89] = -sign * np.inf
    elif case == "two values":
        x[3] = np.where(x[3] > 0, 1.0, 2.0)
    elif case == "sample above the rest":
        x[2, ::8] = sign * (1000 + np.arange(1000))
    calls = []
    original = topk_module._topk_sampled

    def spy(*args: Any) -> Any:
        found = original(*args)
        calls.append(found is not None)
        return found

    topk_module._topk_sampled = spy
    try:
        for k in (4, 30):
            both("TopK", _topk_inputs(x, k), 11, 2, largest=largest)
    finally:
        topk_module._topk_sampled = original
    expected = {"two values": [False, False], "sample above the rest": [True, False]}.get(case, [True, True])
    assert calls == expected, calls


def test_topk_of_one_is_the_first_extreme() -> None:
    # k = 1 is argmax / argmin: the lowest index among equal extremes, on any axis and length.
    x = np.array([[3, 7, 7, 1, 1], [2, 2, 2, 2, 2], [-np.inf, -1, np.inf, np.inf, 0]], dtype=np.float32)
    for axis in (0, 1):
        for largest in (0, 1):
            both("TopK", _topk_inputs(x, 1), 11, 2, axis=axis, largest=largest)
    rng = np.random.default_rng(23)
    both("TopK", _topk_inputs(rng.integers(0, 3, size=(300, 80)).astype(np.int32), 1), 11, 2)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16])  # TopK allows no float8 type
def test_topk_of_ml_dtypes_with_nan_and_inf_ranks_like_float32(dtype: Any) -> None:
    # ml_dtypes' own sort loses values behind a NaN (5.0 went missing): the result must be the
    # float32 one, which onnxruntime gives for the same values in float32.
    skip_before_onnxruntime((1, 24), "ranks NaN first among TopK's smallest values (onnxpy and onnx.reference last)")
    x = np.array([[3, 1, 3, 2, 3, 0, np.nan, 5], [-np.inf, np.inf, np.nan, 0, -0.0, 0, 2, 2]], np.float32)
    for largest in (0, 1):
        inputs = _topk_inputs(x.astype(dtype), 4)
        got = run_ours(node_model("TopK", inputs, 2, 11, largest=largest), inputs)
        f32 = _topk_inputs(x, 4)
        want = run_ort(node_model("TopK", f32, 2, 11, largest=largest), f32)
        assert got[0].dtype == dtype
        assert_same(got[0].astype(np.float32), want[0])
        assert_same(got[1], want[1])


def test_topk_versions_1_and_10() -> None:
    x = np.array([[3, 1, 3, 2], [0, 5, 5, 5]], dtype=np.float32)
    v1 = both("TopK", {"x": x}, 7, 2, k=2)
    v10 = both("TopK", _topk_inputs(x, 2), 10, 2)
    assert v1[1].tolist() == v10[1].tolist() == [[0, 2], [1, 2]]
    both("TopK", {"x": x}, 7, 2, k=3, axis=0 - 1)


def test_topk_unsorted_returns_the_same_set() -> None:
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 10)).astype(np.float32)
    inputs = _topk_inputs(x, 4)
    model = node_model("TopK", inputs, 2, 11, sorted=0, largest=0)
    got = run_ours(model, inputs)
    want = run_ort(model, inputs)
    assert want is not None
    assert sorted(map(tuple, np.sort(got[1], axis=1).tolist())) == sorted(map(tuple, np.sort(want[1], axis=1).tolist()))
    np.testing.assert_array_equal(np.take_along_axis(x, got[1], axis=1), got[0])


def test_topk_nan_and_infinities() -> None:
    x = np.array([1.0, np.inf, -np.inf, 2.0, 2.0], dtype=np.float32)
    for largest in (0, 1):
        both("TopK", _topk_inputs(x, 5), 11, 2, largest=largest)


def test_topk_bfloat16_and_bad_k() -> None:
    x = np.array([1, 4, 4, 2], dtype=ml_dtypes.bfloat16)
    values, idx = ours("TopK", _topk_inputs(x, 2), 24, 2)
    assert values.dtype == ml_dtypes.bfloat16 and values.tolist() == [4, 4] and idx.tolist() == [1, 2]
    for k in (-1, 5):
        with pytest.raises(Exception, match="k"):
            ours("TopK", _topk_inputs(x, k), 24, 2)


# -- LpNormalization / MeanVarianceNormalization ---------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_lp_normalization_matches_onnxruntime(dtype: Any) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 4, 5)).astype(dtype)
    x[0, :, 0] = 0  # a zero slice along axis 1
    x[1, 2, :] = 0  # a zero slice along the last axis
    for p in (1, 2):
        for axis in (0, 1, -1):
            both("LpNormalization", {"x": x}, 11, axis=axis, p=p)
    both("LpNormalization", {"x": x}, 11)


def test_lp_normalization_zero_norm_gives_zeros_and_bad_p() -> None:
    x = np.zeros((2, 3), dtype=np.float32)
    got = ours("LpNormalization", {"x": x}, 22)[0]
    assert np.array_equal(got, x) and not np.isnan(got).any()
    with pytest.raises(Exception, match="p must be"):
        ours("LpNormalization", {"x": x}, 22, p=3)


def test_mean_variance_normalization_axes() -> None:
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((2, 3, 4, 5)) * 3 + 1).astype(np.float32)
    for axes in (None, [0, 2, 3], [1], [2, 3], [-1], [0, 1, 2, 3]):
        attrs = {} if axes is None else {"axes": axes}
        got = both("MeanVarianceNormalization", {"x": x}, 13, **attrs)[0]
        ax = (0, 2, 3) if axes is None else tuple(a % 4 for a in axes)
        np.testing.assert_allclose(got.mean(axis=ax), 0, atol=1e-5)
    got = ours("MeanVarianceNormalization", {"x": x.astype(np.float16)}, 13)[0]
    assert got.dtype == np.float16


# -- EyeLike ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_dtype", "out_elem"),
    [
        (np.float32, None),
        (np.int32, None),
        (np.float32, TensorProto.INT64),
        (np.int64, TensorProto.DOUBLE),
        (np.float32, TensorProto.BOOL),
        (np.int32, TensorProto.UINT8),
        (np.float16, None),
    ],
)
def test_eye_like_matches_onnxruntime(in_dtype: Any, out_elem: int | None) -> None:
    for shape in ((3, 3), (2, 5), (5, 2), (0, 3)):
        for k in (0, 1, -1, 4, -6):
            attrs: dict[str, Any] = {"k": k}
            if out_elem is not None:
                attrs["dtype"] = out_elem
            out = np.dtype(in_dtype) if out_elem is None else np_dtype(out_elem)
            eye = np.eye(shape[0], shape[1], k=k, dtype=out)
            both("EyeLike", {"x": np.zeros(shape, dtype=in_dtype)}, 9, ref=lambda eye=eye: [eye], **attrs)


def test_eye_like_bfloat16_and_rank_check() -> None:
    got = ours("EyeLike", {"x": np.zeros((2, 3), ml_dtypes.bfloat16)}, 22, k=1)[0]
    assert got.dtype == ml_dtypes.bfloat16 and got.astype(np.float32).tolist() == [[0, 1, 0], [0, 0, 1]]
    with pytest.raises(Exception, match="2-D"):
        ours("EyeLike", {"x": np.zeros((2, 3, 4), np.float32)}, 22)


# -- BitCast ---------------------------------------------------------------------------------------

BITCAST_CASES = [
    (np.array([1.5, -0.0, np.inf, np.nan], np.float32), TensorProto.INT32),
    (np.array([1.5, -2.25], np.float32), TensorProto.UINT32),
    (np.array([[1, -1], [2**40, -(2**40)]], np.int64), TensorProto.DOUBLE),
    (np.array([0x3C00, 0x7C00, 0xFFFF], np.uint16), TensorProto.FLOAT16),
    (np.array([0x3F80, 0xC000], np.uint16), TensorProto.BFLOAT16),
    (np.array([1.0, -3.5], np.float16), TensorProto.INT16),
    (np.array([200, 1, 127], np.uint8), TensorProto.INT8),
    (np.array([0, 1, 0], np.uint8), TensorProto.BOOL),
    (np.array([True, False], np.bool_), TensorProto.UINT8),
    (np.array(7.25, np.float64), TensorProto.UINT64),
    (np.array([0x38, 0xC0], np.uint8), TensorProto.FLOAT8E4M3FN),
    (np.array([1 + 2j], np.complex64), TensorProto.INT64),
]


@pytest.mark.parametrize(("x", "to"), BITCAST_CASES, ids=lambda v: str(v) if isinstance(v, int) else str(v.dtype))
def test_bitcast_reinterprets_bytes(x: np.ndarray, to: int) -> None:
    target = np_dtype(to)
    model = node_model("BitCast", {"x": x}, 1, 26, to=to)
    got = run_ours(model, {"x": x})[0]
    want = run_ort(model, {"x": x})
    if want is None:
        want = [x.view(target)]
    assert got.dtype == target and got.shape == x.shape
    # compare bit patterns (nan payloads included)
    np.testing.assert_array_equal(
        np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want[0]).view(np.uint8)
    )


def test_bitcast_sub_byte_and_width_mismatch() -> None:
    x = np.array([-1, 7, -8, 0], dtype=ml_dtypes.int4)
    got = ours("BitCast", {"x": x}, 26, to=TensorProto.UINT4)[0]
    assert got.dtype == ml_dtypes.uint4 and got.astype(np.int32).tolist() == [15, 7, 8, 0]
    back = ours("BitCast", {"x": got}, 26, to=TensorProto.INT4)[0]
    assert back.astype(np.int32).tolist() == [-1, 7, -8, 0]
    fp4 = ours("BitCast", {"x": np.array([2, 10], ml_dtypes.uint4)}, 26, to=TensorProto.FLOAT4E2M1)[0]
    assert fp4.astype(np.float32).tolist() == [1.0, -1.0]
    with pytest.raises(Exception, match="bit widths"):
        ours("BitCast", {"x": np.ones(2, np.float32)}, 26, to=TensorProto.DOUBLE)
