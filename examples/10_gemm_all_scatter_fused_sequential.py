"""10 · GEMM + all-scatter, fused sequential.

The problem shared by examples 09 to 13: C = A x B with B sharded by columns.
Rank r holds A (M x K, the same everywhere) and B_r (K x N/world), computes
C_r = A x B_r, and every rank must end with the whole C (M x N).

One kernel: each program stores every tile it finishes into every peer's C, then
moves on to its next tile. Communication of one tile overlaps the GEMM of other
programs, but each program stalls on its own stores.

Kernel: iris.ops.all_scatter.fused_sequential_kernel.
The four styles side by side: docs/fused.md.

Run: python -m iris.run -n 2 examples/10_gemm_all_scatter_fused_sequential.py
"""

import sys

from gemm_all_scatter_problem import run

if __name__ == "__main__":
    sys.exit(run("fused_sequential", "10_fused_sequential"))
