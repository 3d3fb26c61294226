"""optimizer/passes/pack_gated_mlp.py and its kernel (onnxpy.fused.GatedMatMul): a gated MLP's
act(x @ W_gate) * (x @ W_up) becomes one product against [W_gate | W_up] with the activation
and the Mul on its halves, giving the unpacked graph's (and onnxruntime's) numbers; near misses
stay as they are."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxpy.ops.fused import gated_matmul
from onnxpy.optimizer.manager import optimize
from onnxpy.runtime.compile import build_graph
from tests.helpers import assert_optimized_matches, make_model, vinfo

F = TensorProto.FLOAT
D, HIDDEN = 8, 12


def _mlp(
    *,
    activation: str = "silu",
    biases: bool = False,
    swap: bool = False,
    other_input: bool = False,
    up_width: int = HIDDEN,
    fetch_gate: bool = False,
    both_activated: bool = False,
    rank: int = 3,
) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {
        "w_gate": rng.standard_normal((D, HIDDEN)).astype(np.float32),
        "w_up": rng.standard_normal((D, up_width)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w_gate"], ["gate_mm"]),
        helper.make_node("MatMul", ["x2" if other_input else "x", "w_up"], ["up_mm"]),
    ]
    gate, up = "gate_mm", "up_mm"
    if biases:
        inits["b_gate"] = rng.standard_normal(HIDDEN).astype(np.float32)
        inits["b_up"] = rng.standard_normal(up_width).astype(np.float32)
        nodes += [
            helper.make_node("Add", ["gate_mm", "b_gate"], ["gate_b"]),
            helper.make_node("Add", ["b_up", "up_mm"], ["up_b"]),  # either order, as exporters write
        ]
        gate, up = "gate_b", "up_b"
    if activation == "silu":
        nodes += [
            helper.make_node("Sigmoid", [gate], ["gate_s"]),
            helper.make_node("Mul", [gate, "gate_s"], ["gate_act"]),
        ]
    else:
        nodes.append(helper.make_node("Gelu", [gate], ["gate_act"]))  # opset 20
    if both_activated:
        nodes.append(helper.make_node("Relu", [up], ["up_act"]))
        up = "up_act"
    pair = [up, "gate_act"] if swap else ["gate_act", up]
    nodes.append(helper.make_node("Mul", pair, ["y"]))
    lead = ["b", "s"] if rank == 3 else ["n"]
    inputs = [vinfo("x", F, [*lead, D])] + ([vinfo("x2", F, [*lead, D])] if other_input else [])
    outputs = [vinfo("y", F, None)] + ([vinfo("gate_act", F, None)] if fetch_gate else [])
    return make_model(nodes, inputs, outputs, initializers=inits, opset=20 if activation == "gelu" else 17)


def _feeds(model: onnx.ModelProto, rows: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(sum(rows))
    return {i.name: rng.standard_normal((*rows, D)).astype(np.float32) for i in model.graph.input}


def _ops(model: onnx.ModelProto) -> collections.Counter[str]:
    graph = build_graph(model)
    optimize(graph, 99, host_only=True)
    return collections.Counter(n.op_type for n in graph.nodes)


@pytest.mark.parametrize(
    "variant",
    [{}, {"biases": True}, {"swap": True}, {"activation": "gelu"}, {"rank": 2}],
    ids=["silu", "biases", "up-first", "gelu", "2-d"],
)
def test_gated_mlp_packs_into_one_product(variant: dict[str, object]) -> None:
    model = _mlp(**variant)  # type: ignore[arg-type]
    assert _ops(model) == {"GatedMatMul": 1}
    rows = [(1, 1), (2, 5)] if variant.get("rank", 3) == 3 else [(1,), (6,)]
    for r in rows:
        assert_optimized_matches(model, _feeds(model, r), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "variant",
    [{"other_input": True}, {"up_width": HIDDEN + 4}, {"fetch_gate": True}, {"both_activated": True}],
    ids=["other-input", "other-width", "gate-fetched", "both-activated"],
)
def test_near_misses_stay_two_products(variant: dict[str, object]) -> None:
    model = _mlp(**variant)  # type: ignore[arg-type]
    if variant.get("up_width"):  # the Mul would broadcast mismatched widths: not a valid model to run
        assert "GatedMatMul" not in _ops(model)
        return
    assert "GatedMatMul" not in _ops(model)
    assert_optimized_matches(model, _feeds(model, (2, 5)), rtol=1e-5, atol=1e-5)


def test_kernel_applies_any_activation_to_the_first_half() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, D)).astype(np.float32)
    b = rng.standard_normal((D, 2 * HIDDEN)).astype(np.float32)
    y = a @ b
    got = gated_matmul(np, a, b, activation="Relu")
    np.testing.assert_allclose(got, np.maximum(y[:, :HIDDEN], 0) * y[:, HIDDEN:], rtol=1e-6, atol=1e-6)
    assert got.flags.c_contiguous
    with pytest.raises(ValueError, match="two equal halves"):
        gated_matmul(np, a, b[:, :-1], activation="Relu")


def _chunked_mlp(
    *, gate_half: int = 0, bounds: tuple[int, int] | None = None, fetch_product: bool = False, bias: bool = False
) -> onnx.ModelProto:
    """Phi-3's MLP: one product for gate and up (gate_up_proj), split in halves of the last axis
    by two Slices (torch's chunk), silu on the gate half times the up half."""
    rng = np.random.default_rng(3)
    inits = {
        "w": rng.standard_normal((D, 2 * HIDDEN)).astype(np.float32),
        "zero": np.array([0], np.int64),
        "mid": np.array([HIDDEN], np.int64),
        "end": np.array([2 * HIDDEN], np.int64),
        "last": np.array([-1], np.int64),
    }
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p_mm"])]
    product = "p_mm"
    if bias:
        inits["b"] = rng.standard_normal(2 * HIDDEN).astype(np.float32)
        nodes.append(helper.make_node("Add", ["p_mm", "b"], ["p"]))
        product = "p"
    if bounds is not None:
        inits["odd"] = np.array([bounds[0]], np.int64)
        inits["odd_end"] = np.array([bounds[1]], np.int64)
    first, second = (["zero", "mid"], ["mid", "end"])
    if bounds is not None:
        first = ["odd", "odd_end"]
    halves = [first, second]
    nodes += [
        helper.make_node("Slice", [product, *halves[0], "last"], ["h0"]),
        helper.make_node("Slice", [product, *halves[1], "last"], ["h1"]),
        helper.make_node("Sigmoid", [f"h{gate_half}"], ["s"]),
        helper.make_node("Mul", [f"h{gate_half}", "s"], ["g"]),
        helper.make_node("Mul", [f"h{1 - gate_half}", "g"], ["y"]),
    ]
    outputs = [vinfo("y", F, None)] + ([vinfo(product, F, None)] if fetch_product else [])
    return make_model(nodes, [vinfo("x", F, ["b", "s", D])], outputs, initializers=inits)


@pytest.mark.parametrize("variant", [{}, {"gate_half": 1}, {"bias": True}], ids=["gate-first", "gate-second", "bias"])
def test_one_product_split_in_halves_becomes_a_gated_product(variant: dict[str, object]) -> None:
    model = _chunked_mlp(**variant)  # type: ignore[arg-type]
    assert _ops(model) == {"GatedMatMul": 1}
    for rows in [(1, 1), (2, 5)]:
        assert_optimized_matches(model, _feeds(model, rows), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "variant", [{"bounds": (1, HIDDEN + 1)}, {"fetch_product": True}], ids=["not-halves", "product-fetched"]
)
def test_split_products_that_are_not_a_gated_pair_stay(variant: dict[str, object]) -> None:
    model = _chunked_mlp(**variant)  # type: ignore[arg-type]
    assert "GatedMatMul" not in _ops(model)
    assert_optimized_matches(model, _feeds(model, (2, 5)), rtol=1e-5, atol=1e-5)
