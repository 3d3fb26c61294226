"""ops/_layout.contiguous_copy: a C-order copy of any host array, transposed views of large
matrices through OpenBLAS's blocked transpose."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ops import _layout


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
def test_every_permutation_copies_to_the_same_values_in_c_order(dtype: type) -> None:
    rng = np.random.default_rng(0)
    for shape in [(200, 300), (2, 190, 180), (1, 64, 56, 56), (3, 4, 5, 6, 7)]:
        a = (rng.standard_normal(shape) * 100).astype(dtype)
        for perm in itertools.permutations(range(len(shape))):
            for view in (a.transpose(perm), a.transpose(perm)[..., ::2]):
                got = _layout.contiguous_copy(view)
                assert got.flags.c_contiguous and got.dtype == view.dtype and got.shape == view.shape
                np.testing.assert_array_equal(got, view)
                assert not np.shares_memory(got, a)


def test_which_layouts_take_the_blas_transpose() -> None:
    # Leading axes in place and the rest two swapped groups, float32/64, matrices of at least
    # 32,768 values, at most 64 of them; everything else is numpy's copy.
    rng = np.random.default_rng(1)
    big = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    assert _layout._swap_plan(big.transpose(0, 2, 3, 1)) is not None  # NCHW -> NHWC
    assert _layout._swap_plan(big.reshape(64, 3136).T) is not None
    assert _layout._swap_plan(big.reshape(4, 16, 3136).transpose(0, 2, 1)) is not None
    assert _layout._swap_plan(big.transpose(0, 2, 1, 3)) is None  # not two swapped groups
    assert _layout._swap_plan(big.reshape(512, 8, 49).transpose(0, 2, 1)) is None  # small matrices
    assert _layout._swap_plan(big) is None  # already C-contiguous


def test_the_blas_transpose_does_the_copy_where_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    done: list[bool] = []

    def spy(src: np.ndarray, dst: np.ndarray) -> bool:
        done.append(_layout_transpose(src, dst))
        return done[-1]

    _layout_transpose = _layout.transpose_into
    monkeypatch.setattr(_layout, "transpose_into", spy)
    x = np.random.default_rng(3).standard_normal((3, 200, 300)).astype(np.float64)
    got = _layout.contiguous_copy(x.transpose(0, 2, 1))
    assert done == [True, True, True]
    np.testing.assert_array_equal(got, x.transpose(0, 2, 1))


def test_a_large_transposed_output_reaches_the_caller_dense_and_exact() -> None:
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])],
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 84, 840])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(2).standard_normal((2, 84, 840)).astype(np.float32)
    (y,) = onnxpy.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert y.flags.c_contiguous and y.flags.owndata and y.shape == (2, 840, 84)
    np.testing.assert_array_equal(y, x.transpose(0, 2, 1))
