"""Exports: Perfetto protobuf and Chrome JSON parsed back and checked against the input events."""

import json
import os
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest
import torch
from kernels import ping_pong_rounds
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import iris
from iris_trace.events import DMA_CU_BASE, DMA_PUT, EVENT_DTYPE, lane_name
from iris_trace.export import wire
from iris_trace.export.chrome import write_chrome_json
from iris_trace.export.perfetto import write_perfetto
from iris_trace.lanes import assign_lanes
from iris_trace.trace import RankTrace, Trace

PUT, SIGNAL, WAIT, SCOPE = 4, 15, 16, 64


def make_events(rows):
    """rows: (event_id, rank, target, cu, pid, start, end, address, bytes, value)."""
    events = np.zeros(len(rows), EVENT_DTYPE)
    fields = ("event_id", "cur_rank", "target_rank", "cu_id", "pid", "start_ns", "end_ns", "address")
    for i, row in enumerate(rows):
        for field, value in zip((*fields, "payload_bytes", "value"), row):
            events[i][field] = value
        events[i]["pid_m"] = events[i]["pid_n"] = -1
        events[i]["op_index"] = i
    return events


def make_trace(rows, world=2, dropped=0):
    events = make_events(rows)
    sync = np.zeros((world, 4, 4), np.int64)
    ranks = [
        RankTrace(
            r,
            world,
            events[events["cur_rank"] == r],
            sync,
            sync,
            dropped=dropped,
            device="Test GPU",
            scope_names={0: "gemm"},
            command="pytest",
        )
        for r in range(world)
    ]
    return Trace(ranks)


# rank 0, SM 3: program 0 computes [0, 100) and inside it puts then signals rank 1;
# program 1 on the same SM overlaps it, so it needs a second lane.
# rank 1, SM 5: waits [5, 45) for the flag rank 0 signals at 30.
ROWS = [
    (SCOPE, 0, -1, 3, 0, 0, 100, -1, 0, 0),
    (PUT, 0, 1, 3, 0, 10, 20, 256, 4096, 0),
    (SIGNAL, 0, 1, 3, 0, 30, 40, 512, 4, 1),
    (PUT, 0, 1, 3, 1, 50, 150, 1024, 8192, 0),
    (WAIT, 1, 1, 5, 0, 5, 45, 512, 4, 1),
    (PUT, 1, 0, 5, 0, 60, 60, 2048, 64, 0),  # zero length: an instant
]


def read_perfetto(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    return trace


@pytest.fixture
def exported(tmp_path):
    trace = make_trace(ROWS, dropped=2)
    path = str(tmp_path / "t.pftrace")
    stats = write_perfetto(trace, path, chunk_events=2)  # tiny chunks: exercise chunk boundaries
    return trace, read_perfetto(path), stats


def test_wire_varints_parse_back_including_negatives():
    values = np.array([0, 1, 127, 128, 2**40, -1, -(2**40)])
    rows = (
        wire.Layout().key(4, wire.VARINT).varint("value", wire.varint_width(values)).encode({"value": values})
    )
    for row, value in zip(rows, values.tolist()):
        annotation = pb.DebugAnnotation()
        annotation.ParseFromString(bytes(row))
        assert annotation.int_value == value


def test_lanes_separate_overlapping_programs_only():
    events = make_events(ROWS)
    lanes = assign_lanes(events)
    assert lanes.tolist() == [0, 0, 0, 1, 0, 0]
    sequential = make_events([(PUT, 0, 1, 3, p, 10 * p, 10 * p + 5, 0, 4, 0) for p in range(4)])
    assert assign_lanes(sequential).tolist() == [0, 0, 0, 0]


def test_perfetto_tracks_name_ranks_and_sm_lanes(exported):
    _, trace, _ = exported
    names = {
        p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")
    }
    processes = sorted(d.process.process_name for d in names.values() if d.HasField("process"))
    assert processes == ["rank 0 · Test GPU", "rank 1 · Test GPU"]
    lanes = sorted(d.name for d in names.values() if d.name.startswith("SM"))
    assert lanes == ["SM 3", "SM 3 · lane 1", "SM 5"]


def test_copy_engine_puts_get_a_track_of_their_own(tmp_path):
    rows = [*ROWS, (DMA_PUT, 0, 1, DMA_CU_BASE + 1, -1, 10, 90, 4096, 1 << 20, 0)]
    path = str(tmp_path / "t.pftrace")
    write_perfetto(make_trace(rows), path)
    names = {p.track_descriptor.name for p in read_perfetto(path).packet if p.HasField("track_descriptor")}
    assert "copy engine → rank 1" in names
    write_chrome_json(make_trace(rows), str(tmp_path / "t.json"))
    data = json.loads((tmp_path / "t.json").read_text())
    threads = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert "copy engine → rank 1" in threads
    assert lane_name(DMA_CU_BASE + 3, 2) == "copy engine → rank 3 · lane 2"


def slices_by_track(trace):
    """Replay begin/end packets per track (time order, file order on ties); check strict nesting."""
    interned = {}
    for packet in trace.packet:
        for entry in packet.interned_data.event_names:
            interned[entry.iid] = entry.name
    events = [p for p in trace.packet if p.HasField("track_event")]
    order = sorted(range(len(events)), key=lambda i: (events[i].timestamp, i))
    stacks, slices = defaultdict(list), []
    for i in order:
        packet = events[i]
        event = packet.track_event
        if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stacks[event.track_uuid].append((packet, interned[event.name_iid]))
        elif event.type == pb.TrackEvent.TYPE_SLICE_END:
            assert stacks[event.track_uuid], "an end without a begin"
            begin, name = stacks[event.track_uuid].pop()
            slices.append((name, begin, packet.timestamp - begin.timestamp))
        elif event.type == pb.TrackEvent.TYPE_INSTANT and event.name_iid:
            slices.append((interned[event.name_iid], packet, 0))
    assert all(not stack for stack in stacks.values()), "a begin without an end"
    return slices


def test_perfetto_slices_nest_and_match_the_events(exported):
    source, trace, stats = exported
    slices = slices_by_track(trace)
    assert stats["slices"] == len(slices) == len(ROWS)
    assert sorted(name for name, _, _ in slices) == ["gemm", "put", "put", "put", "signal", "wait_until"]
    durations = sorted(d for _, _, d in slices)
    assert durations == sorted(e - s for *_, s, e, _, _, _ in ROWS)


def interned_arg_names(trace) -> dict[int, str]:
    """Debug-annotation names by interned id."""
    return {
        entry.iid: entry.name
        for packet in trace.packet
        for entry in packet.interned_data.debug_annotation_names
    }


def test_perfetto_slice_args_carry_the_event_fields(exported):
    _, trace, _ = exported
    arg_names = interned_arg_names(trace)
    put = next(b for name, b, d in slices_by_track(trace) if name == "put" and d == 10)
    args = {arg_names[a.name_iid]: a.int_value for a in put.track_event.debug_annotations}
    pointers = {arg_names[a.name_iid]: a.pointer_value for a in put.track_event.debug_annotations}
    assert args["target_rank"] == 1 and args["payload_bytes"] == 4096
    assert pointers["address"] == 256  # a pointer_value: the UI shows it in hex
    assert args["pid"] == 0 and args["pid_m"] == -1 and args["cu_id"] == 3


def test_perfetto_flow_goes_from_signal_to_the_wait_it_released(exported):
    _, trace, stats = exported
    by_name = {name: begin for name, begin, _ in slices_by_track(trace)}
    out = list(by_name["signal"].track_event.flow_ids)
    into = list(by_name["wait_until"].track_event.terminating_flow_ids)
    assert stats["flows"] == 1 and out == into and len(out) == 1


def test_perfetto_metadata_and_counters(exported):
    _, trace, _ = exported
    meta = next(p for p in trace.packet if p.track_event.name == "trace metadata")
    fields = {a.name: (a.int_value or a.string_value) for a in meta.track_event.debug_annotations}
    assert fields["world_size"] == 2 and json.loads(fields["dropped_events_per_rank"]) == [2, 2]
    assert json.loads(fields["clock_residual_ns"]) == [0.0, 0.0] and fields["command"] == "pytest"
    counters = [p for p in trace.packet if p.track_event.type == pb.TrackEvent.TYPE_COUNTER]
    assert sum(p.track_event.double_counter_value for p in counters) > 0
    # A sample only where the rate changes: a handful per rank, not one per bin.
    by_track = {}
    for packet in counters:
        by_track.setdefault(packet.track_event.track_uuid, []).append(packet.track_event.double_counter_value)
    assert len(by_track) == 2 and len(counters) < 20
    assert all(a != b for values in by_track.values() for a, b in zip(values, values[1:]))


def test_chrome_json_has_slices_names_and_flows(tmp_path):
    trace = make_trace(ROWS)
    path = tmp_path / "t.json"
    write_chrome_json(trace, str(path))
    data = json.loads(path.read_text())
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(ROWS)
    put = next(e for e in slices if e["name"] == "put" and e["args"]["address"] == "0x100")
    assert (put["pid"], put["tid"], put["ts"], put["dur"]) == (0, 3 * 64, 0.010, 0.010)
    thread_names = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"
    }
    assert thread_names[(0, 3 * 64 + 1)] == "SM 3 · lane 1"
    starts = {e["id"]: e for e in data["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in data["traceEvents"] if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == 1
    assert data["metadata"]["world_size"] == 2


@pytest.mark.skipif(not os.environ.get("IRIS_TRACE_PROCESSOR"), reason="set IRIS_TRACE_PROCESSOR to a binary")
def test_trace_processor_loads_the_export_without_errors(exported, tmp_path):
    from iris_trace.export.validate import check_with_trace_processor

    path = str(tmp_path / "t.pftrace")
    result = check_with_trace_processor(path, os.environ["IRIS_TRACE_PROCESSOR"])
    assert result.clean, result.errors
    assert result.slices == len(ROWS) and result.flows == 1


def _save_ranks(directory, trace):
    return [str(p) for p in trace.save(str(directory))]


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "iris_trace", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_merge_report_plot(tmp_path):
    files = _save_ranks(tmp_path / "ranks", make_trace(ROWS))
    result = run_cli("merge", *files, "-o", str(tmp_path / "m.pftrace"), "--json", str(tmp_path / "m.json"))
    assert result.returncode == 0, result.stderr
    assert len(slices_by_track(read_perfetto(tmp_path / "m.pftrace"))) == len(ROWS)
    result = run_cli("report", *files, "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "csv"))
    assert result.returncode == 0 and "rank" in result.stdout, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["top_stalls"][0]["releaser_rank"] == 0
    pytest.importorskip("matplotlib")
    result = run_cli("plot", *files, "-o", str(tmp_path / "h.png"))
    assert result.returncode == 0 and (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_names_the_bad_file(tmp_path):
    files = _save_ranks(tmp_path / "ranks", make_trace(ROWS))
    broken = tmp_path / "rank9.npz"
    broken.write_bytes(b"\x00" * 10)
    result = run_cli("merge", files[0], str(broken), "-o", str(tmp_path / "x.pftrace"))
    assert result.returncode == 2 and "rank9.npz" in result.stderr
    other = _save_ranks(tmp_path / "three", make_trace([r for r in ROWS if r[1] == 0], world=3))
    result = run_cli("report", files[0], other[1])
    assert result.returncode == 2 and "world size" in result.stderr


def _traced_run_body(rank, world_size, directory, rounds):
    with iris.iris(1 << 24) as ctx:
        data, flag, ack = ctx.randn(64), ctx.zeros(1, dtype=torch.int32), ctx.zeros(1, dtype=torch.int32)
        ctx.tracing.enable(max_events=16 * rounds * ctx.get_cu_count())
        ping_pong_rounds[(1,)](data, flag, ack, rounds, rank, ctx.get_heap_bases(), BLOCK=64)
        ctx.barrier()
        return ctx.tracing.collect(directory)


def test_end_to_end_traced_run_merges_and_exports(tmp_path):
    from conftest import small_world_pool

    rounds = 5
    files = small_world_pool().run(_traced_run_body, str(tmp_path / "ranks"), rounds)
    result = run_cli(
        "merge", *files, "-o", str(tmp_path / "run.pftrace"), "--json", str(tmp_path / "run.json")
    )
    assert result.returncode == 0, result.stderr
    slices = slices_by_track(read_perfetto(tmp_path / "run.pftrace"))
    names = sorted(name for name, _, _ in slices)
    assert names.count("put") == rounds and names.count("signal") == 2 * rounds
    assert names.count("wait_until") == 2 * rounds
    flows = [e for e in json.loads((tmp_path / "run.json").read_text())["traceEvents"] if e["ph"] == "f"]
    assert len(flows) >= rounds  # every wait after the first round was released by a signal


def test_cli_says_in_one_line_that_a_file_is_no_rank_file(tmp_path):
    perfetto_file = tmp_path / "run.pftrace"
    perfetto_file.write_bytes(b"\x0a\x02\x08\x01")
    result = run_cli("report", str(perfetto_file))
    assert result.returncode == 2 and "allow_pickle" not in result.stderr
    assert result.stderr.strip() == (
        f"iris-trace: {perfetto_file}: not an Iris rank file (a rank<N>.npz written by "
        "ctx.tracing.collect(directory) or ctx.tracing.export(directory))"
    )


def test_cli_names_a_bad_trace_processor_in_one_line(tmp_path):
    result = run_cli("validate", str(tmp_path / "x.pftrace"), "--trace-processor", "/no/such/binary")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "iris-trace: /no/such/binary: not an executable trace_processor_shell"


def test_cli_help_explains_every_argument_without_markup():
    plot_help = run_cli("plot", "--help").stdout
    for text in ("one rank<N>.npz per rank", "the .png to write", "time bins", "--title"):
        assert text in plot_help, plot_help
    top_help = run_cli("--help").stdout
    assert "``" not in top_help and "ctx.tracing.collect" in top_help
    report_help = run_cli("report", "--help").stdout
    assert "columns:" in report_help and "late look" in report_help


def test_cli_plot_draws_the_timeline_with_a_title(tmp_path):
    pytest.importorskip("matplotlib")
    files = _save_ranks(tmp_path / "ranks", make_trace(ROWS))
    result = run_cli("plot", *files, "-o", str(tmp_path / "t.png"), "--title", "mine", "--bins", "50")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_ranks_on_one_clock_get_no_fitted_offset():
    events = make_events(ROWS)
    sync = np.zeros((2, 4, 4), np.int64)
    sync[1, :, :] = [[0, 500, 510, 20]] * 4  # would fit an offset of +495 ns
    ranks = [
        RankTrace(r, 2, events[events["cur_rank"] == r], sync, sync, clock_domain="gpu:one") for r in range(2)
    ]
    shared = Trace(ranks)
    assert shared.clock_fits[1].offset_ns == 0.0 and shared.clock_fits[1].shared_clock
    assert shared.clock_fits[1].rtt_ns == 10.0  # still measured, for reference
    from iris_trace.analysis import trace_notes

    assert any("read one clock" in note for note in trace_notes(shared))
    ranks[1].clock_domain = "gpu:two"
    separate = Trace(ranks)
    assert separate.clock_fits[1].offset_ns == 495.0 and not separate.clock_fits[1].shared_clock


#: The wait of ROWS (rank 1, 5-45 ns), released by rank 0's signal (30-40) while its SM's scope ran:
#: nothing had ended before the release, its SM pushed 10 ns (the put at 10-20) and idled 15.
WAIT_SPLIT = {
    "computing_ns": 0,
    "releaser_waiting_ns": 0,
    "not_started_ns": 0,
    "not_released_ns": 15,
    "in_flight_ns": 20,
    "late_look_ns": 5,
}


def test_perfetto_waits_carry_why_they_waited(exported):
    _, trace, _ = exported
    arg_names = interned_arg_names(trace)
    wait = next(b for name, b, _ in slices_by_track(trace) if name == "wait_until")
    args = {arg_names[a.name_iid]: a.int_value for a in wait.track_event.debug_annotations}
    assert {part: args[part] for part in WAIT_SPLIT} == WAIT_SPLIT
    put = next(b for name, b, _ in slices_by_track(trace) if name == "put")
    assert not {arg_names[a.name_iid] for a in put.track_event.debug_annotations} & set(WAIT_SPLIT)


def test_chrome_json_waits_carry_why_they_waited(tmp_path):
    write_chrome_json(make_trace(ROWS), str(tmp_path / "t.json"))
    slices = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "X"]
    (wait,) = [e for e in slices if e["name"] == "wait_until"]
    assert {part: wait["args"][part] for part in WAIT_SPLIT} == WAIT_SPLIT
    assert all("late_look_ns" not in e["args"] for e in slices if e["name"] != "wait_until")
