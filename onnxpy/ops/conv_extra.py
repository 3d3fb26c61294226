"""conv_extra kernels."""

from __future__ import annotations
