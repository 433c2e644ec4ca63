"""Rank-aware logging: every record says which rank of how many wrote it."""

from __future__ import annotations

import logging

DEBUG = logging.DEBUG
INFO = logging.INFO
WARNING = logging.WARNING
ERROR = logging.ERROR

logger = logging.getLogger("iris")


class _RankFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        rank = getattr(record, "iris_rank", None)
        where = f"[{rank}/{record.iris_num_ranks}] " if rank is not None else ""
        return f"[Iris] {where}{record.getMessage()}"


if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(_RankFormatter())
    logger.addHandler(_handler)
    logger.setLevel(logging.WARNING)
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
