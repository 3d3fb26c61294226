"""Device copies (domain onnxpy.fused), inserted by the placement pass (runtime/placement.py)
where a value crosses between a device provider and the CPU, like onnxruntime's
MemcpyFromHost / MemcpyToHost. Both run on the device provider: ``xp`` is its namespace.

A value may be a tensor, a sequence (Python list) of tensors or None (an empty optional).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .registry import op

DOMAIN = "onnxpy.fused"


def _map(value: Any, fn: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [fn(v) for v in value]
    return fn(value)


def to_device(xp: Any, a: Any) -> Any:
    """Host array -> ``xp`` array; the copy is complete on return (the host array may be freed)."""
    if not isinstance(a, np.ndarray) and not isinstance(a, np.generic):
        return a  # already on the device
    if xp is np:
        return a
    try:
        return xp.asarray(a, blocking=True)
    except TypeError:  # a namespace without the keyword copies synchronously anyway
        return xp.asarray(a)


def to_host(xp: Any, a: Any) -> Any:
    """``xp`` array -> numpy array (waits for the device work that produces it)."""
    if isinstance(a, np.ndarray):
        return a
    asnumpy = getattr(xp, "asnumpy", None)
    if asnumpy is None:
        return np.asarray(a)
    return asnumpy(a)


@op("MemcpyFromHost", 1, domain=DOMAIN)
def memcpy_from_host(xp: Any, x: Any) -> Any:
    return _map(x, lambda a: to_device(xp, a))


@op("MemcpyToHost", 1, domain=DOMAIN)
def memcpy_to_host(xp: Any, x: Any) -> Any:
    return _map(x, lambda a: to_host(xp, a))
