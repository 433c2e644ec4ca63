"""What tracing costs: the same kernels untraced, compiled with tracing but disabled, and traced.

Kernels:
  put      ring put of a large buffer (grid-stride, 16 KiB per op): communication only
  gemm+as  bf16 GEMM tiles (128x128x64) each stored to every rank (all-scatter), with a
           compute scope around each tile's K loop: compute plus communication
  barrier  ``ctx.device_barrier()`` alone, from 2 ranks: the one-program kernel that ends
           every synchronous ``ctx.ops`` call, whose records sit on each call's critical path
  ctx.ops  the library's GEMM + all-scatter (``ctx.ops.matmul_all_gather``, the style
           ``auto`` picks, or ``--op-variant``) at each ``--op-shapes`` shape, from 2
           ranks: what a user tracing a fused op pays. Its traced variant compiles only
           while tracing is enabled, so it has no disabled mode.

Modes, in one run with the same fixed iteration count on every rank (max over ranks):
  untraced   plain heap_bases (tracing compiled out; the code tracing never touched)
  disabled   the traced kernel variant launched while the host has tracing disabled
  enabled    traced and recording
  sampled    traced and recording one program in --sample-period (8): ctx.tracing.enable(sample=1/8)
  untraced   again, a second sample in each trial, to show run-to-run noise

Each trial times every mode once, trial ``t`` starting at the ``t``-th mode and going
round (the place in a trial moved a call by up to 3%); each figure is the median over
``--trials`` trials. ``--breakdown`` also times the GEMM kernel with only its compute
scope traced and with only its stores traced, the latter twice more: with the stores'
tracing switch read before the K loop (where the whole build's scope reads it), and
after an empty scope recorded once the K loop ends (where the whole build records its
scope). Every row gives the registers and spills of its kernel variant, to say where
the cost is.

    python -m iris.run -n 4 benchmarks/tracing_overhead.py --out benchmarks/results/tracing_overhead_h200x4.json
    python -m iris.run -n 1 benchmarks/tracing_overhead.py --breakdown   (one GPU: the GEMM's cost)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from common import all_ranks_agree, parse_shapes, require_own_gpu, time_loop, write_report

import iris
from iris.ops.config import VARIANTS


@triton.jit
def put_ring(src, dst, n, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    peer = (cur_rank + 1) % world_size
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        iris.put(src + offsets, dst + offsets, cur_rank, peer, heap_bases, mask=offsets < n)


@triton.jit
def gemm_all_scatter(
    a,
    b,
    c_all,
    M,
    N,
    K,
    cur_rank,
    world_size,
    scope_bases,
    store_bases,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWITCH_FIRST: tl.constexpr = False,
    MARK_AFTER_LOOP: tl.constexpr = False,
):
    # Two heap_bases so that --breakdown can trace the compute scope and the stores apart.
    # SWITCH_FIRST reads the stores' tracing switch before the K loop (an op's begin whose
    # start is dropped): the stores' own reads of it then reuse that one. MARK_AFTER_LOOP
    # records an empty scope on the stores' heap_bases after the K loop: the stores'
    # records then follow one of the program's own, as they do in the whole traced build.
    if SWITCH_FIRST:
        iris.trace_begin(store_bases)
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // tiles_n, pid % tiles_n
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    started = iris.trace_begin(scope_bases)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        tile_a = tl.load(a + rows[:, None] * K + (k + ks)[None, :])
        tile_b = tl.load(b + (k + ks)[:, None] * N + cols[None, :])
        acc = tl.dot(tile_a, tile_b, acc)
    iris.trace_end(scope_bases, started, 0, pid_m, pid_n)
    if MARK_AFTER_LOOP:
        iris.trace_end(store_bases, iris.trace_begin(store_bases), 1, pid_m, pid_n)
    tile = acc.to(tl.bfloat16)
    offsets = cur_rank * M * N + rows[:, None] * N + cols[None, :]
    for i in range(world_size):
        target = (cur_rank + i) % world_size
        iris.store(c_all + offsets, tile, cur_rank, target, store_bases, pid_m=pid_m, pid_n=pid_n)


MAX_EVENTS = 1 << 22


MODES = ("untraced", "disabled", "enabled", "sampled", "untraced_again")
OP_MODES = ("untraced", "enabled", "sampled", "untraced_again")
#: ``sampled``: traced and recording one program in this many (``--sample-period``).
SAMPLE_PERIOD = 8


def measure(ctx, launch, iters, trials):
    """Time ``launch(heap_bases)`` in every mode, ``trials`` times round.

    Returns {mode: median seconds}, {mode: (registers, spills)}, events per call, and
    whether no event was dropped on any rank.
    """
    plain = ctx.get_heap_bases()
    ctx.tracing.enable(max_events=MAX_EVENTS)
    traced = ctx.get_heap_bases()
    ctx.tracing.disable()
    resources = {}
    for mode, heap_bases in (("untraced", plain), ("disabled", traced)):
        compiled = launch(heap_bases)
        resources[mode] = (compiled.n_regs, compiled.n_spills)
    resources["enabled"] = resources["sampled"] = resources["disabled"]  # the same compiled variant
    resources["untraced_again"] = resources["untraced"]
    ctx.tracing.enable(max_events=MAX_EVENTS)
    ctx.tracing.reset()
    launch(ctx.get_heap_bases())
    events_per_call = len(ctx.tracing.events()) + ctx.tracing.dropped()
    ctx.tracing.disable()
    medians, recorded_ok = _trials(
        ctx, lambda: launch(plain), lambda: launch(traced), iters, trials, lambda: launch(traced)
    )
    return medians, resources, events_per_call, recorded_ok


def _trials(ctx, untraced, traced, iters, trials, disabled=None):
    """Median seconds per call of each mode over ``trials`` rounds, and whether no rank dropped
    an event: ``untraced``, ``disabled`` (if given: the traced variant with tracing off),
    ``traced`` with tracing enabled, ``untraced`` again.

    Trial ``t`` starts at mode ``t`` (modulo the modes) and goes round, so every mode
    runs at every place of a trial equally often, and every loop follows the same host
    work (``tracing.enable()``, a collective that also syncs clocks; then ``disable()``
    for the modes that do not record). Without both, the loops right after enabling ran
    the library op at 16384 x 8192 x 8192 up to 3% faster than the others, which made
    tracing read as a speed-up there."""
    modes = MODES if disabled is not None else OP_MODES
    calls = {
        "untraced": untraced, "disabled": disabled, "enabled": traced, "sampled": traced,
        "untraced_again": untraced,
    }  # fmt: skip
    times = {mode: [] for mode in modes}
    recorded_ok = True
    for trial in range(trials):
        first = trial % len(modes)
        for mode in modes[first:] + modes[:first]:
            ctx.tracing.enable(max_events=MAX_EVENTS, sample=1 / SAMPLE_PERIOD if mode == "sampled" else 1)
            ctx.tracing.reset()
            recording = mode in ("enabled", "sampled")
            if not recording:
                ctx.tracing.disable()
            times[mode].append(time_loop(ctx, calls[mode], iters))
            if recording:
                recorded_ok = recorded_ok and ctx.tracing.dropped() == 0
                ctx.tracing.disable()
    ctx.tracing.reset()
    medians = {mode: statistics.median(samples) for mode, samples in times.items()}
    return medians, all_ranks_agree(recorded_ok)


def measure_op(ctx, call, iters, trials):
    """:func:`measure` for a library call: untraced, enabled and untraced again.

    The call's registers are not reported (None): it may launch several kernels.
    """
    ctx.tracing.enable(max_events=MAX_EVENTS)
    for _ in range(2):  # compile the traced variant, then count one call's events
        ctx.tracing.reset()
        call()
    events_per_call = len(ctx.tracing.events()) + ctx.tracing.dropped()
    ctx.tracing.disable()
    call()  # and the untraced one
    medians, recorded_ok = _trials(ctx, call, call, iters, trials)
    return medians, dict.fromkeys(OP_MODES, (None, None)), events_per_call, recorded_ok


def op_rows(ctx, shapes, variant, iters, trials):
    """{row name: measured} for the library's GEMM + all-scatter at each global (M, N, K) in
    style ``variant`` ("auto": the one it picks there), and whether every output element
    matched torch on every rank."""
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    measured, correct = {}, True
    for M, N, K in shapes:
        n = N // world
        a = ctx.randn(M, K, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
        b = ctx.randn(K, n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1 + rank))
        out = ctx.full((M, world * n), float("nan"), dtype=torch.bfloat16)
        config = ctx.ops.default_config(M, n, K, "matmul_all_gather").replace(variant=variant)
        runs_as = ctx.ops.choose_variant(config, M, n, K, "matmul_all_gather")

        def call(a=a, b=b, out=out, config=config):
            ctx.ops.matmul_all_gather(out, a, b, config=config, dim=1)

        measured[f"ctx.ops {M}x{N}x{K} ({runs_as})"] = measure_op(ctx, call, iters, trials)
        out.fill_(float("nan"))  # poisoned on every rank before any peer stores into it
        ctx.barrier()
        call()
        ctx.barrier()
        for owner in range(world):
            b_owner = torch.randn(
                K, n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1 + owner)
            )
            ref = a.float() @ b_owner.to(a.device).float()
            got = out[:, owner * n : (owner + 1) * n].float()
            correct &= bool(torch.isfinite(got).all()) and ((got - ref).norm() / ref.norm()).item() < 1e-2
        del a, b, out
    return measured, all_ranks_agree(correct)


def row(name, measured):
    results, resources, events_per_call, _ = measured
    base = results["untraced"]
    out = {"kernel": name, "events_per_call_rank0": events_per_call}
    for mode, seconds in results.items():
        registers, spills = resources[mode]
        out[mode] = {
            "us": seconds * 1e6,
            "overhead_pct": 100 * (seconds / base - 1),
            "registers": registers,
            "spills": spills,
        }
    out["events_per_second"] = events_per_call / results["enabled"]
    return out


def main():
    global SAMPLE_PERIOD  # the sampled mode's period, for _trials
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--put-mib", type=int, default=256)
    parser.add_argument("--gemm", type=int, nargs=3, default=[4096, 4096, 4096], metavar=("M", "N", "K"))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument(
        "--trials",
        type=int,
        default=12,
        help="rounds of every mode, each starting at the next mode; medians are reported",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the GEMM with only its scope or only its stores traced",
    )
    parser.add_argument(
        "--op-shapes",
        type=lambda text: parse_shapes(text) if text else [],
        default="4096,8192,8192;16384,8192,8192",
        help='global M,N,K of the library GEMM + all-scatter rows, ";"-separated ("" for none)',
    )
    parser.add_argument(
        "--op-variant",
        default="auto",
        choices=VARIANTS,
        help="the style of the library rows (default: the one auto picks at each shape)",
    )
    parser.add_argument(
        "--sample-period",
        type=int,
        default=SAMPLE_PERIOD,
        help="the sampled mode records one program in this many (ctx.tracing.enable(sample=1/k))",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    SAMPLE_PERIOD = args.sample_period
    if iris.BACKEND != "cuda":
        raise SystemExit("this benchmark times GPUs: run it with IRIS_BACKEND=cuda")
    started = time.time()
    ctx = iris.iris(heap_size=4 << 30)
    require_own_gpu(ctx)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    device = ctx.get_device()

    n = args.put_mib * (1 << 20) // 4
    src, dst = ctx.randn(n), ctx.zeros(n)
    grid = (ctx.get_cu_count() * 2,)

    def put(heap_bases):
        return put_ring[grid](src, dst, n, rank, world, heap_bases, BLOCK=4096, num_warps=16)

    measured = {"put": measure(ctx, put, args.iters, args.trials)}

    M, N, K = args.gemm
    generator = torch.Generator().manual_seed(rank)
    a = ctx.randn(M, K, dtype=torch.bfloat16, generator=generator)
    b = ctx.randn(K, N, dtype=torch.bfloat16, generator=generator)
    c_all = ctx.full((world, M, N), float("nan"), dtype=torch.bfloat16)
    tiles = (triton.cdiv(M, 128) * triton.cdiv(N, 128),)
    ctx.barrier()

    def gemm(scope_bases, store_bases, switch_first=False, mark=False):
        return gemm_all_scatter[tiles](
            a, b, c_all, M, N, K, rank, world, scope_bases, store_bases,
            BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SWITCH_FIRST=switch_first, MARK_AFTER_LOOP=mark,
            num_warps=8, num_stages=3,
        )  # fmt: skip

    plain = ctx.get_heap_bases()
    measured["gemm+all-scatter"] = measure(ctx, lambda hb: gemm(hb, hb), args.iters, args.trials)
    if args.breakdown:
        measured["gemm: scope only"] = measure(ctx, lambda hb: gemm(hb, plain), args.iters, args.trials)
        measured["gemm: stores only"] = measure(ctx, lambda hb: gemm(plain, hb), args.iters, args.trials)
        measured["gemm: stores only, switch read first"] = measure(
            ctx, lambda hb: gemm(plain, hb, switch_first=True), args.iters, args.trials
        )
        measured["gemm: stores only, an empty scope after the K loop"] = measure(
            ctx, lambda hb: gemm(plain, hb, mark=True), args.iters, args.trials
        )
    op_correct = True
    if world > 1:
        measured["ctx.device_barrier"] = measure_op(ctx, ctx.device_barrier, args.iters, args.trials)
    if world > 1 and args.op_shapes:
        op_measured, op_correct = op_rows(ctx, args.op_shapes, args.op_variant, args.iters, args.trials)
        measured.update(op_measured)
    ctx.barrier()  # every rank's last all-scatter has landed
    errors = []
    for owner in range(world):
        g = torch.Generator().manual_seed(owner)
        ref_a = torch.randn(M, K, dtype=torch.bfloat16, generator=g).to(device)
        ref_b = torch.randn(K, N, dtype=torch.bfloat16, generator=g).to(device)
        ref = ref_a.float() @ ref_b.float()
        errors.append(((c_all[owner].float() - ref).norm() / ref.norm()).item())
    correct = all_ranks_agree(max(errors) < 1e-2)

    report = {
        "world_size": world,
        "put_bytes": n * 4,
        "gemm_shape": [M, N, K],
        "iters": args.iters,
        "trials": args.trials,
        "sample_period": args.sample_period,
        "results": [row(name, m) for name, m in measured.items()],
        "gemm_result_correct": correct,
        "gemm_max_relative_error": max(errors),
        "op_variant": args.op_variant,
        "op_results_correct": op_correct,
        "no_events_dropped": all(m[3] for m in measured.values()),
        "seconds": round(time.time() - started, 1),
    }
    if rank == 0:
        print(
            f"{'kernel':18} {'untraced':>10} {'disabled':>10} {'enabled':>10} {'again':>10}  events/call  Mevents/s"
        )
        for r in report["results"]:
            cells = " ".join(f"{r[m]['us']:8.1f}us" if m in r else f"{'-':>10}" for m in MODES)
            print(
                f"{r['kernel']:18} {cells}  {r['events_per_call_rank0']:11d}  {r['events_per_second'] / 1e6:9.1f}"
            )
            disabled = f"disabled {r['disabled']['overhead_pct']:+.1f}%  " if "disabled" in r else ""
            registers = (
                f"  registers {r['untraced']['registers']} -> {r['disabled']['registers']}, "
                f"spills {r['untraced']['spills']} -> {r['disabled']['spills']}"
                if "disabled" in r
                else ""
            )
            print(
                f"{'':18} overhead: {disabled}enabled {r['enabled']['overhead_pct']:+.1f}%  "
                f"untraced again {r['untraced_again']['overhead_pct']:+.1f}%{registers}"
            )
        print(
            f"gemm result correct: {correct} (max relative error {max(errors):.2e}); "
            f"library op results correct: {op_correct}; "
            f"no events dropped: {report['no_events_dropped']}"
        )
    write_report(report, args.out, world)
    ctx.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
