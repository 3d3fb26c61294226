"""Malformed models: each is refused at session creation with an onnxpy error class and a
message naming the problem -- never a crash, a hang or a raw TypeError/KeyError/IndexError
from deep inside."""

from __future__ import annotations

import os
import random
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import onnxpy
from tests.helpers import DEMO_MODEL, make_model, vinfo

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def base() -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
        [vinfo("x", F, [4])],
        [vinfo("y", F, [4])],
        initializers={"w": np.ones(4, np.float32)},
    )


def _edit(fn: Callable[[onnx.ModelProto], Any]) -> Callable[[], onnx.ModelProto]:
    def make() -> onnx.ModelProto:
        m = base()
        fn(m)
        return m

    return make


def _init(m: onnx.ModelProto) -> TensorProto:
    return m.graph.initializer[0]


def _typed_data(field: str, data_type: int, values: list[Any]) -> Callable[[onnx.ModelProto], None]:
    def edit(m: onnx.ModelProto) -> None:
        t = _init(m)
        t.ClearField("raw_data")
        t.data_type = data_type
        getattr(t, field).extend(values)

    return edit


def _single(op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> Callable[[], onnx.ModelProto]:
    def make() -> onnx.ModelProto:
        node = helper.make_node(op, inputs, outputs, name="victim", **attrs)
        ins = [
            vinfo(n, TensorProto.BOOL if n == "c" else F, [] if n == "c" else [4]) for n in dict.fromkeys(inputs) if n
        ]
        return make_model([node], ins, [vinfo(o, F, [4]) for o in outputs])

    return make


def _function_model(body: list[onnx.NodeProto], call_inputs: list[str], recursive: bool = False) -> onnx.ModelProto:
    fn = helper.make_function(
        "local", "F", ["a"], ["b"], body, [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    )
    return make_model(
        [helper.make_node("F", call_inputs, ["y"], domain="local", name="caller")],
        [vinfo("x", F, [4])],
        [vinfo("y", F, [4])],
        extra_opsets={"local": 1},
        functions=[fn],
    )


def _sparse(values: np.ndarray, indices: np.ndarray, dims: list[int]) -> Callable[[onnx.ModelProto], None]:
    def edit(m: onnx.ModelProto) -> None:
        sp = m.graph.sparse_initializer.add()
        sp.values.CopyFrom(numpy_helper.from_array(values, "s"))
        sp.indices.CopyFrom(numpy_helper.from_array(indices, "s_idx"))
        sp.dims.extend(dims)

    return edit


def _short_tensor() -> TensorProto:
    t = numpy_helper.from_array(np.ones(4, np.float32), "v")
    t.dims[:] = [7]  # 7 elements declared, 4 stored
    return t


def _branchless_if() -> onnx.ModelProto:
    return make_model(
        [helper.make_node("If", ["c"], ["y"], name="victim")], [vinfo("c", TensorProto.BOOL, [])], [vinfo("y", F, [4])]
    )


def _if_with(branch: onnx.GraphProto) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("If", ["c"], ["y"], name="victim", then_branch=branch, else_branch=branch)],
        [vinfo("c", TensorProto.BOOL, []), vinfo("x", F, [4])],
        [vinfo("y", F, [4])],
    )


def _bad_utf8(m: onnx.ModelProto) -> bytes:
    return m.SerializeToString().replace(b"add", b"a\xffd", 1)


DEMO = DEMO_MODEL.read_bytes()

# (id, source factory, expected error class, message pattern)
CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # -- bytes ------------------------------------------------------------------------------------
    ("empty", lambda: b"", onnxpy.InvalidProtobuf, "empty"),
    ("truncated-10%", lambda: DEMO[: len(DEMO) // 10], onnxpy.InvalidProtobuf, "Protobuf parsing failed"),
    ("truncated-50%", lambda: DEMO[: len(DEMO) // 2], onnxpy.InvalidProtobuf, "Protobuf parsing failed"),
    ("truncated-last-byte", lambda: DEMO[:-1], onnxpy.InvalidProtobuf, "Protobuf parsing failed"),
    *[
        (f"random-bytes-{seed}", (lambda s=seed: random.Random(s).randbytes(300)), onnxpy.InvalidProtobuf, ".")
        for seed in range(4)
    ],
    ("text-not-protobuf", lambda: b"ir_version: 8\ngraph { name: 'g' }", onnxpy.InvalidProtobuf, "."),
    ("invalid-utf8-name", lambda: _bad_utf8(base()), onnxpy.InvalidProtobuf, "not valid UTF-8"),
    # -- versions ---------------------------------------------------------------------------------
    ("ir-too-new", _edit(lambda m: setattr(m, "ir_version", onnx.IR_VERSION + 1)), onnxpy.InvalidGraph, "IR version"),
    (
        "opset-too-new",
        _edit(lambda m: setattr(m.opset_import[0], "version", onnx.defs.onnx_opset_version() + 1)),
        onnxpy.InvalidGraph,
        "newer than the newest",
    ),
    (
        "ml-opset-too-new",
        _edit(lambda m: m.opset_import.append(helper.make_opsetid("ai.onnx.ml", 99))),
        onnxpy.InvalidGraph,
        "newer than the newest",
    ),
    ("opset-negative", _edit(lambda m: setattr(m.opset_import[0], "version", -5)), onnxpy.NotImplemented, "opset -5"),
    (
        "opset-imported-twice",
        _edit(lambda m: m.opset_import.append(helper.make_opsetid("", 13))),
        onnxpy.InvalidGraph,
        "twice",
    ),
    # -- structure --------------------------------------------------------------------------------
    ("no-graph", _edit(lambda m: m.ClearField("graph")), onnxpy.InvalidGraph, "no graph"),
    ("cycle", _edit(lambda m: m.graph.node[0].input.__setitem__(0, "y")), onnxpy.InvalidGraph, "cycle"),
    (
        "two-node-cycle",
        lambda: make_model(
            [helper.make_node("Relu", ["b"], ["a"], name="p"), helper.make_node("Relu", ["a"], ["b"], name="q")],
            [vinfo("x", F, [4])],
            [vinfo("a", F, [4])],
        ),
        onnxpy.InvalidGraph,
        "cycle",
    ),
    ("undefined-input", _edit(lambda m: m.graph.node[0].input.__setitem__(0, "ghost")), onnxpy.InvalidGraph, "'ghost'"),
    ("undefined-output", _edit(lambda m: setattr(m.graph.output[0], "name", "nope")), onnxpy.InvalidGraph, "'nope'"),
    ("empty-output-name", _edit(lambda m: setattr(m.graph.output[0], "name", "")), onnxpy.InvalidGraph, "output ''"),
    (
        "value-produced-twice",
        _edit(lambda m: m.graph.node.append(helper.make_node("Neg", ["x"], ["y"], name="again"))),
        onnxpy.InvalidGraph,
        "produced by two nodes",
    ),
    (
        "node-writes-graph-input",
        _edit(lambda m: m.graph.node[0].output.__setitem__(0, "x")),
        onnxpy.InvalidGraph,
        "already a graph input",
    ),
    (
        "initializer-twice",
        _edit(lambda m: m.graph.initializer.append(m.graph.initializer[0])),
        onnxpy.InvalidGraph,
        "defined twice",
    ),
    (
        "graph-input-twice",
        _edit(lambda m: m.graph.input.append(m.graph.input[0])),
        onnxpy.InvalidGraph,
        "duplicate names",
    ),
    ("empty-op-type", _edit(lambda m: setattr(m.graph.node[0], "op_type", "")), onnxpy.NotImplemented, "no operator"),
    (
        "unknown-op",
        _edit(lambda m: setattr(m.graph.node[0], "op_type", "NoSuchOp")),
        onnxpy.NotImplemented,
        "NoSuchOp",
    ),
    (
        "absurd-input-count",
        _edit(lambda m: m.graph.node[0].input.extend(["x"] * 100_000)),
        onnxpy.InvalidGraph,
        "100002 inputs",
    ),
    (
        "absurd-output-count",
        _edit(lambda m: m.graph.node[0].output.extend(f"o{i}" for i in range(100_000))),
        onnxpy.InvalidGraph,
        "100001 outputs",
    ),
    (
        "required-input-left-empty",
        _edit(lambda m: m.graph.node[0].input.__setitem__(1, "")),
        onnxpy.InvalidGraph,
        "required",
    ),
    ("too-few-inputs", _edit(lambda m: m.graph.node[0].input.pop()), onnxpy.InvalidGraph, "1 inputs"),
    (
        "unknown-input-element-type",
        _edit(lambda m: setattr(m.graph.input[0].type.tensor_type, "elem_type", 999)),
        onnxpy.InvalidGraph,
        "unknown element type",
    ),
    (
        "negative-input-dimension",
        _edit(lambda m: setattr(m.graph.input[0].type.tensor_type.shape.dim[0], "dim_value", -3)),
        onnxpy.InvalidGraph,
        "negative dimension",
    ),
    # -- initializers: data size against shape ----------------------------------------------------
    ("raw-data-short", _edit(lambda m: setattr(_init(m), "raw_data", b"\0" * 12)), onnxpy.Fail, "'w'"),
    ("raw-data-long", _edit(lambda m: setattr(_init(m), "raw_data", b"\0" * 100)), onnxpy.Fail, "'w'"),
    ("raw-data-odd-bytes", _edit(lambda m: setattr(_init(m), "raw_data", b"\0" * 15)), onnxpy.Fail, "'w'"),
    ("dims-huge", _edit(lambda m: _init(m).dims.__setitem__(0, 1 << 40)), onnxpy.Fail, "'w'"),
    ("dims-negative", _edit(lambda m: _init(m).dims.__setitem__(0, -4)), onnxpy.Fail, "negative dimension"),
    ("float-data-short", _edit(_typed_data("float_data", F, [1.0, 2.0, 3.0])), onnxpy.Fail, "'w'"),
    ("int64-data-short", _edit(_typed_data("int64_data", I64, [1, 2])), onnxpy.Fail, "'w'"),
    ("int32-data-long", _edit(_typed_data("int32_data", TensorProto.INT32, [1] * 9)), onnxpy.Fail, "'w'"),
    ("double-data-short", _edit(_typed_data("double_data", TensorProto.DOUBLE, [1.0])), onnxpy.Fail, "'w'"),
    ("string-data-short", _edit(_typed_data("string_data", TensorProto.STRING, [b"a"])), onnxpy.Fail, "'w'"),
    ("wrong-field-for-type", _edit(_typed_data("int64_data", F, [1, 2, 3, 4])), onnxpy.Fail, "'w'"),
    ("unknown-data-type", _edit(lambda m: setattr(_init(m), "data_type", 999)), onnxpy.Fail, "'w'"),
    ("undefined-data-type", _edit(lambda m: setattr(_init(m), "data_type", 0)), onnxpy.Fail, "'w'"),
    (
        "int4-packed-short",
        _edit(lambda m: (setattr(_init(m), "data_type", TensorProto.INT4), setattr(_init(m), "raw_data", b"\1"))),
        onnxpy.Fail,
        "'w'",
    ),
    ("segment", _edit(lambda m: setattr(_init(m).segment, "end", 2)), onnxpy.Fail, "'w'"),
    (
        "attribute-tensor-short",
        lambda: make_model(
            [helper.make_node("Constant", [], ["y"], value=_short_tensor())],
            [],
            [vinfo("y", F, [7])],
        ),
        onnxpy.Fail,
        "7",
    ),
    (
        "sparse-values-vs-indices",
        _edit(_sparse(np.ones(3, np.float32), np.array([0, 1], np.int64), [4])),
        onnxpy.Fail,
        "3 values",
    ),
    (
        "sparse-index-out-of-range",
        _edit(_sparse(np.ones(1, np.float32), np.array([9], np.int64), [4])),
        onnxpy.Fail,
        "outside dims",
    ),
    (
        "sparse-huge-dense",
        _edit(_sparse(np.ones(1, np.float32), np.array([0], np.int64), [1 << 31, 1 << 31])),
        onnxpy.Fail,
        "once dense",
    ),
    (
        "sparse-float-indices",
        _edit(_sparse(np.ones(1, np.float32), np.array([0.5], np.float32), [4])),
        onnxpy.Fail,
        "integers",
    ),
    # -- attributes -------------------------------------------------------------------------------
    ("attribute-type-float-for-int", _single("Softmax", ["x"], ["y"], axis=1.5), onnxpy.InvalidGraph, "declares INT"),
    (
        "attribute-type-string-for-int",
        _single("Softmax", ["x"], ["y"], axis="one"),
        onnxpy.InvalidGraph,
        "declares INT",
    ),
    ("attribute-type-ints-for-int", _single("Softmax", ["x"], ["y"], axis=[1, 2]), onnxpy.InvalidGraph, "declares INT"),
    (
        "attribute-undefined-type",
        _edit(lambda m: m.graph.node[0].attribute.add(name="foo")),
        onnxpy.Fail,
        "undefined type",
    ),
    (
        "attribute-twice",
        _edit(lambda m: m.graph.node[0].attribute.extend([helper.make_attribute("k", 1)] * 2)),
        onnxpy.InvalidGraph,
        "twice",
    ),
    (
        "attribute-reference-outside-function",
        _edit(lambda m: m.graph.node[0].attribute.add(name="axis", ref_attr_name="ax", type=AttributeProto.INT)),
        onnxpy.InvalidGraph,
        "outside a function",
    ),
    ("required-attribute-missing", _single("Cast", ["x"], ["y"]), onnxpy.InvalidGraph, "'to'"),
    ("if-without-branches", _branchless_if, onnxpy.InvalidGraph, "then_branch"),
    (
        "if-branch-output-count",
        lambda: _if_with(helper.make_graph([], "b", [], [])),
        onnxpy.InvalidGraph,
        "returns 0 values",
    ),
    (
        "loop-body-signature",
        lambda: make_model(
            [
                helper.make_node(
                    "Loop",
                    ["", "", "x"],
                    ["y"],
                    name="victim",
                    body=helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "b", [], [vinfo("o", F, [4])]),
                )
            ],
            [vinfo("x", F, [4])],
            [vinfo("y", F, [4])],
        ),
        onnxpy.InvalidGraph,
        "body takes 0 inputs",
    ),
    (
        "branch-reads-undefined-name",
        lambda: _if_with(
            helper.make_graph([helper.make_node("Relu", ["ghost"], ["o"], name="inner")], "b", [], [vinfo("o", F, [4])])
        ),
        onnxpy.InvalidGraph,
        "'inner'.*'ghost'",
    ),
    # -- against the schema: what onnxruntime refuses and a kernel would have run wrongly -----------
    (
        "unrecognized-attribute",  # ReduceSum-13 takes its axes as an input: the attribute reduced all
        lambda: make_model(
            [helper.make_node("ReduceSum", ["x"], ["y"], name="sum", axes=[0])],
            [vinfo("x", F, [4])],
            [vinfo("y", F)],
            opset=13,
        ),
        onnxpy.InvalidGraph,
        r"'sum'.*unrecognized attribute 'axes'.*\['keepdims', 'noop_with_empty_axes'\]",
    ),
    (
        "type-outside-the-schemas-list",  # Det of int8 gave 23 for det(diag(2, 3, 4))
        lambda: make_model(
            [helper.make_node("Det", ["x"], ["y"], name="det")],
            [vinfo("x", TensorProto.INT8, [3, 3])],
            [vinfo("y", TensorProto.INT8)],
        ),
        onnxpy.InvalidGraph,
        r"'det'.*tensor\(int8\); expected one of T's types: .*tensor\(float\)",
    ),
    (
        "if-branches-of-different-types",  # the output's type would depend on the condition
        lambda: make_model(
            [
                helper.make_node(
                    "If",
                    ["c"],
                    ["y"],
                    name="pick",
                    then_branch=helper.make_graph(
                        [helper.make_node("Identity", ["x"], ["t"])], "t", [], [vinfo("t", F, [4])]
                    ),
                    else_branch=helper.make_graph(
                        [helper.make_node("Cast", ["x"], ["e"], to=I64)], "e", [], [vinfo("e", I64, [4])]
                    ),
                )
            ],
            [vinfo("c", TensorProto.BOOL, []), vinfo("x", F, [4])],
            [vinfo("y", F, [4])],
        ),
        onnxpy.InvalidGraph,
        "'pick'.*tensor\\(float\\) in then_branch.*tensor\\(int64\\) in else_branch",
    ),
    ("no-opset-import", _edit(lambda m: m.ClearField("opset_import")), onnxpy.InvalidGraph, "imports no opset"),
    (
        "operator-before-its-first-opset",
        lambda: make_model([helper.make_node("Celu", ["x"], ["y"])], [vinfo("x", F, [4])], [vinfo("y", F)], opset=11),
        onnxpy.NotImplemented,
        "Celu does not exist at opset 11.*first appears at opset 12",
    ),
    # -- functions --------------------------------------------------------------------------------
    (
        "function-missing",
        lambda: make_model(
            [helper.make_node("F", ["x"], ["y"], domain="local")],
            [vinfo("x", F, [4])],
            [vinfo("y", F, [4])],
            extra_opsets={"local": 1},
        ),
        onnxpy.NotImplemented,
        "'F'",
    ),  # fmt: skip
    (
        "function-recursive",
        lambda: _function_model([helper.make_node("F", ["a"], ["b"], domain="local")], ["x"]),
        onnxpy.InvalidGraph,
        "recursive",
    ),
    (
        "function-body-undefined-name",
        lambda: _function_model([helper.make_node("Relu", ["ghost"], ["b"])], ["x"]),
        onnxpy.InvalidGraph,
        "ghost",
    ),
]


def _create_within(source: Any, seconds: float = 60.0) -> BaseException | None:
    """Create a session in a thread: what it raised (None if it succeeded). A hang fails."""
    outcome: list[BaseException | None] = []

    def create() -> None:
        try:
            onnxpy.InferenceSession(source)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - examined by the caller
            outcome.append(e)

    t = threading.Thread(target=create, daemon=True)
    t.start()
    t.join(seconds)
    assert outcome, f"session creation did not finish within {seconds} s (hang)"
    return outcome[0]


@pytest.mark.parametrize("make, cls, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_model_is_a_clear_error_at_creation(make: Callable[[], Any], cls: type, pattern: str) -> None:
    source = make()
    sources = [source] if isinstance(source, bytes) else [source, source.SerializeToString()]
    for src in sources:  # as a ModelProto and as bytes
        err = _create_within(src)
        assert err is not None, "a malformed model was accepted"
        assert isinstance(err, cls), f"{type(err).__name__}: {err}"
        assert isinstance(err, onnxpy.OnnxpyError)
        assert re.search(pattern, str(err)), str(err)


def test_models_on_disk_too(tmp_path: Any) -> None:
    for name, make, cls, _ in CASES[:12]:
        source = make()
        data = source if isinstance(source, bytes) else source.SerializeToString()
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(data)
        err = _create_within(str(path))
        assert isinstance(err, cls), f"{name}: {err!r}"


def _split_with_an_extra_output() -> onnx.ModelProto:
    """Valid by the schema (Split's outputs are variadic) but 'num_outputs' says 2 for 3 outputs:
    onnx's C++ shape inference for it reads past a vector's end (it aborts in onnx 1.23)."""
    node = helper.make_node("Split", ["x"], ["a", "b", "c"], name="victim", axis=0, num_outputs=2)
    return make_model([node], [vinfo("x", F, [4])], [vinfo(o, F, None) for o in "abc"], opset=18)


def test_shape_inference_crash_costs_the_types_not_the_process() -> None:
    """onnx's shape inference runs in a helper process: a model that crashes it still gets a
    session (or an onnxpy error), and the next model is inferred by a fresh helper."""
    for _ in range(2):
        err = _create_within(_split_with_an_extra_output().SerializeToString())
        assert err is None or isinstance(err, onnxpy.OnnxpyError), repr(err)
    # Inference still works afterwards: the output's shape comes from it (declared unknown).
    m = make_model(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], [vinfo("x", F, [2, 3])], [vinfo("y", F, None)]
    )
    assert onnxpy.InferenceSession(m.SerializeToString()).get_outputs()[0].shape == [3, 2]


@pytest.mark.parametrize("mode", ["off", "in_process", "isolated"])
def test_shape_inference_modes(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNXPY_SHAPE_INFERENCE", mode)
    m = make_model(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], [vinfo("x", F, [2, 3])], [vinfo("y", F, None)]
    )
    sess = onnxpy.InferenceSession(m.SerializeToString())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.T)
    assert sess.get_outputs()[0].shape == ([] if mode == "off" else [3, 2])


def test_shape_inference_helper_that_cannot_start_falls_back_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter whose sys.executable cannot run the helper (an embedding host) infers in
    process instead of waiting for a helper that never answers."""
    from onnxpy.runtime import compile as compile_mod

    helper_process = compile_mod._ShapeInference()
    helper_process.startup_timeout = 5.0
    monkeypatch.setattr(compile_mod.sys, "executable", "/nonexistent/python")
    assert helper_process.infer(b"") is compile_mod._UNAVAILABLE
    monkeypatch.setattr(compile_mod, "_ISOLATED", helper_process)
    m = make_model(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], [vinfo("x", F, [2, 3])], [vinfo("y", F, None)]
    )
    assert onnxpy.InferenceSession(m.SerializeToString()).get_outputs()[0].shape == [3, 2]


def test_shape_inference_helper_loads_onnx_extension_directly() -> None:
    """The helper starts without site-packages and loads onnx's compiled extension from the
    file the parent's onnx uses (a tenth of `import onnx`'s start-up)."""
    from onnxpy.runtime import compile as compile_mod

    command = compile_mod._worker_command(1 << 30)
    assert command[1:3] == ["-I", "-S"]
    assert os.path.isfile(command[-2]) and os.path.samefile(command[-2], onnx.onnx_cpp2py_export.__file__)


@pytest.mark.parametrize("native", ["", "/nonexistent/onnx_cpp2py_export.so"])
def test_shape_inference_helper_without_the_extension_imports_onnx(
    native: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where onnx's extension cannot be loaded from its file, the helper imports onnx instead
    and infers the same types."""
    from onnxpy.runtime import compile as compile_mod

    plain = compile_mod._worker_command

    def without_extension(limit: int) -> list[str]:
        command = plain(limit)
        command[-2] = native
        return command

    monkeypatch.setattr(compile_mod, "_worker_command", without_extension)
    helper_process = compile_mod._ShapeInference()
    monkeypatch.setattr(compile_mod, "_ISOLATED", helper_process)
    m = make_model(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], [vinfo("x", F, [2, 3])], [vinfo("y", F, None)]
    )
    try:
        assert onnxpy.InferenceSession(m.SerializeToString()).get_outputs()[0].shape == [3, 2]
        assert not helper_process._broken and helper_process._proc is not None  # answered by the helper
    finally:
        helper_process.close()
