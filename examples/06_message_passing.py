"""06 · message passing: a producer puts data, then signals; the consumer waits, then reads.

Ranks pair up (0→1, 2→3, ...). For every round the producer writes a fresh block
into the consumer's heap with iris.put and raises the consumer's flag with
iris.signal; the consumer's iris.wait_until returns only once that data is
visible, copies it out, and acknowledges so the producer may overwrite the
buffer in the next round. The data of every round is checked.

Run:  python -m iris.run -n 2 examples/06_message_passing.py
"""

import sys

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def producer(messages, inbox, ready, ack, n, rounds, cur_rank, consumer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    for step in range(rounds):
        iris.wait_until(ack, "ge", step, heap_bases=heap_bases)  # the consumer has read the previous round
        iris.put(messages + step * n + offsets, inbox + offsets, cur_rank, consumer, heap_bases, mask=mask)
        iris.signal(ready, step + 1, cur_rank, consumer, heap_bases)


@triton.jit
def consumer(
    received, inbox, ready, ack, n, rounds, cur_rank, producer_rank, heap_bases, BLOCK: tl.constexpr
):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    for step in range(rounds):
        iris.wait_until(ready, "ge", step + 1, heap_bases=heap_bases)
        tl.store(received + step * n + offsets, tl.load(inbox + offsets, mask=mask), mask=mask)
        iris.signal(ack, step + 1, cur_rank, producer_rank, heap_bases)


def main(rounds: int):
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    if world % 2:
        raise SystemExit("06_message_passing needs an even number of ranks")
    n, block = 1000, 1024
    pair_seed = 7 + rank // 2
    messages = ctx.randn(rounds, n, generator=torch.Generator().manual_seed(pair_seed))
    received = ctx.full((rounds, n), float("nan"))
    inbox = ctx.zeros(n)
    ready = ctx.zeros(1, dtype=torch.int32)
    ack = ctx.zeros(1, dtype=torch.int32)
    ctx.barrier()

    heap_bases = ctx.get_heap_bases()
    if rank % 2 == 0:
        producer[(1,)](messages, inbox, ready, ack, n, rounds, rank, rank + 1, heap_bases, BLOCK=block)
    else:
        consumer[(1,)](received, inbox, ready, ack, n, rounds, rank, rank - 1, heap_bases, BLOCK=block)
    ctx.barrier()

    if rank % 2 == 1:
        torch.testing.assert_close(received, messages, rtol=0, atol=0)
        print(
            f"rank {rank}: 06_message_passing OK ({rounds} rounds from rank {rank - 1}, every value checked)"
        )
    ctx.close()


if __name__ == "__main__":
    main(rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 100)
