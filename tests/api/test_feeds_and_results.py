"""What run() accepts as feeds and what it hands back, against onnxruntime: str arrays, Python
lists and byte-swapped arrays are converted to the declared type; results are arrays the caller
alone holds (never an input, never memory shared with another result); a model whose types
contradict its operators' schemas or its declared outputs is refused."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import onnxpy
from tests.helpers import make_model, vinfo

F, I64, STR = TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING


def _identity(elem: int) -> bytes:
    m = make_model([helper.make_node("Identity", ["x"], ["z"], name="copy")], [vinfo("x", elem)], [vinfo("z", elem)])
    return m.SerializeToString()


def _both(model: bytes, feeds: dict) -> tuple[list, list]:
    ours = onnxpy.InferenceSession(model).run(None, feeds)
    theirs = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    return ours, theirs


# -- feeds ---------------------------------------------------------------------------------------


def test_str_arrays_feed_string_inputs() -> None:
    # numpy's own text arrays (dtype <U), not only object arrays
    x = np.array(["ab", "c", ""])
    (got,), (want,) = _both(_identity(STR), {"x": x})
    assert got.dtype == want.dtype == object and got.tolist() == want.tolist() == ["ab", "c", ""]
    got = onnxpy.InferenceSession(_identity(STR)).run(None, {"x": np.array([b"ab", b"c"])})[0]
    assert got.dtype == object and got.tolist() == [b"ab", b"c"]


@pytest.mark.parametrize(
    ("elem", "value"),
    [(F, [1, 2]), (I64, [1.5, -2.7]), (TensorProto.BOOL, [1, 0]), (TensorProto.FLOAT16, [0.5]), (STR, [1, 2])],
)
def test_python_lists_become_the_declared_type(elem: int, value: list) -> None:
    (got,), (want,) = _both(_identity(elem), {"x": value})
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


@pytest.mark.parametrize(
    ("elem", "value", "why"),
    [(TensorProto.INT8, [300], "out of bounds"), (F, [[1, 2], [3]], "inhomogeneous"), (F, ["a"], "could not convert")],
)
def test_lists_that_do_not_convert_are_refused_naming_the_input(elem: int, value: list, why: str) -> None:
    with pytest.raises(
        onnxpy.InvalidArgument, match=rf"input 'x': cannot convert the list given to tensor\(\w+\).*{why}"
    ):
        onnxpy.InferenceSession(_identity(elem)).run(None, {"x": value})


def test_big_endian_arrays_are_read_by_value() -> None:
    # onnxruntime 1.32 accepts them too, but reads their bytes as native ones (1.0 -> 4.6e-41)
    x = np.arange(4, dtype=">f4")
    got = onnxpy.InferenceSession(_identity(F)).run(None, {"x": x})[0]
    assert got.dtype == np.float32 and got.tolist() == [0, 1, 2, 3]


def test_none_as_a_tensor_feed_is_named() -> None:
    with pytest.raises(onnxpy.InvalidArgument, match=r"input 'x' is None: expected a tensor\(float\) value"):
        onnxpy.InferenceSession(_identity(F)).run(None, {"x": None})


def test_sequence_elements_of_another_type_are_refused() -> None:
    m = make_model(
        [helper.make_node("SequenceLength", ["s"], ["n"])],
        [helper.make_tensor_sequence_value_info("s", F, None)],
        [vinfo("n", I64, [])],
    )
    sess = onnxpy.InferenceSession(m)
    assert sess.run(None, {"s": [np.ones(2, np.float32)] * 3})[0] == 3
    with pytest.raises(
        onnxpy.InvalidArgument, match=r"element 1 of input 's'.*tensor\(int64\).*seq\(tensor\(float\)\)"
    ):
        sess.run(None, {"s": [np.ones(2, np.float32), np.ones(2, np.int64)]})


# -- results -------------------------------------------------------------------------------------


def test_a_result_is_never_the_callers_input() -> None:
    sess = onnxpy.InferenceSession(_identity(F))
    x = np.arange(3, dtype=np.float32)
    z = sess.run(None, {"x": x})[0]
    assert z is not x and not np.shares_memory(z, x)
    z[0] = 99  # the caller's input is not touched
    assert x[0] == 0
    view = np.arange(6, dtype=np.float32)[::2]  # a view feed: copied in, so no sharing either
    assert not np.shares_memory(sess.run(None, {"x": view})[0], view)


def test_results_never_share_memory() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Identity", ["a"], ["b"]),
        helper.make_node("Reshape", ["a", "shape"], ["c"]),
    ]
    m = make_model(
        nodes, [vinfo("x", F, [2, 3])], [vinfo("a", F), vinfo("b", F), vinfo("c", F)], {"shape": np.array([6])}
    )
    sess = onnxpy.InferenceSession(m)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for names in (None, ["c", "a", "b"], ["a", "a"]):
        results = sess.run(names, {"x": x})
        for i, r in enumerate(results):
            for other in results[i + 1 :]:
                assert not np.shares_memory(r, other)
        assert results[0].ravel().tolist() == list(range(6))


def test_reshaped_results_are_handed_over_unless_they_share_memory() -> None:
    # Results that are whole-buffer views (a reshaped product) go back as they are, and still
    # never share memory with each other or with the caller's input.
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Reshape", ["p", "flat"], ["first"]),
        helper.make_node("Reshape", ["p", "column"], ["second"]),
        helper.make_node("Relu", ["x"], ["third"]),
        helper.make_node("Reshape", ["x", "flat"], ["fed"]),
    ]
    m = make_model(
        nodes,
        [vinfo("x", F, [2, 3])],
        [vinfo(n, F) for n in ("first", "second", "third", "fed")],
        {"w": np.eye(3, dtype=np.float32), "flat": np.array([6]), "column": np.array([6, 1])},
    )
    sess = onnxpy.InferenceSession(m)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for names in (None, ["second", "first"], ["fed", "third"]):
        results = sess.run(names, {"x": x})
        for i, r in enumerate(results):
            assert not np.shares_memory(r, x)
            for other in results[i + 1 :]:
                assert not np.shares_memory(r, other)
            assert r.ravel().tolist() == list(range(6))
    first, *_ = sess.run(None, {"x": x})
    assert first.base is not None and first.base.nbytes == first.nbytes  # handed over, not copied


def test_ort_value_results_are_fresh_too() -> None:
    sess = onnxpy.InferenceSession(_identity(F))
    v = onnxpy.OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))
    (r,) = sess.run_with_ort_values(None, {"x": v})
    assert r.data_ptr() != v.data_ptr() and r.numpy().tolist() == [1, 1, 1]


# -- models whose types contradict themselves ------------------------------------------------------


def test_inconsistent_input_types_are_refused_at_creation() -> None:
    m = make_model(
        [helper.make_node("Add", ["x", "y"], ["z"], name="mixed")],
        [vinfo("x", F, [2]), vinfo("y", I64, [2])],
        [vinfo("z", F, [2])],
    ).SerializeToString()
    with pytest.raises(Exception):  # noqa: B017, PT011 - onnxruntime refuses it too, as a Fail
        onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"])
    with pytest.raises(
        onnxpy.InvalidGraph, match=r"node 'mixed' \(Add\): input 'y' \(B\) is tensor\(int64\); expected tensor\(float\)"
    ):
        onnxpy.InferenceSession(m)


def test_an_output_of_another_type_than_declared_is_an_error() -> None:
    m = make_model(
        [helper.make_node("Cast", ["x"], ["z"], to=I64)], [vinfo("x", F, [2])], [vinfo("z", F, [2])]
    ).SerializeToString()
    with pytest.raises(Exception):  # noqa: B017, PT011 - onnxruntime refuses it at creation
        onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"])
    sess = onnxpy.InferenceSession(m)
    for run in (
        lambda: sess.run(None, {"x": np.ones(2, np.float32)}),
        lambda: sess.run(["z"], {"x": np.ones(2, np.float32)}),
    ):
        with pytest.raises(
            onnxpy.InvalidGraph, match=r"declares output 'z' as tensor\(float\).*computes tensor\(int64\)"
        ):
            run()


def test_heterogeneous_loop_state_is_not_a_type_error() -> None:
    # Loop's state variables each have their own type (a heterogeneous variadic parameter).
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["f_in"], ["f_out"]),
            helper.make_node("Identity", ["i_in"], ["i_out"]),
        ],
        "body",
        [
            vinfo("iter", I64, []),
            vinfo("cond_in", TensorProto.BOOL, []),
            vinfo("f_in", F, [1]),
            vinfo("i_in", I64, [1]),
        ],
        [vinfo("cond_out", TensorProto.BOOL, []), vinfo("f_out", F, [1]), vinfo("i_out", I64, [1])],
    )
    m = make_model(
        [helper.make_node("Loop", ["n", "", "f", "i"], ["f_end", "i_end"], body=body)],
        [vinfo("n", I64, []), vinfo("f", F, [1]), vinfo("i", I64, [1])],
        [vinfo("f_end", F, [1]), vinfo("i_end", I64, [1])],
    )
    f, i = onnxpy.InferenceSession(m).run(
        None, {"n": np.array(2), "f": np.ones(1, np.float32), "i": np.ones(1, np.int64)}
    )
    assert f.dtype == np.float32 and i.dtype == np.int64


def test_an_input_without_element_type_is_refused() -> None:
    m = make_model([helper.make_node("Relu", ["x"], ["z"])], [vinfo("x", TensorProto.UNDEFINED, [2])], [vinfo("z", F)])
    with pytest.raises(onnxpy.InvalidGraph, match=r"graph input 'x' declares no element type"):
        onnxpy.InferenceSession(m)


def test_sequence_elements_are_separate_arrays() -> None:
    # SplitToSequence's elements are views of one tensor inside the kernel
    m = make_model(
        [helper.make_node("SplitToSequence", ["x"], ["s"], axis=1, keepdims=0)],
        [vinfo("x", F, [3, 50])],
        [helper.make_tensor_sequence_value_info("s", F, None)],
    )
    x = np.arange(150, dtype=np.float32).reshape(3, 50)
    (seq,) = onnxpy.InferenceSession(m).run(None, {"x": x})
    assert len(seq) == 50 and all(e.flags.c_contiguous for e in seq)
    assert not any(np.shares_memory(a, x) for a in seq)
    assert not any(np.shares_memory(seq[i], seq[j]) for i in range(50) for j in range(i + 1, 50))
    np.testing.assert_array_equal(np.stack(seq, axis=1), x)


def test_runs_raise_no_floating_point_warnings_and_restore_numpy_state() -> None:
    # 1/0 and log(0) give inf as in onnxruntime, without numpy's RuntimeWarnings, on the plain
    # path (run with every output) and the general one (output names); the caller's own error
    # state (here: raise) holds again after the run, and after a run that failed.
    m = make_model(
        [helper.make_node("Div", ["one", "x"], ["q"]), helper.make_node("Log", ["x"], ["l"])],
        [vinfo("x", F, [2])],
        [vinfo("q", F), vinfo("l", F)],
        {"one": np.ones(2, np.float32)},
    )
    sess = onnxpy.InferenceSession(m)
    x = np.array([0.0, 1.0], np.float32)
    with np.errstate(all="raise"):
        for names in (None, ["l", "q"]):
            results = dict(zip(names or ["q", "l"], sess.run(names, {"x": x})))
            assert results["q"].tolist() == [np.inf, 1.0] and results["l"].tolist() == [-np.inf, 0.0]
        with pytest.raises(onnxpy.InvalidArgument):
            sess.run(None, {"x": np.zeros(3, np.float32)})
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "raise", "invalid": "raise"}
        with pytest.raises(FloatingPointError):
            np.float32(1) / np.float32(0)
