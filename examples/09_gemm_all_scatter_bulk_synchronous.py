"""09 · GEMM + all-scatter, bulk-synchronous.

The problem shared by examples 09 to 13: C = A x B with B sharded by columns.
Rank r holds A (M x K, the same everywhere) and B_r (K x N/world), computes
C_r = A x B_r, and every rank must end with the whole C (M x N).

The GEMM kernel runs to completion, then a communication kernel pushes the finished
block to every peer: nothing overlaps, so the time is GEMM + communication.

Kernel: iris.ops.gemm.matmul_kernel, then iris.ops.all_scatter.all_scatter_kernel.
The four styles side by side: docs/fused.md.

Run: python -m iris.run -n 2 examples/09_gemm_all_scatter_bulk_synchronous.py
"""

import sys

from gemm_all_scatter_problem import run

if __name__ == "__main__":
    sys.exit(run("bulk_synchronous", "09_bulk_synchronous"))
