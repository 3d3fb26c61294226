"""Session-wide facts fixed at creation: limits, debug switches, thread settings.

Kernels that ask for ``ctx`` see these as ``ctx.session``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

from .threads import blas_threads


def _default_budget() -> int:
    """Half of physical memory: a single data-dependent allocation above it is refused."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
        return int(pages * size) // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


# onnxpy.set_global_thread_pool_sizes: the pool sizes of sessions that use no threads of their
# own (SessionOptions.use_per_session_threads = False). 0: the BLAS library's default.
GLOBAL_POOL = {"intra_op_num_threads": 0, "inter_op_num_threads": 0}


@dataclass
class SessionFacts:
    max_alloc_bytes: int = field(default_factory=_default_budget)
    check_nan_inf: bool = False
    debug_level: int = 0
    intra_op_threads: int = 0
    config: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def from_options(opts: Any) -> SessionFacts:
        cfg = dict(opts._config)
        threads = int(opts.intra_op_num_threads or 0)
        if not threads and not opts.use_per_session_threads:
            threads = GLOBAL_POOL["intra_op_num_threads"]  # set_global_thread_pool_sizes
        facts = SessionFacts(config=cfg, intra_op_threads=threads)
        if "session.max_allocation_bytes" in cfg:
            facts.max_alloc_bytes = int(cfg["session.max_allocation_bytes"])
        facts.check_nan_inf = cfg.get("session.check_nan_inf", "0") == "1"
        env = os.environ.get("ONNXPY_DEBUG", "")
        level = cfg.get("session.debug_level", env or "0")
        facts.debug_level = int(level) if level.isdigit() else 0
        return facts

    def make_observer(self, profiler: Any) -> Any:
        """None on the fast path; otherwise an observer combining profiling and debugging."""
        if profiler is None and not self.check_nan_inf and not self.debug_level:
            return None
        from ..tools.observers import make_observer

        return make_observer(profiler, self.debug_level, self.check_nan_inf)

    def thread_limit(self) -> contextlib.AbstractContextManager[None]:
        """Caps the BLAS pool for a run when intra_op_num_threads is set (free otherwise)."""
        if self.intra_op_threads > 0:
            return blas_threads(self.intra_op_threads)
        return _NO_LIMIT


_NO_LIMIT = contextlib.nullcontext()
