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


class WorkspaceTooSmallError(ValueError):
    """A workspace reused for a call that needs more tiles than it was prepared for.

    Upstream Iris sizes per-tile locks or flags in a workspace when it is prepared, and
    refuses a later call with smaller tiles (so more of them) that reuses it. The
    buffers here are the context's own and never run out, but a workspace records the
    tile count upstream's would hold, and such a reuse is refused with upstream's
    message, so programs written against upstream see the error they expect.

    Args:
        array: what upstream calls the buffer, ``"Lock"`` or ``"Flags"``.
        have: tiles the workspace was prepared for.
        need: tiles the call needs.

    Example:
        >>> raise WorkspaceTooSmallError("Lock", have=16, need=64)
        Traceback (most recent call last):
        WorkspaceTooSmallError: Lock array too small: have 16 but need 64. ...
    """

    def __init__(self, array: str, have: int, need: int):
        super().__init__(
            f"{array} array too small: have {have} but need {need}. "
            "Pre-allocate workspace with the smallest block sizes you intend to use."
        )
