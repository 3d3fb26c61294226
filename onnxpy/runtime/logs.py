"""onnxruntime's logging severities over Python's logging.

onnxpy logs through the standard ``logging`` module, logger ``"onnxpy"``. onnxruntime's
severity levels (0 verbose, 1 info, 2 warning, 3 error, 4 fatal) select which of those records
pass: ``onnxpy.set_default_logger_severity`` for every session, ``SessionOptions.
log_severity_level`` for one session (its creation, and its runs' messages).

Until one of them is set, Python's logging configuration alone decides, as for any library.
Once a severity applies, a record below it is dropped, and one at or above it is shown on stderr
when the application configured no logging handler (Python itself would show only warnings).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import traceback
import types
from collections.abc import Iterator
from typing import Any

from ..api.errors import InvalidArgument

LOGGER_NAME = "onnxpy"

#: onnxruntime severity -> Python logging level
LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)

#: the default severity, None until set_default_logger_severity is called
_default: int | None = None
_verbosity = 0
#: the severity of the session whose creation or run is logging now (-1: the default)
_session: contextvars.ContextVar[int] = contextvars.ContextVar("onnxpy_log_severity", default=-1)


def _checked(value: Any, what: str, high: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < 0 or (high is not None and value > high):
        bound = f"0 to {high}" if high is not None else "at least 0"
        raise InvalidArgument(f"{what} must be {bound}, got {value}")
    return int(value)


def set_default_logger_severity(severity: int) -> None:
    """Sets the default logging severity: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal."""
    global _default
    _default = _checked(severity, "logger severity", 4)
    _install()


def set_default_logger_verbosity(verbosity: int) -> None:
    """Sets the default verbosity level. onnxpy has one level of verbose messages (shown at
    severity 0), so the value is kept for compatibility and changes nothing else."""
    global _verbosity
    _verbosity = _checked(verbosity, "logger verbosity", None)


def threshold() -> int | None:
    """The Python logging level records must reach now, or None when no severity applies."""
    severity = _session.get()
    if severity < 0:
        severity = -1 if _default is None else _default
    return None if severity < 0 else LEVELS[min(severity, 4)]


#: the logid (SessionOptions.logid) of the session logging now, for a log callback
_logid: contextvars.ContextVar[str] = contextvars.ContextVar("onnxpy_logid", default="")


@contextlib.contextmanager
def scope(severity: int, logid: str = "") -> Iterator[None]:
    """Records logged inside are filtered by ``severity`` (-1: the default severity)."""
    if severity >= 0:
        _install()
    token = _session.set(severity)
    id_token = _logid.set(logid)
    try:
        yield
    finally:
        _logid.reset(id_token)
        _session.reset(token)


def emit(severity: int, level: int, msg: str, *args: Any) -> None:
    """``msg % args`` at ``level`` on the onnxpy logger, under a session's ``severity``."""
    with scope(severity):
        logging.getLogger(LOGGER_NAME).log(level, msg, *args)


class _SeverityFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        level = threshold()
        if level is None:
            # No severity applies: while the logger has the level _install gave it, what it let
            # through before (its parent's level), so the application's handlers see no more
            # than before; once the application set a level of its own, that level decided.
            logger = logging.getLogger(LOGGER_NAME)
            parent = logger.parent
            lowered = logger.level == _OWN_LEVEL and parent is not None
            level = parent.getEffectiveLevel() if lowered and parent is not None else logging.NOTSET
        return record.levelno >= level


class _StderrWithoutConfiguration(logging.StreamHandler):  # type: ignore[type-arg]
    """Shows the records that pass a severity on stderr while the application has no handlers
    of its own (Python's last-resort handler would show warnings only)."""

    def emit(self, record: logging.LogRecord) -> None:
        if threshold() is None or _configured():
            return
        self.stream = sys.stderr  # as it is now: a test or an application may have swapped it
        super().emit(record)


def _configured() -> bool:
    """Whether handlers other than ours would receive onnxpy's records."""
    logger: logging.Logger | None = logging.getLogger(LOGGER_NAME)
    while logger is not None:
        if any(not isinstance(h, _StderrWithoutConfiguration) for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


_installed = False
_install_lock = threading.Lock()
# The level _install gives the logger when it has none of its own: below DEBUG, so that every
# record is made, and a value no application sets, so that one the application sets later
# (even DEBUG) is told apart from it.
_OWN_LEVEL = 1


def _install() -> None:
    """Once a severity applies: the filter and the stderr handler (once), and a logger level low
    enough for verbose records to be made at all, unless the application set one of its own."""
    global _installed
    logger = logging.getLogger(LOGGER_NAME)
    with _install_lock:  # sessions may be created on several threads at once
        if not _installed:
            logger.addFilter(_SeverityFilter())
            handler = _StderrWithoutConfiguration()
            handler.setFormatter(logging.Formatter("onnxpy %(levelname)s: %(message)s"))
            logger.addHandler(handler)
            _installed = True
        if logger.level == logging.NOTSET:
            logger.setLevel(_OWN_LEVEL)


class _CallbackHandler(logging.Handler):
    """Hands the records that pass the severity to set_default_logger_callback's callable, with
    onnxruntime's arguments (severity, category, logid, code_location, message)."""

    def __init__(self, callback: Any) -> None:
        super().__init__()
        self.callback = callback
        self._busy = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._busy, "on", False):
            return  # a record the callback itself caused: dropped rather than recursing
        severity = next((i for i, lv in enumerate(LEVELS) if record.levelno <= lv), 4)
        where = f"{record.pathname}:{record.lineno} {record.funcName}"
        self._busy.on = True
        try:
            self.callback(severity, "onnxpy", _logid.get(), where, record.getMessage())
        except Exception:  # noqa: BLE001 - reported as onnxruntime reports it, the run goes on
            _unraisable(self.callback)
        finally:
            self._busy.on = False


def _unraisable(callback: Any) -> None:
    """The exception being handled, reported through sys.unraisablehook as onnxruntime reports
    a raising log callback (the default hook takes only its own argument type, so its output,
    the message and the traceback on stderr, is written here)."""
    kind, value, tb = sys.exc_info()
    if sys.unraisablehook is not sys.__unraisablehook__:
        args = types.SimpleNamespace(
            exc_type=kind, exc_value=value, exc_traceback=tb, err_msg="Exception ignored in", object=callback
        )
        sys.unraisablehook(args)
        return
    print(f"Exception ignored in onnxpy's log callback {callback!r}:", file=sys.stderr)
    traceback.print_exception(kind, value, tb, file=sys.stderr)


_callback: _CallbackHandler | None = None


def set_default_logger_callback(callback: Any, severity: int = 2) -> None:
    """Send onnxpy's log records to ``callback(severity, category, logid, code_location,
    message)`` instead of stderr, and set the default severity (onnxruntime's signature).
    ``None`` removes the callback and leaves the severity as it is."""
    global _callback
    level = _checked(severity, "logger severity", 4)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
    logger = logging.getLogger(LOGGER_NAME)
    with _install_lock:
        if _callback is not None:
            logger.removeHandler(_callback)
            _callback = None
    if callback is None:
        return
    set_default_logger_severity(level)
    with _install_lock:
        _callback = _CallbackHandler(callback)
        logger.addHandler(_callback)
