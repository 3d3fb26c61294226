"""Property tests: every convolution path, forced onto random geometries, equals a direct
float64 convolution.

The kernel picks its path from channel counts and map sizes (Winograd from 32-64 channels, the
tap sum where M <= C/4, per-tap products above 16 MB of columns), so the example-based cases in
tests/ops/test_conv.py reach each path on a few hand-picked shapes. Here each path's selector is
forced on, so the path runs on whatever geometry it accepts: odd sizes, asymmetric pads, pads
wider than the kernel's reach, dilations, channels-last inputs, results written into a slice of
a larger buffer (as ConcatConv does), with and without bias and a fused activation."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxpy.ops import _winograd_cl, conv
from tests.helpers import draw_padded_map
from tests.ops.test_conv import assert_conv_close, reference_conv, term_scale

# Derandomized: CI checks the same 80 geometries every time (a failure is then reproducible, not
# a matter of luck). A longer search: ONNXPY_CONV_EXAMPLES=4000 (random each run).
_SEARCH = int(os.environ.get("ONNXPY_CONV_EXAMPLES", "0"))
SETTINGS = settings(
    max_examples=_SEARCH or 80,
    derandomize=not _SEARCH,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

WINOGRADABLE = ([3, 3], [1, 1], [1, 1])  # kernel, strides, dilations


def _winograd_tile(r: int) -> Callable[..., int]:
    def tile(k: list[int], strides: list[int], dilations: list[int], *_: Any, **__: Any) -> int:
        return r if [list(k), list(strides), list(dilations)] == list(WINOGRADABLE) else 0

    return tile


def _winograd_path(r: int, channels_last: bool) -> tuple[dict[tuple[Any, str], Any], Callable[..., bool]]:
    """Winograd F(r x r, 3x3), in NCHW or channels-last memory, on every 3x3 stride-1 layer."""
    patches = {
        (conv, "_tap_sum_pays"): lambda *a: False,
        (conv, "_winograd_tile"): _winograd_tile(r),
        (_winograd_cl, "pays"): lambda *a: channels_last,
    }
    return patches, lambda k, s, d, g: g == 1 and (k, s, d) == WINOGRADABLE


# Each path: the selectors patched to force it, and whether it applies to a geometry (kernel,
# strides, dilations, group). Where it does not, the dispatch would quietly take another path,
# so the case is not run under that path's name.
PATHS: dict[str, tuple[dict[tuple[Any, str], Any], Callable[[list[int], list[int], list[int], int], bool]]] = {
    "default": ({}, lambda k, s, d, g: True),
    # The im2col GEMM computing Y^T, its result channels-last (a stem read by depthwise layers).
    "channels_last_result": (
        {(conv, "_tap_sum_pays"): lambda *a: False, (conv, "_winograd_tile"): _winograd_tile(0)},
        lambda k, s, d, g: g == 1,
    ),
    # im2col for group 1 in both forms: columns copied from a channels-last copy of the input
    # (outputs at most 14 wide by default) and from the NCHW input.
    "channels_last_columns": (
        {
            (conv, "_tap_sum_pays"): lambda *a: False,
            (conv, "_winograd_tile"): _winograd_tile(0),
            (conv, "_channels_last_columns_pay"): lambda *a: True,
        },
        lambda k, s, d, g: g == 1,
    ),
    "nchw_columns": (
        {
            (conv, "_tap_sum_pays"): lambda *a: False,
            (conv, "_winograd_tile"): _winograd_tile(0),
            (conv, "_channels_last_columns_pay"): lambda *a: False,
        },
        lambda k, s, d, g: g == 1,
    ),
    "tap_sum": (
        {(conv, "_tap_sum_pays"): lambda strides, c, m: all(v == 1 for v in strides)},
        lambda k, s, d, g: g == 1 and s == [1, 1],
    ),
    "tap_accumulate": (
        {
            (conv, "_tap_sum_pays"): lambda *a: False,
            (conv, "_winograd_tile"): _winograd_tile(0),
            (conv, "_tap_accumulate_pays"): lambda *a: True,
        },
        lambda k, s, d, g: g == 1 and s == [1, 1] and k != [1, 1],
    ),
    **{
        f"winograd_f{r}_{layout}": _winograd_path(r, layout == "channels_last")
        for r in (2, 4)
        for layout in ("nchw", "channels_last")
    },
}


@contextmanager
def forced(path: str) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for (module, name), value in PATHS[path][0].items():
            mp.setattr(module, name, value)
        yield


@st.composite
def conv_cases(draw: Any) -> dict[str, Any]:
    group = draw(st.sampled_from([1, 1, 1, 2, 3]))
    c = group * draw(st.integers(1, 12))
    m = group * draw(st.integers(1, 6))
    winograd_shape = draw(st.booleans())  # half the cases in the shape Winograd accepts
    if winograd_shape:
        k, strides, dilations = [3, 3], [1, 1], [1, 1]
    else:
        k = [draw(st.integers(1, 5)), draw(st.integers(1, 5))]
        strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))] if draw(st.booleans()) else [1, 1]
        dilations = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    pads, (h, w) = draw_padded_map(draw, [(k[i] - 1) * dilations[i] + 1 for i in range(2)], 4, 14)
    return {
        "n": draw(st.integers(1, 2)),
        "c": c,
        "m": m,
        "group": group,
        "k": k,
        "strides": strides,
        "dilations": dilations,
        "pads": pads,
        "hw": (h, w),
        "bias": draw(st.booleans()),
        "relu": draw(st.booleans()),
        "channels_last": draw(st.booleans()),
        "into_slice": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def _inputs(case: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    rng = np.random.default_rng(case["seed"])
    n, c, m = case["n"], case["c"], case["m"]
    h, w = case["hw"]
    if case["channels_last"]:
        x = rng.standard_normal((n, h, w, c)).astype(np.float32).transpose(0, 3, 1, 2)  # NCHW view
    else:
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c // case["group"], *case["k"])).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if case["bias"] else None
    wt.flags.writeable = False  # weights are constants in a session (cached derived forms)
    if b is not None:
        b.flags.writeable = False
    return x, wt, b


def _relu(y: np.ndarray) -> None:
    np.maximum(y, 0, out=y)


@SETTINGS
@given(conv_cases())
def test_every_forced_path_equals_the_direct_convolution(case: dict[str, Any]) -> None:
    x, wt, b = _inputs(case)
    k, strides, dilations, group = case["k"], case["strides"], case["dilations"], case["group"]
    args = (strides, case["pads"], dilations, group)
    want = reference_conv(x, wt, b, *args)
    if case["relu"]:
        want = np.maximum(want, 0)
    scale = term_scale(x, wt, b, *args)
    ran = []
    for path, (_, applies) in PATHS.items():
        if not applies(k, strides, dilations, group):
            continue
        ran.append(path)
        into = None
        if case["into_slice"] and case["n"] == 1:
            # A channel slice of a larger buffer (a concatenation), the channels around it
            # marked: the path must write its slice and nothing else.
            buf = np.full((1, case["m"] + 5, *want.shape[2:]), np.nan, dtype=np.float32)
            into = buf[:, 2 : 2 + case["m"]]
        with forced(path):
            got = conv.conv_nd(
                np,
                x,
                wt,
                b,
                group=group,
                kernel_shape=k,
                pads=case["pads"],
                strides=strides,
                dilations=dilations,
                epilogue=_relu if case["relu"] else None,
                into=into,
                channels_last=path == "channels_last_result",
            )
        # Winograd's transforms mix the terms of a whole tile: an output that reads only padding
        # (exactly 0) still carries its neighbours' rounding, so its scale is its map's largest.
        tile_scale = np.broadcast_to(scale.max(axis=(2, 3), keepdims=True), scale.shape)
        assert_conv_close(np.asarray(got), want, tile_scale if "winograd" in path else scale)
        if into is not None:
            assert got is into, f"{path}: the result was not written into the given buffer"
            assert np.isnan(buf[:, :2]).all() and np.isnan(buf[:, 2 + case["m"] :]).all(), (
                f"{path}: wrote outside its channel slice"
            )
    assert "default" in ran


def test_the_forcing_reaches_each_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The patches above do steer the dispatch: each forced path's own function runs."""
    calls: list[str] = []

    def spy(name: str) -> None:
        original = getattr(conv, name)

        def wrapped(*a: Any, **kw: Any) -> Any:
            calls.append(name)
            return original(*a, **kw)

        monkeypatch.setattr(conv, name, wrapped)

    for name in ("_conv2d_tap_sum", "_conv_tap_accumulate", "_winograd", "_im2col_gemm", "_im2col_channels_last"):
        spy(name)
    monkeypatch.setattr(_winograd_cl, "winograd_channels_last", _counting(_winograd_cl.winograd_channels_last, calls))
    x = np.random.default_rng(0).standard_normal((1, 8, 9, 10)).astype(np.float32)
    wt = np.random.default_rng(1).standard_normal((2, 8, 3, 3)).astype(np.float32)
    expected = {
        "default": "_conv2d_tap_sum",  # 2 <= 8 / 4
        "channels_last_columns": "_im2col_channels_last",
        "nchw_columns": "_im2col_gemm",
        "tap_sum": "_conv2d_tap_sum",
        "tap_accumulate": "_conv_tap_accumulate",
        "winograd_f2_nchw": "_winograd",
        "winograd_f4_nchw": "_winograd",
        "winograd_f2_channels_last": "winograd_channels_last",
        "winograd_f4_channels_last": "winograd_channels_last",
    }
    for path, function in expected.items():
        calls.clear()
        with forced(path):
            conv.conv_nd(np, x, wt, None, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        assert function in calls, (path, calls)


def _counting(fn: Callable[..., Any], calls: list[str]) -> Callable[..., Any]:
    def wrapped(*a: Any, **kw: Any) -> Any:
        calls.append("winograd_channels_last")
        return fn(*a, **kw)

    return wrapped
