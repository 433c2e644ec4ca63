"""12 · GEMM + all-scatter, producer-consumer.

The problem shared by examples 09 to 13: C = A x B with B sharded by columns.
Rank r holds A (M x K, the same everywhere) and B_r (K x N/world), computes
C_r = A x B_r, and every rank must end with the whole C (M x N).

Two kernels on two streams: the GEMM (producer) raises a flag per finished tile and
the communication kernel (consumer, on a side stream, on the SMs the GEMM leaves
free) waits on the flags and pushes the tiles; under emulation they run in turn.

Kernel: iris.ops.all_scatter.workgroup_specialized_kernel, ROLE=PRODUCER and ROLE=CONSUMER.
The four styles side by side: docs/fused.md.

Run: python -m iris.run -n 2 examples/12_gemm_all_scatter_producer_consumer.py
"""

import sys

from gemm_all_scatter_problem import run

if __name__ == "__main__":
    sys.exit(run("producer_consumer", "12_producer_consumer"))
