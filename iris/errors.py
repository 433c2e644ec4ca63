"""Iris's argument errors: classes that are both what upstream Iris and what torch raise.

Upstream Iris raises ``RuntimeError`` for some bad arguments (an ``out=`` of the
wrong size or off the heap, a device that is not the heap's) where this package
raised ``ValueError``, and ``ValueError`` for others where torch raises
``RuntimeError`` (a zero ``arange`` step, ``randint`` bounds). Raising one class
derived from both keeps every caller's ``except`` working, whichever library it
was written against.
"""

from __future__ import annotations


class InvalidArgumentError(ValueError, RuntimeError):
    """A bad argument to an Iris call; catch it as ``ValueError`` or ``RuntimeError``.

    Example:
        >>> try:
        ...     ctx.arange(0, 10, 0)
        ... except ValueError as error:   # or RuntimeError, as upstream Iris code does
        ...     print(error)
        iris: arange step must be non-zero
    """


class ArgumentCountError(TypeError, ValueError):
    """A call with the wrong number of positional arguments; catch it as ``TypeError`` (torch's
    type for it) or ``ValueError`` (upstream Iris's).

    Example:
        >>> try:
        ...     ctx.randint(10)   # no size
        ... except ValueError as error:
        ...     print(error)
        iris: randint expects (high, size) or (low, high, size), got 1 arguments
    """
