"""fuse_rotary: Llama's rotary embedding, q * cos + rotate_half(q) * sin with the split point
computed from Shape(q), becomes one onnxpy.fused.RotaryHalf with the graph's values; other
slicings stay."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches, make_model, vinfo

RNG = np.random.default_rng(31)
D = 8


def _rotary_model(halves: tuple[int, int] | None = None, order: str = "torch", low_start: int = 0) -> onnx.ModelProto:
    """q (b, h, s, D) and cos/sin (b, 1, s, D); the split point h = D // 2 as torch computes it
    (Shape -> Gather -> Div 2 -> Unsqueeze), or the constant slice ends ``halves`` = (low end,
    high start)."""
    nodes = []
    if halves is None:
        nodes += [
            helper.make_node("Shape", ["q"], ["shape"]),
            helper.make_node("Gather", ["shape", "minus_one"], ["width"], axis=0),
            helper.make_node("Div", ["width", "two"], ["h0"]),
            helper.make_node("Cast", ["h0"], ["h1"], to=TensorProto.INT64),
            helper.make_node("Unsqueeze", ["h1", "zero_axis"], ["h"]),
        ]
        low_end, high_start = "h", "h"
    else:
        low_end, high_start = "low_end", "high_start"
    nodes += [
        helper.make_node("Slice", ["q", "low_start", low_end, "last_axis", "one"], ["low"]),
        helper.make_node("Slice", ["q", high_start, "to_end", "last_axis", "one"], ["high"]),
        helper.make_node("Neg", ["high"], ["neg"]),
        helper.make_node("Concat", ["neg", "low"], ["rot"], axis=-1),
    ]
    if order == "torch":
        nodes += [
            helper.make_node("Mul", ["q", "cos"], ["a"]),
            helper.make_node("Mul", ["rot", "sin"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["y"]),
        ]
    else:  # operands the other way round
        nodes += [
            helper.make_node("Mul", ["cos", "q"], ["a"]),
            helper.make_node("Mul", ["sin", "rot"], ["b"]),
            helper.make_node("Add", ["b", "a"], ["y"]),
        ]
    inits = {
        "minus_one": np.array(-1, np.int64),
        "two": np.array(2, np.int64),
        "zero_axis": np.array([0], np.int64),
        "low_start": np.array([low_start], np.int64),
        "one": np.array([1], np.int64),
        "last_axis": np.array([-1], np.int64),
        "to_end": np.array([2**63 - 1], np.int64),
    }
    if halves is not None:
        inits["low_end"], inits["high_start"] = np.array([halves[0]], np.int64), np.array([halves[1]], np.int64)
    used = {i for n in nodes for i in n.input}
    return make_model(
        nodes,
        [vinfo("q", TensorProto.FLOAT, ["b", 4, "s", D]), vinfo("cos", TensorProto.FLOAT, ["b", 1, "s", D]),
         vinfo("sin", TensorProto.FLOAT, ["b", 1, "s", D])],
        [vinfo("y", TensorProto.FLOAT, ["b", 4, "s", D])],
        initializers={k: v for k, v in inits.items() if k in used},
    )  # fmt: skip


def _feeds(batch: int = 2, seq: int = 5) -> dict[str, np.ndarray]:
    return {
        "q": RNG.standard_normal((batch, 4, seq, D)).astype(np.float32),
        "cos": RNG.standard_normal((batch, 1, seq, D)).astype(np.float32),
        "sin": RNG.standard_normal((batch, 1, seq, D)).astype(np.float32),
    }


def _ops(model: onnx.ModelProto) -> list[str]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return [n.op_type for n in graph.nodes]


@pytest.mark.parametrize("order", ["torch", "swapped"])
@pytest.mark.parametrize("halves", [None, (D // 2, D // 2)], ids=["from-shape", "constant"])
def test_rotate_half_becomes_one_node(order: str, halves) -> None:
    model = _rotary_model(halves, order)
    assert _ops(model) == ["RotaryHalf"]
    for batch, seq in ((2, 5), (1, 1)):
        feeds = _feeds(batch, seq)
        assert_optimized_matches(model, feeds, rtol=1e-6, atol=1e-6)
        q, cos, sin = feeds["q"], feeds["cos"], feeds["sin"]
        rotated = np.concatenate([-q[..., D // 2 :], q[..., : D // 2]], axis=-1)
        from onnxpy import InferenceSession

        got = InferenceSession(model.SerializeToString()).run(None, feeds)[0]
        np.testing.assert_allclose(got, q * cos + rotated * sin, rtol=1e-6, atol=1e-6)


def test_a_split_off_the_middle_is_a_rotation_too() -> None:
    # cat(-q[..., 3:], q[..., :3]): rotate_half at another point, the same kernel with half=3
    model = _rotary_model((3, 3))
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    assert [(n.op_type, n.attrs.get("half")) for n in graph.nodes] == [("RotaryHalf", 3)]
    assert_optimized_matches(model, _feeds(), rtol=1e-6, atol=1e-6)


def test_a_low_part_off_the_start_stays() -> None:
    # cat(-q[..., 4:], q[..., 1:5]): as wide as q, but no rotation of it
    model = _rotary_model((5, 4), low_start=1)
    assert "RotaryHalf" not in _ops(model)
    assert_optimized_matches(model, _feeds(), rtol=1e-6, atol=1e-6)


def test_halves_joined_the_other_way_stay() -> None:
    # cat(q[..., :h], -q[..., h:]) is not rotate_half
    model = _rotary_model()
    concat = next(n for n in model.graph.node if n.op_type == "Concat")
    concat.input[:] = ["low", "neg"]
    assert "RotaryHalf" not in _ops(model)
    assert_optimized_matches(model, _feeds(), rtol=1e-6, atol=1e-6)
