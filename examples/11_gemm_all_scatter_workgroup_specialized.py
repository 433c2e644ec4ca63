"""11 · GEMM + all-scatter, workgroup-specialised.

The problem shared by examples 09 to 13: C = A x B with B sharded by columns.
Rank r holds A (M x K, the same everywhere) and B_r (K x N/world), computes
C_r = A x B_r, and every rank must end with the whole C (M x N).

One kernel, two kinds of programs: most compute tiles, store them locally and raise
a per-tile flag (iris.signal); the rest wait on those flags (iris.wait_until) and
push each finished tile to every peer. The GEMM never waits for the network.

Kernel: iris.ops.all_scatter.workgroup_specialized_kernel (ROLE=BOTH).
The four styles side by side: docs/fused.md.

Run: python -m iris.run -n 2 examples/11_gemm_all_scatter_workgroup_specialized.py
"""

import sys

from gemm_all_scatter_problem import run

if __name__ == "__main__":
    sys.exit(run("workgroup_specialized", "11_workgroup_specialized"))
