"""Rank-aware logging: every record says which rank of how many wrote it."""

from __future__ import annotations

import logging

from .. import _env

DEBUG = logging.DEBUG
INFO = logging.INFO
WARNING = logging.WARNING
ERROR = logging.ERROR

logger = logging.getLogger("iris")


class IrisFormatter(logging.Formatter):
    """Upstream Iris's record format: ``12:00:01 INFO  [Iris] [0/4] message``.

    ``[rank/world]`` shows ``?`` for records logged without a rank. A record the library
    logs about itself (``iris_internal`` set) also names the module that logged it, as
    ``[module]`` after the rank; the user's ``ctx.info(...)`` records do not.

    Example:
        >>> handler.setFormatter(iris.host.log.IrisFormatter())
    """

    def format(self, record: logging.LogRecord) -> str:
        rank = getattr(record, "iris_rank", "?")
        num_ranks = getattr(record, "iris_num_ranks", "?")
        stamp = self.formatTime(record, "%H:%M:%S")
        module = f" [{record.module}]" if getattr(record, "iris_internal", False) else ""
        return f"{stamp} {record.levelname:<5s} [Iris] [{rank}/{num_ranks}]{module} {record.getMessage()}"


def _level_from_environment(default: int) -> int:
    name = _env.choice("IRIS_LOG_LEVEL", "", ("DEBUG", "INFO", "WARNING", "ERROR"))
    return getattr(logging, name) if name else default


if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(IrisFormatter())
    logger.addHandler(_handler)
    # Upstream's default: INFO, or IRIS_LOG_LEVEL.
    logger.setLevel(_level_from_environment(logging.INFO))
    logger.propagate = False


def set_logger_level(level: int) -> None:
    """Set the level of Iris's logger.

    Example:
        >>> import iris
        >>> iris.set_logger_level(iris.DEBUG)
    """
    logger.setLevel(level)


def log_with_rank(level: int, message: str, rank: int, num_ranks: int) -> None:
    """Emit ``message`` at ``level`` tagged with ``rank`` and ``num_ranks``."""
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={"iris_rank": rank, "iris_num_ranks": num_ranks})
