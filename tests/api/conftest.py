"""Small models for the API tests (OrtValue, IOBinding, DLPack, examples).

Every builder returns ONNX bytes so the same model can be loaded by onnxpy and, as an oracle,
by onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy

F = TensorProto.FLOAT

#: the twelve element types every binding path must carry, with their numpy dtypes
TWELVE_DTYPES: list[tuple[int, np.dtype]] = [
    (TensorProto.FLOAT, np.dtype(np.float32)),
    (TensorProto.DOUBLE, np.dtype(np.float64)),
    (TensorProto.INT8, np.dtype(np.int8)),
    (TensorProto.INT16, np.dtype(np.int16)),
    (TensorProto.INT32, np.dtype(np.int32)),
    (TensorProto.INT64, np.dtype(np.int64)),
    (TensorProto.UINT8, np.dtype(np.uint8)),
    (TensorProto.UINT16, np.dtype(np.uint16)),
    (TensorProto.UINT32, np.dtype(np.uint32)),
    (TensorProto.UINT64, np.dtype(np.uint64)),
    (TensorProto.FLOAT16, np.dtype(np.float16)),
    (TensorProto.BOOL, np.dtype(np.bool_)),
]


def model_bytes(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, int, Sequence[Any] | None]],
    outputs: Sequence[tuple[str, int, Sequence[Any] | None]],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> bytes:
    """A model from nodes and (name, elem type, shape) triples, serialized."""
    graph = helper.make_graph(
        list(nodes),
        "api_test",
        [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs],
        [helper.make_tensor_value_info(n, e, s) for n, e, s in outputs],
        initializer=[numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxpy-tests")
    model.ir_version = 10 if opset >= 21 else 8
    return model.SerializeToString()


def sample(dtype: np.dtype, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Deterministic values that exercise the whole type (signs, fractions, bools)."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True).astype(dtype)
    return (rng.standard_normal(shape) * 10).astype(dtype)


@pytest.fixture
def session_of() -> Callable[[bytes], onnxpy.InferenceSession]:
    return lambda model: onnxpy.InferenceSession(model)


@pytest.fixture
def neg_model() -> bytes:
    """y = Neg(x), float32, dynamic shape [n, 3]."""
    return model_bytes([helper.make_node("Neg", ["x"], ["y"])], [("x", F, ["n", 3])], [("y", F, ["n", 3])])


@pytest.fixture
def neg_session(neg_model: bytes) -> onnxpy.InferenceSession:
    return onnxpy.InferenceSession(neg_model)


@pytest.fixture
def two_output_session() -> onnxpy.InferenceSession:
    """y1 = Neg(x), y2 = Abs(x) with dynamic shapes, so buffer shapes are only known at run time."""
    return onnxpy.InferenceSession(
        model_bytes(
            [helper.make_node("Neg", ["x"], ["y1"]), helper.make_node("Abs", ["x"], ["y2"])],
            [("x", F, ["n"])],
            [("y1", F, ["n"]), ("y2", F, ["n"])],
        )
    )


def view_model(kind: str) -> bytes:
    """A model whose last node produces a view of its input: Reshape, Transpose or Flatten.

    x is float32 [2, 3, 4]; z = Relu(x) first so the view is of an intermediate.
    """
    relu = helper.make_node("Relu", ["x"], ["r"])
    if kind == "Reshape":
        nodes = [relu, helper.make_node("Reshape", ["r", "shape"], ["y"])]
        return model_bytes(
            nodes, [("x", F, [2, 3, 4])], [("y", F, [6, 4])], {"shape": np.array([6, 4], dtype=np.int64)}
        )
    if kind == "Transpose":
        nodes = [relu, helper.make_node("Transpose", ["r"], ["y"], perm=[2, 0, 1])]
        return model_bytes(nodes, [("x", F, [2, 3, 4])], [("y", F, [4, 2, 3])])
    if kind == "Flatten":
        nodes = [relu, helper.make_node("Flatten", ["r"], ["y"], axis=2)]
        return model_bytes(nodes, [("x", F, [2, 3, 4])], [("y", F, [6, 4])])
    raise ValueError(kind)


def view_of_input_model(kind: str) -> bytes:
    """Like view_model but the view is of the graph input itself (no node in front)."""
    if kind == "Reshape":
        nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
        return model_bytes(
            nodes, [("x", F, [2, 3, 4])], [("y", F, [6, 4])], {"shape": np.array([6, 4], dtype=np.int64)}
        )
    if kind == "Transpose":
        return model_bytes(
            [helper.make_node("Transpose", ["x"], ["y"], perm=[2, 0, 1])], [("x", F, [2, 3, 4])], [("y", F, [4, 2, 3])]
        )
    if kind == "Flatten":
        return model_bytes(
            [helper.make_node("Flatten", ["x"], ["y"], axis=2)], [("x", F, [2, 3, 4])], [("y", F, [6, 4])]
        )
    raise ValueError(kind)


PASSTHROUGH_W = np.array([10.0, 20.0, 30.0], dtype=np.float32)


@pytest.fixture
def passthrough_session() -> onnxpy.InferenceSession:
    """Outputs: x (a graph input passed straight through), w (an initializer) and s = x + w."""
    return onnxpy.InferenceSession(
        model_bytes(
            [helper.make_node("Add", ["x", "w"], ["s"])],
            [("x", F, [3])],
            [("x", F, [3]), ("w", F, [3]), ("s", F, [3])],
            {"w": PASSTHROUGH_W},
        )
    )


@pytest.fixture
def dynamic_reshape_session() -> onnxpy.InferenceSession:
    """y = Reshape(data, shape): the output shape comes from an input's values."""
    return onnxpy.InferenceSession(
        model_bytes(
            [helper.make_node("Reshape", ["data", "shape"], ["y"])],
            [("data", F, [12]), ("shape", TensorProto.INT64, [None])],
            [("y", F, None)],
        )
    )


def identity_model(elem: int, opset: int = 17) -> bytes:
    """y = Identity(x) for one element type, dynamic rank-2 shape."""
    return model_bytes(
        [helper.make_node("Identity", ["x"], ["y"])], [("x", elem, ["a", "b"])], [("y", elem, ["a", "b"])], opset=opset
    )


def add_model(elem: int) -> bytes:
    """y = x + c with a constant c, for element types Add supports."""
    return model_bytes(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        [("x", elem, ["a", "b"]), ("c", elem, [1])],
        [("y", elem, ["a", "b"])],
    )
