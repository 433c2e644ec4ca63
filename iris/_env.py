"""Reading ``IRIS_*`` (and the launcher's) environment variables, each refused in one line when malformed.

Every setting is read through one of these functions, which say which variable was
wrong, what it held and what it must hold: ``iris: IRIS_WAIT_TIMEOUT='abc' is not a
number of seconds``, rather than ``could not convert string to float`` from deep inside
an import, or a negative count that surfaces later as a nonsensical size. This module
imports nothing of Iris, so every other module (the backends included) may use it.

Example:
    >>> _env.seconds("IRIS_HOST_TIMEOUT", 300.0, allow_zero=False)
    300.0
"""

from __future__ import annotations

import math
import os

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


class SettingError(ValueError):
    """An environment variable holds a value Iris cannot use; the message names it."""


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else value.strip()


def flag(name: str, default: bool) -> bool:
    """``name`` as a switch: 1/true/yes/on or 0/false/no/off (any case); ``default`` when unset.

    Example:
        >>> flag("IRIS_DEBUG", False)
        False
    """
    text = _raw(name)
    if text is None:
        return default
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise SettingError(f"iris: {name}={text!r} is not a switch; use 1 or 0")


def seconds(name: str, default: float, allow_zero: bool = True) -> float:
    """``name`` as a finite number of seconds, at least 0 (``allow_zero``) or above 0.

    Example:
        >>> seconds("IRIS_WAIT_TIMEOUT", 0.0)
        0.0
    """
    text = _raw(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        least = "0 or more" if allow_zero else "more than 0"
        raise SettingError(f"iris: {name}={text!r} is not a number of seconds ({least})")
    return value


def integer(
    name: str, default: int, minimum: int = 1, maximum: int | None = None, power_of_two: bool = False
) -> int:
    """``name`` as a whole number in ``[minimum, maximum]`` (a power of two if asked).

    Example:
        >>> integer("IRIS_EMU_NUM_SMS", 8, minimum=1, maximum=4096)
        8
    """
    text = _raw(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    within = value is not None and value >= minimum and (maximum is None or value <= maximum)
    if not within or (power_of_two and value & (value - 1)):
        what = "a power of two" if power_of_two else "a whole number"
        bounds = f"from {minimum}" + (f" to {maximum}" if maximum is not None else " up")
        raise SettingError(f"iris: {name}={text!r} is not {what} {bounds}")
    return value


def choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """``name`` as one of ``choices`` (case-insensitive; returned as listed).

    Example:
        >>> choice("IRIS_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
        'INFO'
    """
    text = _raw(name)
    if text is None or text == "":
        return default
    for option in choices:
        if text.lower() == option.lower():
            return option
    raise SettingError(f"iris: {name}={text!r} is not one of {', '.join(choices)}")


def directory(name: str) -> str | None:
    """``name`` as an existing directory, or ``None`` when unset.

    Example:
        >>> directory("IRIS_HANG_DIR") is None
        True
    """
    text = _raw(name)
    if not text:
        return None
    if not os.path.isdir(text):
        raise SettingError(f"iris: {name}={text!r} is not an existing directory")
    return text


def local_world_size() -> int:
    """Ranks on this host, as the launcher says (``LOCAL_WORLD_SIZE``, else ``WORLD_SIZE``, else 1).

    Example:
        >>> local_world_size()
        1
    """
    return integer("LOCAL_WORLD_SIZE", integer("WORLD_SIZE", 1), minimum=1)


def ranks_per_gpu() -> int:
    """Ranks of one host that may share a GPU (``IRIS_RANKS_PER_GPU``, default 1).

    Example:
        >>> ranks_per_gpu()
        1
    """
    return integer("IRIS_RANKS_PER_GPU", 1, minimum=1)
