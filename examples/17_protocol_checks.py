"""17 · protocol checks: iris-trace check names the mistakes of a hand-written flag protocol.

Rank 0 sends rank 1 two messages: it puts the data into rank 1's inbox, then sets rank
1's flag to 1. Rank 1 takes each one: it waits for the flag, resets it, copies the data
out, and acknowledges the first message so that rank 0 may send the second. The kernel
below can make one of four classic mistakes, and each traced run is checked
(``iris_trace.check``, the ``iris-trace check`` command) from the trace alone:

* ``signal_first``: rank 0 raises the flag before it writes the data; rank 1 may read
  the inbox before the data lands (``data-after-signal``).
* ``no_reset``: rank 1 never resets its flag, so its second wait passes at once on the
  first message's raise and copies an inbox rank 0 has not written yet (``stale-flag``).
* ``no_ack``: rank 0 sends the second message without waiting for the acknowledgement;
  rank 1, busy with work of its own, finds the flag raised once for two messages
  (``raised-twice``). Here it takes what it finds, once: a receiver that waited for the
  second raise would wait forever.
* ``clear_inbox``: rank 1 clears its inbox when it starts, while rank 0 may already be
  writing the first message into it: which one lands last depends on timing
  (``racing-writes``).

The protocol without a mistake is clean. From the command line, on the rank files of a
traced run: ``iris-trace check DIR/rank*.npz`` (exit 1 on a finding, 0 when clean).

Run:  python -m iris.run -n 2 examples/17_protocol_checks.py
"""

import torch
import triton
import triton.language as tl

import iris
from iris.device.utils import read_realtime
from iris_trace import check

MISTAKES = {
    "none": [],
    "signal_first": ["data-after-signal"],
    "no_reset": ["stale-flag"],
    "no_ack": ["raised-twice"],
    "clear_inbox": ["racing-writes"],
}
#: How long rank 0 prepares the second message once acknowledged, and how long rank 1's own
#: work takes: long enough for the other rank to be where the mistake bites, even on a
#: loaded machine.
PREPARE_NS, BUSY_NS = tl.constexpr(1_000_000_000), tl.constexpr(1_000_000_000)


@triton.jit
def spin(NS: tl.constexpr):
    began = read_realtime()
    while read_realtime() - began < NS:
        pass


@triton.jit
def two_messages(
    data, inbox, received, flag, ack, cur_rank, heap_bases, MISTAKE: tl.constexpr, BLOCK: tl.constexpr
):
    offsets = tl.arange(0, BLOCK)
    if cur_rank == 0:
        for message in tl.static_range(2):
            if message == 1 and MISTAKE != "no_ack":
                iris.wait_until(ack, "ge", 1, heap_bases=heap_bases)
                spin(PREPARE_NS)
            slot = message * BLOCK + offsets
            if MISTAKE == "signal_first":
                iris.signal(flag, 1, 0, 1, heap_bases, op="set")
                iris.put(data + slot, inbox + slot, 0, 1, heap_bases)
            else:
                iris.put(data + slot, inbox + slot, 0, 1, heap_bases)
                iris.signal(flag, 1, 0, 1, heap_bases, op="set")
    elif cur_rank == 1:
        if MISTAKE == "clear_inbox":
            iris.store(inbox + offsets, tl.full([BLOCK], float("nan"), tl.float32), 1, 1, heap_bases)
        if MISTAKE == "no_ack":
            spin(BUSY_NS)
        for message in tl.static_range(1 if MISTAKE == "no_ack" else 2):
            iris.wait_until(flag, "ge", 1, heap_bases=heap_bases)
            if MISTAKE != "no_reset":
                tl.atomic_xchg(flag, 0, sem="relaxed", scope="sys")
            slot = message * BLOCK + offsets
            tl.store(received + slot, tl.load(inbox + slot, volatile=True))
            if message == 0:
                iris.signal(ack, 1, 1, 0, heap_bases, op="set")


def main():
    ctx = iris.iris(heap_size=1 << 24)
    rank = ctx.get_rank()
    if ctx.get_num_ranks() < 2:
        raise SystemExit("17_protocol_checks needs two ranks or more (ranks past 1 look on)")
    block = 256
    data = ctx.arange(2 * block, dtype=torch.float32)
    found = {}
    for mistake in MISTAKES:
        inbox = ctx.full((2 * block,), float("nan"))
        received = ctx.full((2 * block,), float("nan"))
        flag, ack = ctx.zeros(1, dtype=torch.int32), ctx.zeros(1, dtype=torch.int32)
        ctx.tracing.reset()
        ctx.tracing.enable(max_events=1 << 12)
        ctx.barrier()
        if rank < 2:
            two_messages[(1,)](
                data, inbox, received, flag, ack, rank, ctx.get_heap_bases(), MISTAKE=mistake, BLOCK=block
            )
        ctx.barrier()
        trace = ctx.tracing.collect()  # the merged trace, on rank 0
        ctx.tracing.disable()
        if rank == 1 and mistake == "none":
            assert torch.equal(received.cpu(), data.cpu()), "both messages arrive whole"
        if rank == 0:
            findings = check.run(trace)
            print(f"{mistake}: " + ("clean" if not findings else ""))
            for finding in findings:
                print(f"  {finding.check}: {finding.message}")
            found[mistake] = [finding.check for finding in findings]
    if rank == 0:
        assert found == MISTAKES, f"expected {MISTAKES}, found {found}"
        print("rank 0: 17_protocol_checks OK: each mistake found by its check, the protocol clean")
    ctx.close()


if __name__ == "__main__":
    main()
