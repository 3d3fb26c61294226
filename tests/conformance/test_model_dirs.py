"""onnx's backend model directories through InferenceSession: the small models exported from
PyTorch ("pytorch-converted", "pytorch-operator") and hand-built ones ("simple") that ship in the
onnx package, each with its recorded inputs and outputs. Like the node suite, the list of known
failures (known_model_failures.txt) only shrinks."""

from __future__ import annotations

import glob
import os
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from .suite import KNOWN_FAILURES_FILE, assert_close, known_failures

KINDS = ("pytorch-converted", "pytorch-operator", "simple")
DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
KNOWN = known_failures(KNOWN_FAILURES_FILE.replace("known_failures", "known_model_failures"))


def _cases() -> list[str]:
    return sorted(
        f"{kind}/{os.path.basename(d)}" for kind in KINDS for d in glob.glob(os.path.join(DATA, kind, "test_*"))
    )


CASES = _cases()


def _read(path: str, tp: onnx.TypeProto) -> Any:
    """One recorded value, read as the model's declared type says it is stored."""
    with open(path, "rb") as f:
        data = f.read()
    kind = tp.WhichOneof("value")
    if kind == "sequence_type":
        return numpy_helper.to_list(onnx.SequenceProto.FromString(data))
    if kind == "optional_type":
        return numpy_helper.to_optional(onnx.OptionalProto.FromString(data))
    return numpy_helper.to_array(onnx.TensorProto.FromString(data))


def _numbered(folder: str, prefix: str) -> list[str]:
    files = glob.glob(os.path.join(folder, f"{prefix}_*.pb"))
    return sorted(files, key=lambda p: int(os.path.basename(p)[len(prefix) + 1 : -3]))


def run_model_dir(name: str) -> None:
    import onnxpy

    folder = os.path.join(DATA, name)
    model = onnx.load(os.path.join(folder, "model.onnx"))
    sess = onnxpy.InferenceSession(os.path.join(folder, "model.onnx"))
    inputs = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    sets = sorted(glob.glob(os.path.join(folder, "test_data_set_*")))
    assert sets, f"{name} has no recorded data"
    for data_set in sets:
        feeds = {vi.name: _read(p, vi.type) for vi, p in zip(inputs, _numbered(data_set, "input"))}
        wanted = [_read(p, vi.type) for vi, p in zip(model.graph.output, _numbered(data_set, "output"))]
        got = sess.run([o.name for o in model.graph.output], feeds)
        for vi, g, w in zip(model.graph.output, got, wanted):
            assert_close(f"{name} output '{vi.name}'", g, w, 1e-3, 1e-5)


@pytest.mark.parametrize("name", CASES)
def test_model_dir(name: str) -> None:
    if name in KNOWN:
        try:
            run_model_dir(name)
        except Exception:  # noqa: BLE001 - a listed failure is expected to fail
            pytest.xfail(KNOWN[name])
        pytest.fail(f"{name} passes now: remove it from known_model_failures.txt (reason was: {KNOWN[name]})")
    run_model_dir(name)


def test_model_dirs_are_found_and_known_failures_are_real() -> None:
    assert len(CASES) >= 100, f"only {len(CASES)} model directories found under {DATA}"
    unknown = sorted(set(KNOWN) - set(CASES))
    assert not unknown, f"known_model_failures.txt lists cases that do not exist: {unknown}"
    assert np.all([os.path.isfile(os.path.join(DATA, c, "model.onnx")) for c in CASES])
