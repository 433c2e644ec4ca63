"""Iris device collectives beside NCCL (torch.distributed), eager and under CUDA graphs.

For each collective and size (nccl-tests conventions: ``size`` is the whole
buffer: all_reduce/all_to_all/broadcast in and out, all_gather's output,
reduce_scatter's input), both implementations run the same fixed number of
iterations on every rank (warm-up, barrier, CUDA events, max over ranks):

* eager: ``iters`` back-to-back calls from Python;
* graph: one CUDA graph holding ``GRAPH_CALLS`` calls, replayed until ``iters`` calls ran;

each repeated ``--trials`` times, reporting the median trial (all trials are in the JSON).

Before timing, both run once on the same random inputs with poisoned outputs and
every element of Iris's result is compared with NCCL's. Bus bandwidth uses the
nccl-tests factors (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all
(n-1)/n; broadcast 1). ``--variants`` adds every all_reduce algorithm, eager;
``--protocols`` adds Iris with each protocol forced up to 1 MiB, where it
applies, eager and graph (to place ``Config.low_latency_max_bytes``);
``--configs`` adds Iris with other settings
(``"comm_sms=32,block_size=8192;protocol=pushed"``), eager and graph.

all_reduce also runs PyTorch SymmetricMemory's one-shot and two-shot all-reduces
(``torch.ops.symm_mem``) on a symmetric buffer of their own, eager and graph, each checked
against NCCL's result first: what a torch user would pick instead. Their multicast
(multimem) variants stay off, as NVLS does on these machines; where this torch has no
symmetric memory the rows are left out and the report says why (``torch_symm``).

    python -m iris.run -n 4 benchmarks/collectives.py --out benchmarks/results/collectives_h200x4.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch
import torch.distributed as dist
from common import all_ranks_agree, median_of_trials, parse_configs, require_own_gpu, write_report

import iris
from iris.ccl import CollectiveError, Config

KIB = 1024
GRAPH_CALLS = 10
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
VARIANTS = ("one_shot", "two_shot", "ring", "atomic")
#: PyTorch SymmetricMemory's all-reduces timed beside NCCL and Iris.
TORCH_SYMM_ALL_REDUCES = ("one_shot", "two_shot")


class TorchSymmetric:
    """PyTorch SymmetricMemory's all-reduces on one symmetric buffer of ``max_bytes``.

    Example:
        >>> symm = TorchSymmetric(1 << 20, torch.float32, torch.device("cuda", 0))
        >>> symm.call("two_shot", 1024)()   # in place on the buffer's first 1024 elements
    """

    def __init__(self, max_bytes: int, dtype: torch.dtype, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem

        self.group = dist.group.WORLD.group_name
        symm_mem.enable_symm_mem_for_group(self.group)
        self.buffer = symm_mem.empty(max_bytes // dtype.itemsize, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buffer, self.group)

    def call(self, variant: str, n: int):
        """One all-reduce of the buffer's first ``n`` elements (one-shot out of place, two-shot in place)."""
        tensor = self.buffer[:n]
        if variant == "one_shot":
            return lambda: torch.ops.symm_mem.one_shot_all_reduce(tensor, "sum", self.group)
        return lambda: torch.ops.symm_mem.two_shot_all_reduce_(tensor, "sum", self.group)

    def check(self, ctx, variant: str, values: torch.Tensor, reference: torch.Tensor) -> bool:
        """Whether ``variant`` of ``values`` (this rank's input) gives NCCL's ``reference``, every element."""
        tensor = self.buffer[: values.numel()]
        tensor.copy_(values)
        torch.cuda.synchronize()
        ctx.barrier()
        result = self.call(variant, values.numel())()
        result = tensor if result is None else result
        torch.cuda.synchronize()
        ctx.barrier()
        return bool(torch.allclose(result, reference, rtol=1e-5, atol=1e-5))


def torch_symmetric(max_bytes: int, dtype: torch.dtype, device: torch.device):
    """``(TorchSymmetric, None)``, or ``(None, why)`` where this torch or machine has none."""
    try:
        return TorchSymmetric(max_bytes, dtype, device), None
    except (ImportError, AttributeError, RuntimeError) as error:
        return None, f"{type(error).__name__}: {error}"


PROTOCOLS = ("low_latency", "staged", "direct")


def bus_factor(name: str, world: int) -> float:
    return (
        2 * (world - 1) / world
        if name == "all_reduce"
        else (1.0 if name == "broadcast" else (world - 1) / world)
    )


def buffers(name: str, nbytes: int, world: int, heap_in, heap_out, dtype):
    """(Iris in, Iris out, NCCL in, NCCL out) as flat views; sizes follow nccl-tests."""
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    n -= n % world
    n_in = n // world if name == "all_gather" else n
    n_out = n // world if name == "reduce_scatter" else n
    if name == "broadcast":
        return heap_out[:n], heap_out[:n], heap_out.new_empty(n), heap_out.new_empty(n)
    return (
        heap_in[:n_in],
        heap_out[:n_out],
        torch.empty_like(heap_in[:n_in]),
        torch.empty_like(heap_out[:n_out]),
    )


def calls(ctx, name: str, iris_in, iris_out, nccl_in, nccl_out, config):
    """(iris_call, nccl_call) running one collective each."""
    if name == "all_reduce":
        return (
            lambda: ctx.ccl.all_reduce(iris_out, iris_in, config=config),
            lambda: dist.all_reduce(nccl_out),  # in place: the check copies the input in first
        )
    if name == "all_gather":
        return (
            lambda: ctx.ccl.all_gather(iris_out, iris_in, config=config),
            lambda: dist.all_gather_into_tensor(nccl_out, nccl_in),
        )
    if name == "reduce_scatter":
        return (
            lambda: ctx.ccl.reduce_scatter(iris_out, iris_in, config=config),
            lambda: dist.reduce_scatter_tensor(nccl_out, nccl_in),
        )
    if name == "all_to_all":
        return (
            lambda: ctx.ccl.all_to_all(iris_out, iris_in, config=config),
            lambda: dist.all_to_all_single(nccl_out, nccl_in),
        )
    return (
        lambda: ctx.ccl.broadcast(iris_out, src=0, config=config),
        lambda: dist.broadcast(nccl_out, src=0),
    )


def input_values(ctx, like: torch.Tensor) -> torch.Tensor:
    """This rank's random input, the same for every implementation."""
    generator = torch.Generator(device=like.device).manual_seed(1000 + ctx.get_rank())
    return torch.randn(like.numel(), generator=generator, device=like.device).to(like.dtype)


def check(ctx, name, iris_in, iris_out, nccl_in, nccl_out, iris_call, nccl_call) -> bool:
    """Same random input to both, outputs poisoned, every element compared."""
    values = input_values(ctx, iris_in)
    iris_in.copy_(values)
    nccl_in.copy_(values)
    receives = name != "broadcast" or ctx.get_rank() != 0
    if receives:
        iris_out.fill_(float("nan"))
        nccl_out.fill_(float("nan"))
    if name == "all_reduce" or not receives:
        nccl_out.copy_(values)
    iris_call()
    nccl_call()
    torch.cuda.synchronize()
    ctx.barrier()
    # all_reduce sums in a different order than NCCL; allow for fp32 rounding.
    return bool(torch.allclose(iris_out, nccl_out, rtol=1e-5, atol=1e-5))


def graph_of(fn, calls_per_graph: int):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    return graph


def iterations(nbytes: int, base: int) -> int:
    return base if nbytes <= 16 << 20 else max(5, base * (16 << 20) // nbytes)


def measure(ctx, fn, iters: int, graphs: bool, trials: int) -> dict:
    eager, eager_trials = median_of_trials(ctx, fn, iters, trials)
    result = {"eager_us": eager * 1e6, "eager_trials_us": [t * 1e6 for t in eager_trials]}
    if graphs:
        graph = graph_of(fn, GRAPH_CALLS)
        replays = max(1, iters // GRAPH_CALLS)
        replay, replay_trials = median_of_trials(ctx, graph.replay, replays, trials, warmup=2)
        result["graph_us"] = replay * 1e6 / GRAPH_CALLS
        result["graph_trials_us"] = [t * 1e6 / GRAPH_CALLS for t in replay_trials]
        del graph
    return result


def entries(args, name: str, nbytes: int) -> list[tuple[str, Config | None, bool]]:
    """(label, Iris config or None for NCCL, whether to time graphs too) of one row."""
    base = Config(comm_sms=args.comm_sms)
    graphs = not args.no_graphs
    rows = [("iris", base, graphs), ("nccl", None, graphs)]
    if name == "all_reduce" and args.torch_symm is not None:
        rows += [(f"torch:{v}", None, graphs) for v in TORCH_SYMM_ALL_REDUCES]
    if args.variants and name == "all_reduce" and nbytes <= 256 << 20:
        rows += [(f"iris:{v}", dataclasses.replace(base, all_reduce_variant=v), False) for v in VARIANTS]
    if args.protocols and nbytes <= 1 << 20:
        rows += [(f"iris:{p}", dataclasses.replace(base, protocol=p), graphs) for p in PROTOCOLS]
    for fields in args.configs:
        label = ",".join(f"{k}={v}" for k, v in fields.items())
        rows.append((f"iris:{label}", dataclasses.replace(base, **fields), graphs))
    return rows


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--min-kib", type=int, default=1)
    parser.add_argument("--max-mib", type=int, default=1024)
    parser.add_argument(
        "--iters", type=int, default=100, help="calls per measurement up to 16 MiB (fewer above)"
    )
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--variants", action="store_true", help="also time each all_reduce algorithm (eager)")
    parser.add_argument("--protocols", action="store_true", help="also time each forced protocol up to 1 MiB")
    parser.add_argument("--configs", type=parse_configs, default=[], help="also time these Config settings")
    parser.add_argument("--trials", type=int, default=3, help="timed runs per measurement (median reported)")
    parser.add_argument("--no-graphs", action="store_true")
    parser.add_argument("--comm-sms", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    max_bytes = args.max_mib << 20
    ctx = iris.iris(2 * max_bytes + (512 << 20))  # room for full-size low-latency and push slots
    require_own_gpu(ctx)
    world = ctx.get_num_ranks()
    dtype = torch.float32
    heap_in = ctx.empty(max_bytes // 4, dtype=dtype)
    heap_out = ctx.empty(max_bytes // 4, dtype=dtype)
    args.torch_symm, torch_symm_missing = None, None
    if "all_reduce" in args.collectives.split(","):
        args.torch_symm, torch_symm_missing = torch_symmetric(max_bytes, dtype, ctx.get_device())
        if torch_symm_missing and ctx.get_rank() == 0:
            print(f"PyTorch SymmetricMemory rows left out: {torch_symm_missing}", flush=True)
    sizes = []
    size = args.min_kib * KIB
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    rows = []
    for name in args.collectives.split(","):
        for nbytes in sizes:
            bufs = buffers(name, nbytes, world, heap_in, heap_out, dtype)
            iris_call, nccl_call = calls(ctx, name, *bufs, Config(comm_sms=args.comm_sms))
            ok = all_ranks_agree(check(ctx, name, *bufs, iris_call, nccl_call))
            # NCCL's all_reduce result, before its timing sums in place (the torch rows' check).
            reference = bufs[3].clone() if name == "all_reduce" and args.torch_symm is not None else None
            iters = iterations(nbytes, args.iters)
            for impl, config, graphs in entries(args, name, nbytes):
                if impl.startswith("torch:"):
                    variant, n = impl.split(":")[1], bufs[0].numel()
                    try:
                        correct = args.torch_symm.check(ctx, variant, input_values(ctx, bufs[0]), reference)
                    except RuntimeError:  # the same refusal on every rank (its size limits)
                        torch.cuda.synchronize()
                        ctx.barrier()
                        continue
                    fn, ok_variant = args.torch_symm.call(variant, n), all_ranks_agree(correct)
                elif impl == "nccl":
                    fn, ok_variant = nccl_call, ok
                elif impl.startswith("iris:"):
                    fn = calls(ctx, name, *bufs, config)[0]
                    try:
                        ok_variant = all_ranks_agree(check(ctx, name, *bufs, fn, nccl_call))
                    except CollectiveError:  # raised on every rank: this protocol cannot run here
                        torch.cuda.synchronize()
                        ctx.barrier()
                        continue
                else:
                    fn, ok_variant = calls(ctx, name, *bufs, config)[0], ok
                timing = measure(ctx, fn, iters, graphs, args.trials)
                row = {
                    "collective": name,
                    "bytes": nbytes,
                    "impl": impl,
                    "iters": iters,
                    "correct": ok_variant,
                }
                row.update(timing)
                for mode in ("eager", "graph"):
                    if f"{mode}_us" in row:
                        row[f"{mode}_busbw_gbs"] = (
                            nbytes / (row[f"{mode}_us"] * 1e-6) * bus_factor(name, world) / 1e9
                        )
                rows.append(row)
                if ctx.get_rank() == 0:
                    print(_line(row), flush=True)
    report = {"world_size": world, "dtype": "float32", "graph_calls": GRAPH_CALLS, "rows": rows}
    report["torch_symm"] = (
        torch_symm_missing or "one_shot and two_shot all_reduce; multicast variants off (no NVLS)"
    )
    report["summary"] = summarize(rows)
    write_report(report, args.out, world)
    if ctx.get_rank() == 0:
        print_summary(report["summary"])
        if args.out:
            plot(rows, os.path.splitext(args.out)[0] + ".png", world)
    ctx.barrier()


def _line(row) -> str:
    graph = (
        f"  graph {row['graph_us']:9.1f} us {row['graph_busbw_gbs']:7.1f} GB/s" if "graph_us" in row else ""
    )
    return (
        f"{row['collective']:>14} {_size(row['bytes']):>8} {row['impl']:>15}  eager {row['eager_us']:9.1f} us "
        f"{row['eager_busbw_gbs']:7.1f} GB/s{graph}  {'ok' if row['correct'] else 'WRONG'}"
    )


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def summarize(rows) -> list[dict]:
    """Iris over NCCL time ratio (below 1: Iris faster) per collective, size and mode."""
    table = {}
    for row in rows:
        table[(row["collective"], row["bytes"], row["impl"])] = row
    summary = []
    for (name, nbytes, impl), row in table.items():
        if impl != "iris":
            continue
        nccl = table[(name, nbytes, "nccl")]
        entry = {"collective": name, "bytes": nbytes, "correct": row["correct"]}
        torch_rows = [
            table[(name, nbytes, f"torch:{v}")]
            for v in TORCH_SYMM_ALL_REDUCES
            if (name, nbytes, f"torch:{v}") in table
        ]
        for mode in ("eager", "graph"):
            key = f"{mode}_us"
            if key in row and key in nccl:
                entry[f"{mode}_iris_us"] = row[key]
                entry[f"{mode}_nccl_us"] = nccl[key]
                entry[f"{mode}_speedup"] = nccl[key] / row[key]
                peers = [r for r in torch_rows if key in r and r["correct"]]
                if peers:
                    fastest = min(peers, key=lambda r: r[key])
                    entry[f"{mode}_torch_us"], entry[f"{mode}_torch_impl"] = fastest[key], fastest["impl"]
                    entry[f"{mode}_vs_best_peer"] = min(nccl[key], fastest[key]) / row[key]
        summary.append(entry)
    return summary


def print_summary(summary) -> None:
    print(
        "\n| collective | size | eager Iris us | eager NCCL us | speedup | graph Iris us | graph NCCL us | speedup "
        "| eager / graph vs best of NCCL and torch |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for e in summary:
        graph = (
            f"{e['graph_iris_us']:.1f} | {e['graph_nccl_us']:.1f} | {e['graph_speedup']:.2f}x"
            if "graph_iris_us" in e
            else "- | - | -"
        )
        peers = " / ".join(
            f"{e[f'{m}_vs_best_peer']:.2f}x" if f"{m}_vs_best_peer" in e else "-" for m in ("eager", "graph")
        )
        print(
            f"| {e['collective']} | {_size(e['bytes'])} | {e['eager_iris_us']:.1f} | {e['eager_nccl_us']:.1f} | "
            f"{e['eager_speedup']:.2f}x | {graph} | {peers} |"
        )


def plot(rows, path: str, world: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["collective"] for r in rows}, key=COLLECTIVES.index)
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for impl in sorted({r["impl"] for r in rows if r["collective"] == name}):
            for mode, style in (("eager", "-"), ("graph", "--")):
                points = [
                    (r["bytes"], r[f"{mode}_us"])
                    for r in rows
                    if r["collective"] == name and r["impl"] == impl and f"{mode}_us" in r
                ]
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, style, marker="o", markersize=3, label=f"{impl} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{name}, {world} ranks")
        ax.set_xlabel("bytes")
        ax.set_ylabel("us per call (max over ranks)")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
