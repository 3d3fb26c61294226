"""Arrays derived from constant weights (transformed, transposed, tiled), computed once.

Kernels derive forms of their weights that suit the computation: Winograd-transformed kernels,
[W | b] for a bias inside the GEMM, W^T or tiled rows for channels-last layouts. Constants
are read-only arrays that live as long as the session, so the derived form is cached, keyed by
the sources' identity, and dropped when a source is freed. A writable source (a weight fed at
run time, which may change between calls) or one without a writeable flag (a CuPy array) is
derived afresh each call.

A kernel often derives from a view of a constant made on the call (Gemm's ``B.T``, a slice):
a new object each time, so its identity alone would miss every call and rebuild the form (a
QGemm head re-shifted its 1280 x 1000 weight on every run, 4 ms). Such a view is keyed by the
constant it was taken from and its place in it instead.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")

_CACHE: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}


def derived(sources: tuple[Any, ...], tag: tuple[Any, ...], build: Callable[[], T]) -> T:
    """``build()``, cached per (sources, tag) while every source is alive and read-only."""
    if len(sources) == 1:
        # The usual case, without generators: a hit costs 0.27 us instead of 0.84, and
        # MobileNet-v2 makes ~90 lookups a run.
        only = sources[0]
        key: tuple[Any, ...] = (id(only), *tag)
        hit = _CACHE.get(key)
        if hit is not None and hit[0][0]() is only:
            return hit[1]  # type: ignore[no-any-return]
    elif len(sources) == 2:
        # [W | b] and friends (a bias-augmented 1x1 convolution's weights, every call).
        first, second = sources
        key = (id(first), id(second), *tag)
        hit = _CACHE.get(key)
        if hit is not None and hit[0][0]() is first and hit[0][1]() is second:
            return hit[1]  # type: ignore[no-any-return]
    else:
        key = (*(id(s) for s in sources), *tag)
        hit = _CACHE.get(key)
        if hit is not None and all(ref() is s for ref, s in zip(hit[0], sources)):
            return hit[1]  # type: ignore[no-any-return]
    anchors = tuple([_constant_under(s) for s in sources])
    if any([a is not s for a, s in zip(anchors, sources)]):
        # Views of constants: keyed by the constants and each view's place in them.
        key = (*[id(a) for a in anchors], *[_place(s, a) for s, a in zip(sources, anchors)], *tag)
        hit = _CACHE.get(key)
        if hit is not None and all([ref() is a for ref, a in zip(hit[0], anchors)]):
            # Also under these very objects, while they live: a constant that is itself a view
            # (a reshaped weight) then hits on the first lookup from its next call on.
            _store(sources, (*[id(s) for s in sources], *tag), hit[1])
            return hit[1]  # type: ignore[no-any-return]
        places = (*(id(a) for a in anchors), *tag)
        if _PLACES.get(places, 0) >= _MAX_PLACES:
            return build()  # a view that moves from call to call (a slice at a run-time offset)
        _store(anchors, key, value := build())
        if key in _CACHE:
            if places not in _PLACES:
                for a in anchors:  # the count goes with the first of them to go, as its entries do
                    weakref.finalize(a, _PLACES.pop, places, None)
            _PLACES[places] = _PLACES.get(places, 0) + 1
            _store(sources, (*[id(s) for s in sources], *tag), value)
        return value
    _store(sources, key, value := build())
    return value


# Places (views) cached per constants and tag, and the most kept: a kernel takes its views of a
# weight at the same few places every call; views at ever new places are derived afresh
# rather than hoarded for the session's life.
_PLACES: dict[tuple[Any, ...], int] = {}
_MAX_PLACES = 4


def _store(sources: tuple[Any, ...], key: tuple[Any, ...], value: Any) -> None:
    """Cache ``value`` under ``key`` while every source is alive, if every one is read-only."""
    if any(getattr(s.flags, "writeable", True) for s in sources):
        return
    try:
        refs = tuple(weakref.ref(s) for s in sources)
    except TypeError:
        return
    if value.__class__ is np.ndarray and value.flags.writeable:
        # Shared by every later call: read-only, so no kernel writes into it and forms derived
        # from it in turn are cached too (a QLinearConv's shifted weights, then their
        # depthwise tiling, which was rebuilt on every call).
        value.flags.writeable = False
    _CACHE[key] = (refs, value)
    for s in sources:
        weakref.finalize(s, _CACHE.pop, key, None)


def _constant_under(v: Any) -> Any:
    """The read-only array furthest up ``v``'s chain of bases through read-only arrays: the
    constant a read-only view was taken from (``v`` itself when it is no such view). A view of
    a writable array stops at the view, which dies with the call."""
    if v.__class__ is not np.ndarray or v.flags.writeable:
        return v
    while v.base.__class__ is np.ndarray and not v.base.flags.writeable:
        v = v.base
    return v


def _place(view: np.ndarray, whole: np.ndarray) -> tuple[Any, ...]:
    """Where ``view`` lies in ``whole``'s memory (which stays put while ``whole`` lives): its
    address, shape, strides and dtype."""
    if view is whole:
        return ()
    return (view.__array_interface__["data"][0], view.shape, view.strides, view.dtype.str)


def in_dtype(v: Any, dtype: Any) -> Any:
    """``v`` in ``dtype``: itself when it already is; for a constant, one converted copy kept
    read-only for the session's life, so kernels that derive forms of their weights (Winograd,
    packed columns) find the same array every run and derive them once. A float16 model's
    convolutions converted their weights to float32 and derived them again on every call."""
    if v.dtype == dtype:
        return v

    def build() -> Any:
        converted = v.astype(dtype)
        if hasattr(converted, "flags"):
            converted.flags.writeable = False
        return converted

    if getattr(getattr(v, "flags", None), "writeable", True):
        return v.astype(dtype)  # a value computed or fed at run time: converted afresh
    return derived((v,), ("in-dtype", str(dtype)), build)


def cached_values() -> list[Any]:
    """Every derived array cached now (for tests and memory accounting)."""
    return [v for _, v in _CACHE.values()]
