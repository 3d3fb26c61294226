"""optimizer/passes/common_subexpressions.py: repeated computations merge into one node, the
numbers stay those of the unoptimized graph and of onnxruntime, and what must not merge
(random draws, different attributes, graph outputs, large constants under two names) stays."""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxpy.optimizer.passes import common_subexpressions
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches, make_model, vinfo

F, B = TensorProto.FLOAT, TensorProto.BOOL


def _ops_after(model: onnx.ModelProto) -> dict[str, int]:
    graph = build_graph(model)
    common_subexpressions.run(graph)
    return dict(collections.Counter(n.op_type for n in graph.nodes))


def _check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    assert_optimized_matches(model, feeds, rtol=1e-6, atol=1e-7)


def _mask_model() -> onnx.ModelProto:
    """BERT's per-layer attention mask: Where(mask, 0, -inf) twice, each from its own pair of
    constants, then a chain on each (Add of the same input) that merges in turn."""
    nodes = [
        helper.make_node("Where", ["m", "zero_a", "ninf_a"], ["bias_a"]),
        helper.make_node("Where", ["m", "zero_b", "ninf_b"], ["bias_b"]),
        helper.make_node("Add", ["x", "bias_a"], ["s_a"]),
        helper.make_node("Add", ["x", "bias_b"], ["s_b"]),
        helper.make_node("Softmax", ["s_a"], ["p_a"], axis=-1),
        helper.make_node("Softmax", ["s_b"], ["p_b"], axis=0),  # another axis: stays apart
        helper.make_node("Mul", ["p_a", "p_b"], ["y"]),
    ]
    inits = {
        "zero_a": np.array(0.0, np.float32),
        "ninf_a": np.array(-np.inf, np.float32),
        "zero_b": np.array(0.0, np.float32),
        "ninf_b": np.array(-np.inf, np.float32),
    }
    return make_model(nodes, [vinfo("m", B, [3, 4]), vinfo("x", F, [3, 4])], [vinfo("y", F, [3, 4])], inits)


def _mask_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = rng.random((3, 4)) < 0.7
    mask[:, 0] = True  # every row keeps a key
    return {"m": mask, "x": rng.standard_normal((3, 4)).astype(np.float32)}


def test_repeated_computations_merge_into_one() -> None:
    model = _mask_model()
    assert _ops_after(model) == {"Where": 1, "Add": 1, "Softmax": 2, "Mul": 1}
    _check(model, _mask_feeds())


def test_graph_outputs_keep_their_nodes() -> None:
    model = _mask_model()
    model.graph.output.append(vinfo("s_b", F, [3, 4]))
    ops = _ops_after(model)
    assert ops["Where"] == 1 and ops["Add"] == 2  # s_b is fetched under its own name
    _check(model, _mask_feeds())


def test_random_draws_and_large_constants_stay_apart() -> None:
    big = np.arange(100, dtype=np.float32).reshape(10, 10)
    nodes = [
        helper.make_node("RandomUniformLike", ["x"], ["r1"], seed=1.0),
        helper.make_node("RandomUniformLike", ["x"], ["r2"], seed=1.0),
        helper.make_node("Add", ["x", "w1"], ["a1"]),
        helper.make_node("Add", ["x", "w2"], ["a2"]),  # equal values, another name: weights
        helper.make_node("Sum", ["r1", "r2", "a1", "a2"], ["y"]),
    ]
    model = make_model(nodes, [vinfo("x", F, [10, 10])], [vinfo("y", F, [10, 10])], {"w1": big, "w2": big.copy()})
    assert _ops_after(model) == {"RandomUniformLike": 2, "Add": 2, "Sum": 1}


def test_a_subgraph_node_is_never_merged() -> None:
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["o"])], "b", [], [vinfo("o", F, [2])]
    )  # reads x from the outer scope
    nodes = [
        helper.make_node("If", ["c"], ["i1"], then_branch=branch, else_branch=branch),
        helper.make_node("If", ["c"], ["i2"], then_branch=branch, else_branch=branch),
        helper.make_node("Add", ["i1", "i2"], ["y"]),
    ]
    model = make_model(nodes, [vinfo("c", B, []), vinfo("x", F, [2])], [vinfo("y", F, [2])])
    assert _ops_after(model)["If"] == 2
    _check(model, {"c": np.array(True), "x": np.array([1.0, 2.0], np.float32)})
