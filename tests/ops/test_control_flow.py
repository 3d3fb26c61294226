"""If, Loop and Scan against onnxruntime: outer-scope reads, nesting, sequences and optionals out
of branches, loop modes, empty loops, scan axes and directions, and the per-iteration cost."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import onnxpy
from tests.helpers import python_lines_run

F = TP.FLOAT


def vi(name: str, elem: int = F, shape: list[Any] | None = None) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, shape)


def model(
    nodes: list[onnx.NodeProto], inputs: list[Any], outputs: list[Any], opset: int = 17, inits: list[Any] | None = None
) -> onnx.ModelProto:
    g = oh.make_graph(nodes, "g", inputs, outputs, initializer=inits or [])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


def assert_same(got: Any, want: Any) -> None:
    if want is None:
        assert got is None
        return
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{type(got)} vs list of {len(want)}"
        for g, w in zip(got, want):
            assert_same(g, w)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{got.dtype}{got.shape} != {want.dtype}{want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def both(m: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    ours = onnxpy.InferenceSession(m.SerializeToString()).run(None, feeds)
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(ours) == len(theirs)
    for g, w in zip(ours, theirs):
        assert_same(g, w)
    return ours


def const(name: str, value: Any, dtype: Any = np.float32) -> onnx.NodeProto:
    return oh.make_node(
        "Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype), name)
    )


# -- If ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cond", [True, False])
def test_if_reads_outer_values_and_branches_differ_in_shape(cond: bool) -> None:
    then = oh.make_graph([oh.make_node("Add", ["x", "y"], ["t"])], "then", [], [vi("t")])
    other = oh.make_graph([oh.make_node("Concat", ["x", "x"], ["e"], axis=0)], "else", [], [vi("e")])
    m = model(
        [
            oh.make_node("Add", ["a", "a"], ["x"]),
            oh.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other),
        ],
        [vi("c", TP.BOOL, []), vi("a", F, [2]), vi("y", F, [2])],
        [vi("out")],
    )
    got = both(m, {"c": np.array(cond), "a": np.array([1, 2], np.float32), "y": np.array([10, 20], np.float32)})
    assert got[0].shape == ((2,) if cond else (4,))


def test_nested_if_reads_values_two_scopes_out() -> None:
    inner_then = oh.make_graph([oh.make_node("Mul", ["x", "k"], ["it"])], "it", [], [vi("it")])
    inner_else = oh.make_graph([oh.make_node("Sub", ["x", "k"], ["ie"])], "ie", [], [vi("ie")])
    outer_then = oh.make_graph(
        [
            oh.make_node("Neg", ["x"], ["k"]),
            oh.make_node("If", ["c2"], ["r"], then_branch=inner_then, else_branch=inner_else),
        ],
        "ot",
        [],
        [vi("r")],
    )
    outer_else = oh.make_graph([oh.make_node("Identity", ["x"], ["oe"])], "oe", [], [vi("oe")])
    m = model(
        [oh.make_node("If", ["c1"], ["out"], then_branch=outer_then, else_branch=outer_else)],
        [vi("c1", TP.BOOL, []), vi("c2", TP.BOOL, []), vi("x", F, [3])],
        [vi("out")],
    )
    x = np.array([1, -2, 3], np.float32)
    for c1 in (True, False):
        for c2 in (True, False):
            both(m, {"c1": np.array(c1), "c2": np.array(c2), "x": x})


def test_if_with_several_outputs_and_constant_branch() -> None:
    then = oh.make_graph([const("p", [1.0, 2.0]), const("q", 7, np.int64)], "t", [], [vi("p"), vi("q", TP.INT64)])
    other = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["p2"]), oh.make_node("Shape", ["x"], ["q2"])],
        "e",
        [],
        [vi("p2"), vi("q2", TP.INT64)],
    )
    m = model(
        [oh.make_node("If", ["c"], ["p", "q"], then_branch=then, else_branch=other)],
        [vi("c", TP.BOOL, [1]), vi("x")],
        [vi("p"), vi("q", TP.INT64)],
    )
    for c in (True, False):
        both(m, {"c": np.array([c]), "x": np.ones((2, 3), np.float32)})


def test_if_sequence_and_optional_branches() -> None:
    seq_t = oh.make_sequence_type_proto(oh.make_tensor_type_proto(F, None))
    then = oh.make_graph(
        [oh.make_node("SequenceConstruct", ["x", "x"], ["s"])], "t", [], [oh.make_value_info("s", seq_t)]
    )
    other = oh.make_graph(
        [oh.make_node("SequenceEmpty", [], ["s2"], dtype=F)], "e", [], [oh.make_value_info("s2", seq_t)]
    )
    m = model(
        [oh.make_node("If", ["c"], ["s"], then_branch=then, else_branch=other)],
        [vi("c", TP.BOOL, []), vi("x", F, [2])],
        [oh.make_value_info("s", seq_t)],
    )
    for c in (True, False):
        both(m, {"c": np.array(c), "x": np.array([1, 2], np.float32)})
    opt_t = oh.make_optional_type_proto(oh.make_tensor_type_proto(F, [2]))
    then = oh.make_graph([oh.make_node("Optional", ["x"], ["o"])], "t", [], [oh.make_value_info("o", opt_t)])
    other = oh.make_graph(
        [oh.make_node("Optional", [], ["o2"], type=oh.make_tensor_type_proto(F, [2]))],
        "e",
        [],
        [oh.make_value_info("o2", opt_t)],
    )
    m = model(
        [oh.make_node("If", ["c"], ["o"], then_branch=then, else_branch=other)],
        [vi("c", TP.BOOL, []), vi("x", F, [2])],
        [oh.make_value_info("o", opt_t)],
        opset=18,
    )
    got_t = onnxpy.InferenceSession(m.SerializeToString()).run(
        None, {"c": np.array(True), "x": np.array([1, 2], np.float32)}
    )
    got_f = onnxpy.InferenceSession(m.SerializeToString()).run(
        None, {"c": np.array(False), "x": np.array([1, 2], np.float32)}
    )
    np.testing.assert_array_equal(got_t[0], [1, 2])
    assert got_f[0] is None


def test_if_rejects_a_non_scalar_condition() -> None:
    then = oh.make_graph([const("p", 1.0)], "t", [], [vi("p")])
    m = model(
        [oh.make_node("If", ["c"], ["p"], then_branch=then, else_branch=then)], [vi("c", TP.BOOL, [2])], [vi("p")]
    )
    with pytest.raises(Exception, match="single"):
        onnxpy.InferenceSession(m.SerializeToString()).run(None, {"c": np.array([True, False])})


# -- Loop -------------------------------------------------------------------------------------


def _counting_body(stop_at: float | None = None) -> onnx.GraphProto:
    """acc += x (an outer value) each iteration; scan out acc * i; cond = acc < stop_at."""
    nodes = [
        oh.make_node("Add", ["acc_in", "x"], ["acc_out"]),
        oh.make_node("Cast", ["i"], ["i_f"], to=F),
        oh.make_node("Mul", ["acc_out", "i_f"], ["scan"]),
    ]
    if stop_at is None:
        nodes.append(oh.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        nodes += [
            const("lim", stop_at),
            oh.make_node("ReduceSum", ["acc_out"], ["tot"], keepdims=0),
            oh.make_node("Less", ["tot", "lim"], ["cond_out"]),
        ]
    return oh.make_graph(
        nodes,
        "body",
        [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc_in", F, [2])],
        [vi("cond_out", TP.BOOL, []), vi("acc_out", F, [2]), vi("scan", F, [2])],
    )


@pytest.mark.parametrize(
    "trip, cond, stop_at",
    [
        (5, None, None),  # for loop
        (None, True, 7.0),  # while loop
        (10, True, 7.0),  # both: the condition stops it first
        (2, True, 100.0),  # both: the count stops it first
        (0, None, None),  # no iteration: the scan output is empty
        (4, False, None),  # false condition: no iteration
        (None, None, 7.0),  # neither: the body's condition ends it
    ],
)
def test_loop_modes(trip: int | None, cond: bool | None, stop_at: float | None) -> None:
    body = _counting_body(stop_at)
    ins, feeds = (
        [vi("acc0", F, [2]), vi("x", F, [2])],
        {"acc0": np.zeros(2, np.float32), "x": np.array([1.0, 0.5], np.float32)},
    )
    names = ["", "", "acc0"]
    if trip is not None:
        ins.append(vi("M", TP.INT64, []))
        feeds["M"] = np.array(trip, np.int64)
        names[0] = "M"
    if cond is not None:
        ins.append(vi("c", TP.BOOL, []))
        feeds["c"] = np.array(cond)
        names[1] = "c"
    m = model(
        [oh.make_node("Loop", names, ["acc", "scans"], body=body)], ins, [vi("acc", F, [2]), vi("scans", F, [None, 2])]
    )
    got = both(m, feeds)
    if trip == 0:
        assert got[1].shape == (0, 2)


def test_loop_without_iterations_keeps_the_rank_of_a_symbolic_scan_output() -> None:
    # The body declares its scan output [N, 3]: no iteration gives [0, 0, 3], as onnxruntime
    # gives it and shape inference types it (rank 3), not a rank-1 [0].
    body = oh.make_graph(
        [oh.make_node("Identity", ["cond"], ["cond_o"]), oh.make_node("Identity", ["x"], ["x_o"])]
        + [oh.make_node("Relu", ["x"], ["sc"])],
        "body",
        [vi("i", TP.INT64, []), vi("cond", TP.BOOL, []), vi("x", F, ["N", 3])],
        [vi("cond_o", TP.BOOL, []), vi("x_o", F, ["N", 3]), vi("sc", F, ["N", 3])],
    )
    m = model(
        [oh.make_node("Loop", ["M", "", "x0"], ["xf", "scan"], body=body)],
        [vi("M", TP.INT64, []), vi("x0", F, ["N", 3])],
        [vi("xf", F), vi("scan", F)],
    )
    got = both(m, {"M": np.array(0, np.int64), "x0": np.ones((2, 3), np.float32)})
    assert got[1].shape == (0, 0, 3)


def test_loop_carried_sequence_and_outer_scope() -> None:
    seq_t = oh.make_sequence_type_proto(oh.make_tensor_type_proto(F, None))
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
            oh.make_node("Cast", ["i"], ["i_f"], to=F),
            oh.make_node("Mul", ["x", "i_f"], ["xi"]),
            oh.make_node("SequenceInsert", ["seq_in", "xi"], ["seq_out"]),
        ],
        "body",
        [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), oh.make_value_info("seq_in", seq_t)],
        [vi("cond_out", TP.BOOL, []), oh.make_value_info("seq_out", seq_t)],
    )
    m = model(
        [oh.make_node("SequenceEmpty", [], ["s0"], dtype=F), oh.make_node("Loop", ["M", "", "s0"], ["s"], body=body)],
        [vi("M", TP.INT64, []), vi("x", F, [3])],
        [oh.make_value_info("s", seq_t)],
    )
    got = both(m, {"M": np.array(4, np.int64), "x": np.array([1, 2, 3], np.float32)})
    assert len(got[0]) == 4


def test_nested_loops() -> None:
    inner = oh.make_graph(
        [oh.make_node("Identity", ["c2"], ["co2"]), oh.make_node("Add", ["b", "x"], ["bo"])],
        "inner",
        [vi("j", TP.INT64, []), vi("c2", TP.BOOL, []), vi("b", F, [])],
        [vi("co2", TP.BOOL, []), vi("bo", F, [])],
    )
    outer = oh.make_graph(
        [
            oh.make_node("Identity", ["c"], ["co"]),
            oh.make_node("Loop", ["N", "", "a"], ["ao"], body=inner),
            oh.make_node("Identity", ["ao"], ["snap"]),
        ],
        "outer",
        [vi("i", TP.INT64, []), vi("c", TP.BOOL, []), vi("a", F, [])],
        [vi("co", TP.BOOL, []), vi("ao", F, []), vi("snap", F, [])],
    )
    m = model(
        [oh.make_node("Loop", ["M", "", "a0"], ["a", "snaps"], body=outer)],
        [vi("M", TP.INT64, []), vi("N", TP.INT64, []), vi("a0", F, []), vi("x", F, [])],
        [vi("a", F, []), vi("snaps", F, [None])],
    )
    both(
        m,
        {
            "M": np.array(3, np.int64),
            "N": np.array(4, np.int64),
            "a0": np.array(0, np.float32),
            "x": np.array(0.5, np.float32),
        },
    )


def test_loop_of_a_thousand_tiny_iterations_has_bounded_overhead() -> None:
    """Per-iteration overhead, counted in interpreter lines (deterministic, unlike a timing):
    about 160 per iteration today; the bound catches per-element work or a heavier dispatch."""
    m = model(
        [oh.make_node("Loop", ["M", "", "acc0"], ["acc", "scans"], body=_counting_body())],
        [vi("M", TP.INT64, []), vi("acc0", F, [2]), vi("x", F, [2])],
        [vi("acc", F, [2]), vi("scans", F, [None, 2])],
    )
    sess = onnxpy.InferenceSession(m.SerializeToString())
    feeds = {"M": np.array(1000, np.int64), "acc0": np.zeros(2, np.float32), "x": np.ones(2, np.float32)}
    sess.run(None, feeds)
    (acc, scans), lines = python_lines_run(lambda: sess.run(None, feeds))
    np.testing.assert_array_equal(acc, [1000, 1000])
    assert scans.shape == (1000, 2)
    assert lines < 400 * 1000, f"1000 iterations ran {lines} Python lines"


# -- Scan -------------------------------------------------------------------------------------


def _scan_body() -> onnx.GraphProto:
    """state s += row * w (w from the outer scope); outputs s and row - s."""
    return oh.make_graph(
        [
            oh.make_node("Mul", ["row", "w"], ["rw"]),
            oh.make_node("Add", ["s_in", "rw"], ["s_out"]),
            oh.make_node("Sub", ["row2", "s_out"], ["d"]),
            oh.make_node("Identity", ["s_out"], ["s_copy"]),
        ],
        "body",
        [vi("s_in", F, [3]), vi("row", F, [3]), vi("row2", F, [3])],
        [vi("s_out", F, [3]), vi("s_copy", F, [3]), vi("d", F, [3])],
    )


@pytest.mark.parametrize(
    "in_axes, in_dirs, out_axes, out_dirs",
    [
        (None, None, None, None),
        ([1, 0], [1, 0], [0, 1], [0, 1]),
        ([-1, 0], [0, 1], [-1, 0], [1, 1]),
    ],
)
def test_scan9_axes_and_directions(in_axes: Any, in_dirs: Any, out_axes: Any, out_dirs: Any) -> None:
    attrs: dict[str, Any] = {"num_scan_inputs": 2}
    for k, v in (
        ("scan_input_axes", in_axes),
        ("scan_input_directions", in_dirs),
        ("scan_output_axes", out_axes),
        ("scan_output_directions", out_dirs),
    ):
        if v is not None:
            attrs[k] = v
    a = (
        np.arange(12, dtype=np.float32).reshape(4, 3)
        if in_axes is None or in_axes[0] == 0
        else np.arange(12, dtype=np.float32).reshape(3, 4)
    )
    b = np.arange(12, dtype=np.float32).reshape(4, 3) * 0.5
    m = model(
        [oh.make_node("Scan", ["s0", "a", "b"], ["s", "ys", "ds"], body=_scan_body(), **attrs)],
        [vi("s0", F, [3]), vi("a", F, list(a.shape)), vi("b", F, [4, 3]), vi("w", F, [])],
        [vi("s", F, None), vi("ys", F, None), vi("ds", F, None)],
    )
    both(m, {"s0": np.ones(3, np.float32), "a": a, "b": b, "w": np.array(2.0, np.float32)})


def test_scan8_batch_and_sequence_lens() -> None:
    body = oh.make_graph(
        [oh.make_node("Add", ["s_in", "row"], ["s_out"]), oh.make_node("Identity", ["s_out"], ["y"])],
        "body",
        [vi("s_in", F, [2]), vi("row", F, [2])],
        [vi("s_out", F, [2]), vi("y", F, [2])],
    )
    x = np.arange(24, dtype=np.float32).reshape(3, 4, 2)
    for lens, dirs in ((None, [0]), (np.array([4, 2, 1], np.int64), [0]), (np.array([3, 4, 1], np.int64), [1])):
        names = ["L" if lens is not None else "", "s0", "x"]
        m = model(
            [oh.make_node("Scan", names, ["s", "ys"], body=body, num_scan_inputs=1, directions=dirs)],
            ([vi("L", TP.INT64, [3])] if lens is not None else []) + [vi("s0", F, [3, 2]), vi("x", F, [3, 4, 2])],
            [vi("s", F, [3, 2]), vi("ys", F, [3, 4, 2])],
            opset=8,
        )
        feeds = {"s0": np.zeros((3, 2), np.float32), "x": x}
        if lens is not None:
            feeds["L"] = lens
        both(m, feeds)


def test_scan9_without_state_and_with_empty_sequence() -> None:
    body = oh.make_graph([oh.make_node("Neg", ["row"], ["y"])], "body", [vi("row", F, [2])], [vi("y", F, [2])])
    m = model(
        [oh.make_node("Scan", ["x"], ["ys"], body=body, num_scan_inputs=1)],
        [vi("x", F, [None, 2])],
        [vi("ys", F, [None, 2])],
    )
    both(m, {"x": np.arange(6, dtype=np.float32).reshape(3, 2)})
    (got,) = onnxpy.InferenceSession(m.SerializeToString()).run(None, {"x": np.zeros((0, 2), np.float32)})
    assert got.shape == (0, 2)
