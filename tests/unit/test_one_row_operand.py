"""One-row products read mid-sized constant weights in the layout GEMV streams faster
(ops/_blas.one_row_operand): the same matrix, from a copy made once per constant; products of a
few rows run as one such GEMV per row (few_row_product)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from onnxpy.ops import _blas
from onnxpy.ops._blas import few_row_product, one_row_operand, stacked_matmul
from onnxpy.ops.nn import gemm


def _constant(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    a.flags.writeable = False
    return a


def test_a_tall_constant_is_read_through_a_cached_transposed_copy() -> None:
    w = _constant((2048, 512))  # 4 MB, more rows than columns
    got = one_row_operand(w)
    assert got is not w and got.shape == w.shape and np.array_equal(got, w)
    assert got.flags.f_contiguous and not got.flags.writeable  # rows of 2048 values in memory
    again = one_row_operand(w)
    assert again.base is got.base  # copied once, not per call


def test_a_wide_constant_stored_transposed_is_read_through_a_c_ordered_copy() -> None:
    stored = _constant((2048, 512))  # Gemm's B with transB = 1: the product reads stored.T
    b = stored.T  # (512, 2048), rows of 512 values in memory
    got = one_row_operand(b)
    assert got is not b and got.flags.c_contiguous and np.array_equal(got, b)
    # A view made per call (transB applied at run time) finds the same copy.
    assert one_row_operand(stored.T) is got


def test_layouts_already_streaming_well_are_kept() -> None:
    wide = _constant((512, 2048))
    assert one_row_operand(wide) is wide
    tall_stored_transposed = _constant((512, 2048)).T  # (2048, 512) with rows of 2048
    assert one_row_operand(tall_stored_transposed) is tall_stored_transposed


@pytest.mark.parametrize("shape", [(1024, 256), (2048, 128), (768, 256)])
def test_an_oblong_constant_under_2_mb_is_read_through_a_copy_too(shape: tuple[int, int]) -> None:
    w = _constant(shape)  # 0.75-1 MB, one side at least twice the other
    got = one_row_operand(w)
    assert got is not w and got.flags.f_contiguous and np.array_equal(got, w)
    wide = _constant(shape, seed=1).T  # a wide weight stored transposed (Gemm's transB = 1)
    assert one_row_operand(wide).flags.c_contiguous


@pytest.mark.parametrize("shape", [(512, 512), (640, 400), (256, 128)])
def test_near_square_or_small_constants_under_2_mb_are_kept(shape: tuple[int, int]) -> None:
    w = _constant(shape)  # near square, or under 512 KB
    assert one_row_operand(w) is w


@pytest.mark.parametrize(
    "case",
    ["small", "huge", "writeable", "read-only view of writeable memory", "strided", "float16", "1-D"],
)
def test_other_operands_are_returned_as_they_are(case: str) -> None:
    if case == "small":
        b = _constant((512, 512))  # 1 MB: in cache, neither layout wins
    elif case == "huge":
        b = np.zeros((4352, 2048), np.float32)  # 35.7 MB: streaming from memory either way
        b.flags.writeable = False
    elif case == "writeable":
        b = np.ones((2048, 512), np.float32)
    elif case == "read-only view of writeable memory":
        b = np.ones((2048, 512), np.float32).view()
        b.flags.writeable = False
    elif case == "strided":
        b = _constant((2048, 1024))[:, ::2]
    elif case == "float16":
        b = _constant((4096, 512)).astype(np.float16)
        b.flags.writeable = False
    else:
        b = _constant((1 << 20,))
    assert one_row_operand(b) is b


def test_a_per_call_view_of_a_constant_finds_the_first_copy() -> None:
    flat = _constant((2048 * 512,))
    first = one_row_operand(flat.reshape(2048, 512))
    second = one_row_operand(flat.reshape(2048, 512))  # another view object of the same memory
    assert first is not None and second.base is first.base


@pytest.mark.parametrize("rows_shape", [(1, 2048), (2048,), (1, 1, 2048)])
def test_one_row_products_match_the_plain_product(rows_shape: tuple[int, ...]) -> None:
    w = _constant((2048, 512), seed=1)
    x = np.random.default_rng(2).standard_normal(rows_shape).astype(np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64)
    got = stacked_matmul(np, x, w)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_gemm_with_one_row_and_trans_b_matches_numpy() -> None:
    stored = _constant((2048, 512), seed=3)  # B of a wide (512 -> 2048) layer, transB = 1
    a = np.random.default_rng(4).standard_normal((1, 512)).astype(np.float32)
    c = np.random.default_rng(5).standard_normal(2048).astype(np.float32)
    got = gemm(np, a, stored, c, transB=1)
    want = a.astype(np.float64) @ stored.T.astype(np.float64) + c
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_decoder_like_session_gives_the_same_outputs_with_and_without_the_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # MatMul with a tall weight and Gemm(transB) with a wide one, one row at a time and then
    # several rows, against the same session with the copies switched off.
    rng = np.random.default_rng(6)
    # Scaled as initialized layers are, so that outputs stay near 1 and float32 rounding small.
    down = numpy_helper.from_array((rng.standard_normal((2048, 512)) / 45).astype(np.float32), "down")
    up = numpy_helper.from_array((rng.standard_normal((2048, 512)) / 23).astype(np.float32), "up")
    nodes = [
        helper.make_node("MatMul", ["x", "down"], ["h"]),
        helper.make_node("Gemm", ["h", "up"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 2048])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 2048])],
        [down, up],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    onnx.checker.check_model(onnx.load_from_string(model))
    session = onnxpy.InferenceSession(model)
    feeds = [rng.standard_normal((rows, 2048)).astype(np.float32) for rows in (1, 3, 1, 2, 6, 8)]
    with_copies = [session.run(None, {"x": x})[0] for x in feeds]
    monkeypatch.setattr(_blas, "_ROW_FORM_MAX_BYTES", 0)
    without = [session.run(None, {"x": x})[0] for x in feeds]
    for x, a, b in zip(feeds, with_copies, without):
        want = (x.astype(np.float64) @ numpy_helper.to_array(down)) @ numpy_helper.to_array(up).T
        np.testing.assert_allclose(a, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [2, 3, 6])
@pytest.mark.parametrize("layout", ["tall", "wide", "wide stored transposed", "writeable"])
def test_few_row_products_are_one_gemv_per_row(rows: int, layout: str) -> None:
    if layout == "tall":
        b = _constant((2048, 512), seed=7)
    elif layout == "wide":
        b = _constant((512, 2048), seed=8)
    elif layout == "wide stored transposed":
        b = _constant((2048, 512), seed=9).T
    else:
        b = np.random.default_rng(10).standard_normal((2048, 512)).astype(np.float32)
    a = np.random.default_rng(11).standard_normal((rows, b.shape[0])).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = few_row_product(a, b)
    assert got is not None and got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    # Each row is the one-row product of that row, bit for bit.
    for r in range(rows):
        assert np.array_equal(got[r : r + 1], stacked_matmul(np, a[r : r + 1], b))
    out = np.full(want.shape, np.nan, np.float32)
    assert few_row_product(a, b, out) is out
    assert np.array_equal(out, got)


def test_few_row_products_only_where_they_pay() -> None:
    tall = _constant((2048, 512))
    rng = np.random.default_rng(12)
    assert few_row_product(rng.standard_normal((1, 2048)).astype(np.float32), tall) is None  # the GEMV path
    assert few_row_product(rng.standard_normal((7, 2048)).astype(np.float32), tall) is None  # GEMM wins
    assert few_row_product(rng.standard_normal((2, 512)).astype(np.float32), _constant((512, 512))) is None
    assert few_row_product(rng.standard_normal((2, 2048)), tall) is None  # float64 rows: numpy's promotion
    # Beyond 32 MB each row streams the weight again: pairs of rows only.
    huge = _constant((4352, 2048), seed=16)  # 35.7 MB
    assert few_row_product(rng.standard_normal((3, 4352)).astype(np.float32), huge) is None
    pair = rng.standard_normal((2, 4352)).astype(np.float32)
    got = few_row_product(pair, huge)
    assert got is not None
    np.testing.assert_allclose(got, pair.astype(np.float64) @ huge, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("shape", [(2, 2048), (1, 3, 2048), (4, 1, 2048)])
def test_few_row_products_through_the_kernels_match_numpy(shape: tuple[int, ...]) -> None:
    b = _constant((2048, 512), seed=13)
    a = np.random.default_rng(14).standard_normal(shape).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(stacked_matmul(np, a, b), want, rtol=1e-4, atol=1e-3)
    out = np.empty(want.shape, np.float32)
    assert stacked_matmul(np, a, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)
    if a.ndim == 2:
        stored = _constant((512, 2048), seed=15)  # Gemm's B with transB = 1
        np.testing.assert_allclose(
            gemm(np, a, stored, transB=1), a.astype(np.float64) @ stored.T.astype(np.float64), rtol=1e-4, atol=1e-3
        )
