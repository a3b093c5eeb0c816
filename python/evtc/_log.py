"""evtc's messages in Python: one level for the native library and the package.

The level comes from ``EVTC_LOG`` (error, warning, info, debug; default info, as the native
library reads it), from :func:`set_log_level`, or from Python's logging configuration of the
``"evtc"`` logger, PyTorch's ``TORCH_LOGS="evtc"`` / ``"+evtc"`` and
``torch._logging.set_logs(modules={"evtc": logging.DEBUG})`` included: whichever set the
``"evtc"`` logger's level last is passed to the native library when evtc next compiles a graph
(:func:`sync_native_level`). The package's own messages (the FX pass's reports at debug) are
records of ``logging.getLogger("evtc.<module>")``; where no handler of the application or of
PyTorch takes them, they are written as the native library writes its own: ``evtc: ...`` on
stderr.
"""
from __future__ import annotations

import logging
import sys
from typing import Union

from . import _evtc

logger = logging.getLogger("evtc")

# The native library's level names (error, warning, info, debug), in order, as logging levels.
_BY_NAME = dict(zip(_evtc.log_level_names(), (logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG)))


def _name_of(level: int) -> str:
    """The native level that shows what a Python level shows."""
    if level <= logging.DEBUG:
        return "debug"
    if level <= logging.INFO:
        return "info"
    if level <= logging.WARNING:
        return "warning"
    return "error"


class _StderrHandler(logging.Handler):
    """Writes evtc's records as ``evtc: message`` on stderr unless another handler will: one on
    the ``"evtc"`` logger or on a logger it propagates to (the application's logging
    configuration, or PyTorch's handler under TORCH_LOGS)."""

    def emit(self, record: logging.LogRecord) -> None:
        if _handled_elsewhere():
            return
        try:
            sys.stderr.write(f"evtc: {record.getMessage()}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 (logging's own rule: never raise from a handler)
            self.handleError(record)


_handler = _StderrHandler()


def _handled_elsewhere() -> bool:
    log = logger
    while log is not None:
        if any(h is not _handler for h in log.handlers):
            return True
        if not log.propagate:
            return False
        log = log.parent
    return False


def set_log_level(level: Union[str, int]) -> None:
    """Sets what evtc says on stderr, in the native library and in Python: ``"error"``,
    ``"warning"``, ``"info"`` (each kernel compile's start and end; the default) or ``"debug"``
    (also nvcc's command lines and the FX pass's reports); or a :mod:`logging` level."""
    if isinstance(level, str):
        _evtc.set_log_level(level)  # checks the name (UserError naming the levels)
        logger.setLevel(_BY_NAME[level])
    elif isinstance(level, int) and not isinstance(level, bool):
        logger.setLevel(level)
        _evtc.set_log_level(_name_of(level))
    else:
        raise _evtc.ArgumentTypeError(f"log level: expected a name ({', '.join(_BY_NAME)}) or a logging level, "
                                      f"got {type(level).__name__}")


def log_level() -> str:
    """The level in effect (``"error"``, ``"warning"``, ``"info"`` or ``"debug"``)."""
    return _evtc.log_level()


def sync_native_level() -> None:
    """Passes the ``"evtc"`` logger's level to the native library, so that a level set through
    Python's logging (TORCH_LOGS among them) applies to compile messages too."""
    _evtc.set_log_level(_name_of(logger.getEffectiveLevel()))


def _init() -> None:
    if logger.level == logging.NOTSET:
        # Nothing configured the logger yet: it follows EVTC_LOG, as the native library does.
        logger.setLevel(_BY_NAME[_evtc.log_level()])
    else:
        sync_native_level()
    if _handler not in logger.handlers:
        logger.addHandler(_handler)


_init()
