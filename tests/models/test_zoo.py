"""Exporter-style vision and transformer models (tests/models/zoo.py) match onnxruntime.

Each model runs at batch 1 and 2 (models with a sequence axis also at two sequence lengths) with
the graph optimizer off and fully on, in onnxpy and in onnxruntime at the same level; every
output must be within 1e-3 of its magnitude, and the sessions must describe the same inputs and
outputs.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime
import pytest

import onnxpy
from tests.models.zoo import ZOO

LEVELS = {
    "disable_all": (onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL, onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL),
    "enable_all": (onnxpy.GraphOptimizationLevel.ORT_ENABLE_ALL, onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL),
}
BATCHES = (1, 2)
SEQ_LENS = (7, 16)
RTOL = 1e-3


@functools.cache
def _model_bytes(name: str) -> bytes:
    return ZOO[name].build().SerializeToString()


def _sessions(name: str, level: str) -> tuple[onnxpy.InferenceSession, onnxruntime.InferenceSession]:
    ours, theirs = LEVELS[level]
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = ours
    ref_so = onnxruntime.SessionOptions()
    ref_so.graph_optimization_level = theirs
    data = _model_bytes(name)
    ref = onnxruntime.InferenceSession(data, ref_so, providers=["CPUExecutionProvider"])
    return onnxpy.InferenceSession(data, so), ref


def max_relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over max |want|: the error relative to the output's magnitude."""
    if want.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(want))), 1e-6)
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


def _describe(args: list) -> list[tuple[str, str, list]]:
    return [(a.name, a.type, list(a.shape)) for a in args]


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_is_valid(name: str) -> None:
    """The builders write models onnx's full checker accepts (strict shape inference included)."""
    onnx.checker.check_model(onnx.load_from_string(_model_bytes(name)), full_check=True)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_describes_inputs_and_outputs_like_onnxruntime(name: str) -> None:
    """Names, types and shapes (symbolic dims included) of get_inputs() and get_outputs()."""
    sess, ref = _sessions(name, "enable_all")
    assert _describe(sess.get_inputs()) == _describe(ref.get_inputs())
    assert _describe(sess.get_outputs()) == _describe(ref.get_outputs())


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_matches_onnxruntime(name: str, level: str) -> None:
    sess, ref = _sessions(name, level)
    seqs = SEQ_LENS if ZOO[name].text else SEQ_LENS[:1]
    failures = []
    for batch in BATCHES:
        for seq in seqs:
            feeds = ZOO[name].feeds(batch, seq, np.random.default_rng(batch * 100 + seq))
            want = ref.run(None, feeds)
            got = sess.run(None, feeds)
            assert len(got) == len(want)
            for g, w, arg in zip(got, want, ref.get_outputs()):
                where = f"{name} [{level}] batch={batch} seq={seq} output {arg.name}"
                assert g.shape == w.shape, f"{where}: shape {g.shape} != {w.shape}"
                assert g.dtype == w.dtype, f"{where}: dtype {g.dtype} != {w.dtype}"
                err = max_relative_error(g, w)
                if not err <= RTOL:
                    failures.append(f"{where}: max abs diff {err:.3g} x max|want|")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "declared",
    [["a", "b", "c"], [None, None, None], ["a", 3, "c"], [None, "b", 7]],
    ids=["all-symbolic", "unknown", "mixed", "unknown-symbolic-static"],
)
def test_output_shape_merges_declared_and_inferred_dims_like_onnxruntime(declared: list) -> None:
    """What the TorchScript exporter's ``<Op><output>_dim_<i>`` names reduce to: onnxruntime
    reports, per dimension, an inferred static size over a declared name, a declared name over
    an inferred one, and an inferred name over an unknown dim."""
    node = onnx.helper.make_node("Relu", ["x"], ["y"])
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3, None])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, declared)],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    ref = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert _describe(onnxpy.InferenceSession(data).get_outputs()) == _describe(ref.get_outputs())
