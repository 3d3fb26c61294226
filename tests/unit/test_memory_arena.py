"""The CPU arena (runtime/memory.py): with enable_cpu_mem_arena, memory freed by one run is
reused by the next instead of being faulted in from the kernel again."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxpy
from onnxpy.api import session as session_module
from onnxpy.runtime import memory

glibc_only = pytest.mark.skipif(memory._libc() is None, reason="the arena tunes glibc's malloc; this is not glibc")

# A run's worth of arrays: six of 1.4 MB and one of 4 MB, written (so their pages are touched)
# and freed together, as a model's values are at the end of a run; page faults counted over
# 20 such runs after 3 warm-up ones.
_PROBE = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from onnxpy.runtime.memory import keep_freed_memory
    if sys.argv[1] == "arena":
        assert keep_freed_memory()
    def run():
        arrays = [np.ones(350_000, np.float32) for _ in range(6)] + [np.ones(1_000_000, np.float32)]
        del arrays
    for _ in range(3):
        run()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        run()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
    """
)
_PAGES_PER_RUN = (6 * 350_000 + 1_000_000) * 4 // 4096


def _faults_per_run(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.strip())


@glibc_only
def test_freed_memory_is_reused_without_page_faults() -> None:
    with_arena = _faults_per_run("arena")
    without = _faults_per_run("default")
    assert with_arena <= 0.05 * _PAGES_PER_RUN, (with_arena, _PAGES_PER_RUN)
    # The probe can tell: glibc's defaults return the freed top of the heap and fault it back.
    assert without >= 0.5 * _PAGES_PER_RUN, (without, _PAGES_PER_RUN)


def _model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("enabled", [True, False])
def test_session_sets_the_arena_only_when_enabled(monkeypatch: pytest.MonkeyPatch, enabled: bool) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(session_module, "keep_freed_memory", lambda: calls.append(True) or True)
    so = onnxpy.SessionOptions()
    so.enable_cpu_mem_arena = enabled
    sess = onnxpy.InferenceSession(_model().SerializeToString(), so)
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([-1, 2], np.float32)})[0], [0, 2])
    assert calls == ([True] if enabled else [])
