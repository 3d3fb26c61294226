"""ai.onnx.preview.training optimizers (Adagrad, Adam, Momentum) against the operator docs'
pseudo code, written out here in numpy float64 (onnxruntime's CPU build has no such kernels)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import onnxpy

DOMAIN = "ai.onnx.preview.training"
RNG = np.random.default_rng(0)


def run_optimizer(
    op: str, groups: list[str], outs: list[str], R: float, T: int, tensors: dict[str, list[np.ndarray]], **attrs: Any
) -> list[np.ndarray]:
    names = ["R", "T"]
    feeds: dict[str, Any] = {"R": np.array(R, np.float32), "T": np.array(T, np.int64)}
    inputs = [oh.make_tensor_value_info("R", TP.FLOAT, []), oh.make_tensor_value_info("T", TP.INT64, [])]
    for g in groups:
        for i, arr in enumerate(tensors[g]):
            name = f"{g}{i}"
            names.append(name)
            feeds[name] = arr
            inputs.append(oh.make_tensor_value_info(name, TP.FLOAT, list(arr.shape)))
    n = len(tensors[groups[0]])
    out_names = [f"{o}{i}_new" for o in outs for i in range(n)]
    outputs = [
        oh.make_tensor_value_info(f"{o}{i}_new", TP.FLOAT, list(tensors[o][i].shape)) for o in outs for i in range(n)
    ]
    node = oh.make_node(op, names, out_names, domain=DOMAIN, **attrs)
    model = oh.make_model(
        oh.make_graph([node], "g", inputs, outputs),
        opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid(DOMAIN, 1)],
        ir_version=8,
    )
    onnx.checker.check_model(model)
    return onnxpy.InferenceSession(model.SerializeToString()).run(None, feeds)


def tensors(n: int, groups: str) -> dict[str, list[np.ndarray]]:
    shapes = [(3,), (2, 2), (1,)][:n]
    out = {g: [RNG.normal(size=s).astype(np.float32) for s in shapes] for g in groups}
    if "H" in out:
        out["H"] = [np.abs(h) for h in out["H"]]
    return out


@pytest.mark.parametrize("T", [0, 3])
@pytest.mark.parametrize("n", [1, 3])
def test_adagrad(T: int, n: int) -> None:
    t = tensors(n, "XGH")
    attrs = dict(decay_factor=0.1, epsilon=1e-5, norm_coefficient=0.01)
    got = run_optimizer("Adagrad", ["X", "G", "H"], ["X", "H"], 0.5, T, t, **attrs)
    r = 0.5 / (1 + T * 0.1)
    for i in range(n):
        x, g, h = (t[k][i].astype(np.float64) for k in "XGH")
        g_reg = 0.01 * x + g
        h_new = h + g_reg * g_reg
        np.testing.assert_allclose(got[i], x - r * g_reg / (np.sqrt(h_new) + 1e-5), rtol=1e-5)
        np.testing.assert_allclose(got[n + i], h_new, rtol=1e-5)
        assert got[i].dtype == np.float32


@pytest.mark.parametrize("T", [0, 2])
@pytest.mark.parametrize("n", [1, 2])
def test_adam(T: int, n: int) -> None:
    t = tensors(n, "XGVH")
    a, b, eps, nc, ncp = 0.8, 0.95, 1e-6, 0.02, 0.1
    got = run_optimizer(
        "Adam",
        ["X", "G", "V", "H"],
        ["X", "V", "H"],
        0.1,
        T,
        t,
        alpha=a,
        beta=b,
        epsilon=eps,
        norm_coefficient=nc,
        norm_coefficient_post=ncp,
    )
    r = 0.1 * np.sqrt(1 - b**T) / (1 - a**T) if T > 0 else 0.1
    for i in range(n):
        x, g, v, h = (t[k][i].astype(np.float64) for k in "XGVH")
        g_reg = nc * x + g
        v_new = a * v + (1 - a) * g_reg
        h_new = b * h + (1 - b) * g_reg * g_reg
        x_new = (1 - ncp) * (x - r * v_new / (np.sqrt(h_new) + eps))
        np.testing.assert_allclose(got[i], x_new, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[n + i], v_new, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[2 * n + i], h_new, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("T", [0, 5])
def test_momentum(mode: str, T: int) -> None:
    t = tensors(2, "XGV")
    a, b, nc = 0.9, 0.3, 0.01
    got = run_optimizer(
        "Momentum", ["X", "G", "V"], ["X", "V"], 0.2, T, t, alpha=a, beta=b, mode=mode, norm_coefficient=nc
    )
    b_adj = b if T > 0 else 1.0
    for i in range(2):
        x, g, v = (t[k][i].astype(np.float64) for k in "XGV")
        g_reg = nc * x + g
        v_new = a * v + b_adj * g_reg
        x_new = x - 0.2 * (v_new if mode == "standard" else g_reg + a * v_new)
        np.testing.assert_allclose(got[i], x_new, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[2 + i], v_new, rtol=1e-5, atol=1e-6)


def test_momentum_rejects_unknown_mode() -> None:
    t = tensors(1, "XGV")
    with pytest.raises(Exception, match="mode"):
        run_optimizer(
            "Momentum", ["X", "G", "V"], ["X", "V"], 0.2, 1, t, alpha=0.9, beta=0.1, mode="heavy", norm_coefficient=0.0
        )
