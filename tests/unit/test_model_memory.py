"""A session holds its model's weights once: nothing of the loaded protobuf stays alive, and
external data are read straight into arrays.

With protobuf's upb backend, any sub-message still referenced (a value's TypeProto, a node's
NodeProto) keeps the whole parsed model, weight bytes included, in memory: sessions used to
hold every model twice. Measured in a fresh process, against the weights' size."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_PROBE = textwrap.dedent(
    """
    import ctypes, gc, sys
    import numpy as np, onnx
    from onnx import helper, numpy_helper, TensorProto
    import onnxpy

    def rss_mb():
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        with open("/proc/self/status") as f:
            return int(next(l for l in f if l.startswith("VmRSS")).split()[1]) / 1024

    folder, external = sys.argv[1], sys.argv[2] == "external"
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((1024, 2048), dtype=np.float32) for _ in range(12)]  # 96 MiB
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(12)]
    # Declared types on intermediate values too: each becomes a TypeProto the graph keeps.
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, 2048]) for i in range(12)],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder + "/m.onnx"
    onnx.save(model, path, save_as_external_data=external, all_tensors_to_one_file=True, location="m.data")
    del weights, graph, model
    before = rss_mb()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current resident size
    options = onnxpy.SessionOptions()
    # Basic level: the extended one packs these sibling products' weights into one matrix,
    # a copy of its own while it is made.
    options.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = onnxpy.InferenceSession(path, options)
    with open("/proc/self/status") as f:
        peak = int(next(l for l in f if l.startswith("VmHWM")).split()[1]) / 1024
    session.run(None, {"x": np.ones((1, 1024), np.float32)})
    print((rss_mb() - before) / 96, (peak - before) / 96)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("storage", ["inline", "external"])
def test_a_session_holds_its_weights_once(tmp_path: Path, storage: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path), storage], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    ratio, peak = (float(v) for v in out.stdout.strip().splitlines()[-1].split())
    assert ratio < 1.4, f"the session holds {ratio:.2f}x its weights"
    if storage == "external":
        # Read from the data file straight into arrays: never twice in memory while loading.
        assert peak < 1.5, f"creating the session peaked at {peak:.2f}x its weights"
