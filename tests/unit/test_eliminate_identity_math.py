"""eliminate.py's Mul / Div by a constant one: removed when the result is bit for bit x, kept
whenever the one could broadcast, convert, round or is not a one."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.optimizer.manager import optimize
from onnxpy.optimizer.passes import eliminate
from onnxpy.runtime.compile import build_graph
from tests.helpers import make_model, vinfo

F32 = TensorProto.FLOAT


def _ops(model: onnx.ModelProto) -> dict[str, int]:
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    return dict(collections.Counter(n.op_type for n in graph.nodes))


def _special(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    """Random values with NaN, -0, +-inf and a subnormal among them (x * 1 keeps them all)."""
    x = np.random.default_rng(3).standard_normal(shape).astype(dtype).reshape(-1)
    special = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-40], dtype)[: x.size]
    x[: special.size] = special
    return x.reshape(shape)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "f" else a


def _assert_bit_identical(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Basic-level outputs equal the unoptimized graph's bit for bit, and keep their names."""
    data = model.SerializeToString()
    plain_opts = onnxpy.SessionOptions()
    plain_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    basic_opts = onnxpy.SessionOptions()
    basic_opts.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_ENABLE_BASIC
    plain = onnxpy.InferenceSession(data, plain_opts).run(None, feeds)
    sess = onnxpy.InferenceSession(data, basic_opts)
    got = sess.run(None, feeds)
    assert [o.name for o in sess.get_outputs()] == [o.name for o in model.graph.output]
    for g, p in zip(got, plain, strict=True):
        assert g.dtype == p.dtype and g.shape == p.shape
        np.testing.assert_array_equal(_bits(g), _bits(p))


def _one_model(
    op: str, one: np.ndarray, x_shape: list[int] | None, out_shape: list[int] | None, one_first: bool = False
) -> onnx.ModelProto:
    """x -> op(x, one) (or op(one, x)) -> Neg -> y: the product is no graph output."""
    elem = helper.np_dtype_to_tensor_dtype(one.dtype)
    ins = ["one", "x"] if one_first else ["x", "one"]
    nodes = [helper.make_node(op, ins, ["m"]), helper.make_node("Neg", ["m"], ["y"])]
    return make_model(nodes, [vinfo("x", elem, x_shape)], [vinfo("y", elem, out_shape)], initializers={"one": one})


GOES = [
    ("Mul", np.array(1.0, np.float32), [2, 3], False),
    ("Mul", np.ones((1, 1), np.float32), [2, 3], True),
    ("Div", np.ones(1, np.float32), [2, 3], False),
    ("Mul", np.ones((1, 1, 1), np.float32), [4, 2, 3], False),
    ("Mul", np.array(1.0, np.float32), None, False),  # a 0-d one needs no rank
    ("Mul", np.ones(1, np.float64), [5], True),
    ("Div", np.array(1, np.int64), [2, 3], False),
]


@pytest.mark.parametrize(("op", "one", "x_shape", "one_first"), GOES)
def test_product_by_one_goes_and_results_are_bit_identical(
    op: str, one: np.ndarray, x_shape: list[int] | None, one_first: bool
) -> None:
    model = _one_model(op, one, x_shape, x_shape, one_first)
    assert _ops(model) == {"Neg": 1}
    shape = tuple(x_shape or [2, 3])
    x = _special(shape, one.dtype.type) if one.dtype.kind == "f" else np.arange(6, dtype=one.dtype).reshape(shape)
    _assert_bit_identical(model, {"x": x})


def test_chain_of_ones_and_a_constant_node_go() -> None:
    """Mul by a Constant node's one (constant folding off), then Div by an initializer one."""
    nodes = [
        helper.make_node("Constant", [], ["c"], value_float=1.0),
        helper.make_node("Mul", ["x", "c"], ["m"]),
        helper.make_node("Div", ["m", "one"], ["d"]),
        helper.make_node("Neg", ["d"], ["y"]),
    ]
    model = make_model(
        nodes, [vinfo("x", F32, [2, 3])], [vinfo("y", F32, [2, 3])], initializers={"one": np.ones(1, np.float32)}
    )
    graph = build_graph(model)
    assert eliminate.run(graph)
    assert [n.op_type for n in graph.nodes] == ["Neg"] and graph.nodes[0].inputs == ["x"]
    assert _ops(model) == {"Neg": 1}
    _assert_bit_identical(model, {"x": _special((2, 3))})


STAYS = [
    # [2] against [3, 1]: the result is [3, 2], not x
    ("Mul", np.ones(2, np.float32), [3, 1], [3, 2], False),
    ("Mul", np.array(1.0000001, np.float32), [2, 3], [2, 3], False),
    ("Mul", np.array([[1.0, 1.0000001]], np.float32), [2, 2], [2, 2], False),
    ("Mul", np.ones(1, np.float32), None, None, False),  # x's rank unknown: [1] may add an axis
    ("Mul", np.ones(1, np.float32), [], [1], False),  # a [1] one makes a 0-d x 1-D
    ("Mul", np.ones((1, 1, 1), np.float32), [2, 3], [1, 2, 3], True),
    ("Div", np.array(1.0, np.float32), [2, 3], [2, 3], True),  # 1 / x is not x
]


@pytest.mark.parametrize(("op", "one", "x_shape", "out_shape", "one_first"), STAYS)
def test_product_that_may_change_x_stays(
    op: str, one: np.ndarray, x_shape: list[int] | None, out_shape: list[int] | None, one_first: bool
) -> None:
    model = _one_model(op, one, x_shape, out_shape, one_first)
    assert _ops(model) == {op: 1, "Neg": 1}
    x = np.asarray(np.random.default_rng(0).standard_normal([2, 3] if x_shape is None else x_shape) + 3, np.float32)
    _assert_bit_identical(model, {"x": x})


def test_one_of_another_element_type_stays() -> None:
    """A float64 one against a float32 x would compute in float64: not removed (the model itself
    is invalid, so the one is swapped in after the graph is built)."""
    graph = build_graph(_one_model("Mul", np.array(1.0, np.float32), [2, 3], [2, 3]))
    graph.initializers["one"] = np.array(1.0, np.float64)
    assert not eliminate.run(graph)
    assert [n.op_type for n in graph.nodes] == ["Mul", "Neg"]


def test_product_by_one_that_is_a_graph_output_keeps_its_name() -> None:
    nodes = [helper.make_node("Cos", ["x"], ["c"]), helper.make_node("Mul", ["c", "one"], ["y"])]
    model = make_model(
        nodes, [vinfo("x", F32, [2, 3])], [vinfo("y", F32, [2, 3])], initializers={"one": np.array(1.0, np.float32)}
    )
    graph = build_graph(model)
    optimize(graph, onnxpy.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert graph.outputs == ["y"] and graph.nodes[-1].outputs == ["y"]
    _assert_bit_identical(model, {"x": _special((2, 3))})
