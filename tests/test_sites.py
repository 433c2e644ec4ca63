"""Every event names its kernel, its launch and the source line that called the op (iris_trace.sites)."""

import inspect
import json
import os

import numpy as np
import pytest
import triton
import triton.language as tl
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import iris
from iris.backends._cuda_call_sites import MARKER, PLACEHOLDER_ASM, assign_sites
from iris_trace import schema
from iris_trace.analysis import analyze_trace
from iris_trace.events import EVENT_DTYPE, decode_records
from iris_trace.export.chrome import write_chrome_json
from iris_trace.export.perfetto import write_perfetto
from iris_trace.sites import Launch, Site, name_launches
from iris_trace.trace import RankTrace, Trace, TraceFileError


@triton.jit
def two_call_sites(src, dst, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    peer = (cur_rank + 1) % world_size
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    iris.put(src + offsets, dst + offsets, cur_rank, peer, heap_bases)  # site: put
    began = iris.trace_begin(heap_bases)
    iris.store(dst + offsets, tl.load(src + offsets), cur_rank, peer, heap_bases)  # site: store
    iris.trace_end(heap_bases, began, scope=1)  # site: scope


def _line_of(marker: str) -> int:
    lines, first = inspect.getsourcelines(two_call_sites.fn)
    return first + next(i for i, text in enumerate(lines) if text.rstrip().endswith(f"# site: {marker}"))


def _call_sites_body(rank, world_size, launches):
    with iris.iris(1 << 22) as ctx:
        src, dst = ctx.ones(256), ctx.zeros(256)
        ctx.tracing.enable(max_events=1024)
        for _ in range(launches):
            two_call_sites[(2,)](src, dst, rank, world_size, ctx.get_heap_bases(), BLOCK=128)
        ctx.barrier()
        return ctx.tracing.collect()


def test_each_event_names_its_kernel_launch_and_line(multi_world):
    trace = multi_world.run(_call_sites_body, 2)[0]
    events, site_at, launch_at, labels = trace.events, *trace.origins
    names = {schema.PUT: "put", schema.STORE: "store", schema.SCOPE_BASE + 1: "scope"}
    for event_id, marker in names.items():
        chosen = events["event_id"] == event_id
        sites = {trace.sites[s] for s in np.unique(events["site"][chosen]).tolist()}
        assert sites == {Site("two_call_sites", os.path.abspath(__file__), _line_of(marker))}
        assert {labels[i] for i in site_at[chosen]} == {f"two_call_sites · test_sites.py:{_line_of(marker)}"}
    for rank in range(multi_world.world_size):
        mine = events["cur_rank"] == rank
        launches = {trace.launches[rank][t] for t in np.unique(events["launch"][mine]).tolist()}
        assert launches == {Launch("two_call_sites", i, (2, 1, 1)) for i in range(2)}
        # Each launch's events: every op of its two programs once.
        for tag in np.unique(events["launch"][mine]).tolist():
            assert (mine & (events["launch"] == tag)).sum() == 2 * 3
    assert labels[launch_at[0]].startswith("two_call_sites #")


def _library_sites_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        x, out = ctx.ones(64), ctx.zeros(64)
        ctx.tracing.enable(max_events=4096)
        ctx.ccl.all_reduce(out, x)
        ctx.barrier()
        return ctx.tracing.collect()


def test_an_iris_kernel_names_its_own_lines(multi_world):
    trace = multi_world.run(_library_sites_body)[0]
    package = os.path.dirname(os.path.abspath(iris.__file__))
    sites = [trace.sites[s] for s in np.unique(trace.events["site"]).tolist()]
    assert sites and all(site.file.startswith(package + os.sep) for site in sites)
    # The kernel's own line, not the test's (the host code that launched it).
    assert all(site.line > 0 and "test_sites" not in site.file for site in sites)


def _events(rows):
    # rows: (rank, launch tag, site, start)
    events = np.zeros(len(rows), EVENT_DTYPE)
    for i, (rank, tag, site, start) in enumerate(rows):
        events[i]["cur_rank"], events[i]["launch"], events[i]["site"] = rank, tag, site
        events[i]["event_id"], events[i]["target_rank"] = schema.PUT, 1 - rank
        events[i]["start_ns"], events[i]["end_ns"] = start, start + 10
        events[i]["payload_bytes"], events[i]["pid_m"], events[i]["pid_n"] = 64, -1, -1
    return events


SITES = {7: Site("k", "/app/k.py", 3), 9: Site("other", "/app/o.py", 5)}


def test_gpu_launches_take_the_logged_grids_in_order_when_every_launch_recorded():
    events = _events([(0, 501, 7, 0), (0, 502, 9, 5), (0, 504, 7, 20), (0, 501, 7, 30)])
    log = [("k", (4, 1, 1), None), ("other", (1, 1, 1), None), ("k", (8, 2, 1), None)]
    assert name_launches(events, SITES, log) == {
        501: Launch("k", 0, (4, 1, 1)),
        504: Launch("k", 1, (8, 2, 1)),
        502: Launch("other", 0, (1, 1, 1)),
    }


def test_gpu_launches_keep_their_order_but_no_grid_when_a_launch_recorded_nothing():
    events = _events([(0, 501, 7, 0), (0, 504, 7, 20)])
    log = [("k", (4, 1, 1), None), ("k", (2, 1, 1), None), ("k", (8, 1, 1), None)]
    assert name_launches(events, SITES, log) == {501: Launch("k", 0), 504: Launch("k", 1)}


def test_emulated_launches_are_named_by_their_tags():
    events = _events([(0, 3, 7, 0), (0, 5, 7, 20)])
    log = [("k", (1, 1, 1), 3), ("k", (2, 1, 1), 4), ("k", (3, 1, 1), 5)]
    assert name_launches(events, SITES, log) == {3: Launch("k", 0, (1, 1, 1)), 5: Launch("k", 1, (3, 1, 1))}


def test_a_record_carries_its_launch_and_site_above_its_address_and_bytes():
    record = np.zeros((1, 1, schema.RECORD_WORDS), np.int64)
    record[0, 0, schema.W_END] = 1
    record[0, 0, schema.W_ADDRESS] = (-1 & schema.FIELD_MASK) | (77 << schema.LAUNCH_SHIFT)
    record[0, 0, schema.W_BYTES] = 4096 | (1234 << schema.SITE_SHIFT)
    event = decode_records(record.reshape(-1), [1], 1)[0]
    assert (event["address"], event["payload_bytes"], event["launch"], event["site"]) == (-1, 4096, 77, 1234)


def _trace(tmp_path=None):
    events = _events([(0, 501, 7, 0), (1, 601, 9, 5)])
    sync = np.zeros((2, 4, 4), np.int64)
    ranks = [
        RankTrace(
            r, 2, events[events["cur_rank"] == r], sync, sync,
            sites={7: SITES[7]} if r == 0 else {9: SITES[9]},
            launches={501: Launch("k", 0, (4, 1, 1))} if r == 0 else {601: Launch("other", 0)},
        )
        for r in range(2)
    ]  # fmt: skip
    if tmp_path is None:
        return Trace(ranks)
    return Trace.from_files([r.save(str(tmp_path / f"rank{r.rank}.npz")) for r in ranks])


def test_rank_files_keep_the_sites_and_launches(tmp_path):
    trace = _trace(tmp_path)
    assert trace.sites == SITES
    assert trace.launches == [{501: Launch("k", 0, (4, 1, 1))}, {601: Launch("other", 0)}]


def test_a_rank_file_with_malformed_sites_is_refused_in_one_line(tmp_path):
    path = _trace(tmp_path).ranks[0].save(str(tmp_path / "rank0.npz"))
    arrays = dict(np.load(path))
    meta = json.loads(str(arrays["meta"]))
    meta["sites"] = {"7": ["k", "/app/k.py", "three"]}
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    with pytest.raises(TraceFileError, match="call sites or launches are malformed"):
        RankTrace.load(path)


def test_exports_show_each_events_call_site_and_launch(tmp_path):
    trace = _trace()
    write_chrome_json(trace, str(tmp_path / "t.json"))
    slices = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert {(e["args"]["call_site"], e["args"]["launch"]) for e in slices} == {
        ("k · k.py:3", "k #0 (4, 1, 1)"),
        ("other · o.py:5", "other #0"),
    }
    write_perfetto(trace, str(tmp_path / "t.pftrace"))
    parsed = pb.Trace()
    parsed.ParseFromString((tmp_path / "t.pftrace").read_bytes())
    names, strings = {}, {}
    for packet in parsed.packet:
        for entry in packet.interned_data.debug_annotation_names:
            names[entry.iid] = entry.name
        for entry in packet.interned_data.debug_annotation_string_values:
            strings[entry.iid] = entry.str.decode()
    shown = set()
    for packet in parsed.packet:
        args = {names.get(a.name_iid): a.string_value_iid for a in packet.track_event.debug_annotations}
        if "call_site" in args:
            shown.add((strings[args["call_site"]], strings[args["launch"]]))
    assert shown == {("k · k.py:3", "k #0 (4, 1, 1)"), ("other · o.py:5", "other #0")}


def test_the_report_says_where_the_time_went_by_call_site():
    report = analyze_trace(_trace())
    assert [(r["site"], r["events"], r["comm_ns"]) for r in report.call_sites] == [
        ("k · k.py:3", 1, 10),
        ("other · o.py:5", 1, 10),
    ]
    assert "by call site" in report.format_table() and "k · k.py:3" in report.format_table()


# ---------------------------------------------------------------- the site pass (LLVM IR)
LLIR = f"""define ptx_kernel void @my_kernel(ptr %0) !dbg !4 {{
  %a = tail call i32 asm sideeffect "{PLACEHOLDER_ASM}", "=r"() #5, !dbg !10
  %b = tail call i32 asm sideeffect "{PLACEHOLDER_ASM}", "=r"() #5, !dbg !20
  ret void
}}
!1 = !DIFile(filename: "app.py", directory: "/work")
!4 = distinct !DISubprogram(name: "my_kernel", linkageName: "my_kernel", scope: !1, file: !1, line: 10)
!5 = distinct !DILexicalBlockFile(scope: !4, file: !6, discriminator: 0)
!6 = !DIFile(filename: "tracing.py", directory: "{os.path.dirname(iris.__file__)}/device")
!10 = !DILocation(line: 300, column: 1, scope: !5, inlinedAt: !11)
!11 = !DILocation(line: 14, column: 5, scope: !4)
!20 = !DILocation(line: 300, column: 1, scope: !5, inlinedAt: !21)
!21 = !DILocation(line: 17, column: 5, scope: !4)
"""


def test_the_site_pass_gives_each_copy_the_id_of_the_users_line():
    llir, sites = assign_sites(LLIR)
    first, second = (
        schema.site_id("my_kernel", "/work/app.py", 14),
        schema.site_id("my_kernel", "/work/app.py", 17),
    )
    assert sites == sorted([[first, "/work/app.py", 14], [second, "/work/app.py", 17]])
    assert f"mov.u32 $0, {first}; {MARKER}" in llir and f"mov.u32 $0, {second}; {MARKER}" in llir
    assert PLACEHOLDER_ASM not in llir


def test_the_site_pass_leaves_a_kernel_without_sites_alone():
    text = "define ptx_kernel void @plain() {\n  ret void\n}\n"
    assert assign_sites(text) == (text, [])


@pytest.mark.codegen
def test_a_compiled_kernel_carries_each_call_sites_id_fixed_at_compile_time():
    from offline import run_cuda_script

    report = json.loads(run_cuda_script("call_sites.py").strip().splitlines()[-1])
    expected = [[schema.site_id("two_puts", report["file"], line), line] for line in report["call_lines"]]
    # The file as the compiling process saw it: a cached binary may come from another copy of it.
    assert all(os.path.basename(file) == "call_sites.py" for _, file, _ in report["sites"])
    assert [[site, line] for site, _, line in report["sites"]] == sorted(expected)
    assert sorted(report["ptx_site_ids"]) == sorted(site for site, _ in expected)
    assert report["gridid_reads"] >= 1 and report["untraced_markers"] == 0


def test_an_id_two_call_sites_share_is_noted_in_the_trace(tmp_path):
    from iris.backends import call_sites

    shared_id = (1 << 24) - 3  # an id nothing else registers in this process
    try:
        call_sites.remember(shared_id, "k", "/app/k.py", 3)
        call_sites.remember(shared_id, "k", "/copy/of/k.py", 3)  # the same line elsewhere: not shared
        assert shared_id not in call_sites.SHARED
        call_sites.remember(shared_id, "k", "/app/k.py", 9)
        assert shared_id in call_sites.SHARED and call_sites.SITES[shared_id].line == 3
    finally:
        call_sites.SITES.pop(shared_id, None)
        call_sites.SHARED.discard(shared_id)
    trace = _trace()
    trace.ranks[0].shared_sites = [7]
    reloaded = Trace.from_files([r.save(str(tmp_path / f"rank{r.rank}.npz")) for r in trace.ranks])
    assert reloaded.shared_sites == [7]
    notes = analyze_trace(reloaded).notes
    assert any(
        "call site id 7 is the hash of two source lines" in note and "k · k.py:3" in note for note in notes
    )


def test_prepared_launches_keep_their_fast_path_while_only_the_launch_log_listens():
    from triton import knobs

    from iris.backends._cuda_call_sites import _note_launch
    from iris.host import prepared

    def profiler_hook(metadata):
        pass

    chain = knobs.runtime.launch_enter_hook
    assert not prepared._hooks_installed()
    chain.add(_note_launch)
    try:
        assert not prepared._hooks_installed()  # tracing's launch log alone: the fast path stays
        chain.add(profiler_hook)
        assert prepared._hooks_installed()  # anyone else listening: Triton's launcher, which calls hooks
    finally:
        chain.remove(_note_launch)
        chain.remove(profiler_hook)


@pytest.mark.parametrize(
    "content", ["not json", "[1, 2]", '{"iris_sites": [[1, 2]]}', '{"iris_sites": [["x", "f.py", 3]]}']
)
def test_a_cached_kernels_unreadable_metadata_names_no_line_and_breaks_no_launch(tmp_path, content):
    from iris.backends import _cuda_call_sites, call_sites

    path = tmp_path / "kernel.json"
    path.write_text(content)
    before = dict(call_sites.SITES)
    _cuda_call_sites._register_loaded(None, 1234, "kernel", {"kernel.json": str(path)}, "hash")
    assert call_sites.SITES == before and 1234 not in _cuda_call_sites._WITH_SITES
