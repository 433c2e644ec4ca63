"""What changed between two traced runs: ``iris-trace diff RUN_A RUN_B``.

Two runs of the same program (before and after a change, on two machines, at two sizes)
are compared at three levels, each as ``A -> B`` with the change in percent:

* **per rank and op** (``put`` on rank 1, ``gemm tile`` on rank 0, ...): events, total
  and mean time, and bytes moved;
* **per rank**: the report's compute, communication, wait, overlap and stall time
  (:mod:`iris_trace.analysis`), and per SM its stall time;
* **the critical path** (:func:`iris_trace.attribution.critical_path`, the chain that set
  each run's end): where it ends (rank, SM, op) and how its time splits by rank and op; the
  path *moved* when it ends on another rank or SM, or another op takes the largest share.

A *finding* is a row whose time changed by at least ``threshold`` (default 10%) and by at
least ``min_ns`` (default 1 us), largest change first, plus the window and the critical
path when they moved: one line each, so that a regression reads as a short list.
Emulated runs time the interpreter, not a GPU: their differences say little (a note says so).

Example:
    >>> from iris_trace import Trace, diff
    >>> result = diff.compare(Trace.from_files(before), Trace.from_files(after))
    >>> print("\\n".join(result.findings))
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from .analysis import analyze_trace
from .attribution import critical_path
from .schema import event_name

#: The per-rank quantities compared (the report's definitions).
RANK_FIELDS = ("compute_ns", "comm_ns", "wait_ns", "overlap_ns", "stall_ns")


@dataclass
class Difference:
    """The comparison of two runs: rows per (rank, op), per rank and per SM, the critical paths, findings.

    Example:
        >>> result.findings[0]
        'rank 1 put: total 412.0 us -> 655.3 us (+59%), mean 4.0 us -> 6.4 us, 103 -> 103 events'
    """

    window_ns: tuple[int, int]
    ops: list[dict] = field(default_factory=list)
    ranks: list[dict] = field(default_factory=list)
    sms: list[dict] = field(default_factory=list)
    paths: tuple[dict, dict] = field(default_factory=lambda: ({}, {}))
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "window_ns": list(self.window_ns),
            "findings": list(self.findings),
            "notes": list(self.notes),
            "ops": self.ops,
            "ranks": self.ranks,
            "sms": self.sms,
            "critical_paths": list(self.paths),
        }

    def to_json(self, path: str) -> None:
        """Write :meth:`to_dict` to ``path`` (atomically)."""
        from . import files

        with files.replace_atomically(path, "w") as handle:
            json.dump(self.to_dict(), handle, indent=2)

    def format(self) -> str:
        """The findings, then the per-(rank, op) table, as text."""
        lines = [f"window: {_us(self.window_ns[0])} -> {_us(self.window_ns[1])} ({_change(*self.window_ns)})"]
        lines += [f"note: {note}" for note in self.notes]
        lines += ["findings:"] + ([f"  {line}" for line in self.findings] or ["  none above the threshold"])
        lines.append("per rank and op (total time A -> B, events A -> B):")
        for row in self.ops:
            lines.append(
                f"  rank {row['rank']} {row['op']:<20s} {_us(row['total_ns_a']):>12s} -> "
                f"{_us(row['total_ns_b']):>12s} {_change(row['total_ns_a'], row['total_ns_b']):>7s}   "
                f"{row['events_a']} -> {row['events_b']}"
            )
        return "\n".join(lines)


def compare(trace_a, trace_b, threshold: float = 0.10, min_ns: int = 1000) -> Difference:
    """Compare run ``trace_a`` (before) with ``trace_b`` (after); see the module docstring.

    Args:
        trace_a, trace_b: merged :class:`iris_trace.Trace` objects.
        threshold: smallest relative change reported as a finding (0.10: 10%).
        min_ns: smallest absolute change reported as a finding.

    Example:
        >>> print(compare(before, after).format())
    """
    if not threshold >= 0 or min_ns < 0:
        raise ValueError(f"threshold and min_ns must be non-negative, got {threshold} and {min_ns}")
    windows = (_window(trace_a.events), _window(trace_b.events))
    result = Difference(window_ns=windows)
    if trace_a.world_size != trace_b.world_size:
        result.notes.append(
            f"the runs have {trace_a.world_size} and {trace_b.world_size} ranks: ranks present in one only "
            "compare with nothing"
        )
    periods = (getattr(trace_a, "sample_period", 1), getattr(trace_b, "sample_period", 1))
    if periods != (1, 1):
        result.notes.append(
            f"run A recorded one program in {periods[0]} and run B one in {periods[1]} (enable(sample=...)): "
            "event counts, bytes and totals compare what was recorded, not what ran"
        )
    if getattr(trace_a, "emulated", False) or getattr(trace_b, "emulated", False):
        result.notes.append(
            "an emulated run times Triton's interpreter, not a GPU: its differences say little"
        )
    result.ops = _op_rows(trace_a, trace_b)
    reports = (analyze_trace(trace_a), analyze_trace(trace_b))
    result.ranks = _rank_rows(*reports)
    result.sms = _sm_rows(*reports)
    result.paths = (_path_summary(trace_a), _path_summary(trace_b))

    # The window and the critical path first, then every row that moved, largest change first.
    head = []
    if _notable(*windows, threshold, min_ns):
        head.append(f"window: {_us(windows[0])} -> {_us(windows[1])} ({_change(*windows)})")
    moved = _path_moved(*result.paths)
    if moved:
        head.append(moved)
    rows: list[tuple[int, str]] = []
    for row in result.ops:
        a, b = row["total_ns_a"], row["total_ns_b"]
        if _notable(a, b, threshold, min_ns):
            mean = f"mean {_us(row['mean_ns_a'])} -> {_us(row['mean_ns_b'])}"
            events = f"{row['events_a']} -> {row['events_b']} events"
            total = f"total {_us(a)} -> {_us(b)} ({_change(a, b)})"
            rows.append((abs(b - a), f"rank {row['rank']} {row['op']}: {total}, {mean}, {events}"))
    for row in result.ranks:
        for name in ("stall_ns", "overlap_ns"):
            a, b = row[f"{name}_a"], row[f"{name}_b"]
            if _notable(a, b, threshold, min_ns):
                rows.append(
                    (abs(b - a), f"rank {row['rank']} {name[:-3]}: {_us(a)} -> {_us(b)} ({_change(a, b)})")
                )
    result.findings = head + [text for _, text in sorted(rows, key=lambda item: -item[0])]
    return result


def plot(result: Difference, path: str) -> str:
    """A picture of the difference: total time per rank and op, A beside B (PNG).

    Example:
        >>> plot(compare(before, after), "diff.png")
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from . import files

    rows = [row for row in result.ops if row["total_ns_a"] or row["total_ns_b"]]
    labels = [f"rank {row['rank']} {row['op']}" for row in rows]
    height = max(2.5, 0.32 * len(rows) + 1.2)
    figure, axis = plt.subplots(figsize=(9, height))
    positions = np.arange(len(rows))
    axis.barh(positions - 0.2, [row["total_ns_a"] / 1000 for row in rows], 0.4, label="A (before)")
    axis.barh(positions + 0.2, [row["total_ns_b"] / 1000 for row in rows], 0.4, label="B (after)")
    axis.set_yticks(positions, labels)
    axis.invert_yaxis()
    axis.set_xlabel("total time in the op (us)")
    axis.set_title(f"window {_us(result.window_ns[0])} -> {_us(result.window_ns[1])} "
                   f"({_change(*result.window_ns)})")  # fmt: skip
    axis.legend(loc="lower right")
    figure.tight_layout()
    with files.replacing(path) as partial:
        figure.savefig(partial, format="png", dpi=110)
    plt.close(figure)
    return path


# ---------------------------------------------------------------------------- rows
def _window(events: np.ndarray) -> int:
    if len(events) == 0:
        return 0
    return int(np.maximum(events["end_ns"], events["start_ns"]).max() - events["start_ns"].min())


def _op_stats(trace) -> dict[tuple[int, str], tuple[int, int, int]]:
    """(rank, op name) -> (events, total ns, bytes)."""
    events = trace.events
    stats: dict[tuple[int, str], list[int]] = {}
    durations = np.maximum(events["end_ns"] - events["start_ns"], 0)
    for rank, event_id, duration, nbytes in zip(
        events["cur_rank"].tolist(), events["event_id"].tolist(), durations.tolist(),
        events["payload_bytes"].tolist(), strict=True,
    ):  # fmt: skip
        entry = stats.setdefault((rank, event_name(event_id, trace.scope_names)), [0, 0, 0])
        entry[0] += 1
        entry[1] += duration
        entry[2] += nbytes
    return {key: tuple(value) for key, value in stats.items()}


def _op_rows(trace_a, trace_b) -> list[dict]:
    stats_a, stats_b = _op_stats(trace_a), _op_stats(trace_b)
    rows = []
    for key in sorted(set(stats_a) | set(stats_b)):
        (count_a, total_a, bytes_a), (count_b, total_b, bytes_b) = (
            stats_a.get(key, (0, 0, 0)), stats_b.get(key, (0, 0, 0))
        )  # fmt: skip
        rows.append({
            "rank": key[0], "op": key[1], "events_a": count_a, "events_b": count_b,
            "total_ns_a": total_a, "total_ns_b": total_b,
            "mean_ns_a": total_a // max(count_a, 1), "mean_ns_b": total_b // max(count_b, 1),
            "bytes_a": bytes_a, "bytes_b": bytes_b,
        })  # fmt: skip
    return rows


def _rank_rows(report_a, report_b) -> list[dict]:
    by_rank = (
        {row["rank"]: row for row in report_a.per_rank},
        {row["rank"]: row for row in report_b.per_rank},
    )
    rows = []
    for rank in sorted(set(by_rank[0]) | set(by_rank[1])):
        row = {"rank": rank}
        for name in RANK_FIELDS:
            row[f"{name}_a"] = int(by_rank[0].get(rank, {}).get(name, 0))
            row[f"{name}_b"] = int(by_rank[1].get(rank, {}).get(name, 0))
        rows.append(row)
    return rows


def _sm_rows(report_a, report_b) -> list[dict]:
    keyed = [{(row["rank"], row["cu_id"]): row for row in report.per_sm} for report in (report_a, report_b)]
    rows = []
    for key in sorted(set(keyed[0]) | set(keyed[1])):
        a, b = keyed[0].get(key, {}), keyed[1].get(key, {})
        rows.append({
            "rank": key[0], "sm": key[1], "stall_ns_a": int(a.get("stall_ns", 0)),
            "stall_ns_b": int(b.get("stall_ns", 0)), "busy_ns_a": int(a.get("busy_ns", 0)),
            "busy_ns_b": int(b.get("busy_ns", 0)),
        })  # fmt: skip
    return rows


def _path_summary(trace) -> dict:
    """Where a run's critical path ends and how its time splits by (rank, op)."""
    events = trace.events
    chain = critical_path(events)
    if not chain:
        return {}
    last = events[chain[-1]]
    shares: dict[str, int] = {}
    for index in chain:
        event = events[index]
        name = f"rank {int(event['cur_rank'])} {event_name(int(event['event_id']), trace.scope_names)}"
        shares[name] = shares.get(name, 0) + max(int(event["end_ns"]) - int(event["start_ns"]), 0)
    return {
        "ends_on": {
            "rank": int(last["cur_rank"]),
            "sm": int(last["cu_id"]),
            "op": event_name(int(last["event_id"]), trace.scope_names),
        },
        "time_by_step": dict(sorted(shares.items(), key=lambda item: -item[1])),
    }


def _path_moved(path_a: dict, path_b: dict) -> str | None:
    if not path_a or not path_b:
        return None
    end_a, end_b = path_a["ends_on"], path_b["ends_on"]
    top_a, top_b = next(iter(path_a["time_by_step"])), next(iter(path_b["time_by_step"]))
    where_a = f"rank {end_a['rank']} SM {end_a['sm']} ({end_a['op']})"
    where_b = f"rank {end_b['rank']} SM {end_b['sm']} ({end_b['op']})"
    if (end_a["rank"], end_a["sm"]) != (end_b["rank"], end_b["sm"]) or top_a != top_b:
        return (
            f"the critical path moved: it ended on {where_a}, most of it in {top_a}; now on {where_b}, "
            f"most of it in {top_b}"
        )
    return None


def _notable(a: int, b: int, threshold: float, min_ns: int) -> bool:
    change = abs(b - a)
    return change >= min_ns and change >= threshold * max(abs(a), 1)


def _change(a: int, b: int) -> str:
    if a == 0:
        return "new" if b else "0%"
    return f"{(b - a) / a:+.0%}"


def _us(ns: int) -> str:
    return f"{ns / 1000:.1f} us"
