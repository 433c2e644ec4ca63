"""Merged multi-rank trace to Perfetto protobuf (``.pftrace``, opens in ui.perfetto.dev).

Layout: one process track per rank ("rank 0 · NVIDIA H200"), one child track per
SM lane ("SM 12", "SM 12 · lane 1" where CTAs overlap), a slice per op with its
fields as args, a "bytes moved" counter track per rank, flow arrows from the op
that released each wait to that wait, and a "trace metadata" instant carrying
world size, devices, dropped events, clock offsets and residuals, and the command.

Descriptors, interned names and metadata are built with the perfetto package's
message classes and streaming builder; the millions of slice packets are
encoded column-wise by :mod:`viewer_exports.wire` in chunks, so memory stays
bounded by the chunk size and packets leave in timestamp order.
"""

from __future__ import annotations

import json

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from iris_trace.analysis import match_releasers
from iris_trace.events import EVENT_NAMES, RELEASE_EVENTS, SCOPE_BASE, event_name
from iris_trace.lanes import assign_lanes
from iris_trace.trace import Trace

from . import wire

SEQUENCE_ID = 1
METADATA_TRACK = 1
#: Debug-annotation name ids (interned) and the event field each one shows.
ARGS = {
    1: "target_rank",
    2: "payload_bytes",
    3: "address",
    4: "pid",
    5: "pid_m",
    6: "pid_n",
    7: "op_index",
    8: "value",
    9: "cu_id",
}
COUNTER_BINS = 1000

_BEGIN, _END, _INSTANT, _COUNTER = 1, 2, 3, 4
_NEEDS_STATE = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE


def rank_track(rank):
    """uuid of a rank's process track."""
    return (rank + 1) << 40


def lane_track(rank: int, cu_id: np.ndarray | int, lane: np.ndarray | int):
    """uuid of an SM lane track under its rank."""
    return rank_track(rank) + (np.asarray(cu_id, dtype=np.int64) << 16) + np.asarray(lane, dtype=np.int64) + 1


def counter_track(rank):
    """uuid of a rank's bytes-moved counter track."""
    return rank_track(rank) + (1 << 39)


def write_perfetto(trace: Trace, path: str, chunk_events: int = 1 << 20, progress=None) -> dict:
    """Write ``trace`` to ``path`` as a Perfetto protobuf trace; returns counts of what was written.

    ``progress`` (optional) is called with the number of events written after each chunk.

    Example:
        >>> trace = Trace.from_files(paths)
        >>> write_perfetto(trace, "run.pftrace")
        {'slices': 120000, 'flows': 400, 'tracks': 70, ...}
    """
    events = trace.events
    base = int(events["start_ns"].min()) if len(events) else 0
    lanes = assign_lanes(events)
    releasers = match_releasers(events)
    waits = np.flatnonzero(releasers >= 0)
    with open(path, "wb") as f:
        builder = StreamingTraceProtoBuilder(f)
        tracks = _write_descriptors(builder, trace, events, lanes)
        _write_interned(builder, trace)
        _write_metadata(builder, trace, base)
        outgoing = _outgoing_flows(len(events), releasers[waits], waits)
        writer = _SliceWriter(f, events, lanes, base, releasers, outgoing)
        lo = 0
        while lo < len(events):
            hi = writer.chunk_end(lo, chunk_events)
            writer.write_chunk(lo, hi)
            if progress is not None:
                progress(hi - lo)
            lo = hi
        times, ranks, values = counter_rows(trace, events, base)
        writer.write_counters((times, counter_track(ranks), values))
    return {"slices": len(events), "flows": len(waits), "tracks": tracks, "base_ns": base}


def _write_descriptors(builder, trace: Trace, events: np.ndarray, lanes: np.ndarray) -> int:
    count = 0
    meta = builder.create_packet()
    meta.track_descriptor.uuid = METADATA_TRACK
    meta.track_descriptor.name = "Iris trace"
    builder.write_packet(meta)
    for rank_trace in trace.ranks:
        rank = rank_trace.rank
        packet = builder.create_packet()
        descriptor = packet.track_descriptor
        descriptor.uuid = rank_track(rank)
        descriptor.process.pid = rank + 1
        descriptor.process.process_name = f"rank {rank} · {rank_trace.device or 'GPU'}"
        descriptor.child_ordering = pb.TrackDescriptor.EXPLICIT
        builder.write_packet(packet)
        count += 1
        mine = events["cur_rank"] == rank
        pairs = np.unique((events["cu_id"][mine].astype(np.int64) << 32) | lanes[mine].astype(np.int64))
        for order, (cu_id, lane) in enumerate(zip((pairs >> 32).tolist(), (pairs & 0xFFFFFFFF).tolist())):
            packet = builder.create_packet()
            descriptor = packet.track_descriptor
            descriptor.uuid = int(lane_track(rank, cu_id, lane))
            descriptor.parent_uuid = rank_track(rank)
            descriptor.name = f"SM {cu_id}" if lane == 0 else f"SM {cu_id} · lane {lane}"
            descriptor.sibling_order_rank = order + 1
            builder.write_packet(packet)
            count += 1
        packet = builder.create_packet()
        packet.track_descriptor.uuid = counter_track(rank)
        packet.track_descriptor.parent_uuid = rank_track(rank)
        packet.track_descriptor.name = "bytes moved (GB/s)"
        packet.track_descriptor.sibling_order_rank = 0
        packet.track_descriptor.counter.unit_name = "GB/s"
        builder.write_packet(packet)
        count += 1
    return count


def _write_interned(builder, trace: Trace) -> None:
    packet = builder.create_packet()
    packet.trusted_packet_sequence_id = SEQUENCE_ID
    packet.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    names = dict(EVENT_NAMES)
    used_scopes = {int(e) for e in np.unique(trace.events["event_id"]) if e >= SCOPE_BASE}
    for event_id in sorted(used_scopes):
        names[event_id] = event_name(event_id, trace.scope_names)
    for iid, name in sorted(names.items()):
        entry = packet.interned_data.event_names.add()
        entry.iid, entry.name = iid, name
    for iid, name in ARGS.items():
        entry = packet.interned_data.debug_annotation_names.add()
        entry.iid, entry.name = iid, name
    builder.write_packet(packet)


def _write_metadata(builder, trace: Trace, base: int) -> None:
    packet = builder.create_packet()
    packet.timestamp = 0
    packet.trusted_packet_sequence_id = SEQUENCE_ID
    packet.sequence_flags = _NEEDS_STATE
    event = packet.track_event
    event.type = _INSTANT
    event.track_uuid = METADATA_TRACK
    event.name = "trace metadata"
    for name, value in trace_metadata(trace, base).items():
        annotation = event.debug_annotations.add()
        annotation.name = name
        if isinstance(value, int):
            annotation.int_value = value
        else:
            annotation.string_value = value if isinstance(value, str) else json.dumps(value)
    builder.write_packet(packet)


def trace_metadata(trace: Trace, base: int) -> dict:
    """What every export records about the run (also used by the Chrome JSON writer)."""
    return {
        "world_size": trace.world_size,
        "events": int(len(trace.events)),
        "dropped_events_per_rank": trace.dropped,
        "devices": [r.device for r in trace.ranks],
        "clock_offsets_ns": [round(f.offset_ns, 1) for f in trace.clock_fits],
        "clock_drift_ppm": [round(f.drift * 1e6, 3) for f in trace.clock_fits],
        "clock_residual_ns": [round(f.residual_ns, 1) for f in trace.clock_fits],
        "clock_min_rtt_ns": [round(f.rtt_ns, 1) for f in trace.clock_fits],
        "time_base_ns": base,
        "command": trace.ranks[0].command,
    }


def _outgoing_flows(count: int, releaser_of_wait: np.ndarray, waits: np.ndarray) -> list[np.ndarray]:
    """Flow ids leaving each event, as columns: column k holds each event's k-th flow id (0: none)."""
    columns = []
    if len(waits) == 0:
        return columns
    order = np.argsort(releaser_of_wait, kind="stable")
    sources, flow_ids = releaser_of_wait[order], waits[order] + 1
    first = np.searchsorted(sources, sources, side="left")
    rank_in_source = np.arange(len(sources)) - first
    for k in range(int(rank_in_source.max()) + 1):
        column = np.zeros(count, dtype=np.uint64)
        pick = rank_in_source == k
        column[sources[pick]] = flow_ids[pick]
        columns.append(column)
    return columns


def counter_rows(trace: Trace, events: np.ndarray, base: int):
    """Per-rank GB/s of payload moved, in COUNTER_BINS bins: (times relative to ``base``, ranks, values)."""
    if len(events) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    start, stop = int(events["start_ns"].min()), int(events["end_ns"].max()) + 1
    edges = np.linspace(start, stop, COUNTER_BINS + 1)
    width_s = (edges[1] - edges[0]) / 1e9
    moving = np.isin(events["event_id"], sorted(RELEASE_EVENTS | {1, 3}))
    times, tracks, values = [], [], []
    for rank in range(trace.world_size):
        mine = moving & (events["cur_rank"] == rank)
        totals, _ = np.histogram(events["start_ns"][mine], bins=edges, weights=events["payload_bytes"][mine])
        times.append(edges[:-1].astype(np.int64) - base)
        tracks.append(np.full(COUNTER_BINS, rank, dtype=np.int64))
        values.append(totals / width_s / 1e9)
    return np.concatenate(times), np.concatenate(tracks), np.concatenate(values)


class _SliceWriter:
    """Encodes slice packets chunk by chunk; memory stays bounded by the chunk.

    The trace processor sorts packets by timestamp and keeps file order among
    equal timestamps, so only ties need care: each chunk writes its slice ends
    first (shortest first, so children close before parents), then its begins
    (longest first, so parents open before children), and zero-length events as
    instants. Chunks never split a run of equal start times.
    """

    def __init__(self, f, events, lanes, base, releasers, outgoing):
        self.f = f
        self.events = events
        self.lanes = lanes
        self.base = base
        self.terminating = np.where(releasers >= 0, np.arange(len(events)) + 1, 0).astype(np.uint64)
        self.outgoing = outgoing

    def chunk_end(self, lo: int, size: int) -> int:
        """End of the chunk starting at ``lo``: about ``size`` events, never splitting equal start times."""
        hi = min(lo + size, len(self.events))
        if hi < len(self.events):
            hi = int(np.searchsorted(self.events["start_ns"], self.events["start_ns"][hi - 1], side="right"))
        return hi

    def write_chunk(self, lo: int, hi: int) -> None:
        chunk = self.events[lo:hi]
        start = chunk["start_ns"] - self.base
        end = np.maximum(chunk["end_ns"], chunk["start_ns"]) - self.base
        duration = end - start
        tracks = np.zeros(len(chunk), dtype=np.int64)
        for rank in np.unique(chunk["cur_rank"]).tolist():
            mine = chunk["cur_rank"] == rank
            tracks[mine] = lane_track(rank, chunk["cu_id"][mine], self.lanes[lo:hi][mine])
        spans = np.flatnonzero(duration > 0)
        ends = spans[np.lexsort((duration[spans], end[spans]))]
        self.f.write(_packets(end[ends], _event_head(_END, tracks[ends])).tobytes())
        begins = spans[np.lexsort((-duration[spans], start[spans]))]
        self._write_opening(chunk, start, tracks, lo, begins, _BEGIN)
        self._write_opening(chunk, start, tracks, lo, np.flatnonzero(duration == 0), _INSTANT)

    def _write_opening(self, chunk, start, tracks, lo, rows, kind) -> None:
        """BEGIN (or INSTANT) packets of ``rows`` in their given order, one group per shape.

        Shapes differ by how many flows leave or end at the slice; the group with
        none goes first because compute scopes, the only parents, never carry flows.
        """
        index = rows + lo
        outgoing = [column[index] for column in self.outgoing]
        terminating = self.terminating[index]
        flow_count = np.zeros(len(rows), np.int64)
        for column in outgoing:
            flow_count += column > 0
        for flows in np.unique(flow_count).tolist():
            for ends_here in (False, True):
                pick = (flow_count == flows) & ((terminating > 0) == ends_here)
                if not pick.any():
                    continue
                selected = rows[pick]
                m = len(selected)
                body = [
                    *_event_head(kind, tracks[selected]),
                    wire.key(10, wire.VARINT, m),
                    wire.varint(chunk["event_id"][selected].astype(np.int64)),
                ]
                for iid, field in ARGS.items():
                    value = wire.varint(chunk[field][selected].astype(np.int64))
                    # DebugAnnotation {name_iid, int_value} as a length-delimited field 4.
                    body += [
                        wire.key(4, wire.LENGTH_DELIMITED, m),
                        wire.constant(wire.scalar_varint(3 + value.shape[1]), m),
                        wire.key(1, wire.VARINT, m),
                        wire.constant(bytes([iid]), m),
                        wire.key(4, wire.VARINT, m),
                        value,
                    ]
                for column in outgoing[:flows]:
                    body += [wire.key(47, wire.FIXED64, m), wire.fixed64(column[pick])]
                if ends_here:
                    body += [wire.key(48, wire.FIXED64, m), wire.fixed64(terminating[pick])]
                self.f.write(_packets(start[selected], body).tobytes())

    def write_counters(self, counters) -> None:
        times, tracks, values = counters
        m = len(times)
        if m:
            body = [
                *_event_head(_COUNTER, tracks),
                wire.key(44, wire.FIXED64, m),
                wire.fixed64(values.astype(np.float64)),
            ]
            self.f.write(_packets(times, body).tobytes())


def _event_head(kind: int, tracks: np.ndarray) -> list[np.ndarray]:
    """TrackEvent columns every packet has: type and track uuid."""
    m = len(tracks)
    return [
        wire.key(9, wire.VARINT, m),
        wire.constant(bytes([kind]), m),
        wire.key(11, wire.VARINT, m),
        wire.varint(tracks),
    ]


def _packets(times: np.ndarray, track_event: list[np.ndarray]) -> np.ndarray:
    """Whole ``Trace.packet`` fields around TrackEvent columns, one packet per row, in one copy."""
    m = len(times)
    event_width = sum(column.shape[1] for column in track_event)
    packet = [
        wire.key(8, wire.VARINT, m),
        wire.varint(np.maximum(times, 0)),
        wire.key(11, wire.LENGTH_DELIMITED, m),
        wire.constant(wire.scalar_varint(event_width), m),
        *track_event,
        wire.key(10, wire.VARINT, m),
        wire.constant(bytes([SEQUENCE_ID]), m),
        wire.key(13, wire.VARINT, m),
        wire.constant(bytes([_NEEDS_STATE]), m),
    ]
    packet_width = sum(column.shape[1] for column in packet)
    return wire.hstack(
        [wire.key(1, wire.LENGTH_DELIMITED, m), wire.constant(wire.scalar_varint(packet_width), m), *packet]
    )
