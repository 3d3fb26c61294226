"""CLI verbs. Each verb registers its parser and a ``func(namespace) -> int``."""

from __future__ import annotations

import argparse
from typing import Any


def add_verbs(sub: Any) -> None:
    """Register the verbs (run, info, bench, profile) on the argparse subparsers."""
    _ = argparse  # the verbs arrive with the tools issue
