"""Kernels, one module per operator family; importing this package registers them all."""

from . import conv, elementwise, indexing, nn, pool, reduce, tensor  # noqa: F401
