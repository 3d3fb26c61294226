"""Every real model runs and matches onnxruntime on the same random input.

onnx's light models (shipped in the onnx package) have a fixed batch of 1. The models in
../shared/models have dynamic axes and also run at batch 2; they are absent from a user's
fresh clone, and their tests then report the reason.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

import onnxpy
from tests.helpers import light_models, model_id, random_feeds, shared_models

SHARED = shared_models()


def _compare(path, batch: int) -> None:
    ref = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    sess = onnxpy.InferenceSession(str(path))
    assert [a.name for a in sess.get_inputs()] == [a.name for a in ref.get_inputs()]
    feeds = random_feeds(sess.get_inputs(), np.random.default_rng(batch), batch=batch)
    want = ref.run(None, feeds)
    got = sess.run(None, feeds)
    assert len(got) == len(want)
    for g, w, arg in zip(got, want, sess.get_outputs()):
        assert g.shape == w.shape, f"{arg.name}: shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype
        scale = max(float(np.max(np.abs(w))), 1e-6)
        err = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
        assert err <= 1e-4 * scale, f"{path.name} output {arg.name}: max abs diff {err} > 1e-4 * {scale}"


@pytest.mark.parametrize("path", light_models(), ids=model_id)
def test_light_model_matches_onnxruntime(path) -> None:
    _compare(path, 1)


@pytest.mark.skipif(not SHARED, reason="../shared/models is not beside this clone (CI has it; a fresh clone does not)")
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("path", SHARED, ids=model_id)
def test_shared_model_matches_onnxruntime(path, batch: int) -> None:
    sess = onnxpy.InferenceSession(str(path))
    if batch > 1 and all(isinstance(a.shape[0], int) for a in sess.get_inputs()):
        # squeezenet1_1 was exported with a fixed batch of 1: batch 2 does not apply.
        arg = sess.get_inputs()[0]
        x = np.zeros([batch, *arg.shape[1:]], dtype=np.float32)
        with pytest.raises(onnxpy.InvalidArgument, match="invalid dimensions for input: input"):
            sess.run(None, {arg.name: x})
        return
    _compare(path, batch)


def test_demo_model_matches_onnxruntime() -> None:
    from tests.helpers import DEMO_MODEL

    _compare(DEMO_MODEL, 1)
    _compare(DEMO_MODEL, 3)


@pytest.mark.parametrize("level", [0, 1, 2, 99])
@pytest.mark.parametrize("path", light_models(), ids=model_id)
def test_light_models_with_random_weights_at_every_optimization_level(path, level: int) -> None:
    """The light models' weights are one repeated value each; with random weights a wrong
    folding or fusion cannot hide. Every level must stay within 1e-4 of onnxruntime."""
    import onnx

    from tests.helpers import randomize_weights

    model = randomize_weights(onnx.load(str(path)), seed=level)
    ref = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel(level)
    sess = onnxpy.InferenceSession(model, so)
    name = sess.get_inputs()[0].name
    x = np.random.default_rng(level).standard_normal((1, 3, 224, 224)).astype(np.float32)
    want = ref.run(None, {name: x})[0]
    got = sess.run(None, {name: x})[0]
    scale = float(np.max(np.abs(want)))
    assert float(np.max(np.abs(got - want))) <= 1e-4 * scale
