"""18 · Gluon: upstream's IrisDeviceCtx in a @gluon.jit kernel, message passing, traced.

Rank 0 puts a block into rank 1's inbox and raises rank 1's flag; rank 1 waits for the
flag. The kernel is Gluon (``triton.experimental.gluon``: layouts are explicit), and its
ops are the ones Triton kernels use, through upstream's ``iris.gluon.IrisDeviceCtx``: so
the run is traced like any other, and every event names the kernel line that issued it.

Gluon kernels are compiled only: this example needs GPUs (``IRIS_BACKEND=cuda``); under
the emulation backend it says so and exits.

Run:  python -m iris.run -n 2 examples/18_gluon.py
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import iris
from iris.gluon import IrisDeviceCtx
from iris_trace.schema import EVENT_NAMES


@gluon.jit
def send_and_receive(IrisDeviceCtx: gl.constexpr, context, data, inbox, flag, BLOCK: gl.constexpr):
    ctx = IrisDeviceCtx.initialize(context)
    offsets = gl.arange(0, BLOCK, layout=gl.BlockedLayout([4], [32], [4], [0]))
    if ctx.cur_rank == 0:
        ctx.put(data + offsets, inbox + offsets, 1)  # into rank 1's inbox
        ctx.signal(flag, 1, 1)  # after the put: rank 1 may read
    elif ctx.cur_rank == 1:
        ctx.wait_until(flag, "eq", 1)


def main():
    if iris.BACKEND != "cuda":
        raise SystemExit("18_gluon needs GPUs (IRIS_BACKEND=cuda): the interpreter cannot run Gluon kernels")
    ctx = iris.iris(heap_size=1 << 24)
    rank = ctx.get_rank()
    if ctx.get_num_ranks() < 2:
        raise SystemExit("18_gluon needs two ranks or more (ranks past 1 look on)")
    block = 512
    data = ctx.arange(block, dtype=torch.float32)
    inbox = ctx.full((block,), float("nan"))
    flag = ctx.zeros(1, dtype=torch.int32)
    ctx.tracing.enable(max_events=1 << 12)
    ctx.barrier()
    context = ctx.get_device_context()
    send_and_receive[(1,)](IrisDeviceCtx, context, data, inbox, flag, BLOCK=block, num_warps=4)
    ctx.barrier()
    if rank == 1:
        assert torch.equal(inbox.cpu(), data.cpu()), "the whole block arrived before the flag"
    trace = ctx.tracing.collect()  # the merged trace, on rank 0
    if rank == 0:
        site_at, _, labels = trace.origins
        lines = sorted({labels[i] for i in site_at})
        print("\n".join(f"  {line}" for line in lines))
        assert {"put", "signal", "wait_until"} <= {EVENT_NAMES[int(e)] for e in trace.events["event_id"]}
        assert all(line.startswith("send_and_receive · 18_gluon.py:") for line in lines), lines
        print(f"rank 0: 18_gluon OK: {len(trace.events)} events, each naming its line of the Gluon kernel")
    ctx.close()


if __name__ == "__main__":
    main()
