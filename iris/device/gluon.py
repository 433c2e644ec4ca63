"""Upstream Iris's Gluon device API: ``IrisDeviceCtx`` in ``@gluon.jit`` kernels (``iris.gluon``).

Gluon kernels get the device ops Triton kernels get, not a second implementation:
``IrisDeviceCtx.initialize(context_tensor)`` reads this rank and the world size from the
context tensor (``ctx.get_device_context()``) and returns this package's
:class:`~iris.device.context.DeviceContext`, whose methods (``load`` ... ``atomic_max``,
``signal``, ``wait_until``, ``tracing.record_event_start``) are the ``@triton.jit`` ops of
:mod:`iris.device.rma`, which a Gluon kernel may call. So in a Gluon kernel too every op
records itself while the host has tracing enabled (with its call site and launch), keeps
its flight-recorder entry, and every wait times out naming its culprit. The few places
where an op needs a range of lanes (the recorder's reductions over a block, a flight
entry's words) take one laid out for Gluon (:func:`iris.device.blocks.lanes`).

Gluon kernels are compiled, never interpreted: under the emulation backend, which runs
kernels in Triton's interpreter, launching one raises an error that says so.

Example:
    >>> from triton.experimental import gluon
    >>> from triton.experimental.gluon import language as gl
    >>> from iris.gluon import IrisDeviceCtx
    >>> @gluon.jit
    >>> def copy_from_peer(IrisDeviceCtx: gl.constexpr, context, buf, out, peer, BLOCK: gl.constexpr):
    >>>     ctx = IrisDeviceCtx.initialize(context)
    >>>     offsets = gl.arange(0, BLOCK, layout=gl.BlockedLayout([1], [32], [4], [0]))
    >>>     gl.store(out + offsets, ctx.load(buf + offsets, peer))
    >>> copy_from_peer[(1,)](IrisDeviceCtx, ctx.get_device_context(), buf, out, peer, BLOCK=128, num_warps=4)
"""

import triton
import triton.language as tl

from . import layout
from .context import DeviceContext, DeviceTracing


class IrisDeviceCtx:
    """Upstream's Gluon context: pass the class to the kernel as a ``gl.constexpr`` and
    call :meth:`initialize` there (the module docstring has an example)."""

    @staticmethod
    @triton.jit
    def initialize(context_tensor, tracing: tl.constexpr = False):
        """This rank's :class:`~iris.device.context.DeviceContext`, from the context tensor alone.

        ``tracing`` is taken for upstream's signature: here the host's
        ``ctx.tracing.enable()`` decides, through the context tensor.

        Example:
            >>> ctx = IrisDeviceCtx.initialize(context_tensor)
            >>> peer = (ctx.cur_rank + 1) % ctx.num_ranks
        """
        heap_bases = layout.heap_bases_of(context_tensor)
        rank = layout.cur_rank(heap_bases)
        return DeviceContext.initialize(context_tensor, rank, layout.world_size(heap_bases), tracing)


#: Upstream's name for the type of ``ctx.tracing`` (``record_event_start``, ``record_event_end``).
GluonDeviceTracing = DeviceTracing
