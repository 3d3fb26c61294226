"""quant kernels."""

from __future__ import annotations
