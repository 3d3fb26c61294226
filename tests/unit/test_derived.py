"""onnxpy/ops/_derived.py: forms derived from constant weights are built once per constant,
rebuilt for writable (run-time) weights, and dropped with their source."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from onnxpy.ops import _derived


def _counting_build(calls: list[int], source: Any) -> Any:
    def build() -> Any:
        calls.append(1)
        return source.sum()

    return build


def test_cached_forms_are_read_only() -> None:
    w = np.arange(6.0)
    w.flags.writeable = False
    form = _derived.derived((w,), ("copy",), lambda: w * 2)
    assert not form.flags.writeable  # shared by every later call: nobody may write into it
    fed = np.arange(6.0)  # a run-time value: its form is the caller's own
    assert _derived.derived((fed,), ("copy",), lambda: fed * 2).flags.writeable


def test_read_only_sources_are_built_once_and_dropped_when_freed() -> None:
    w = np.arange(6.0)
    w.flags.writeable = False
    calls: list[int] = []
    assert _derived.derived((w,), ("t",), _counting_build(calls, w)) == 15
    assert _derived.derived((w,), ("t",), _counting_build(calls, w)) == 15
    assert len(calls) == 1
    assert _derived.derived((w,), ("other tag",), _counting_build(calls, w)) == 15
    assert len(calls) == 2
    keys = [k for k, (refs, _) in _derived._CACHE.items() if refs[0]() is w]
    assert len(keys) == 2
    del w
    gc.collect()
    assert not any(k in _derived._CACHE for k in keys)  # both entries went with their source


def test_writable_sources_and_sources_without_the_flag_are_rebuilt() -> None:
    w = np.arange(3.0)
    calls: list[int] = []
    _derived.derived((w,), ("t",), _counting_build(calls, w))
    w[0] = 10  # a run-time weight may change between calls
    assert _derived.derived((w,), ("t",), _counting_build(calls, w)) == 13
    assert len(calls) == 2

    class DeviceArray:  # like CuPy: flags without 'writeable'
        class flags:  # noqa: N801 - mimics the attribute
            c_contiguous = True

        def sum(self) -> int:
            return 7

    d = DeviceArray()
    _derived.derived((d,), ("t",), _counting_build(calls, d))
    _derived.derived((d,), ("t",), _counting_build(calls, d))
    assert len(calls) == 4


def test_all_sources_must_be_read_only() -> None:
    w, b = np.ones(2), np.ones(2)
    w.flags.writeable = False  # b stays writable
    calls: list[int] = []
    for _ in range(2):
        _derived.derived((w, b), ("pair",), _counting_build(calls, w))
    assert len(calls) == 2


def test_in_dtype_converts_a_constant_once_and_a_writable_value_every_time() -> None:
    from onnxpy.ops._derived import in_dtype

    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    w.flags.writeable = False
    first = in_dtype(w, np.dtype(np.float32))
    assert first.dtype == np.float32 and not first.flags.writeable
    assert in_dtype(w, np.dtype(np.float32)) is first  # kernels' own caches key on this identity
    np.testing.assert_array_equal(first, w.astype(np.float32))
    fed = np.arange(6, dtype=np.float16)
    a, b = in_dtype(fed, np.dtype(np.float32)), in_dtype(fed, np.dtype(np.float32))
    assert a is not b and a.flags.writeable
    assert in_dtype(first, np.dtype(np.float32)) is first


def test_views_of_a_constant_made_on_each_call_share_one_entry() -> None:
    # Kernels derive from views taken on the call (Gemm's B.T, a slice): a new object each
    # time, so the entry must be found through the constant under it.
    w = np.arange(12.0).reshape(3, 4).copy()  # owns its memory, as a loaded weight does
    w.flags.writeable = False
    calls: list[int] = []
    for _ in range(3):
        t = w.T
        assert _derived.derived((t,), ("t",), _counting_build(calls, t)) == 66
    assert len(calls) == 1
    # Another place in the same memory is another entry, and so is another shape.
    assert _derived.derived((w[1:],), ("t",), _counting_build(calls, w[1:])) == 60
    assert _derived.derived((w[:, :2].T,), ("t",), _counting_build(calls, w[:, :2].T)) == 27
    assert _derived.derived((w[1:],), ("t",), _counting_build(calls, w[1:])) == 60
    assert len(calls) == 3
    # A pair: one source a view, the other the constant itself.
    for _ in range(2):
        _derived.derived((w.T, w), ("pair",), _counting_build(calls, w))
    assert len(calls) == 4
    keys = [k for k, (refs, _) in _derived._CACHE.items() if any(r() is w for r in refs)]
    assert len(keys) == 4
    del w, t
    gc.collect()
    assert not any(k in _derived._CACHE for k in keys)


def test_a_read_only_view_of_a_writable_array_is_rebuilt() -> None:
    x = np.arange(4.0)  # a value computed at run time: it may change
    calls: list[int] = []
    for value in (10.0, 20.0):
        x[0] = value
        view = np.broadcast_to(x, (2, 4))  # read-only, over writable memory
        assert _derived.derived((view,), ("t",), _counting_build(calls, view)) == 2 * (value + 6)
    assert len(calls) == 2


def _count_builds(monkeypatch: Any) -> list[tuple[Any, ...]]:
    """Record the tag of every form built, whichever kernel asks. In a model whose weights are
    all constants, nothing is built after the first run: every source is a constant or a form
    derived from one."""
    import sys

    builds: list[tuple[Any, ...]] = []
    real = _derived.derived

    def spy(sources: tuple[Any, ...], tag: tuple[Any, ...], build: Any) -> Any:
        def counted() -> Any:
            builds.append(tag)
            return build()

        return real(sources, tag, counted)

    for name, module in list(sys.modules.items()):
        if name.startswith("onnxpy") and getattr(module, "derived", None) is real:
            monkeypatch.setattr(module, "derived", spy)
    return builds


def _gemm_head() -> Any:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1024, 256)).astype(np.float32), "w")  # 1 MB, oblong
    node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    graph = helper.make_graph(
        [node],
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), {
        "x": rng.standard_normal((1, 256)).astype(np.float32)
    }


def _qgemm_head() -> Any:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    consts = {
        "sa": np.float32(0.02),
        "za": np.uint8(128),
        "b": rng.integers(-100, 100, (64, 256)).astype(np.int8),
        "sb": np.float32(0.004),
        "zb": np.int8(0),
    }
    node = helper.make_node("QGemm", ["a", "sa", "za", "b", "sb", "zb"], ["y"], domain="com.microsoft", transB=1)
    graph = helper.make_graph(
        [node],
        "qhead",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets), {"a": rng.integers(0, 255, (1, 256)).astype(np.uint8)}


def _qlinear_depthwise() -> Any:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    consts = {
        "sx": np.float32(0.05),
        "zx": np.uint8(120),
        "w": rng.integers(-60, 60, (8, 1, 3, 3)).astype(np.int8),
        "sw": np.full(8, 0.01, np.float32),
        "zw": np.zeros(8, np.int8),
        "sy": np.float32(0.1),
        "zy": np.uint8(128),
    }
    names = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"]
    node = helper.make_node("QLinearConv", names, ["y"], group=8, pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node],
        "qdw",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 8, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 8, 10, 10])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, {"x": rng.integers(0, 255, (1, 8, 10, 10)).astype(np.uint8)}


@pytest.mark.parametrize(
    "model",
    [_gemm_head, _qgemm_head, _qlinear_depthwise],
    ids=["gemm-transB-one-row", "qgemm-transB", "qlinearconv-depthwise"],
)
def test_runs_after_the_first_derive_nothing(model: Any, monkeypatch: Any) -> None:
    # Gemm and QGemm derive from B.T, a view made on each call: the form of the weight must come
    # from the cache on every run after the first (it was rebuilt every run: a QGemm head
    # shifted its whole weight to float each time). QLinearConv's depthwise path tiles its
    # shifted weights, themselves a derived form: that tiling was rebuilt on every call while
    # derived forms were writable.
    import onnxpy

    builds = _count_builds(monkeypatch)
    proto, feeds = model()
    sess = onnxpy.InferenceSession(proto.SerializeToString())
    first = sess.run(None, feeds)[0]
    assert builds, "the kernel derives a form of its weight"
    builds.clear()
    for _ in range(3):
        np.testing.assert_array_equal(sess.run(None, feeds)[0], first)
    assert builds == []


def _real_models() -> list[Any]:
    from onnxpy.cli import demo_model_path
    from tests.helpers import light_models, shared_models

    models = [pytest.param(demo_model_path(), id="demo")]
    models += [pytest.param(p, id=p.stem) for p in light_models() if p.stem == "light_shufflenet"]
    # None stands for the shared models where the folder is absent: the test skips, saying so.
    return models + ([pytest.param(p, id=p.stem) for p in shared_models()] or [pytest.param(None, id="shared")])


@pytest.mark.parametrize("path", _real_models())
def test_real_models_derive_nothing_after_the_first_run(path: Any, monkeypatch: Any) -> None:
    # Light ShuffleNet's classifier (Gemm with transB, one row) re-laid its 2.2 MB weight for
    # the one-row product on every run.
    import onnx

    import onnxpy
    from onnxpy.tools.feeds import make_feeds
    from tests.helpers import SHARED_MODELS

    if path is None:
        pytest.skip(f"{SHARED_MODELS} is absent (a clone without ../shared)")
    builds = _count_builds(monkeypatch)
    sess = onnxpy.InferenceSession(str(path))
    feeds = make_feeds(onnx.load(str(path), load_external_data=False), batch=1, seed=0).arrays
    sess.run(None, feeds)
    builds.clear()
    for _ in range(2):
        sess.run(None, feeds)
    assert builds == []


def test_views_at_ever_new_places_are_not_hoarded() -> None:
    # A slice at a run-time offset (a position table read one step further each call) must
    # not leave one cached form per offset for the constant's whole life.
    table = np.arange(400.0).reshape(100, 4).copy()
    table.flags.writeable = False
    calls: list[int] = []
    for step in range(20):
        row = table[step : step + 1]
        assert _derived.derived((row,), ("rows",), _counting_build(calls, row)) == row.sum()
    kept = [k for k, (refs, _) in _derived._CACHE.items() if refs[0]() is table and "rows" in k]
    assert 1 <= len(kept) <= _derived._MAX_PLACES
    assert len(calls) == 20
    # The places it kept are still found.
    first = table[0:1]
    _derived.derived((first,), ("rows",), _counting_build(calls, first))
    assert len(calls) == 20
    # The count of places goes with the constant, as its entries do.
    counted = [k for k in _derived._PLACES if k[0] == id(table)]
    assert counted
    del table, row, first
    gc.collect()
    assert not any(k in _derived._PLACES for k in counted)
    assert not any(k in _derived._CACHE for k in kept)


def test_a_constant_that_is_a_view_is_found_by_identity_after_its_first_call() -> None:
    # Loaded weights are often reshaped views of a read-only buffer: the entry found through
    # the buffer is also kept under the weight itself, so its later calls take the first,
    # cheapest lookup (MobileNet-v2 made 73 slower lookups a run without this).
    flat = np.arange(12.0)
    flat.flags.writeable = False
    w = flat.reshape(3, 4)  # read-only, a view of flat
    calls: list[int] = []
    first = _derived.derived((w,), ("w",), _counting_build(calls, w))
    assert (id(w), "w") in _derived._CACHE
    assert _derived.derived((w,), ("w",), _counting_build(calls, w)) is first
    assert len(calls) == 1
    # A second view at the same place shares the form, and is found by identity next time.
    again = flat.reshape(3, 4)
    assert _derived.derived((again,), ("w",), _counting_build(calls, again)) is first
    assert (id(again), "w") in _derived._CACHE and len(calls) == 1
    key = (id(again), "w")
    del again
    gc.collect()
    assert key not in _derived._CACHE  # the alias goes with its view
