"""Plain-text tables and a progress bar for the command line (no dependency beyond the stdlib)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: int = 0) -> str:
    """Columns padded to their widest cell; numbers right-aligned, text left-aligned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    # A column of numbers (placeholders "-" and "" aside) is right-aligned.
    numeric = [
        any(_looks_numeric(r[i]) for r in cells[1:])
        and all(_looks_numeric(r[i]) for r in cells[1:] if r[i] not in ("", "-"))
        for i in range(len(headers))
    ]
    pad = " " * indent
    lines = []
    for n, r in enumerate(cells):
        parts = [c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append(pad + "  ".join(parts).rstrip())
        if n == 0:
            lines.append(pad + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _looks_numeric(s: str) -> bool:
    t = s.replace(",", "").replace("%", "").replace("x", "").strip()
    try:
        float(t)
        return True
    except ValueError:
        return False


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def human_count(n: int) -> str:
    if n >= 1_000_000_000:
        return f"{n / 1e9:.2f} G"
    if n >= 1_000_000:
        return f"{n / 1e6:.2f} M"
    if n >= 1_000:
        return f"{n / 1e3:.1f} K"
    return str(n)


class Progress:
    """A one-line progress bar on stderr, redrawn at most 10 times a second.

    Only drawn when the stream is a terminal (or ``force``), so piped output and tests stay clean.
    """

    def __init__(self, label: str, total: float, stream: TextIO | None = None, force: bool = False) -> None:
        self.label = label
        self.total = max(total, 1e-9)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = force or bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._shown = False

    def update(self, done: float, extra: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        frac = min(1.0, done / self.total)
        width = 30
        fill = int(frac * width)
        count = f"{done:.0f}/{self.total:.0f}" if float(self.total).is_integer() else f"{frac * 100:.0f}%"
        self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {count} {extra}\033[K")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


def status(message: str, stream: TextIO | None = None) -> None:
    """A transient status line ("creating session...") on a terminal; nothing when piped."""
    s = stream if stream is not None else sys.stderr
    if getattr(s, "isatty", lambda: False)():
        s.write(f"\r{message}\033[K")
        s.flush()
