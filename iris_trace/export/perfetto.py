"""Merged multi-rank trace to Perfetto protobuf (``.pftrace``, opens in ui.perfetto.dev).

Layout: one process track per rank ("rank 0 · NVIDIA H200"), one child track per
SM lane ("SM 12", "SM 12 · lane 1" where CTAs overlap; copy-engine puts on
"copy engine → rank 2"), a slice per op with its fields as args (its call site and
launch as interned strings, ``common.ORIGIN_ARGS``; a released wait also its split,
``common.WAIT_ARGS``: why it waited), a "bytes moved" counter track
per rank, flow arrows from the op that released each wait to that wait, and a
"trace metadata" instant carrying world size, devices, dropped events, clock offsets
and residuals, and the command. A rank that ran ``ctx.tracing.torch_profiler()`` also
has its host threads and CUDA streams (every kernel, cuBLAS and NCCL too) as tracks
above its SMs, on the same clock, with an arrow from each launch to its kernel.

Descriptors, interned names and metadata are built with the perfetto package's
message classes and streaming builder; the millions of slice packets are
encoded column-wise by :mod:`iris_trace.export.wire` in chunks, so memory stays
bounded by the chunk size.

Packet order: the file is *not* in timestamp order. Each chunk of events writes
its slice ends, then its begins, then its instants, each group in timestamp
order, because packets of one shape are encoded together in blocks (the speed
of this writer). The trace processor sorts every packet by timestamp when it
loads a file, keeping file order among equal timestamps, which is all the order
a viewer needs: the writer only makes ties right (ends before begins, children
inside parents). The address argument is a ``pointer_value`` (shown in hex);
the bytes-moved counters have a sample only where the value changes.
"""

from __future__ import annotations

import json

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

from .. import files
from ..events import EVENT_NAMES, SCOPE_BASE, event_name, lane_name
from ..lanes import stable_order
from ..trace import Trace
from . import wire
from .common import ARGS, ORIGIN_ARGS, WAIT_ARGS, counter_rows, profiles_and_base, trace_metadata, wait_split

SEQUENCE_ID = 1
#: The PyTorch profiler's slices: names inline, no interned state.
TORCH_SEQUENCE_ID = 2
METADATA_TRACK = 1
#: Packets encoded per numpy pass: about 1 MiB of rows, so the rows and their words stay in the
#: CPU cache while each field is stored, and the Python cost of a pass is spread over many rows.
BLOCK_ROWS = 8192
#: Events read at a time by the passes over the whole trace: about 1 MiB of records, which stay
#: in the CPU cache while each field is read (reading a field of the whole array walks every
#: record, once per field), and the temporaries stay small.
SLICE_EVENTS = 1 << 14

_BEGIN, _END, _INSTANT, _COUNTER = 1, 2, 3, 4
_PARTS = tuple(WAIT_ARGS.values())
_NEEDS_STATE = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE


def rank_track(rank):
    """uuid of a rank's process track."""
    return (rank + 1) << 40


def lane_track(rank: np.ndarray | int, cu_id: np.ndarray | int, lane: np.ndarray | int):
    """uuid of an SM lane track under its rank."""
    rank = np.asarray(rank, dtype=np.int64)
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
    profiles, base = profiles_and_base(trace)
    lanes = trace.lanes
    waits = np.flatnonzero(trace.releasers >= 0)
    sources = trace.releasers[waits]
    with files.replace_atomically(path) as f:
        builder = StreamingTraceProtoBuilder(f)
        tracks = _write_descriptors(builder, trace, events, lanes)
        _write_interned(builder, trace)
        _write_metadata(builder, trace, base)
        site_at, launch_at, _ = trace.origins
        origin = {"call_site": site_at + 1, "launch": launch_at + 1}  # interned iids (_write_interned)
        writer = _SliceWriter(f, events, lanes, base, waits, sources, wait_split(trace, waits), origin)
        lo = 0
        while lo < len(events):
            hi = writer.chunk_end(lo, chunk_events)
            writer.write_chunk(lo, hi)
            if progress is not None:
                progress(hi - lo)
            lo = hi
        times, ranks, values = counter_rows(trace, events, base)
        writer.write_counters((times, counter_track(ranks), values))
        torch_counts = [_write_torch(builder, rank, *found, base) for rank, found in profiles]
    written = {"slices": len(events), "flows": len(waits), "tracks": tracks, "base_ns": base}
    if torch_counts:
        written["torch_slices"] = sum(n for n, _, _ in torch_counts)
        written["torch_flows"] = sum(n for _, n, _ in torch_counts)
        written["tracks"] += sum(n for _, _, n in torch_counts)
    return written


def torch_track(rank: int, index: int) -> int:
    """uuid of a rank's PyTorch profiler track (a host thread or a CUDA stream)."""
    return rank_track(rank) + (1 << 38) + index + 1


def _write_torch(builder, rank: int, profile, start: np.ndarray, end: np.ndarray, base: int):
    """A rank's PyTorch profile: its tracks, slices and launch arrows; returns (slices, flows, tracks).

    Slices of one track must nest for the viewer: a slice that outlasts the one it began
    in is cut at that one's end (Kineto's microsecond rounding makes a few).
    """
    for index, name in enumerate(profile.tracks):
        packet = builder.create_packet()
        descriptor = packet.track_descriptor
        descriptor.uuid = torch_track(rank, index)
        descriptor.parent_uuid = rank_track(rank)
        descriptor.name = name
        descriptor.sibling_order_rank = -len(profile.tracks) + index  # above the SMs
        builder.write_packet(packet)
    launch, activity = profile.launches()
    flow_out = dict(zip(launch.tolist(), range(len(launch))))
    flow_in = dict(zip(activity.tolist(), range(len(activity))))
    flow_base = (1 << 62) | (rank << 40)
    events = profile.events
    for index in range(len(profile.tracks)):
        rows = np.flatnonzero(events["track"] == index)
        rows = rows[np.lexsort((-(end[rows] - start[rows]), start[rows]))]
        open_ends: list[int] = []
        for row in rows.tolist():
            begin = int(start[row])
            while open_ends and open_ends[-1] <= begin:
                _torch_packet(builder, open_ends.pop() - base, _END, index, rank)
            finish = min(int(end[row]), open_ends[-1]) if open_ends else int(end[row])
            packet = _torch_packet(builder, begin - base, _BEGIN, index, rank, write=False)
            packet.track_event.name = profile.names[events["name"][row]]
            if row in flow_out:
                packet.track_event.flow_ids.append(flow_base + flow_out[row])
            if row in flow_in:
                packet.track_event.terminating_flow_ids.append(flow_base + flow_in[row])
            builder.write_packet(packet)
            open_ends.append(finish)
        while open_ends:
            _torch_packet(builder, open_ends.pop() - base, _END, index, rank)
    return len(events), len(launch), len(profile.tracks)


def _torch_packet(builder, time: int, kind: int, track: int, rank: int, write: bool = True):
    packet = builder.create_packet()
    packet.timestamp = time
    packet.trusted_packet_sequence_id = TORCH_SEQUENCE_ID
    packet.track_event.type = kind
    packet.track_event.track_uuid = torch_track(rank, track)
    if write:
        builder.write_packet(packet)
    return packet


def _write_descriptors(builder, trace: Trace, events: np.ndarray, lanes: np.ndarray) -> int:
    count = 0
    meta = builder.create_packet()
    meta.track_descriptor.uuid = METADATA_TRACK
    meta.track_descriptor.name = "Iris trace"
    builder.write_packet(meta)
    used_rank, used_cu, used_lane = _lanes_in_use(events, lanes)
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
        mine = used_rank == rank
        pairs = zip(used_cu[mine].tolist(), used_lane[mine].tolist())
        for order, (cu_id, lane) in enumerate(pairs):
            packet = builder.create_packet()
            descriptor = packet.track_descriptor
            descriptor.uuid = int(lane_track(rank, cu_id, lane))
            descriptor.parent_uuid = rank_track(rank)
            descriptor.name = lane_name(cu_id, lane)
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


def _lanes_in_use(events: np.ndarray, lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (rank, SM, lane) that has events, sorted: three int64 arrays."""
    # rank * 2^48 + SM * 2^32 + lane sorts like the triple for int16 ranks and SMs and lanes < 2^32.
    used = []
    for lo in range(0, len(events), SLICE_EVENTS):
        part = events[lo : lo + SLICE_EVENTS]
        columns = [
            part["cur_rank"].astype(np.int64),
            part["cu_id"].astype(np.int64),
            lanes[lo : lo + SLICE_EVENTS],
        ]
        lows = [int(column.min()) for column in columns]
        sizes = [int(column.max()) - low + 1 for column, low in zip(columns, lows)]
        if sizes[0] * sizes[1] * sizes[2] > 1 << 22:
            used.append(np.unique((columns[0] << 48) + (columns[1] << 32) + columns[2]))
            continue
        # Few possible triples (the usual case): flag them in a table indexed by the triple.
        index = (columns[0] - lows[0]) * sizes[1]
        index += columns[1] - lows[1]
        index *= sizes[2]
        index += columns[2] - lows[2]
        flagged = np.flatnonzero(np.bincount(index, minlength=sizes[0] * sizes[1] * sizes[2]))
        rank_cu, lane = np.divmod(flagged, sizes[2])
        rank, cu_id = np.divmod(rank_cu, sizes[1])
        used.append(((rank + lows[0]) << 48) + ((cu_id + lows[1]) << 32) + lane + lows[2])
    used = np.unique(np.concatenate(used)) if used else np.zeros(0, np.int64)
    cu_id = (((used >> 32) + (1 << 15)) & 0xFFFF) - (1 << 15)
    return ((used >> 32) - cu_id) >> 16, cu_id, used & 0xFFFFFFFF


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
    for iid, name in {**ARGS, **WAIT_ARGS, **ORIGIN_ARGS}.items():
        entry = packet.interned_data.debug_annotation_names.add()
        entry.iid, entry.name = iid, name
    # The origins' labels: string iid k + 1 is label k of Trace.origins.
    for iid, label in enumerate(trace.origins[2], 1):
        entry = packet.interned_data.debug_annotation_string_values.add()
        entry.iid, entry.str = iid, label.encode()
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


class _SliceWriter:
    """Encodes slice packets chunk by chunk; memory stays bounded by the chunk.

    The trace processor sorts packets by timestamp and keeps file order among
    equal timestamps, so only ties need care: each chunk writes its slice ends
    first (shortest first, so children close before parents), then its begins
    (longest first, so parents open before children), and zero-length events as
    instants. Chunks never split a run of equal start times.

    Packets are encoded BLOCK_ROWS at a time with a :class:`wire.Layout` per packet shape
    and varint widths; each block's widths fit its own values, so varints stay short.
    """

    #: Layouts kept (each with a block of rows); more than this and the cache starts over.
    MAX_LAYOUTS = 32

    def __init__(self, f, events, lanes, base, waits, sources, split, origin):
        """``waits``: sorted indices of the waits that have a releaser, ``sources`` their releasers,
        ``split`` their split into parts (one array per :data:`WAIT_ARGS` name, in ``waits`` order),
        ``origin`` each event's interned call-site and launch label (one array per :data:`ORIGIN_ARGS` name).

        Flow ids are the wait's index + 1. Flows are kept by source, in wait order within
        a source: the k-th flow leaving an event goes into its k-th ``flow_ids`` field.
        """
        self.f = f
        self.events = events
        self.lanes = lanes
        self.base = base
        self.waits = waits
        self.split = split
        self.origin = origin
        order = np.argsort(sources, kind="stable")
        self.flow_sources = sources[order]
        self.flow_ids = (waits[order] + 1).astype(np.uint64)
        new_source = np.ones(len(order), dtype=bool)
        new_source[1:] = self.flow_sources[1:] != self.flow_sources[:-1]
        first = np.maximum.accumulate(np.where(new_source, np.arange(len(order)), 0))
        self.flow_rank = np.arange(len(order)) - first
        self.layouts: dict = {}

    def chunk_end(self, lo: int, size: int) -> int:
        """End of the chunk starting at ``lo``: about ``size`` events, never splitting equal start times."""
        n = len(self.events)
        hi = min(lo + size, n)
        if hi == n:
            return hi
        starts = self.events["start_ns"]
        last, window = starts[hi - 1], 64
        # Runs of equal start times are short: search windows of doubling size (searching the
        # whole field would first copy it, a field of a record array not being contiguous).
        while True:
            ahead = np.ascontiguousarray(starts[hi : hi + window])
            ties = int(np.searchsorted(ahead, last, side="right"))
            if ties < len(ahead) or hi + window >= n:
                return hi + ties
            window *= 2

    def write_chunk(self, lo: int, hi: int) -> None:
        chunk = self.events[lo:hi]
        start, end, tracks = (np.empty(hi - lo, dtype=np.int64) for _ in range(3))
        for at in range(0, hi - lo, SLICE_EVENTS):
            part, rows = chunk[at : at + SLICE_EVENTS], slice(at, at + SLICE_EVENTS)
            np.subtract(part["start_ns"], self.base, out=start[rows])
            np.maximum(part["end_ns"], part["start_ns"], out=end[rows])
            tracks[rows] = lane_track(
                part["cur_rank"], part["cu_id"], self.lanes[lo + at : lo + at + len(part)]
            )
        end -= self.base
        duration = end - start
        spans = np.flatnonzero(duration > 0)
        ends = spans[_nearly_sorted_order(end[spans], duration[spans])]
        for rows in _blocks(ends):
            columns = {"time": end.take(rows), "track": tracks.take(rows)}
            self._write(
                _END, columns, ("time", "track"), lambda widths: _packet(_event_head(_END, widths), widths)
            )
        flows = self._flows(lo, hi)
        begins = spans[_nearly_sorted_order(start[spans], -duration[spans])]
        origin = {name: column[lo:hi] for name, column in self.origin.items()}
        self._write_opening(chunk, origin, start, tracks, begins, _BEGIN, *flows)
        instants = np.flatnonzero(duration == 0)
        self._write_opening(chunk, origin, start, tracks, instants, _INSTANT, *flows)

    def _flows(self, lo: int, hi: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """Flow ids of the chunk's events, as columns (0: none), and each event's packet shape.

        Returns ``outgoing``, where column k holds each event's k-th flow id leaving it,
        ``terminating``, the flow id ending at each event, and ``shape``: twice the number of
        flows leaving the event, plus one if a flow ends there.
        """
        a, b = np.searchsorted(self.flow_sources, (lo, hi))
        sources, ids, rank = self.flow_sources[a:b] - lo, self.flow_ids[a:b], self.flow_rank[a:b]
        outgoing = []
        for k in range(int(rank.max()) + 1 if len(rank) else 0):
            column = np.zeros(hi - lo, dtype=np.uint64)
            pick = rank == k
            column[sources[pick]] = ids[pick]
            outgoing.append(column)
        a, b = np.searchsorted(self.waits, (lo, hi))
        terminating = np.zeros(hi - lo, dtype=np.uint64)
        terminating[self.waits[a:b] - lo] = self.waits[a:b] + 1
        shape = 2 * np.bincount(sources, minlength=hi - lo)
        shape[self.waits[a:b] - lo] += 1
        return outgoing, terminating, shape

    def _write_opening(self, chunk, origin, start, tracks, rows, kind, outgoing, terminating, shapes) -> None:
        """BEGIN (or INSTANT) packets of ``rows`` in their given order, one group per shape.

        Shapes differ by how many flows leave or end at the slice; the group with
        none goes first because compute scopes, the only parents, never carry flows.
        """
        if len(rows) == 0:
            return
        shape = shapes.take(rows)
        counts = np.bincount(shape)
        codes = np.flatnonzero(counts)
        # Rows grouped by shape, in order within each group: a stable sort of small integers
        # (a radix sort when they fit 16 bits).
        small = np.int16 if len(counts) <= 1 << 15 else np.int64
        grouped = rows if len(codes) == 1 else rows[np.argsort(shape.astype(small), kind="stable")]
        bounds = np.cumsum(counts[codes]) - counts[codes]
        varints = ("time", "track", "event_id", *ARGS.values(), *ORIGIN_ARGS.values())
        for code, first, size in zip(codes.tolist(), bounds.tolist(), counts[codes].tolist()):
            flows, ends_here = divmod(code, 2)

            def layout(widths, flows=flows, ends_here=ends_here):
                return _opening_layout(kind, widths, flows, ends_here)

            for block in _blocks(grouped[first : first + size]):
                records = chunk.take(block)
                columns = {"time": start.take(block), "track": tracks.take(block)}
                columns["event_id"] = records["event_id"]
                for field in ARGS.values():
                    columns[field] = records[field]
                columns["address"] = np.maximum(records["address"], 0)  # compute scopes have none (-1)
                for name, column in origin.items():
                    columns[name] = column.take(block)
                for k in range(flows):
                    columns[f"flow{k}"] = outgoing[k].take(block)
                if ends_here:  # a released wait: its flow ends here, and its split is shown
                    columns["terminating"] = terminating.take(block)
                    at = np.searchsorted(self.waits, columns["terminating"].astype(np.int64) - 1)
                    for part in WAIT_ARGS.values():
                        columns[part] = self.split[part][at]
                fields = varints + _PARTS if ends_here else varints
                self._write((kind, flows, ends_here), columns, fields, layout)

    def write_counters(self, counters) -> None:
        times, tracks, values = counters
        for rows in _blocks(np.arange(len(times))):
            columns = {
                "time": np.maximum(times[rows], 0),
                "track": tracks[rows],
                "value": values[rows].astype(np.float64),
            }
            self._write(_COUNTER, columns, ("time", "track"), _counter_layout)

    def _write(self, shape, columns: dict, varints: tuple, build) -> None:
        """Encode one block of packets of ``shape`` and write it.

        ``build(widths)`` makes the layout for the block's varint widths (a dict by column);
        layouts are cached by shape and widths, so their constant bytes are laid out once.
        """
        widths = tuple(wire.varint_width(columns[name]) for name in varints)
        layout = self.layouts.get((shape, widths))
        if layout is None:
            if len(self.layouts) >= self.MAX_LAYOUTS:
                self.layouts.clear()
            layout = self.layouts[(shape, widths)] = build(dict(zip(varints, widths)))
        self.f.write(layout.encode(columns))


def _nearly_sorted_order(primary: np.ndarray, secondary: np.ndarray) -> np.ndarray:
    """The stable order by (primary, secondary), for int64 arrays already almost in that order.

    Both go into one int64 key when they fit: timsort (numpy's stable sort) on an almost
    sorted key is a few merges, faster than sorting (or lexsorting) from scratch.
    """
    if len(primary) == 0:
        return np.zeros(0, dtype=np.int64)
    low, high = int(secondary.min()), int(secondary.max())
    first, last = int(primary.min()), int(primary.max())
    if (last - first + 1) * (high - low + 1) >= 2**63:
        return stable_order(primary, secondary)
    key = (primary - first) * (high - low + 1)
    key += secondary - low
    return np.argsort(key, kind="stable")


def _blocks(rows: np.ndarray):
    """``rows`` in slices of at most BLOCK_ROWS."""
    for i in range(0, len(rows), BLOCK_ROWS):
        yield rows[i : i + BLOCK_ROWS]


def _event_head(kind: int, widths: dict) -> wire.Layout:
    """The TrackEvent fields every packet has: type and track uuid."""
    return (
        wire.Layout()
        .key(9, wire.VARINT)
        .constant(bytes([kind]))
        .key(11, wire.VARINT)
        .varint("track", widths["track"])
    )


def _opening_layout(kind: int, widths: dict, flows: int, ends_here: bool) -> wire.Layout:
    """A BEGIN or INSTANT packet: name, the ARGS as debug annotations, flows leaving and ending."""
    event = _event_head(kind, widths).key(10, wire.VARINT).varint("event_id", widths["event_id"])
    for iid, field in ARGS.items():
        annotation = wire.Layout().key(1, wire.VARINT).constant(bytes([iid]))
        # DebugAnnotation field 7 (pointer_value) shows in hex, 4 (int_value) in decimal.
        value_field = 7 if field == "address" else 4
        event.message(4, annotation.key(value_field, wire.VARINT).varint(field, widths[field]))
    for iid, field in ORIGIN_ARGS.items():
        # DebugAnnotation field 17 (string_value_iid): an interned label.
        annotation = wire.Layout().key(1, wire.VARINT).constant(bytes([iid]))
        event.message(4, annotation.key(17, wire.VARINT).varint(field, widths[field]))
    if ends_here:
        for iid, part in WAIT_ARGS.items():
            annotation = wire.Layout().key(1, wire.VARINT).constant(bytes([iid]))
            event.message(4, annotation.key(4, wire.VARINT).varint(part, widths[part]))
    for k in range(flows):
        event.key(47, wire.FIXED64).fixed64(f"flow{k}")
    if ends_here:
        event.key(48, wire.FIXED64).fixed64("terminating")
    return _packet(event, widths)


def _counter_layout(widths: dict) -> wire.Layout:
    return _packet(_event_head(_COUNTER, widths).key(44, wire.FIXED64).fixed64("value"), widths)


def _packet(track_event: wire.Layout, widths: dict) -> wire.Layout:
    """A whole ``Trace.packet`` field around a TrackEvent: timestamp, sequence id and flags."""
    packet = wire.Layout().key(8, wire.VARINT).varint("time", widths["time"]).message(11, track_event)
    packet.key(10, wire.VARINT).constant(bytes([SEQUENCE_ID]))
    packet.key(13, wire.VARINT).constant(bytes([_NEEDS_STATE]))
    return wire.Layout().message(1, packet)
