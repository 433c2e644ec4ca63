"""08 · collectives: ctx.ccl.all_reduce / all_gather / reduce_scatter, checked against torch.distributed.

Each collective is one Triton kernel on the current stream (no host sync, CUDA-graph
capturable); the inputs here are fresh random values and every element is compared.
The references run through torch.distributed on CPU copies (gloo), so the example
also runs where NCCL cannot: with several ranks on one GPU (IRIS_RANKS_PER_GPU).

Run:  python -m iris.run -n 4 examples/08_collectives.py
"""

import torch
import torch.distributed as dist

import iris
from iris.ccl import Config


def main():
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    inp = ctx.randn(1000, generator=torch.Generator().manual_seed(rank))

    # all_reduce: the algorithm is picked by size ("auto") or named in a Config.
    out = ctx.empty(1000)
    for variant in ("auto", "one_shot", "two_shot", "ring", "atomic"):
        out.fill_(float("nan"))
        ctx.ccl.all_reduce(out, inp, config=Config(all_reduce_variant=variant))
        expected = inp.cpu()
        dist.all_reduce(expected)
        assert torch.allclose(out.cpu(), expected, rtol=1e-5, atol=1e-5), f"all_reduce {variant} differs"

    # all_gather / reduce_scatter follow all_gather_into_tensor / reduce_scatter_tensor: every
    # rank's input stacked in rank order.
    gathered = ctx.empty(world * 1000)
    ctx.ccl.all_gather(gathered, inp)
    parts = [torch.empty(1000) for _ in range(world)]
    dist.all_gather(parts, inp.cpu())
    assert torch.equal(gathered.cpu(), torch.cat(parts)), "all_gather differs"

    scattered = ctx.empty(1000)
    ctx.ccl.reduce_scatter(scattered, gathered)
    total = gathered.cpu()
    dist.all_reduce(total)
    assert torch.allclose(scattered.cpu(), total[rank * 1000 : (rank + 1) * 1000], rtol=1e-5, atol=1e-5)

    print(f"rank {rank}: 08_collectives OK (all_reduce x5 variants, all_gather, reduce_scatter)")
    ctx.close()


if __name__ == "__main__":
    main()
