"""The fused ops' table of record in docs/fused.md, printed from the results files it cites.

Each ``benchmarks/results/fused_ops_<machine>.json`` is one run of ``benchmarks/fused_ops.py``
at its default shapes. This prints one Markdown row per op and shape with, for every
machine, the style ``auto`` picked and its speedup over cuBLAS + NCCL, and the fastest
style of the same run where that was another one; then each run against the goals,
computed from its results. Pasting its output keeps the doc's numbers those of the files.

    python scripts/records_table.py [benchmarks/results/fused_ops_h200x4.json ...]
"""

from __future__ import annotations

import json
import os
import sys

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results")
#: The runs of record, in the table's column order.
MACHINES = ("h200x4", "h100x4", "h200x2", "h100x2")
#: The fastest style is named beside ``auto``'s where it was at least this much faster.
SHOWN_GAP = 0.005


def _label(machine: str) -> str:
    # "h200x4" -> "4 x H200"
    card, count = machine.split("x")
    return f"{count} x {card.upper()}"


def _style(result: dict) -> str:
    # The style auto ran, with the GEMM + all-scatter's kind of fused kernel named.
    variant = result["auto_variant"]
    if variant == "fused" and result["op"] == "gemm_all_scatter":
        sharing = result.get("config", {}).get("consumer_warps", 0) > 0
        return "fused (consumers beside the GEMM)" if sharing else "fused (workgroup-specialised)"
    return variant


def cell(result: dict) -> str:
    """``auto``'s style and speedup, and the fastest style where ``auto`` was not it.

    Example:
        >>> cell(run["results"][0])
        'producer_consumer 1.48x'
    """
    best, fastest = _fastest(result)
    text = f"{_style(result)} {result['speedup']['auto']:.2f}x"
    if fastest >= result["speedup"]["auto"] * (1 + SHOWN_GAP):
        text += f" (best: {best} {fastest:.2f}x)"
    return text


def table(runs: dict[str, dict]) -> str:
    """The Markdown table: one row per op and shape, one column per run.

    Example:
        >>> print(table({"h200x4": json.load(open("benchmarks/results/fused_ops_h200x4.json"))}))
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
        cells = [cell(by_case[name][case]) if case in by_case[name] else "" for name in names]
        rows.append(f"| {shown_op} | {m}, {n}, {k} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def goals(runs: dict[str, dict]) -> str:
    """Each run against the goals of docs/fused.md, one line per run, computed from its results.

    Example:
        >>> print(goals({"h200x4": json.load(open("benchmarks/results/fused_ops_h200x4.json"))}))
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


def _fastest(result: dict) -> tuple[str, float]:
    # The fastest style the run timed, and its speedup.
    return max(((k, v) for k, v in result["speedup"].items() if k != "auto"), key=lambda item: item[1])


def _share_of_fastest(result: dict) -> float:
    # ``auto``'s speedup as a share of the fastest style's.
    return result["speedup"]["auto"] / _fastest(result)[1]


def _case(result: dict) -> str:
    return f"{result['op']} {result['M']} x {result['N']} x {result['K']}"


def load_runs(paths: list[str] | None = None) -> dict[str, dict]:
    """The runs in ``paths`` (default: the four of record), by machine name, in that order.

    Example:
        >>> list(load_runs())
        ['h200x4', 'h100x4', 'h200x2', 'h100x2']
    """
    if not paths:
        paths = [os.path.join(RESULTS, f"fused_ops_{machine}.json") for machine in MACHINES]
    runs = {}
    for path in paths:
        name = os.path.basename(path).removeprefix("fused_ops_").removesuffix(".json")
        with open(path) as file:
            runs[name] = json.load(file)
    return runs


def main(paths: list[str]) -> None:
    runs = load_runs(paths)
    print(table(runs))
    print()
    print(goals(runs))


if __name__ == "__main__":
    main(sys.argv[1:])
