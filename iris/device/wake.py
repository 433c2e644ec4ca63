"""Waking the links to the peers before a call that should not wait for them.

NVLink links enter a low-power state after a stretch without traffic: the driver's
threshold, 50 ms on the H100 machines measured (``nvidia-smi nvlink -gLowPwrInfo``
reads it; Iris never changes it). The first access that crosses a sleeping link waits
for it to wake, about 105 us, so the first flag of a launch after a pause arrives that
late whatever the kernel does. A GPU spreads its addresses over all its links, and each
link wakes on its own traffic: on 2 x H100 (a probe; docs/tracing.md, "Links that sleep"), after
100 ms without traffic, one remote read took 105 us and the next 0.9 us, yet a flag on
another line then still paid the full wake; after reads of 64 lines at once, or of the
flag's own line, the flag came on time (docs/tracing.md, "Links that sleep").

:func:`wake_links_kernel` therefore reads one word of each of the first ``LINES``
128-byte lines of every peer's heap at once (enough lines that every link to that peer
carries one) and waits for the values: kernels queued after it on the stream find the
links awake. ``Iris.wake_links`` launches it over the peers of this node.
"""

import triton
import triton.language as tl

from . import rma

#: Bytes in one line of the memory system: the reads go one word per line.
LINE_BYTES = 128
_WORDS_PER_LINE: tl.constexpr = tl.constexpr(LINE_BYTES // 4)
#: Lines read on every peer: 128 KiB of addresses, many times the 18 links of an H100.
LINES = 1024


@triton.jit
def wake_links_kernel(heap, lines, peers, folded, cur_rank, heap_bases, LINES: tl.constexpr):
    """Program ``p`` reads a word of each of the first ``lines`` lines of rank ``peers[p]``'s heap.

    ``heap`` is this rank's heap as int32 (the same offsets on the peer). The words read,
    folded by exclusive or, go to ``folded[p]``: that makes the program wait for every
    value (and, unlike a sum, cannot overflow under the interpreter), and lets a test
    check the reads.

    Example:
        >>> wake_links_kernel[(len(peers),)](heap, 1024, peers, folded, rank, heap_bases, LINES=1024)
    """
    pid = tl.program_id(0)
    peer = tl.load(peers + pid)
    offsets = tl.arange(0, LINES) * _WORDS_PER_LINE
    remote = rma.translate(heap + offsets, cur_rank, peer, heap_bases, op="iris.wake_links")
    values = tl.load(remote, mask=offsets < lines * _WORDS_PER_LINE, other=0, volatile=True)
    tl.store(folded + pid, tl.xor_sum(values, axis=0))
