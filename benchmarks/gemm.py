"""Iris's tile GEMM against cuBLAS, one GPU, bf16.

Every fused op is built on the tile GEMM of ``iris.ops.gemm``; this times the plain
persistent GEMM as the ops launch it (:func:`iris.ops.matmul.matmul_launch`: tensor
descriptors where the layouts allow, on every SM) beside ``torch.matmul`` (cuBLAS) in
the same run: ``auto`` (the tiles :func:`iris.ops.config.gemm_config` picks for the
shape), ``auto, pointer loads`` (the same tiles through ``matmul_kernel``, what the
fused kernels' GEMM part uses), the 128 x 256 x 64 tiles of the fused ops, and any
``--configs``. Shapes are the per-rank GEMMs of benchmarks/fused_ops.py on 4 ranks
(N or K divided by 4). Each way runs ``--iters`` calls between CUDA events, in
``--trials`` trials that go round every way in a new (seeded) order; each figure is
the median trial. Each result is checked against cuBLAS on fresh random inputs, on a
poisoned output, before any timing.

    python benchmarks/gemm.py --out benchmarks/results/gemm_h200.json
    ... --shapes "4096,2048,8192;4096,3584,4096"   (per-rank M,N,K)
    ... --configs "num_stages=4;block_n=128"        more tile settings
    ... --configs "tma=0,block_n=128"               pointer loads (tma=1: descriptors)
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time

import torch
from common import parse_configs, parse_shapes, relative_error, time_loop, write_report

from iris.ops.config import FusedConfig, flatten_tile_loop, gemm_config
from iris.ops.matmul import matmul_launch

#: Per-rank GEMMs of fused_ops.py's default shapes on 4 ranks: GEMM + all-scatter and
#: all_gather_matmul split N, matmul_all_reduce / reduce_scatter split K.
DEFAULT_SHAPES = [
    (m, n, k)
    for m in (1024, 4096, 16384)
    for n, k in ((2048, 8192), (3584, 4096), (8192, 2048), (14336, 1024))
]


def launch(a, b, c, config: FusedConfig, num_sms: int, untraced, tma: bool | None):
    # ``untraced``: a uint64 heap_bases, so no tracing is compiled in (nor read).
    step = matmul_launch(a, b, c, config, num_sms, untraced, tma=tma)
    step()
    return step


def measure_shape(shape, configs, args, num_sms: int) -> dict:
    M, N, K = shape
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    untraced = torch.zeros(1, device="cuda", dtype=torch.uint64)
    expected = torch.matmul(a, b)
    ways = {"cublas": lambda: torch.matmul(a, b, out=c)}
    compiled, errors = {}, {}
    chosen = gemm_config(M, N, K, num_sms)
    configs = {"auto": (chosen, None), "auto, pointer loads": (chosen, False), **configs}
    for way, (config, tma) in configs.items():
        c.fill_(float("nan"))
        step = launch(a, b, c, config, num_sms, untraced, tma)
        torch.cuda.synchronize()
        errors[way] = relative_error(c, expected)
        kernel = step.compile()
        compiled[way] = {
            "kernel": step.kernel.fn.__name__,
            "registers": kernel.n_regs,
            "spills": kernel.n_spills,
        }
        ways[way] = step
    order = list(ways)
    trials = {way: [] for way in ways}
    rng = random.Random(f"{shape}")
    for _ in range(args.trials):
        rng.shuffle(order)
        for way in order:
            trials[way].append(time_loop(None, ways[way], args.iters, warmup=2) * 1e3)
    ms = {way: statistics.median(times) for way, times in trials.items()}
    flops = 2.0 * M * N * K
    return {
        "M": M,
        "N": N,
        "K": K,
        "ms": ms,
        "trials_ms": trials,
        "tflops": {way: flops / t / 1e9 for way, t in ms.items()},
        "of_cublas": {way: ms["cublas"] / t for way, t in ms.items() if way != "cublas"},
        "auto": {**dataclasses.asdict(chosen), "flatten": flatten_tile_loop(chosen)},
        "relative_error": errors,
        "correct": all(e < 1e-2 for e in errors.values()),
        "compiled": compiled,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", type=parse_shapes, default=DEFAULT_SHAPES, help="'M,N,K;M,N,K' (per rank)"
    )
    parser.add_argument(
        "--configs", type=parse_configs, default=[], help="FusedConfig changes, ';'-separated"
    )
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark times a GPU")
    started = time.time()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = FusedConfig(block_n=256, num_stages=3)
    configs = {"128x256x64 s3": (base, None)}
    for changes in args.configs:
        name = ",".join(f"{k}={v}" for k, v in changes.items())
        tma = changes.pop("tma", None)
        configs[name] = (base.replace(**changes), None if tma is None else bool(tma))
    rows = []
    for shape in args.shapes:
        row = measure_shape(shape, configs, args, num_sms)
        rows.append(row)
        best = max((w for w in row["tflops"] if w != "cublas"), key=row["tflops"].get)
        print(
            f"{shape}: cuBLAS {row['tflops']['cublas']:6.1f} TFLOP/s; "
            + "  ".join(f"{w} {t:6.1f}" for w, t in row["tflops"].items() if w != "cublas")
            + f"  auto {row['of_cublas']['auto']:.3f}x cuBLAS, best {best} ({row['of_cublas'][best]:.3f}x)"
            + f" ok={row['correct']}",
            flush=True,
        )
    report = {
        "iters": args.iters,
        "trials": args.trials,
        "configs": {
            name: {**dataclasses.asdict(config), "flatten": flatten_tile_loop(config), "tma": tma}
            for name, (config, tma) in configs.items()
        },
        "results": rows,
        "seconds": time.time() - started,
    }
    write_report(report, args.out, None)


if __name__ == "__main__":
    main()
