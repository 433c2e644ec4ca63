"""The cross-node path: how a device op reaches a rank on another node.

Within a node every peer's heap is mapped into this process, so a remote op is a
plain load, store or atomic through a translated pointer (:mod:`iris.device.rma`).
A rank on another node has no mapped pointer: there the op becomes an NVSHMEM call
(``nvshmem_<type>_p`` / ``_g``, NVSHMEM atomics), which the NVSHMEM runtime carries
over NVLink or the network. The symmetric heap is an NVSHMEM allocation, so the
caller's own address of an object is the address NVSHMEM wants, with the target PE.

Which path an op takes is decided per op, from the context tensor (the ranks per
node, ``layout.off_node``), and only in jobs that span nodes: ``SCALE_OUT`` is fixed
when ``iris`` is imported (``IRIS_RANKS_PER_NODE`` or the launcher's
``LOCAL_WORLD_SIZE`` below the world size), and without it the cross-node branch is
not compiled at all, so single-node kernels are the same instructions as before.

Every function here works element by element over a block, honours ``mask``, and
takes the caller's (symmetric) pointer and the target rank:

* ``put(ptr, value, rank, heap_bases, mask)``: write, complete at the next :func:`quiet`;
* ``get(ptr, rank, heap_bases, mask, other)``: read, complete on return;
* ``atomic(op, ptr, value, rank, heap_bases, mask)``: read-modify-write at the target,
  returning the old values (``op``: add, xchg, and, or, xor, min, max);
* ``cas(ptr, cmp, value, rank, heap_bases)``: compare-and-swap, returning the old value;
* ``quiet()``: complete every put this rank issued; the release ops of ``rma`` call it
  first, so data written before a ``signal`` is visible after the matching wait, as
  within a node.

Atomics on 8- and 16-bit types do not cross nodes (NVSHMEM has none; ``rma``
refuses them when they would). Under the emulation backend the same calls run on
the mapped heaps with NVSHMEM's completion rule modelled
(``iris.backends.emulated.RemoteWrites``), so CI covers the routing and ordering.
On GPUs they are NVSHMEM calls (``_crossnode_cuda``, through ``_nvshmem_calls.ll``),
linked into every kernel by ``iris.backends.cuda_nvshmem``.

Example:
    >>> # A constant False in single-node jobs (``and`` short-circuits), so no branch is compiled.
    >>> if crossnode.SCALE_OUT and layout.off_node(heap_bases, cur_rank, peer):
    >>>     crossnode.put(buf + offs, values, peer, heap_bases, mask)
"""

import triton.language as tl

from ..config import BACKEND
from ..config import SCALE_OUT as _SCALE_OUT

#: Whether device ops route by node (the job spans nodes); constant for the process.
SCALE_OUT: tl.constexpr = tl.constexpr(_SCALE_OUT)
if BACKEND == "emulated":
    from ._crossnode_emulated import atomic, cas, get, put, quiet
else:
    from ._crossnode_cuda import atomic, cas, get, put, quiet

__all__ = ["SCALE_OUT", "atomic", "cas", "get", "put", "quiet"]
