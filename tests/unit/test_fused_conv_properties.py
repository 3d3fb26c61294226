"""Property tests: the fused convolution kernels of this optimizer equal the compositions they
replace, over random geometries (shapes, kernels, strides, pads, groups, activations)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxpy.ops.concat_append import concat_append
from onnxpy.ops.fused import concat_conv, fused_conv, pointwise_depthwise_conv
from tests.helpers import draw_padded_map

# Derandomized, as the convolution path properties: CI checks the same examples every run.
SETTINGS = settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ZERO_KEEPING = [("", []), ("Relu", []), ("Clip", [0.0, 6.0]), ("LeakyRelu", [0.1]), ("Tanh", []), ("HardSwish", [])]


@st.composite
def pointwise_depthwise_cases(draw: Any) -> dict[str, Any]:
    group1 = draw(st.sampled_from([1, 1, 2, 3]))
    c = group1 * draw(st.integers(1, 4))
    m = group1 * draw(st.integers(1, 5))
    shuffle = group1 if group1 > 1 and draw(st.booleans()) else 0
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(2, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads, (h, w) = draw_padded_map(draw, [kh, kw], 3, 9)
    return {
        "n": draw(st.integers(1, 2)),
        "c": c,
        "m": m,
        "group1": group1,
        "shuffle": shuffle,
        "kernel": [kh, kw],
        "strides": [sh, sw],
        "pads": pads,
        "hw": (h, w),
        "act1": draw(st.sampled_from(ZERO_KEEPING)),
        "act": draw(st.sampled_from(ZERO_KEEPING)),
        "bias1": draw(st.booleans()),
        "bias": draw(st.booleans()),
        "channels_last": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


@SETTINGS
@given(pointwise_depthwise_cases())
def test_pointwise_depthwise_equals_the_two_convolutions(case: dict[str, Any]) -> None:
    rng = np.random.default_rng(case["seed"])
    n, c, m = case["n"], case["c"], case["m"]
    h, w = case["hw"]
    x = rng.standard_normal((n, h, w, c) if case["channels_last"] else (n, c, h, w)).astype(np.float32)
    if case["channels_last"]:
        x = x.transpose(0, 3, 1, 2)  # an NCHW-shaped view of channels-last memory
    w1 = rng.standard_normal((m, c // case["group1"], 1, 1)).astype(np.float32)
    b1 = rng.standard_normal(m).astype(np.float32) * 2 if case["bias1"] else None
    w2 = rng.standard_normal((m, 1, *case["kernel"])).astype(np.float32)
    b2 = rng.standard_normal(m).astype(np.float32) if case["bias"] else None
    (a1, p1), (a2, p2) = case["act1"], case["act"]
    dw = {"group": m, "pads": case["pads"], "strides": case["strides"], "kernel_shape": case["kernel"]}
    mid = fused_conv(
        np, x, w1, b1, group=case["group1"], shuffle_groups=case["shuffle"], activation=a1, activation_params=p1
    )
    want = fused_conv(np, mid, w2, b2, **dw, activation=a2, activation_params=p2)
    got = pointwise_depthwise_conv(
        np,
        x,
        w1,
        b1,
        w2,
        b2,
        activation1=a1,
        activation1_params=p1,
        group1=case["group1"],
        shuffle_groups1=case["shuffle"],
        activation=a2,
        activation_params=p2,
        **dw,
    )
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@st.composite
def concat_conv_cases(draw: Any) -> dict[str, Any]:
    c = draw(st.integers(1, 12))
    h, w = draw(st.integers(3, 10)), draw(st.integers(3, 10))
    members = []
    for _ in range(draw(st.integers(2, 4))):
        k = draw(st.sampled_from([1, 3, 5]))
        group = draw(st.sampled_from([g for g in (1, 2, 3, c) if c % g == 0]))
        members.append(
            {
                "m": group * draw(st.integers(1, 4)),
                "k": k,
                "group": group,
                "dil": draw(st.sampled_from([1, 1, 2])) if k > 1 else 1,
                "act": draw(st.sampled_from(ZERO_KEEPING + [("HardSigmoid", [0.2, 0.5])])),
                "bias": draw(st.booleans()),
            }
        )
    return {"n": draw(st.integers(1, 2)), "c": c, "hw": (h, w), "members": members, "seed": draw(st.integers(0, 2**16))}


@SETTINGS
@given(concat_conv_cases())
def test_concat_conv_equals_the_concatenated_convolutions(case: dict[str, Any]) -> None:
    """Members keep the input's spatial size ('same' padding for their dilated kernel), so any
    mix of paths (1x1, tap-sum, Winograd-free small maps, padded width, im2col, grouped,
    depthwise) writes its slice."""
    rng = np.random.default_rng(case["seed"])
    n, c = case["n"], case["c"]
    x = rng.standard_normal((n, c, *case["hw"])).astype(np.float32)
    inputs: list[Any] = []
    lists: dict[str, list[Any]] = {
        k: [] for k in ("kernel_shapes", "pads", "strides", "dilations", "groups", "activations", "activation_params")
    }
    parts = []
    for mem in case["members"]:
        k, d = mem["k"], mem["dil"]
        pad = (k - 1) * d // 2
        wt = rng.standard_normal((mem["m"], c // mem["group"], k, k)).astype(np.float32)
        b = rng.standard_normal(mem["m"]).astype(np.float32) if mem["bias"] else None
        act, params = mem["act"]
        attrs = {"pads": [pad] * 4, "dilations": [d, d], "group": mem["group"], "kernel_shape": [k, k]}
        parts.append(fused_conv(np, x, wt, b, **attrs, activation=act, activation_params=params))
        inputs += [x, wt, b]
        lists["kernel_shapes"] += [k, k]
        lists["pads"] += [pad] * 4
        lists["strides"] += [1, 1]
        lists["dilations"] += [d, d]
        lists["groups"].append(mem["group"])
        lists["activations"].append(act)
        lists["activation_params"] += (list(params) + [0.0, 0.0])[:2]
    got = concat_conv(np, *inputs, **lists)
    want = np.concatenate(parts, axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(st.lists(st.integers(1, 4), min_size=2, max_size=6), st.integers(1, 2), st.data())
def test_concat_append_chains_and_branches(widths: list[int], n: int, data: Any) -> None:
    """A chain of appends, with a branch appended to a random earlier link: every value equals
    np.concatenate of its inputs, however the buffers were shared."""
    rng = np.random.default_rng(len(widths) * 7 + n)
    parts = [rng.standard_normal((n, k, 3, 2)).astype(np.float32) for k in widths]
    capacity = sum(widths) + data.draw(st.integers(0, 3))
    links = [parts[0]]
    for p in parts[1:]:
        links.append(concat_append(np, links[-1], p, capacity=capacity))
    at = data.draw(st.integers(0, len(links) - 1))
    extra = rng.standard_normal((n, 2, 3, 2)).astype(np.float32)
    branch = concat_append(np, links[at], extra, capacity=capacity)
    for i in range(1, len(links)):
        np.testing.assert_array_equal(links[i], np.concatenate(parts[: i + 1], axis=1))
    np.testing.assert_array_equal(branch, np.concatenate([*parts[: at + 1], extra], axis=1))
