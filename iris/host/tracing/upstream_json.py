"""Upstream Iris's trace files: ``ctx.tracing.export("trace.json", merge=False)``.

Upstream writes each rank's events as Chrome trace JSON to ``trace_rank<N>.json`` and,
with ``merge=True``, rank 0 also writes every rank's events to ``trace.json``, returning
the document it wrote (``{}`` on the other ranks). Programs written against it get the
same files and return values here, with this package's events: ``tid`` names the SM
(``SM<cu_id>``; NVIDIA GPUs have no XCCs, so ``xcc_id`` is 0), timestamps are
microseconds (Chrome's unit) from the GPU's nanosecond timer, and the merged file is
:func:`iris_trace.export.write_chrome_json`'s: every rank on rank 0's clock (fitted
offsets and drift, not upstream's shift to the earliest event), with a flow from each
wait to the op that released it.

Example:
    >>> ctx.tracing.enable(max_events=1 << 16)
    >>> kernel[grid](buf, ctx.get_rank(), ctx.get_heap_bases())
    >>> merged = ctx.tracing.export("trace.json", merge=True)   # rank 0: the merged document
"""

from __future__ import annotations

import json
import os
import socket
import sys

import numpy as np
import torch

from iris_trace import files
from iris_trace.events import event_name

#: Upstream's ``metadata.schema_version`` of the files it writes.
SCHEMA_VERSION = "1.2"
#: What each field of an event means (upstream's ``metadata.fields``, for these files).
FIELDS = {
    "name": "event type name (put, get, load, store, an atomic, signal, wait_until, a scope)",
    "cat": "event category (always 'iris')",
    "ts": "start, microseconds on this GPU's timer (rank 0's clock in the merged file)",
    "pid": "the rank",
    "tid": "the SM (SM<cu_id>)",
    "ph": "'X' for events with a duration, 'i' for instants",
    "dur": "duration in microseconds (events with one)",
    "args": {
        "program_id": "Triton program id",
        "pid_m": "tile row given with the op (-1: none)",
        "pid_n": "tile column given with the op (-1: none)",
        "target_rank": "the rank the op reached",
        "address": "heap offset of the op's first element (hex)",
        "xcc_id": "always 0 on NVIDIA GPUs",
        "cu_id": "the SM",
        "op_index": "the record's slot in its buffer region",
        "payload_size": "bytes the op moved (active lanes x element size)",
    },
}


#: Upstream's ``trace_buffers`` columns, in its order.
BUFFER_COLUMNS = (
    "event_id", "pid", "pid_m", "pid_n", "cur_rank", "target_rank", "xcc_id", "cu_id",
    "timestamp", "address", "duration_cycles", "op_index", "payload_size",
)  # fmt: skip
#: The columns whose event field has another name; ``xcc_id`` has none (0: NVIDIA GPUs have no
#: XCCs) and ``duration_cycles`` holds the end time, as upstream's does.
_FIELD_OF = {
    "xcc_id": None, "timestamp": "start_ns", "duration_cycles": "end_ns", "payload_size": "payload_bytes",
}  # fmt: skip
#: The columns upstream keeps as int64; the others are int32.
_INT64_COLUMNS = ("timestamp", "address", "duration_cycles")


def trace_buffers(events: np.ndarray, length: int, device) -> dict[str, torch.Tensor]:
    """``events`` as upstream's ``ctx.tracing.trace_buffers``: one tensor per column, events in
    the order they started, zero past the last one, ``max(length, len(events))`` long.

    Example:
        >>> trace_buffers(ctx.tracing.events(), 1000, "cuda")["event_id"][0]
        tensor(4, device='cuda:0', dtype=torch.int32)
    """
    events = events[np.argsort(events["start_ns"], kind="stable")]
    size = max(int(length), len(events))
    columns = {}
    for column in BUFFER_COLUMNS:
        field = _FIELD_OF.get(column, column)
        dtype = torch.int64 if column in _INT64_COLUMNS else torch.int32
        values = torch.zeros(size, dtype=dtype)
        if field is not None and len(events):
            values[: len(events)] = torch.from_numpy(events[field].astype(np.int64)).to(dtype)
        columns[column] = values.to(device)
    return columns


def export(tracing, filename: str, merge: bool) -> dict:
    """Write upstream's files for ``tracing`` (``ctx.tracing``) and return upstream's document.

    Every rank writes ``trace_rank<N>.json`` beside ``filename`` and, without ``merge``,
    returns that document; with ``merge`` (collective) rank 0 writes ``filename`` and
    returns it, the other ranks ``{}``.

    Example:
        >>> export(ctx.tracing, "out/trace.json", merge=False)["metadata"]["num_events"]
        128
    """
    ctx = tracing._ctx
    rank = ctx.cur_rank
    events = tracing.events()
    document = {
        "traceEvents": [*_events(events, tracing.scope_names), _process_name(rank)],
        "displayTimeUnit": "ns",
        "metadata": {
            "schema_version": SCHEMA_VERSION,
            "num_events": int(len(events)),
            "rank": rank,
            "world_size": ctx.num_ranks,
            "time_unit": "us (from the GPU's nanosecond timer)",
            "fields": FIELDS,
            **_system(ctx),
        },
    }
    stem, suffix = os.path.splitext(filename)
    with files.replace_atomically(f"{stem}_rank{rank}{suffix}", "w") as handle:
        json.dump(document, handle, indent=2)
    if not merge:
        return document
    trace = tracing.collect()
    if trace is None:
        return {}
    from iris_trace.export import write_chrome_json  # the exporters load only when a file is asked for

    write_chrome_json(trace, filename)
    with open(filename) as handle:
        merged = json.load(handle)
    merged["metadata"].update(
        schema_version=SCHEMA_VERSION,
        total_events=int(len(trace.events)),
        max_events=tracing.max_events,
        world_size=trace.world_size,
        aligned="every rank on rank 0's clock (fitted offset and drift)",
        **_system(ctx),
    )
    with files.replace_atomically(filename, "w") as handle:
        json.dump(merged, handle)
    return merged


def _events(events: np.ndarray, scope_names: dict[int, str]) -> list[dict]:
    out = []
    for e in events:
        start, end = int(e["start_ns"]), int(e["end_ns"])
        event = {
            "name": event_name(int(e["event_id"]), scope_names),
            "cat": "iris",
            "ts": start / 1e3,
            "pid": int(e["cur_rank"]),
            "tid": f"SM{int(e['cu_id'])}",
            "args": {
                "program_id": int(e["pid"]),
                "pid_m": int(e["pid_m"]),
                "pid_n": int(e["pid_n"]),
                "target_rank": int(e["target_rank"]),
                "address": hex(int(e["address"])),
                "xcc_id": 0,
                "cu_id": int(e["cu_id"]),
                "op_index": int(e["op_index"]),
                "payload_size": int(e["payload_bytes"]),
            },
        }
        if end > start:
            event.update(ph="X", dur=(end - start) / 1e3)
        else:
            event.update(ph="i", s="t")
        out.append(event)
    return out


def _process_name(rank: int) -> dict:
    return {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"Rank {rank}"}}


def _system(ctx) -> dict:
    """Upstream's system metadata, as far as it applies to NVIDIA GPUs and emulation."""
    device = ctx.get_device()
    return {
        "process_name": os.path.basename(sys.argv[0]) if sys.argv else "unknown",
        "command_line": " ".join(sys.argv),
        "hostname": socket.gethostname(),
        "gpu_device_name": ctx.backend.device_name(device),
        "gpu_cu_count": ctx.get_cu_count(),
    }
