"""Iris's error classes: device faults, and argument errors that are both what upstream Iris and torch raise.

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


class WaitTimeoutError(RuntimeError):
    """A device wait ran past the wait timeout; the message names rank, SM, program, op, flag and culprit.

    Raised by ``ctx.barrier()`` (and the synchronisations that check) on GPUs, and by the
    kernel launch itself under emulation, as this one error (never wrapped).

    Attributes:
        timeout: the :class:`iris_trace.flight_file.Timeout` record of the wait (``None``
            under emulation, where the message holds the same facts).
        culprit: the rank the hang report blames (or ``None``).

    Example:
        >>> try:
        ...     ctx.barrier()
        ... except iris.WaitTimeoutError as error:
        ...     print(error.culprit)
    """

    def __init__(self, message: str, timeout=None, culprit=None):
        super().__init__(message)
        self.timeout = timeout
        self.culprit = culprit


class DeviceCheckError(RuntimeError):
    """A device-side check failed under emulation (``IRIS_DEBUG=1``: a rank out of range, a
    pointer outside the symmetric heap); the message names the op.

    Example:
        >>> iris.store(buf + n, x, rank, peer, heap_bases)   # one past the heap, IRIS_DEBUG=1
        DeviceCheckError: iris.store: pointer is outside the symmetric heap
    """
