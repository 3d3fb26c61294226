"""Sequence and optional kernels against onnxruntime: positions (negative, default, out of
range), SplitToSequence / ConcatFromSequence variants, SequenceMap with extra inputs and
outer-scope reads, and optionals of tensors and sequences."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import onnxpy
from tests.ops.test_control_flow import assert_same, both, model, vi

F = TP.FLOAT
SEQ = oh.make_sequence_type_proto(oh.make_tensor_type_proto(F, None))


def seq_out(name: str) -> onnx.ValueInfoProto:
    return oh.make_value_info(name, SEQ)


A = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.arange(6, 12, dtype=np.float32).reshape(2, 3)
C = np.arange(12, 18, dtype=np.float32).reshape(2, 3)


def _abc(
    nodes: list[onnx.NodeProto], outputs: list[Any], extra_inputs: list[Any] | None = None, opset: int = 17
) -> onnx.ModelProto:
    ins = [vi("a", F, [2, 3]), vi("b", F, [2, 3]), vi("c", F, [2, 3]), *(extra_inputs or [])]
    return model([oh.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]), *nodes], ins, outputs, opset)


FEEDS = {"a": A, "b": B, "c": C}


@pytest.mark.parametrize("pos", [0, 2, -1, -3])
def test_sequence_at_insert_erase(pos: int) -> None:
    p = {"p": np.array(pos, np.int64)}
    m = _abc([oh.make_node("SequenceAt", ["s", "p"], ["t"])], [vi("t")], [vi("p", TP.INT64, [])])
    both(m, {**FEEDS, **p})
    m = _abc([oh.make_node("SequenceInsert", ["s", "a", "p"], ["s2"])], [seq_out("s2")], [vi("p", TP.INT64, [])])
    both(m, {**FEEDS, **p})
    m = _abc(
        [oh.make_node("SequenceErase", ["s", "p"], ["s2"]), oh.make_node("SequenceLength", ["s2"], ["n"])],
        [seq_out("s2"), vi("n", TP.INT64, [])],
        [vi("p", TP.INT64, [])],
    )
    both(m, {**FEEDS, **p})


def test_sequence_defaults_and_empty() -> None:
    m = _abc(
        [oh.make_node("SequenceInsert", ["s", "b"], ["s2"]), oh.make_node("SequenceErase", ["s2"], ["s3"])],
        [seq_out("s2"), seq_out("s3")],
    )
    both(m, FEEDS)
    m = model(
        [
            oh.make_node("SequenceEmpty", [], ["e"], dtype=F),
            oh.make_node("SequenceInsert", ["e", "a"], ["s"]),
            oh.make_node("SequenceLength", ["e"], ["n"]),
        ],
        [vi("a", F, [2, 3])],
        [seq_out("s"), vi("n", TP.INT64, [])],
    )
    both(m, {"a": A})


def test_sequence_position_out_of_range_and_type_mismatch() -> None:
    m = _abc([oh.make_node("SequenceAt", ["s", "p"], ["t"])], [vi("t")], [vi("p", TP.INT64, [])])
    with pytest.raises(Exception, match="out of range"):
        onnxpy.InferenceSession(m.SerializeToString()).run(None, {**FEEDS, "p": np.array(3, np.int64)})
    m = _abc([oh.make_node("SequenceErase", ["s", "p"], ["t"])], [seq_out("t")], [vi("p", TP.INT64, [])])
    with pytest.raises(Exception, match="out of range"):
        onnxpy.InferenceSession(m.SerializeToString()).run(None, {**FEEDS, "p": np.array(-4, np.int64)})


@pytest.mark.parametrize(
    "split, axis, keepdims",
    [
        (None, 0, 1),
        (None, 1, 0),
        (None, -1, 1),
        (np.array(2, np.int64), 1, 1),  # chunks of 2, the last one shorter
        (np.array([1, 4, 1], np.int64), 1, 0),  # keepdims is ignored when split is given
        (np.array([3], np.int64), 0, 1),
    ],
)
def test_split_to_sequence(split: np.ndarray | None, axis: int, keepdims: int) -> None:
    x = np.arange(18, dtype=np.float32).reshape(3, 6)
    ins = [vi("x", F, [3, 6])]
    names = ["x"]
    feeds: dict[str, Any] = {"x": x}
    if split is not None:
        ins.append(vi("sp", TP.INT64, list(split.shape)))
        names.append("sp")
        feeds["sp"] = split
    m = model([oh.make_node("SplitToSequence", names, ["s"], axis=axis, keepdims=keepdims)], ins, [seq_out("s")])
    both(m, feeds)


@pytest.mark.parametrize("axis, new_axis", [(0, 0), (1, 0), (-1, 0), (0, 1), (2, 1), (-3, 1), (-1, 1)])
def test_concat_from_sequence(axis: int, new_axis: int) -> None:
    m = _abc([oh.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=new_axis)], [vi("y")])
    both(m, FEEDS)


def test_sequence_map_with_extra_inputs_and_outer_scope() -> None:
    body = oh.make_graph(
        [
            oh.make_node("Add", ["e", "t"], ["u"]),
            oh.make_node("Mul", ["u", "k"], ["v"]),
            oh.make_node("Shape", ["e2"], ["sh"]),
        ],
        "body",
        [vi("e", F, None), vi("t", F, None), vi("e2", F, None)],
        [vi("v", F, None), vi("sh", TP.INT64, None)],
    )
    sh_seq = oh.make_sequence_type_proto(oh.make_tensor_type_proto(TP.INT64, None))
    m = model(
        [
            oh.make_node("SequenceConstruct", ["a", "b"], ["s"]),
            oh.make_node("SplitToSequence", ["x"], ["s2"], axis=1, keepdims=0),
            oh.make_node("SequenceMap", ["s", "t", "s2"], ["vs", "shapes"], body=body),
        ],
        [vi("a", F, [2, 3]), vi("b", F, [2, 3]), vi("t", F, [3]), vi("x", F, [4, 2]), vi("k", F, [])],
        [seq_out("vs"), oh.make_value_info("shapes", sh_seq)],
    )
    both(
        m,
        {
            "a": A,
            "b": B,
            "t": np.array([1, 2, 3], np.float32),
            "x": np.ones((4, 2), np.float32),
            "k": np.array(3, np.float32),
        },
    )


def test_optionals_of_tensors_and_sequences() -> None:
    opt_t = oh.make_optional_type_proto(oh.make_tensor_type_proto(F, [2, 3]))
    opt_s = oh.make_optional_type_proto(SEQ)
    m = model(
        [
            oh.make_node("Optional", ["a"], ["oa"]),
            oh.make_node("Optional", [], ["none"], type=oh.make_tensor_type_proto(F, [2, 3])),
            oh.make_node("SequenceConstruct", ["a", "a"], ["s"]),
            oh.make_node("Optional", ["s"], ["os"]),
            oh.make_node("OptionalHasElement", ["oa"], ["h1"]),
            oh.make_node("OptionalHasElement", ["none"], ["h2"]),
            oh.make_node("OptionalGetElement", ["oa"], ["ga"]),
            oh.make_node("OptionalGetElement", ["os"], ["gs"]),
            # opset 18: a plain tensor is accepted and an absent input has no element
            oh.make_node("OptionalHasElement", ["a"], ["h3"]),
            oh.make_node("OptionalHasElement", [""], ["h4"]),
            oh.make_node("OptionalGetElement", ["a"], ["ga2"]),
        ],
        [vi("a", F, [2, 3])],
        [
            oh.make_value_info("oa", opt_t),
            oh.make_value_info("none", opt_t),
            oh.make_value_info("os", opt_s),
            vi("h1", TP.BOOL, []),
            vi("h2", TP.BOOL, []),
            vi("ga", F, [2, 3]),
            seq_out("gs"),
            vi("h3", TP.BOOL, []),
            vi("h4", TP.BOOL, []),
            vi("ga2", F, [2, 3]),
        ],
        opset=18,
    )
    got = both(m, {"a": A})
    assert got[1] is None and bool(got[3]) and not bool(got[4]) and bool(got[7]) and not bool(got[8])


def test_optional_get_element_of_empty_fails() -> None:
    m = model(
        [
            oh.make_node("Optional", [], ["none"], type=oh.make_tensor_type_proto(F, [2])),
            oh.make_node("OptionalGetElement", ["none"], ["g"]),
        ],
        [],
        [vi("g", F, [2])],
        opset=18,
    )
    with pytest.raises(Exception, match="empty"):
        onnxpy.InferenceSession(m.SerializeToString()).run(None, {})


def test_an_optional_with_neither_input_nor_type_is_refused_at_load() -> None:
    opt = oh.make_value_info("o", oh.make_optional_type_proto(oh.make_tensor_type_proto(F, None)))
    m = model([oh.make_node("Optional", [], ["o"])], [], [opt], opset=18)
    with pytest.raises(onnxpy.InvalidGraph, match="Optional needs either an input or the 'type' attribute"):
        onnxpy.InferenceSession(m.SerializeToString())


def test_sequence_input_and_output_roundtrip() -> None:
    m = model(
        [oh.make_node("SequenceAt", ["s", "p"], ["t"]), oh.make_node("Identity", ["s"], ["s2"])],
        [oh.make_value_info("s", SEQ), vi("p", TP.INT64, [])],
        [vi("t"), seq_out("s2")],
    )
    got = both(m, {"s": [A, B[:1]], "p": np.array(1, np.int64)})
    assert_same(got[1], [A, B[:1]])
