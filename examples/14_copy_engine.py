"""14 · copy engine: every rank puts its column block of C into every peer by DMA, no SM used.

``ctx.copy_engine`` queues one copy per destination rank on a lane (a stream) of its
own: ``fork`` starts the lanes after the work queued so far (here, the block's GEMM),
``put`` copies a row or column block of a symmetric tensor into a peer's copy, and
``join`` makes later work wait for the copies. A barrier then says every peer's
puts have landed; every element is checked against torch.distributed.

Run:  python -m iris.run -n 4 examples/14_copy_engine.py
"""

import torch
import torch.distributed as dist

import iris


def main():
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    generator = torch.Generator().manual_seed(rank)
    a = torch.randn(64, 32, generator=generator).to(ctx.get_device())
    b = torch.randn(32, 48, generator=generator).to(ctx.get_device())
    c = ctx.full((64, world * 48), float("nan"))  # every rank ends with all of C
    mine = c[:, rank * 48 : (rank + 1) * 48]
    ctx.barrier()

    torch.matmul(a, b, out=mine)
    ctx.copy_engine.fork()  # the puts start once the matmul is done
    for peer in range(world):
        if peer != rank:
            ctx.copy_engine.put(mine, mine, peer)
    ctx.copy_engine.join()
    ctx.barrier()  # every peer's puts into this rank's C have landed

    blocks = [torch.empty(64, 48) for _ in range(world)]
    dist.all_gather(blocks, (a @ b).cpu())  # the reference, on CPU copies (gloo)
    expected = torch.cat(blocks, dim=1)
    assert torch.allclose(c.cpu(), expected, rtol=1e-5, atol=1e-5), "copy-engine all-scatter differs"
    print(f"rank {rank}: 14_copy_engine OK ({world - 1} puts of {mine.numel() * 4} bytes)")
    ctx.close()


if __name__ == "__main__":
    main()
