"""Every script in examples/ runs, and its results match session.run (and onnxruntime)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest

import onnxpy as ort

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TORCH_REASON = "torch is not installed (the example binds torch tensors)"
NEEDS_TORCH = {"preallocated_output_torch.py", "torch_data_ptr.py"}


def _scripts() -> list[str]:
    return sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


@pytest.fixture
def run_example(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Run a script as __main__; returns its globals. cwd and sys.path are restored after."""

    def run(name: str) -> dict[str, Any]:
        if name in NEEDS_TORCH:
            pytest.importorskip("torch", reason=TORCH_REASON)
        monkeypatch.chdir(Path.cwd())  # the scripts chdir into their model folder; undo at teardown
        monkeypatch.syspath_prepend(str(EXAMPLES))
        monkeypatch.delitem(sys.modules, "_setup", raising=False)
        result = runpy.run_path(str(EXAMPLES / name), run_name="__main__")
        result["_stdout"] = capsys.readouterr().out
        return result

    return run


def _oracle(path: str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(got: Any, path: str | Path, feeds: dict[str, np.ndarray], index: int = 0) -> None:
    """``got`` equals output ``index`` of a fresh onnxpy session.run and of onnxruntime."""
    got = np.asarray(got)
    ours = ort.InferenceSession(str(path)).run(None, feeds)[index]
    np.testing.assert_array_equal(got, ours)
    np.testing.assert_allclose(got, _oracle(path, feeds)[index], rtol=1e-5, atol=1e-7)


def test_every_document_example_has_a_script():
    assert set(_scripts()) >= {
        "basic_inference.py",
        "reuse_iobinding.py",
        "preallocated_output_torch.py",
        "multiple_inputs_outputs.py",
        "cpu_binding.py",
        "best_practices.py",
        "torch_data_ptr.py",
    }


def test_basic_inference(run_example):
    g = run_example("basic_inference.py")
    assert "Output device: cpu" in g["_stdout"]
    assert g["outputs"][0].device_name() == "cpu"
    _check(g["output_cpu"][0], "model.onnx", {"input": g["input_data"]})
    assert g["output_cpu"][0].shape == (1, 1000)


def test_reuse_iobinding(run_example):
    g = run_example("reuse_iobinding.py")
    results = g["results"]
    assert len(results) == 100
    for i in (0, 1, 37, 99):
        _check(results[i], "model.onnx", {"input": g["generate_input"](i)})
    assert not np.array_equal(results[0], results[1])


def test_preallocated_output_torch(run_example):
    g = run_example("preallocated_output_torch.py")
    buf = g["output_buffer"]
    assert g["io_binding"].get_outputs()[0].data_ptr() == buf.data_ptr()
    _check(buf.numpy(), "model.onnx", {"input": g["input_data"]})


def test_multiple_inputs_outputs(run_example):
    g = run_example("multiple_inputs_outputs.py")
    feeds = {"input1": g["data1"], "input2": g["data2"]}
    _check(g["output1"].numpy(), "multi_input_model.onnx", feeds, 0)
    _check(g["output2"].numpy(), "multi_input_model.onnx", feeds, 1)
    np.testing.assert_allclose(g["output2"].numpy(), g["data1"] @ g["data2"].T, rtol=1e-5)


def test_cpu_binding(run_example):
    g = run_example("cpu_binding.py")
    _check(g["outputs"][0], "model.onnx", {"input": g["input_array"]})


def test_best_practices(run_example):
    g = run_example("best_practices.py")
    _check(g["gpu_output"].numpy(), "model.onnx", {"input": g["gpu_ortvalue"].numpy()})
    _check(g["outputs"][0].numpy(), "model.onnx", {"input": g["batches"][-1].numpy()})
    assert g["outputs"][0].shape() == [2, 1000]
    assert not np.array_equal(g["outputs"][0].numpy(), g["gpu_output"].numpy())


def test_torch_data_ptr(run_example):
    g = run_example("torch_data_ptr.py")
    x, y = g["x"], g["y"]
    assert g["io_binding"].get_outputs()[0].data_ptr() == y.data_ptr()
    feeds = {"input": x.numpy()}
    np.testing.assert_allclose(y.numpy(), ort.InferenceSession(str(g["model_path"])).run(None, feeds)[0], rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), _oracle(g["model_path"], feeds)[0], rtol=1e-4, atol=1e-6)


DOCUMENT_EXAMPLES = [
    "basic_inference.py",
    "reuse_iobinding.py",
    "preallocated_output_torch.py",
    "multiple_inputs_outputs.py",
    "cpu_binding.py",
    "best_practices.py",
]


@pytest.mark.parametrize("name", DOCUMENT_EXAMPLES)
def test_document_examples_are_also_valid_onnxruntime_code(name, monkeypatch, capsys):
    # The adaptations are only the device; the same script runs unchanged on onnxruntime.
    if name in NEEDS_TORCH:
        pytest.importorskip("torch", reason=TORCH_REASON)
    source = (EXAMPLES / name).read_text()
    assert source.count("import onnxpy as ort") == 1
    source = source.replace("import onnxpy as ort", "import onnxruntime as ort")
    monkeypatch.chdir(Path.cwd())
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delitem(sys.modules, "_setup", raising=False)
    scope: dict[str, Any] = {"__name__": "__main__", "__file__": str(EXAMPLES / name)}
    exec(compile(source, str(EXAMPLES / name), "exec"), scope)  # noqa: S102 - our own example file
    assert scope["ort"] is onnxruntime
    capsys.readouterr()
