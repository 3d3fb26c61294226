"""Make the tests' helpers importable as `tests.helpers` whatever the rootdir; skip, with the
reason, comparisons an older onnxruntime (the oracle) cannot make."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# -- onnxruntime as the oracle -------------------------------------------------------------------
#
# Many tests compare onnxpy with onnxruntime. An older onnxruntime (Python 3.10 gets 1.23 at
# most) cannot load every model they build: a newer IR version, an opset still in development,
# an operator it does not implement yet. Such a test cannot judge onnxpy there; it is skipped,
# naming the onnxruntime version and its reason, instead of failing on the oracle's error.

_ORACLE_LIMITS = (
    "Unsupported model IR version",
    "is under development and support for this is limited",
    "Could not find an implementation for",
)


def _oracle_limit(exc: BaseException) -> str | None:
    """The limit of onnxruntime that ``exc`` reports, or None for any other error."""
    if not type(exc).__module__.startswith("onnxruntime"):
        return None
    message = str(exc)
    for limit in _ORACLE_LIMITS:
        if limit in message:
            return message[message.find(limit) :].split("\n")[0][:200]
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    outcome = yield
    excinfo = outcome.excinfo
    if excinfo is None:
        return
    limit = _oracle_limit(excinfo[1])
    if limit is not None:
        import onnxruntime

        outcome.force_exception(
            pytest.skip.Exception(f"onnxruntime {onnxruntime.__version__} (the oracle) cannot run this model: {limit}")
        )
