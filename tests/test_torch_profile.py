"""ctx.tracing.torch_profiler(): PyTorch profiler events and Iris events on one clock."""

import json
from collections import defaultdict

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from conftest import SMALL_WORLD, get_pool
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from torch.profiler import ProfilerActivity, record_function

import iris
from iris_trace import schema
from iris_trace.export.chrome import write_chrome_json
from iris_trace.export.perfetto import write_perfetto
from iris_trace.plot_profile import profile_timeline
from iris_trace.torch_profile import (
    MARKER_KERNEL,
    MARKER_RANGE,
    MARKERS_PER_END,
    ProfileError,
    TorchProfile,
    fit_profile_clock,
)
from iris_trace.trace import RankTrace, Trace, TraceFileError


def test_markers_of_one_end_are_intersected():
    # kineto - device lies in [1000, 1002] and [999, 1003]: the intersection's middle.
    clock = fit_profile_clock(np.array([[100, 1100, 1102, 0], [200, 1199, 1203, 0]]))
    assert (clock.offset_ns, clock.uncertainty_ns, clock.drift) == (1001.0, 1.0, 0.0)
    assert clock.to_device(np.array([1500.0])).tolist() == [499.0]


def test_two_ends_give_the_drift():
    # The offset grows by 10 ns over 10,010 ns of the profiler's time.
    anchors = np.array([[0, 1000, 1000, 0], [10_000, 11_010, 11_010, 1]])
    clock = fit_profile_clock(anchors)
    assert clock.drift == pytest.approx(10 / 10_010) and clock.to_device(np.array([11_010.0]))[
        0
    ] == pytest.approx(10_000)


def test_markers_that_disagree_fall_back_to_their_median_and_say_how_far_apart():
    clock = fit_profile_clock(np.array([[0, 100, 101, 0], [0, 200, 201, 0], [0, 150, 151, 0]]))
    assert clock.offset_ns == 150.5 and clock.uncertainty_ns == 50.5


def _kineto(markers, name=MARKER_RANGE, category="user_annotation", extra=()):
    base = 1_700_000_000_000_000_000
    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "thread 7 (python)"}}]
    events += [
        {
            "ph": "X",
            "cat": category,
            "name": name,
            "pid": 1,
            "tid": 7,
            "ts": ts / 1000,
            "dur": 2.0,
            "args": {},
        }
        for ts in markers
    ]
    return {"traceEvents": events + list(extra), "baseTimeNanoseconds": base}, base


def test_a_kineto_trace_is_read_into_events_tracks_and_launch_pairs():
    markers = [1000 * i for i in range(2 * MARKERS_PER_END)]
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 7, "ts": 50.0,
              "dur": 3.0, "args": {"correlation": 9}}  # fmt: skip
    kernel = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 3, "ts": 55.5, "dur": 20.0,
              "args": {"correlation": 9, "stream": 3}}  # fmt: skip
    document, base = _kineto(markers, extra=[launch, kernel])
    stamps = np.arange(2 * MARKERS_PER_END).reshape(2, -1)
    profile = TorchProfile.from_kineto(document, stamps)
    assert profile.source == "host ranges" and len(profile.anchors) == 2 * MARKERS_PER_END
    assert [profile.names[i] for i in profile.events["name"]] == ["cudaLaunchKernel", "gemm"]
    assert [profile.tracks[i] for i in profile.events["track"]] == [
        "host · thread 7 (python)",
        "CUDA stream 3",
    ]
    assert profile.events["start_ns"].tolist() == [base + 50_000, base + 55_500]
    assert [x.tolist() for x in profile.launches()] == [[0], [1]]


def test_marker_kernels_are_preferred_to_the_ranges_around_them():
    markers = [1000 * i for i in range(2 * MARKERS_PER_END)]
    document, _ = _kineto(markers)
    kernels, _ = _kineto([m + 300 for m in markers], name=MARKER_KERNEL, category="kernel")
    document["traceEvents"] += kernels["traceEvents"][1:]
    profile = TorchProfile.from_kineto(document, np.zeros((2, MARKERS_PER_END)))
    assert profile.source == "kernels" and len(profile.events) == 0  # markers are not events


def test_a_profile_without_its_markers_is_refused_in_one_line():
    document, _ = _kineto([0, 1000])
    with pytest.raises(ProfileError, match="holds 0 marker kernels and 2 marker ranges, expected 16"):
        TorchProfile.from_kineto(document, np.zeros((2, MARKERS_PER_END)))
    with pytest.raises(ProfileError, match="no traceEvents list"):
        TorchProfile.from_kineto({"traceEvents": "x"}, np.zeros((2, MARKERS_PER_END)))


#: On GPUs the profile holds the kernels too: the markers are found as kernels and each
#: kernel's slice bounds its Iris events; under emulation the host range that ran it does.
ACTIVITIES = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if iris.BACKEND == "cuda" else [])
HOLDER = "put_block" if iris.BACKEND == "cuda" else "step"
MARKERS_FOUND_AS = "kernels" if iris.BACKEND == "cuda" else "host ranges"


@triton.jit
def put_block(buf, cur_rank, world_size, heap_bases):
    offsets = tl.arange(0, 16)
    iris.put(buf + offsets, buf + 16 + offsets, cur_rank, (cur_rank + 1) % world_size, heap_bases)


def _profiled_body(rank, world_size, directory):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.zeros(32, dtype=torch.float32)
        ctx.tracing.enable(max_events=1 << 10)
        with pytest.raises(ValueError, match="takes no schedule"):
            with ctx.tracing.torch_profiler(schedule=torch.profiler.schedule(wait=0, warmup=0, active=1)):
                pass
        with ctx.tracing.torch_profiler(activities=ACTIVITIES) as prof:
            with record_function("step"):
                put_block[(1,)](buf, rank, world_size, ctx.get_heap_bases())
            torch.ones(8).add_(1)
        assert any(e.key == "step" for e in prof.key_averages())  # the profiler, as usual
        with pytest.raises(RuntimeError, match="previous .* profile has not been collected"):
            with ctx.tracing.torch_profiler(activities=ACTIVITIES):
                pass
        ctx.barrier()
        ctx.tracing.export(directory)
        with ctx.tracing.torch_profiler(activities=ACTIVITIES):  # collected: a new one may replace it
            pass


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    if SMALL_WORLD is None:
        pytest.skip("IRIS_TEST_WORLD_SIZES has no world size above 1")
    directory = tmp_path_factory.mktemp("profiled")
    get_pool(SMALL_WORLD).run(_profiled_body, str(directory))
    return directory


def _trace(directory):
    return Trace.from_files(sorted(str(p) for p in directory.glob("rank*.npz")))


def test_each_ranks_iris_ops_fall_inside_the_profiler_slice_that_ran_them(profiled):
    trace = _trace(profiled)
    puts = trace.events[trace.events["event_id"] == int(schema.Event.PUT)]
    for rank in range(trace.world_size):
        profile, start, end = trace.torch_events(rank)
        names = [profile.names[i] for i in profile.events["name"]]
        holder, slack = names.index(HOLDER), profile.clock().uncertainty_ns
        mine = puts[puts["cur_rank"] == rank]
        assert len(mine) == 1 and "aten::add_" in names and profile.source == MARKERS_FOUND_AS
        assert start[holder] - slack <= mine["start_ns"][0], (rank, start[holder], slack, mine)
        assert mine["end_ns"][0] <= end[holder] + slack, (rank, end[holder], slack, mine)


def _perfetto_slices(path):
    trace = pb.Trace()
    trace.ParseFromString(open(path, "rb").read())
    tracks = {
        p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")
    }
    stacks, slices = defaultdict(list), []
    events = [p for p in trace.packet if p.HasField("track_event") and p.track_event.name]
    ends = [p for p in trace.packet if p.HasField("track_event") and p.track_event.type == 2]
    for packet in sorted(events + ends, key=lambda p: (p.timestamp, p.track_event.type != 2)):
        event = packet.track_event
        if event.type == 1:
            stacks[event.track_uuid].append(packet)
        elif event.type == 2 and stacks[event.track_uuid]:
            begin = stacks[event.track_uuid].pop()
            slices.append(
                (tracks[event.track_uuid], begin.track_event.name, begin.timestamp, packet.timestamp)
            )
    return tracks, slices


def test_the_merged_perfetto_trace_puts_each_ranks_host_threads_under_that_rank(profiled, tmp_path):
    trace = _trace(profiled)
    written = write_perfetto(trace, str(tmp_path / "t.pftrace"))
    tracks, slices = _perfetto_slices(str(tmp_path / "t.pftrace"))
    assert written["torch_slices"] == sum(
        len(trace.torch_events(r)[0].events) for r in range(trace.world_size)
    )
    host = [d for d in tracks.values() if d.name.startswith("host · ")]
    assert sorted({tracks[d.parent_uuid].process.process_name[:6] for d in host}) == [
        f"rank {r}" for r in range(trace.world_size)
    ]
    steps = [s for s in slices if s[1] == "step" and s[0].name.startswith("host · ")]
    assert len(steps) == trace.world_size and all(begin < end for _, _, begin, end in steps)


def test_a_rank_file_keeps_the_profile_and_refuses_a_damaged_one(profiled, tmp_path):
    path = sorted(profiled.glob("rank*.npz"))[0]
    rank = RankTrace.load(str(path))
    assert rank.torch is not None and rank.torch.source == MARKERS_FOUND_AS
    broken = tmp_path / "rank0.npz"
    rank.torch.events["name"][0] = 10**6
    rank.save(str(broken))
    with pytest.raises(TraceFileError, match="names a string the file does not hold"):
        RankTrace.load(str(broken))
    rank.torch.events["name"][0] = 0
    rank.torch.anchors = np.zeros((0, 4), np.int64)
    rank.save(str(broken))
    with pytest.raises(TraceFileError, match="are not clock markers"):
        RankTrace.load(str(broken))


def test_profile_strings_that_are_not_the_names_and_tracks_are_refused(profiled, tmp_path):
    rank = RankTrace.load(str(sorted(profiled.glob("rank*.npz"))[0]))
    arrays = {**rank.torch.arrays(), "torch_strings": np.array(json.dumps({"names": [1], "tracks": []}))}
    with pytest.raises(ProfileError, match="not the profile's names and tracks"):
        TorchProfile.from_arrays("rank0.npz", arrays)


def test_the_picture_of_one_timeline_is_drawn_and_needs_a_profile(profiled, tmp_path):
    trace = _trace(profiled)
    path = profile_timeline(trace, str(tmp_path / "profile.png"), title="test")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    for rank in trace.ranks:
        rank.torch = None
    with pytest.raises(ValueError, match="holds no PyTorch profile"):
        profile_timeline(trace, str(tmp_path / "none.png"))


def test_the_chrome_json_export_carries_the_profile_too(profiled, tmp_path):
    trace = _trace(profiled)
    written = write_chrome_json(trace, str(tmp_path / "t.json"))
    document = json.loads((tmp_path / "t.json").read_text())
    threads = {(e["pid"], e["args"]["name"]) for e in document["traceEvents"] if e["name"] == "thread_name"}
    for rank in range(trace.world_size):
        assert any(pid == rank and name.startswith("host · ") for pid, name in threads), threads
    torch_slices = [e for e in document["traceEvents"] if e.get("cat") == "torch"]
    assert len(torch_slices) == written["torch_slices"] and all(e["tid"] < 0 for e in torch_slices)
    assert all(float(e["ts"]) >= 0 for e in document["traceEvents"] if "ts" in e)
    steps = [e for e in torch_slices if e["name"] == "step"]
    assert len(steps) >= trace.world_size
