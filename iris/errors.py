"""Iris's argument error: one class that is both ``ValueError`` and ``RuntimeError``.

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
