"""Collects onnx's backend node test cases from the installed onnx package and runs one."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

KNOWN_FAILURES_FILE = __file__.replace("suite.py", "known_failures.txt")


@functools.cache
def node_cases() -> dict[str, Any]:
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    return {c.name: c for c in cases}


def known_failures(path: str = KNOWN_FAILURES_FILE) -> dict[str, str]:
    """name -> reason, from known_failures.txt or another such list ('name  # reason' per line)."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition("#")
            out[name.strip()] = reason.strip()
    return out


def assert_close(name: str, got: Any, want: Any, rtol: float, atol: float) -> None:
    if isinstance(want, list):
        assert isinstance(got, list), f"{name}: expected a sequence, got {type(got).__name__}"
        assert len(got) == len(want), f"{name}: sequence length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(f"{name}[{i}]", g, w, rtol, atol)
        return
    if want is None:
        assert got is None, f"{name}: expected an empty optional, got {type(got).__name__}"
        return
    want = np.asarray(want)
    assert got is not None, f"{name}: got None, expected {want.dtype}{list(want.shape)}"
    got = np.asarray(got)
    assert got.shape == want.shape, f"{name}: shape {list(got.shape)} != expected {list(want.shape)}"
    if want.dtype.kind in "OUS":
        assert got.dtype.kind in "OUS", f"{name}: dtype {got.dtype} != expected {want.dtype}"
        assert got.tolist() == want.tolist(), f"{name}: {got.tolist()} != {want.tolist()}"
        return
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != expected {want.dtype}"
    if (
        want.dtype.kind in "fc"
        or want.dtype.kind == "V"
        or str(want.dtype).startswith(("bfloat16", "float8", "float4"))
    ):
        g = got.astype(np.float64) if want.dtype.kind != "c" else got
        w = want.astype(np.float64) if want.dtype.kind != "c" else want
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


def _array(v: Any) -> Any:
    """Test data come as numpy arrays, TensorProtos (exotic dtypes), lists (sequences) or None."""
    from onnx import TensorProto, numpy_helper

    if isinstance(v, TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list):
        return [_array(x) for x in v]
    return v


def run_case(case: Any, runtime: Any = None) -> None:
    """Run one case through ``runtime`` (a module with onnxruntime's API; onnxpy by default)."""
    if runtime is None:
        import onnxpy as runtime

    sess = runtime.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
    input_names = [i.name for i in case.model.graph.input]
    output_names = [o.name for o in case.model.graph.output]
    rtol = max(case.rtol, 1e-3)
    atol = max(case.atol, 1e-5)
    for inputs, outputs in case.data_sets:
        feeds = {n: _array(v) for n, v in zip(input_names, inputs)}
        outputs = [_array(v) for v in outputs]
        got = sess.run(output_names, feeds)
        for n, g, w in zip(output_names, got, outputs):
            assert_close(f"{case.name} output '{n}'", g, w, rtol, atol)
