"""The results of record, as the docs show them: docs/performance.md, the README's summary and
the upstream runs of docs/upstream.md.

Every figure the user docs quote comes from a file in ``benchmarks/results/`` (each one a
run of a benchmark of this folder, or of ``scripts/upstream_tests.py``, holding its command
and device). This renders them: one table of record per area, its file, command and device
under it. The page, the README's block between ``<!-- records:begin -->`` and
``<!-- records:end -->`` and docs/upstream.md's between ``<!-- upstream:begin -->`` and
``<!-- upstream:end -->`` are what this prints, and ``tests/test_docs.py`` keeps them so.

    python benchmarks/records.py            # rewrite docs/performance.md and the two blocks
    python benchmarks/records.py --check    # exit 1 if either differs from the files

Example:
    >>> from records import page, load
    >>> print(page(load()))
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from iris_trace import files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PAGE = os.path.join(ROOT, "docs", "performance.md")
README = os.path.join(ROOT, "README.md")
UPSTREAM_PAGE = os.path.join(ROOT, "docs", "upstream.md")
BEGIN, END = "<!-- records:begin -->", "<!-- records:end -->"
UPSTREAM_BEGIN, UPSTREAM_END = "<!-- upstream:begin -->", "<!-- upstream:end -->"
#: The fused-op and tracing runs of record, in the tables' column order.
MACHINES = ("h200x4", "h100x4", "h200x2", "h100x2")
#: The fastest style is named beside ``auto``'s where it was at least this much faster.
SHOWN_GAP = 0.005
#: Each area's files of record (``{machine}`` stands for every machine of ``MACHINES``).
FILES = {
    "fused": "fused_ops_{machine}",
    "tracing": "tracing_overhead_{machine}",
    "tracing_1rank": "tracing_overhead_1rank_h200",
    "collectives_small": "collectives_small_h200x4",
    "collectives": "collectives_h200x4",
    "put_get": "put_get_h200x4",
    "put_get_2": "put_get_h200x2",
    "copy_engine": "copy_engine_h200x4",
    "gemm": "gemm_h200",
    "clock": "clock_alignment_h200x4",
    "export_1M": "export_speed_1M",
    "export_10M": "export_speed_10M",
    "shared_2": "shared_gpu_2ranks_1gpu_h200",
    "shared_4": "shared_gpu_4ranks_1gpu_h200",
}
#: Upstream's own files, run by ``scripts/upstream_tests.py``: ``upstream_<kind>_<machine>.json``
#: for every machine that has a ``tests`` file.
UPSTREAM_KINDS = ("tests", "examples", "benchmarks")


def load(results: str = RESULTS) -> dict:
    """Every file of record, by area (fused and tracing: by machine).

    Example:
        >>> sorted(load()["fused"])
        ['h100x2', 'h100x4', 'h200x2', 'h200x4']
    """

    def read(name: str) -> dict:
        with open(os.path.join(results, f"{name}.json")) as handle:
            return {**json.load(handle), "file": f"{name}.json"}

    records = {}
    machines = sorted(
        name[len("upstream_tests_") : -len(".json")]
        for name in os.listdir(results)
        if name.startswith("upstream_tests_") and name.endswith(".json")
    )
    records["upstream"] = {
        machine: {
            kind: read(f"upstream_{kind}_{machine}")
            for kind in UPSTREAM_KINDS
            if os.path.exists(os.path.join(results, f"upstream_{kind}_{machine}.json"))
        }
        for machine in machines
    }
    for area, name in FILES.items():
        if "{machine}" in name:
            records[area] = {m: read(name.format(machine=m)) for m in MACHINES}
        else:
            records[area] = read(name)
    return records


def _label(machine: str) -> str:
    # "h200x4" -> "4 x H200"
    card, count = machine.split("x")
    return f"{count} x {card.upper()}"


def _source(*runs: dict) -> str:
    """Where a table's figures come from: file, command and device of each run."""
    lines = []
    for run in runs:
        device = run.get("device", "one CPU core")
        lines.append(f"`benchmarks/results/{run['file']}` ({device}): `{run['command']}`")
    return "From " + "; ".join(lines) + "."


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _pct(value: float) -> str:
    return f"{value:+.1f}%"


# ---------------------------------------------------------------- fused ops
def _style(result: dict) -> str:
    # The style auto ran, with the GEMM + all-scatter's kind of fused kernel named.
    variant = result["auto_variant"]
    if variant == "fused" and result["op"] == "gemm_all_scatter":
        sharing = result.get("config", {}).get("consumer_warps", 0) > 0
        return "fused (consumers beside the GEMM)" if sharing else "fused (workgroup-specialised)"
    return variant


def _fastest(result: dict) -> tuple[str, float]:
    # The fastest style the run timed, and its speedup.
    return max(((k, v) for k, v in result["speedup"].items() if k != "auto"), key=lambda item: item[1])


def _share_of_fastest(result: dict) -> float:
    # ``auto``'s speedup as a share of the fastest style's.
    return result["speedup"]["auto"] / _fastest(result)[1]


def _case(result: dict) -> str:
    return f"{result['op']} {result['M']} x {result['N']} x {result['K']}"


def fused_cell(result: dict) -> str:
    """``auto``'s style and speedup, and the fastest style where ``auto`` was not it.

    Example:
        >>> fused_cell(run["results"][0])
        'producer_consumer 1.48x'
    """
    best, fastest = _fastest(result)
    text = f"{_style(result)} {result['speedup']['auto']:.2f}x"
    if fastest >= result["speedup"]["auto"] * (1 + SHOWN_GAP):
        text += f" (best: {best} {fastest:.2f}x)"
    return text


def fused_table(runs: dict[str, dict]) -> str:
    """One row per op and shape, one column per machine: ``auto``'s style and speedup.

    Example:
        >>> print(fused_table(load()["fused"]))
    """
    names = list(runs)
    rows = ["| op | M, N, K | " + " | ".join(_label(n) for n in names) + " |"]
    rows.append("| --- | --- |" + " --- |" * len(names))
    by_case = {n: {(r["op"], r["M"], r["N"], r["K"]): r for r in runs[n]["results"]} for n in names}
    previous_op = None
    for case in by_case[names[0]]:
        op, m, n, k = case
        shown_op = f"`{op}`" if op != previous_op else ""
        previous_op = op
        cells = [fused_cell(by_case[name][case]) if case in by_case[name] else "" for name in names]
        rows.append(f"| {shown_op} | {m}, {n}, {k} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def fused_goals(runs: dict[str, dict]) -> str:
    """Each run against the fused ops' goals, one line per run, computed from its results.

    Example:
        >>> print(fused_goals(load()["fused"]))
    """
    lines = []
    for name, run in runs.items():
        results = run["results"]
        lowest = min(results, key=lambda r: r["speedup"]["auto"])
        farthest = min(results, key=_share_of_fastest)
        scatter = [r for r in results if r["op"] == "gemm_all_scatter" and r["M"] >= 4096]
        slowest = min(scatter, key=lambda r: r["speedup"]["auto"])
        text = (
            f"* {_label(name)}: `auto` never below {lowest['speedup']['auto']:.2f}x ({_case(lowest)}); "
            f"at worst {100 * (1 - _share_of_fastest(farthest)):.1f}% behind the fastest style "
            f"({_case(farthest)}); "
            f"GEMM + all-scatter at M >= 4096 from {slowest['speedup']['auto']:.2f}x ({_case(slowest)}, "
            f"ceiling {slowest['overlap_ceiling']:.2f}x)"
        )
        correct = all(r["correct"] for r in results)
        lines.append(text + ("; every result correct" if correct else "; NOT every result correct"))
    return "\n".join(lines)


def _fused_section(runs: dict[str, dict]) -> str:
    return f"""## Fused ops (`ctx.ops`) against cuBLAS + NCCL

`benchmarks/fused_ops.py` at its default shapes (bf16; M, N, K global), 50 calls in each of
5 shuffled trials, median. Each cell is the style `variant="auto"` picked and its speedup
over cuBLAS then NCCL; where another style of the same run was at least 0.5% faster, it is
named. How `auto` picks, and the ceiling hiding all communication would give:
[fused.md](fused.md).

{fused_table(runs)}

Each run against the goals (never below 0.95x; `auto` within 3% of the fastest style;
GEMM + all-scatter at least 1.3x from M = 4096):

{fused_goals(runs)}

{_source(*runs.values())}
"""


# ---------------------------------------------------------------- collectives
def _collective_cells(run: dict, sizes, cell) -> list[str]:
    by_key = {(r["collective"], r["bytes"]): r for r in run["summary"]}
    collectives = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
    rows = []
    for name in collectives:
        rows.append(f"| {name} | " + " | ".join(cell(by_key[(name, size)], run) for size in sizes) + " |")
    return rows


def _bus_bandwidth(run: dict, collective: str, nbytes: int, impl: str) -> float:
    row = next(
        r for r in run["rows"] if (r["collective"], r["bytes"], r["impl"]) == (collective, nbytes, impl)
    )
    return row["graph_busbw_gbs"]


def _collectives_section(small: dict, large: dict) -> str:
    small_sizes = sorted({r["bytes"] for r in small["summary"]})
    large_sizes = [s for s in sorted({r["bytes"] for r in large["summary"]}) if s > small_sizes[-1]]
    header = "| collective | " + " | ".join(_size(s) for s in small_sizes) + " |"
    rule = "| --- |" + " --- |" * len(small_sizes)
    small_rows = _collective_cells(
        small, small_sizes, lambda r, _: f"{r['eager_speedup']:.2f}x / {r['graph_speedup']:.2f}x"
    )

    def large_cell(result: dict, run: dict) -> str:
        text = f"{result['graph_speedup']:.2f}x"
        if result["bytes"] == large_sizes[-1]:
            ours = _bus_bandwidth(run, result["collective"], result["bytes"], "iris")
            theirs = _bus_bandwidth(run, result["collective"], result["bytes"], "nccl")
            text += f" ({ours:.0f} / {theirs:.0f} GB/s)"
        return text

    large_header = "| collective | " + " | ".join(_size(s) for s in large_sizes) + " |"
    large_rule = "| --- |" + " --- |" * len(large_sizes)
    large_rows = _collective_cells(large, large_sizes, large_cell)
    correct = all(r["correct"] for r in small["summary"] + large["summary"])
    return f"""## Collectives (`ctx.ccl`) against NCCL

`benchmarks/collectives.py`, {small["dtype"]}, {small["world_size"]} ranks; the speedup is NCCL's
time over Iris's for the same call on the same inputs, the median of the trials, ranks
aligned by one call before each trial's clock starts. {"Every result matched NCCL's." if correct else "NOT every result matched."}

Up to {_size(small_sizes[-1])}, eager / CUDA graph:

{header}
{rule}
{chr(10).join(small_rows)}

{_source(small)}

From {_size(large_sizes[0])}, CUDA graph (at {_size(large_sizes[-1])}: Iris's and NCCL's bus bandwidth):

{large_header}
{large_rule}
{chr(10).join(large_rows)}

{_source(large)}
"""


# ---------------------------------------------------------------- bandwidth
def _put_get_section(four: dict, two: dict) -> str:
    patterns = [
        ("one sender, one receiver", "uni", "nccl-uni", "send/recv"),
        ("every rank to its neighbour (ring)", "one", "nccl-sendrecv", "send/recv ring"),
        ("every rank to every peer", "all", "nccl-allgather", "all_gather"),
    ]
    rows = []
    for run in (four, two):
        last = run["results"][-1]
        for name, suffix, nccl, how in patterns:
            put, get = last[f"put-{suffix}"]["GBps"], last[f"get-{suffix}"]["GBps"]
            machine = f"{run['world_size']} x H200, {_size(last['bytes'])}"
            rows.append(f"| {machine} | {name} | {put:.0f} | {get:.0f} | {last[nccl]['GBps']:.0f} ({how}) |")
    return f"""## Put and get bandwidth

`benchmarks/put_get_bandwidth.py`: GB/s per rank for the largest transfer, max over ranks,
NCCL through torch.distributed in the same run.

| machine, transfer | pattern | Iris put | Iris get | NCCL |
| --- | --- | --- | --- | --- |
{chr(10).join(rows)}

{_source(four, two)}
"""


def _copy_engine_section(run: dict) -> str:
    rows = [
        f"| {r['mib_per_peer']} MiB | {r['gbs']['copy_engine']:.0f} | {r['gbs']['iris_sm']:.0f} | "
        f"{r['gbs']['nccl']:.0f} |"
        for r in run["rows"]
    ]
    return f"""## Copy engines

`benchmarks/copy_engine.py`: every rank sends the same bytes to each peer at once, GB/s per
rank: through `ctx.copy_engine` (DMA, no SM), SM-issued puts (`ctx.ccl.all_gather`), NCCL.

| per peer | copy engines | SM puts | NCCL |
| --- | --- | --- | --- |
{chr(10).join(rows)}

{_source(run)}
"""


# ---------------------------------------------------------------- tracing
def _tracing_row(machine: str, run: dict) -> str:
    results = {r["kernel"]: r for r in run["results"]}
    gemm, put = results["gemm+all-scatter"], results["put"]
    cells = [
        f"{gemm['untraced']['us']:.1f} us, {_pct(gemm['disabled']['overhead_pct'])}, "
        f"{_pct(gemm['enabled']['overhead_pct'])}",
        f"{_pct(put['disabled']['overhead_pct'])}, {_pct(put['enabled']['overhead_pct'])}",
    ]
    for shape in ("4096x8192x8192", "16384x8192x8192"):
        op = next((r for k, r in results.items() if k.startswith(f"ctx.ops {shape}")), None)
        if op is None:
            cells.append("")
            continue
        style = op["kernel"].split("(", 1)[1].rstrip(")")
        cells.append(f"{style}: {op['untraced']['us']:.1f} us, {_pct(op['enabled']['overhead_pct'])}")
    barrier = results.get("ctx.device_barrier")
    cells.append(
        f"{barrier['untraced']['us']:.1f} us, {_pct(barrier['enabled']['overhead_pct'])}" if barrier else ""
    )
    return f"| {_label(machine)} | " + " | ".join(cells) + " |"


def _tracing_section(runs: dict[str, dict], one_rank: dict) -> str:
    rows = [_tracing_row(machine, run) for machine, run in runs.items()]
    single = {r["kernel"]: r for r in one_rank["results"]}
    gemm, put = single["gemm+all-scatter"], single["put"]
    dropped_none = all(run.get("no_events_dropped", True) for run in runs.values())
    return f"""## Tracing cost

`benchmarks/tracing_overhead.py`: each kernel untraced, with tracing compiled in but off
(*disabled*) and recording (*enabled*), 100 calls in each of 12 trials, modes shuffled
per trial, median, max over ranks. The GEMM + all-scatter is the benchmark's own (bf16
4096^3); the ring put moves 256 MiB in 16 KiB ops; `ctx.ops` is the library's
`matmul_all_gather` at global M x N x K in the style `auto` picks (it compiles its traced
variant only while tracing is on: no disabled mode). {"No run dropped an event." if dropped_none else "Some run DROPPED events."}
What the costs are made of: [tracing.md](tracing.md#cost).

| machine | GEMM + all-scatter: untraced, disabled, enabled | ring put: disabled, enabled | `ctx.ops` 4096 x 8192 x 8192: style, untraced, enabled | `ctx.ops` 16384 x 8192 x 8192: style, untraced, enabled | `ctx.device_barrier`: untraced, enabled |
| --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}
{_sampled_runs_sentence(runs)}
One rank on one H200: GEMM + store {gemm["untraced"]["us"]:.1f} us, disabled {_pct(gemm["disabled"]["overhead_pct"])}, enabled {_pct(gemm["enabled"]["overhead_pct"])}; a copy of 256 MiB to itself in 16 KiB ops, disabled {_pct(put["disabled"]["overhead_pct"])}, enabled {_pct(put["enabled"]["overhead_pct"])} ({put["events_per_second"] / 1e6:.0f} M events/s, the harshest case there is).{_sampled_sentence(one_rank, gemm, put)}

{_source(*runs.values(), one_rank)}
"""


def _sampled_runs_sentence(runs: dict[str, dict]) -> str:
    parts = []
    for machine, run in runs.items():
        gemm = {r["kernel"]: r for r in run["results"]}["gemm+all-scatter"]
        if "sampled" not in gemm:  # runs from before sampling existed
            continue
        own_build = 100 * (gemm["sampled"]["us"] / gemm["disabled"]["us"] - 1)
        parts.append(
            f"{_label(machine)} {_pct(gemm['sampled']['overhead_pct'])} (against the same build with "
            f"tracing off, {_pct(own_build)}; untraced again {_pct(gemm['untraced_again']['overhead_pct'])})"
        )
    if not parts:
        return ""
    period = next(run["sample_period"] for run in runs.values() if "sample_period" in run)
    return (
        f"\nSampled, one program in {period} recording (`enable(sample=...)`), GEMM + all-scatter "
        f"against untraced: {'; '.join(parts)}.\n"
    )


def _sampled_sentence(run: dict, gemm: dict, put: dict) -> str:
    # Runs from before sampling existed have no sampled mode.
    if "sampled" not in gemm:
        return ""
    return (
        f" Sampled, one program in {run['sample_period']} recording (`enable(sample=...)`): GEMM + store "
        f"{_pct(gemm['sampled']['overhead_pct'])}, the copy {_pct(put['sampled']['overhead_pct'])} (each recorded "
        "program records every op it issues, and the recording ones still end last); the same "
        f"kernel untraced again read {_pct(gemm['untraced_again']['overhead_pct'])}, the noise."
    )


# ---------------------------------------------------------------- the rest
def _gemm_section(run: dict) -> str:
    def spread(rows, key):
        values = [r["of_cublas"][key] for r in rows]
        return f"{min(values):.3f}-{max(values):.3f}x"

    small = [r for r in run["results"] if r["M"] <= 1024]
    large = [r for r in run["results"] if r["M"] > 1024]
    return f"""## The plain GEMM against cuBLAS

`benchmarks/gemm.py`, one GPU, {len(run["results"])} shapes: `iris.ops.matmul.matmul_launch` with the tiles
`iris.ops.config.gemm_config` picks, as a share of cuBLAS's speed (above 1: faster).

| loads | M = 1024 | M >= 4096 |
| --- | --- | --- |
| tensor descriptors (TMA; the plain GEMM) | {spread(small, "auto")} | {spread(large, "auto")} |
| pointer loads (the fused kernels' GEMM) | {spread(small, "auto, pointer loads")} | {spread(large, "auto, pointer loads")} |

{_source(run)}
"""


def _clock_section(run: dict) -> str:
    rows = [
        f"| {p['peer']} | {p['offset_us']:.0f} us | {p['drift_ppm']:+.2f} ppm | "
        f"{p['causality_violations_aligned']} of {p['rounds']} | {p['causality_violations_raw']} of {p['rounds']} |"
        for p in run["peers"]
    ]
    return f"""## Clock alignment

`benchmarks/clock_alignment.py`: each rank's `%globaltimer` against rank 0's, fitted from
the ping-pongs taken at `enable()` and `collect()`; a violation is a wait that ends before
the signal that released it.

| rank | offset | drift | violations, aligned | violations, raw clocks |
| --- | --- | --- | --- | --- |
{chr(10).join(rows)}

{_source(run)}
"""


def _export_section(small: dict, large: dict) -> str:
    rows = []
    for run in (small, large):
        chrome = run.get("chrome_json")
        json_speed = f"{chrome['events_per_second'] / 1e6:.2f} M events/s" if chrome else "not timed"
        rows.append(
            f"| {run['events'] / 1e6:g} M | {run['perfetto']['events_per_second'] / 1e6:.2f} M events/s "
            f"({run['perfetto']['file_mib']:.0f} MiB) | {json_speed} |"
        )
    return f"""## Trace export speed

`benchmarks/export_speed.py`, one CPU core, waits' splits and flows included.

| events | Perfetto | Chrome JSON |
| --- | --- | --- |
{chr(10).join(rows)}

{_source(small, large)}
"""


def _shared_section(two: dict, four: dict) -> str:
    rows = [
        f"| {run['world_size']} ranks, 1 GPU | {run['results']['round_trip_us']:.0f} us | "
        f"{run['results']['device_barrier_us']:.0f} us | {run['results']['all_reduce_4k_us']:.0f} us |"
        for run in (two, four)
    ]
    return f"""## Ranks sharing one GPU

`benchmarks/shared_gpu.py` (`IRIS_RANKS_PER_GPU`): kernels of different processes take turns
on a GPU, so every hand-over between ranks costs a time slice. For correctness runs,
traces and teaching, never for timings.

| ranks | flag round trip | `ctx.device_barrier()` | `ctx.ccl.all_reduce`, 4 KiB |
| --- | --- | --- | --- |
{chr(10).join(rows)}

{_source(two, four)}
"""


def page(records: dict) -> str:
    """docs/performance.md, whole.

    Example:
        >>> page(load()).splitlines()[0]
        '# Performance: the results of record'
    """
    sections = [
        _fused_section(records["fused"]),
        _collectives_section(records["collectives_small"], records["collectives"]),
        _put_get_section(records["put_get"], records["put_get_2"]),
        _copy_engine_section(records["copy_engine"]),
        _tracing_section(records["tracing"], records["tracing_1rank"]),
        _gemm_section(records["gemm"]),
        _clock_section(records["clock"]),
        _export_section(records["export_1M"], records["export_10M"]),
        _shared_section(records["shared_2"], records["shared_4"]),
    ]
    head = """# Performance: the results of record

Every figure here is printed by `python benchmarks/records.py` from the files of
`benchmarks/results/` (each holds the command that made it and the device), and
`tests/test_docs.py` keeps this page equal to what it prints. Timings ran one rank per
GPU, the same fixed number of calls on every rank, max over ranks, every result checked
against torch or NCCL. Why the defaults are what they are: [design.md](design.md).
"""
    return "\n".join([head, *sections]).rstrip("\n") + "\n"


def summary(records: dict) -> str:
    """The README's block: one line per area, with the range of its table of record.

    Example:
        >>> print(summary(load()))
    """
    fused = [r["speedup"]["auto"] for run in records["fused"].values() for r in run["results"]]
    small, large = records["collectives_small"]["summary"], records["collectives"]["summary"]
    graph = [r["graph_speedup"] for r in small] + [
        r["graph_speedup"] for r in large if r["bytes"] > max(s["bytes"] for s in small)
    ]
    above = sum(value >= 1.0 for value in graph)
    tracing = {m: {r["kernel"]: r for r in run["results"]} for m, run in records["tracing"].items()}
    gemm = [t["gemm+all-scatter"]["enabled"]["overhead_pct"] for t in tracing.values()]
    ops = [
        r["enabled"]["overhead_pct"]
        for t in tracing.values()
        for k, r in t.items()
        if k.startswith("ctx.ops")
    ]
    last = records["put_get"]["results"][-1]
    rows = [
        "| what | against | result | where |",
        "| --- | --- | --- | --- |",
        f"| fused GEMM + communication (`ctx.ops`, `auto`), 4 ops x 6 shapes | cuBLAS + NCCL | "
        f"{min(fused):.2f}-{max(fused):.2f}x on 4 and 2 x H200 and H100 | "
        "[performance.md](docs/performance.md#fused-ops-ctxops-against-cublas--nccl) |",
        f"| collectives (`ctx.ccl`), 5 kinds, 1 KiB-256 MiB, CUDA graphs | NCCL | "
        f"{min(graph):.2f}-{max(graph):.2f}x, {above} of {len(graph)} cells at or above 1.0x, 4 x H200 | "
        "[performance.md](docs/performance.md#collectives-ctxccl-against-nccl) |",
        f"| one-to-one put / get, {_size(last['bytes'])} | NCCL send/recv | "
        f"{last['put-uni']['GBps']:.0f} / {last['get-uni']['GBps']:.0f} GB/s against "
        f"{last['nccl-uni']['GBps']:.0f}, 4 x H200 | [performance.md](docs/performance.md#put-and-get-bandwidth) |",
        f"| tracing on: the benchmark's GEMM + all-scatter / `ctx.ops` | untraced | "
        f"{min(gemm):+.1f}% to {max(gemm):+.1f}% / {min(ops):+.1f}% to {max(ops):+.1f}%, four machines | "
        "[performance.md](docs/performance.md#tracing-cost) |",
    ]
    return "\n".join([BEGIN, *rows, END])


# ---------------------------------------------------------------- upstream's own files
#: What a run of ``scripts/upstream_tests.py`` keeps of each result in a file of record: counts
#: and the failing tests' names, not the output's last lines nor the benchmark files' rows.
UPSTREAM_KEPT = (
    "file", "example", "benchmark", "ranks", "seconds", "returncode", "ok", "passed", "failed", "errors",
    "skipped", "failures", "failed_validation", "combinations",
)  # fmt: skip


def keep_upstream(runs: list[dict], device: str, upstream: str, packages: list[str] = ()) -> dict:
    """A file of record from runs of ``scripts/upstream_tests.py`` (their results JSON, as loaded).

    Each run keeps its command, this package's commit and its results, cut to
    :data:`UPSTREAM_KEPT`. The commit is the run's own, unless the run has none (runs older
    than the runner's ``package`` field) or says ``<commit>+``: its tree had changes, as a GPU
    machine's copy of a working tree newer than the commit it knows. Those take it from
    ``packages``, one for all runs or one per run.

    Example:
        >>> runs = [json.load(open(path)) for path in ("out/a.json", "out/b.json")]
        >>> record = keep_upstream(runs, "2 x H200 (nvidia-h200-x2), one GPU per rank", "abd3f2ad")
    """
    if len(packages) not in (0, 1, len(runs)):
        raise ValueError(
            f"records: give one package commit, or one per run ({len(runs)}), not {len(packages)}"
        )
    kept = []
    for index, run in enumerate(runs):
        commit = run.get("package")
        if not commit or commit.endswith("+"):
            if not packages:
                said = f"its tree had changes from {commit[:-1]}" if commit else "no package commit"
                raise ValueError(f"records: a run has {said}: give --package")
            commit = packages[index % len(packages)]
        results = [{k: r[k] for k in UPSTREAM_KEPT if k in r} for r in run["results"]]
        for result in results:
            if "failures" in result:  # "path::test[id] Assert...": the test's name alone
                result["failures"] = [name.split(" ")[0] for name in result["failures"]]
        kept.append(
            {
                "package": commit,
                "command": run["command"],
                "vendor_changes": run["vendor_changes"],
                "results": results,
            }
        )
    return {
        "device": device,
        "upstream": upstream,
        "command": " ; ".join(run["command"] for run in kept),
        "runs": kept,
    }


def _results(record: dict) -> list[dict]:
    return [result for run in record["runs"] for result in run["results"]]


def _packages(record: dict) -> str:
    return " and ".join(dict.fromkeys(f"`{run['package']}`" for run in record["runs"]))


def _counts(rows: list[dict]) -> str:
    total = {key: sum(r.get(key, 0) for r in rows) for key in ("passed", "failed", "errors", "skipped")}
    return " | ".join(str(total[key]) for key in ("passed", "failed", "errors", "skipped"))


def upstream_block(records: dict) -> str:
    """docs/upstream.md's block: per machine, upstream's test folders, failing files, examples and
    benchmark files.

    Example:
        >>> print(upstream_block(load()))
    """
    machines = records["upstream"]
    # The most GPUs first: the run at the most ranks leads.
    order = sorted(machines, key=lambda machine: (-int(machine.rsplit("x", 1)[-1]), machine))
    sections = [_upstream_section(machines[machine]) for machine in order]
    return "\n".join([UPSTREAM_BEGIN, "\n\n".join(sections), UPSTREAM_END])


def _upstream_section(kinds: dict) -> str:
    tests = kinds["tests"]
    results = _results(tests)
    folders = sorted({r["file"].split("/")[1] for r in results})
    rows = [
        "| folder | files | whole | passed | failed | errors (import) | skipped |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for folder in folders:
        mine = [r for r in results if r["file"].split("/")[1] == folder]
        whole = sum(r["returncode"] == 0 for r in mine)
        rows.append(f"| {folder} | {len(mine)} | {whole} | {_counts(mine)} |")
    whole = sum(r["returncode"] == 0 for r in results)
    rows.append(f"| all | {len(results)} | {whole} | {_counts(results)} |")
    failing = [
        f"| `{r['file'].removeprefix('tests/')}` | {r.get('passed', 0)} | {r.get('failed', 0)} | "
        f"{r.get('errors', 0)} |"
        for r in sorted(results, key=lambda r: r["file"])
        if r["returncode"] != 0
    ]
    records = [kinds[kind] for kind in UPSTREAM_KINDS if kind in kinds]
    changes = sorted({run["vendor_changes"] for record in records for run in record["runs"]})
    ranks = sorted({r["ranks"] for r in results})
    lines = [
        f"Upstream at `{tests['upstream']}`, this package at {_packages(tests)}, {tests['device']}, "
        f"{' and '.join(map(str, ranks))} ranks, one launch per file "
        f"({' or '.join(map(str, changes))} vendor changes):",
        "",
        *rows,
        "",
        "Files that did not pass whole (why: the table below):",
        "",
        "| file | passed | failed | errors |",
        "| --- | --- | --- | --- |",
        *failing,
    ]
    others = []
    if "examples" in kinds:
        runs = _results(kinds["examples"])
        others.append(
            f"Upstream's application examples at the same rank count: {sum(r['ok'] for r in runs)} of "
            f"{len(runs)} ran and validated (this package at {_packages(kinds['examples'])})."
            + _not_ok(runs, "example")
        )
    if "benchmarks" in kinds:
        files = _results(kinds["benchmarks"])
        others.append(
            f"Its benchmark files: {sum(r['ok'] for r in files)} of {len(files)} ran, "
            f"{sum(r['combinations'] for r in files)} combinations of their axes, "
            f"{sum(r['skipped'] for r in files)} skipped by the files themselves."
            + _not_ok(files, "benchmark")
        )
    if others:
        lines += ["", " ".join(others)]
    return "\n".join([*lines, "", _source(*records)])


def _not_ok(results: list[dict], key: str) -> str:
    failed = [f"`{r[key]}`" for r in results if not r["ok"]]
    return f" Stopped with an error: {', '.join(failed)} (why: below)." if failed else ""


def _block_replaced(text: str, block: str, begin: str, end: str) -> str:
    before, rest = text.split(begin, 1)
    _, after = rest.split(end, 1)
    return before + block + after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the docs differ from the files")
    parser.add_argument(
        "--keep", nargs="+", metavar=("NAME", "RUN"),
        help="write benchmarks/results/NAME.json from runs of scripts/upstream_tests.py (their --results files)",
    )  # fmt: skip
    parser.add_argument("--device", help="with --keep: the machine, as the docs name it")
    parser.add_argument("--upstream", help="with --keep: upstream's commit the runs tested")
    parser.add_argument(
        "--package",
        nargs="+",
        default=[],
        help="with --keep: this package's commit (one, or one per run) for runs that do not say "
        "or say <commit>+ (a tree with changes)",
    )
    options = parser.parse_args(argv)
    if options.keep:
        name, paths = options.keep[0], options.keep[1:]
        if not paths or not options.device or not options.upstream:
            parser.error("--keep NAME RUN [RUN ...] needs --device and --upstream")
        if not re.fullmatch(r"upstream_(tests|examples|benchmarks)_\w+", name):
            parser.error(
                f"--keep {name!r}: name a file of record upstream_<tests|examples|benchmarks>_<machine>"
            )
        runs = []
        for path in paths:
            try:
                with open(path) as handle:
                    runs.append(json.load(handle))
            except (OSError, ValueError) as error:
                parser.error(f"--keep: cannot read {path} as a run of scripts/upstream_tests.py ({error})")
        try:
            record = keep_upstream(runs, options.device, options.upstream, options.package)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            parser.error(f"--keep: not a run of scripts/upstream_tests.py, or incomplete ({error!r})")
        with files.replace_atomically(os.path.join(RESULTS, f"{name}.json"), "w") as handle:
            handle.write(json.dumps(record, indent=1) + "\n")
    records = load()
    wanted = {PAGE: page(records)}
    with open(README) as handle:
        wanted[README] = _block_replaced(handle.read(), summary(records), BEGIN, END)
    with open(UPSTREAM_PAGE) as handle:
        wanted[UPSTREAM_PAGE] = _block_replaced(
            handle.read(), upstream_block(records), UPSTREAM_BEGIN, UPSTREAM_END
        )
    stale = []
    for path, text in wanted.items():
        current = ""
        if os.path.exists(path):
            with open(path) as handle:
                current = handle.read()
        if current != text:
            stale.append(path)
            if not options.check:
                with files.replace_atomically(path, "w") as handle:
                    handle.write(text)
    if options.check and stale:
        print(f"records: out of date: {', '.join(stale)} (run python benchmarks/records.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
