"""Which protocol's launcher a collective call takes.

``Runtime.protocol`` picks a protocol per call (``Config.protocol``, or auto by size):
``"direct"`` runs the collective's own kernel on the heap; the others copy through a
protocol of their own (:mod:`iris.ccl.low_latency`, :mod:`iris.ccl.staged`,
:mod:`iris.ccl.pushed`). Each collective asks here first and builds its direct launch
only when this returns ``None``.
"""

from __future__ import annotations

from .low_latency import low_latency_launch
from .pushed import pushed_launch
from .staged import staged_launch


def protocol_launch(protocol: str, runtime, state, mode: str, out, inp, n: int, config, op=None):
    """``(kernel, grid, args, num_warps)`` of ``mode`` through ``protocol``; ``None`` for ``"direct"``.

    Args:
        protocol: ``Runtime.protocol``'s choice for this call.
        mode: the collective (``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``).
        n: the elements the staged and pushed kernels cover: ``inp.numel()``, or
            ``out.numel()`` for ``reduce_scatter``.
        op: the reduction, where the collective reduces.

    Example:
        >>> launch = protocol_launch(protocol, runtime, state, "all_reduce", out, inp, n, config, op)
        >>> if launch is not None:
        ...     return launch
    """
    if protocol == "low_latency":
        return low_latency_launch(runtime, state, mode, out, inp, config, op)
    if protocol == "staged":
        return staged_launch(runtime, state, mode, out, inp, n, config, op)
    if protocol == "pushed":
        return pushed_launch(runtime, state, mode, out, inp, n, config, op)
    return None
