"""Merged multi-rank trace to Chrome trace JSON (chrome://tracing, ui.perfetto.dev, Speedscope).

``pid`` is the rank and ``tid`` the SM lane (``cu_id * 64 + lane``; copy-engine
lanes as in ``iris_trace.events.lane_name``), named by metadata events; timestamps
are microseconds with nanosecond decimals; every wait with a known releaser gets a
flow (``s`` on the releasing op, ``f`` bound to the wait); ``metadata`` carries the
same run facts as the Perfetto export. A rank's PyTorch profile
(``ctx.tracing.torch_profiler()``) adds its host threads and CUDA streams as threads with
negative ids (listed above the SMs), its slices (category ``torch``) and an arrow from each
launch to its kernel.
"""

from __future__ import annotations

import json

import numpy as np

from .. import files
from ..events import event_name, lane_name
from ..trace import Trace
from .common import ARGS, WAIT_ARGS, counter_rows, profiles_and_base, trace_metadata, wait_split

LANES_PER_SM = 64


def write_chrome_json(trace: Trace, path: str, chunk_events: int = 1 << 18, progress=None) -> dict:
    """Write ``trace`` to ``path`` as Chrome trace JSON; returns counts of what was written.

    Example:
        >>> write_chrome_json(Trace.from_files(paths), "run.json")
        {'slices': 120000, 'flows': 400}
    """
    events = trace.events
    profiles, base = profiles_and_base(trace)
    tids = events["cu_id"].astype(np.int64) * LANES_PER_SM + trace.lanes
    releasers = trace.releasers
    waits = np.flatnonzero(releasers >= 0)
    split = wait_split(trace, waits)
    names = {int(e): event_name(int(e), trace.scope_names) for e in np.unique(events["event_id"])}
    with files.replace_atomically(path, "w") as f:
        f.write('{"displayTimeUnit": "ns",\n"metadata": ')
        json.dump(trace_metadata(trace, base), f)
        f.write(',\n"traceEvents": [\n')
        f.write(",\n".join(_metadata_events(trace, events, tids)))
        site_at, launch_at, labels = trace.origins
        quoted = [json.dumps(label) for label in labels]
        for lo in range(0, len(events), chunk_events):
            hi = min(lo + chunk_events, len(events))
            released = _split_by_row(waits, split, lo, hi)
            origin = (site_at[lo:hi], launch_at[lo:hi], quoted)
            f.write(",\n" + ",\n".join(_slices(events[lo:hi], tids[lo:hi], base, names, released, origin)))
            if progress is not None:
                progress(hi - lo)
        if len(waits):
            f.write(",\n" + ",\n".join(_flows(events, tids, releasers, waits, base)))
        launches = 0
        for rank, (profile, start, end) in profiles:
            lines, flows = _torch_lines(rank, profile, start, end, base, len(waits) + launches + 1)
            launches += flows
            f.write("".join(",\n" + line for line in lines))
        times, ranks, values = counter_rows(trace, events, base)
        counters = (
            f'{{"ph": "C", "name": "bytes moved", "pid": {rank}, "ts": {ts}, '
            f'"args": {{"GB/s": {value:.3f}}}}}'
            for ts, rank, value in zip(_us(times), ranks.tolist(), values.tolist())
        )
        f.write("".join(",\n" + line for line in counters))
        f.write("\n]}\n")
    written = {"slices": len(events), "flows": len(waits)}
    if profiles:
        written["torch_slices"] = sum(len(profile.events) for _, (profile, _, _) in profiles)
        written["torch_flows"] = launches
    return written


def _torch_lines(rank: int, profile, start, end, base: int, first_flow: int) -> tuple[list[str], int]:
    # A rank's PyTorch profile: its tracks as threads with negative ids (above the SMs), its
    # slices, and an arrow from each launch to its kernel; returns the lines and the arrows.
    lines = []
    for index, name in enumerate(profile.tracks):
        tid = -(len(profile.tracks) - index)
        lines.append(
            json.dumps({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        )
        lines.append(
            json.dumps(
                {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}}
            )
        )
    tids = profile.events["track"].astype(np.int64) - len(profile.tracks)
    names = [json.dumps(name) for name in profile.names]
    for i, (ts, dur) in enumerate(zip(_us(start - base), _us(np.maximum(end - start, 0)))):
        lines.append(
            f'{{"ph": "X", "cat": "torch", "name": {names[profile.events["name"][i]]}, "pid": {rank}, '
            f'"tid": {tids[i]}, "ts": {ts}, "dur": {dur}}}'
        )
    launch, activity = profile.launches()
    for flow, (a, b) in enumerate(zip(launch.tolist(), activity.tolist()), first_flow):
        for phase, row, bind in (("s", a, ""), ("f", b, ', "bp": "e"')):
            lines.append(
                f'{{"ph": "{phase}"{bind}, "cat": "launch", "name": "launch", "id": {flow}, "pid": {rank}, '
                f'"tid": {tids[row]}, "ts": {_us(np.array([start[row] - base]))[0]}}}'
            )
    return lines, len(launch)


def _us(ns: np.ndarray) -> list[str]:
    """Nanosecond counts as microsecond strings with three decimals, exactly (no float rounding)."""
    ns = np.asarray(ns, dtype=np.int64)
    whole, frac = np.divmod(ns, 1000)
    return [f"{w}.{r:03d}" for w, r in zip(whole.tolist(), frac.tolist())]


def _metadata_events(trace: Trace, events: np.ndarray, tids: np.ndarray) -> list[str]:
    lines = []
    for rank_trace in trace.ranks:
        rank = rank_trace.rank
        label = f"rank {rank} · {rank_trace.device or 'GPU'}"
        lines.append(json.dumps({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": label}}))
        lines.append(
            json.dumps({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        )
        for tid in np.unique(tids[events["cur_rank"] == rank]).tolist():
            sm, lane = divmod(tid, LANES_PER_SM)
            name = lane_name(sm, lane)
            lines.append(
                json.dumps(
                    {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}}
                )
            )
            lines.append(
                json.dumps(
                    {
                        "ph": "M",
                        "name": "thread_sort_index",
                        "pid": rank,
                        "tid": tid,
                        "args": {"sort_index": tid},
                    }
                )
            )
    return lines


def _split_by_row(waits: np.ndarray, split: dict, lo: int, hi: int) -> dict[int, dict[str, int]]:
    # The split of each released wait among events [lo, hi), by its row in that chunk.
    a, b = np.searchsorted(waits, (lo, hi))
    parts = {part: split[part][a:b].tolist() for part in WAIT_ARGS.values()}
    rows = (waits[a:b] - lo).tolist()
    return {row: {part: column[k] for part, column in parts.items()} for k, row in enumerate(rows)}


def _slices(
    chunk: np.ndarray, tids: np.ndarray, base: int, names: dict[int, str], released: dict, origin: tuple
) -> list[str]:
    # ``released``: by row of the chunk, the split of each wait that has a releaser; ``origin``:
    # each row's call-site and launch label indices, and the labels as JSON strings.
    site_at, launch_at, quoted = origin
    start = chunk["start_ns"] - base
    duration = np.maximum(chunk["end_ns"] - chunk["start_ns"], 0)
    columns = [chunk[field].tolist() for field in ARGS.values()]
    # Addresses (heap offsets) in hex, as in every other output; compute scopes have none.
    at = list(ARGS.values()).index("address")
    columns[at] = [f'"{a:#x}"' if a >= 0 else "null" for a in columns[at]]
    arg_names = list(ARGS.values())
    lines = []
    for i, (event_id, rank, tid, ts, dur) in enumerate(
        zip(chunk["event_id"].tolist(), chunk["cur_rank"].tolist(), tids.tolist(), _us(start), _us(duration))
    ):
        args = ", ".join(f'"{name}": {column[i]}' for name, column in zip(arg_names, columns))
        args += f', "call_site": {quoted[site_at[i]]}, "launch": {quoted[launch_at[i]]}'
        if i in released:
            args += "".join(f', "{part}": {ns}' for part, ns in released[i].items())
        lines.append(
            f'{{"ph": "X", "cat": "iris", "name": "{names[event_id]}", "pid": {rank}, "tid": {tid}, '
            f'"ts": {ts}, "dur": {dur}, "args": {{{args}}}}}'
        )
    return lines


def _flows(events, tids, releasers, waits, base) -> list[str]:
    sources = releasers[waits]
    columns = zip(
        _us(events["start_ns"][sources] - base),
        events["cur_rank"][sources].tolist(),
        tids[sources].tolist(),
        _us(events["start_ns"][waits] - base),
        events["cur_rank"][waits].tolist(),
        tids[waits].tolist(),
    )
    lines = []
    for flow, (s_ts, s_pid, s_tid, d_ts, d_pid, d_tid) in enumerate(columns, 1):
        lines.append(
            f'{{"ph": "s", "cat": "release", "name": "release", "id": {flow}, "pid": {s_pid}, '
            f'"tid": {s_tid}, "ts": {s_ts}}}'
        )
        lines.append(
            f'{{"ph": "f", "bp": "e", "cat": "release", "name": "release", "id": {flow}, '
            f'"pid": {d_pid}, "tid": {d_tid}, "ts": {d_ts}}}'
        )
    return lines
