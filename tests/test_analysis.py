"""Trace analysis and the stall heatmap on small synthetic traces with hand-computed answers."""

import csv
import json
import os

import numpy as np
import pytest

from iris_trace.analysis import analyze, match_releasers
from iris_trace.events import DMA_CU_BASE, EVENT_DTYPE, EVENT_NAMES, SCOPE_BASE
from iris_trace.intervals import Coverage
from iris_trace.plot import (
    COLOURS,
    STATES,
    _group_rows,
    binned_fractions,
    rank_overview,
    stall_heatmap,
    state_fractions,
    timeline,
)

ID = {name: event_id for event_id, name in EVENT_NAMES.items()}
GEMM = SCOPE_BASE  # user scope 0


def make_events(*specs) -> np.ndarray:
    """Events from ``(op, rank, sm, start_ns, end_ns, extra fields)`` tuples; unset fields 0 or -1.

    ``op`` is an op name or an event id (``GEMM`` for a compute scope).
    """
    events = np.zeros(len(specs), dtype=EVENT_DTYPE)
    events["target_rank"] = -1
    events["pid_m"] = -1
    events["pid_n"] = -1
    for i, (op, rank, sm, start, end, *extra) in enumerate(specs):
        fields = {"event_id": ID[op] if isinstance(op, str) else op, "cur_rank": rank, "cu_id": sm}
        fields.update(start_ns=start, end_ns=end, **(extra[0] if extra else {}))
        for name, value in fields.items():
            events[name][i] = value
    return events


def only_sm(report, rank=0, sm=0) -> dict:
    (row,) = [r for r in report.per_sm if (r["rank"], r["cu_id"]) == (rank, sm)]
    return row


def test_concurrent_ctas_on_one_sm_are_counted_once():
    events = make_events((GEMM, 0, 0, 0, 100), (GEMM, 0, 0, 50, 150))
    row = only_sm(analyze(events, 1))
    assert (row["compute_ns"], row["busy_ns"], row["compute_events"]) == (150, 150, 2)


def test_compute_fully_covering_a_put_overlaps_all_of_it():
    events = make_events((GEMM, 0, 0, 0, 100), ("put", 0, 0, 20, 60, {"payload_bytes": 256}))
    row = only_sm(analyze(events, 1))
    assert (row["overlap_ns"], row["comm_ns"]) == (40, 40)


def test_compute_partly_covering_a_put_overlaps_the_shared_part():
    events = make_events((GEMM, 0, 0, 0, 100), ("put", 0, 0, 80, 120))
    assert only_sm(analyze(events, 1))["overlap_ns"] == 20


def test_bytes_moved_counts_communication_only():
    events = make_events(
        ("put", 0, 0, 0, 10, {"payload_bytes": 256}),
        ("get", 0, 1, 0, 10, {"payload_bytes": 64}),
        ("wait_until", 0, 0, 10, 20, {"payload_bytes": 8}),
    )
    report = analyze(events, 1)
    assert report.per_rank[0]["bytes_moved"] == 320


def test_copy_engine_puts_count_for_the_rank_but_are_no_sm():
    # A GEMM on SM 0 [0, 100) while the copy engine puts to rank 1 during [50, 150).
    events = make_events(
        (GEMM, 0, 0, 0, 100),
        ("dma_put", 0, DMA_CU_BASE + 1, 50, 150, {"payload_bytes": 1024, "target_rank": 1}),
    )
    report = analyze(events, 2)
    assert [(r["rank"], r["cu_id"]) for r in report.per_sm] == [(0, 0)]
    rank = report.per_rank[0]
    assert (rank["comm_ns"], rank["compute_during_comm_ns"], rank["bytes_moved"]) == (100, 50, 1024)


def stall_trace():
    """SM 0 waits [0, 100) and computes [60, 160); SM 1 of the same rank computes [0, 30)."""
    return make_events(("wait_until", 0, 0, 0, 100), (GEMM, 0, 0, 60, 160), (GEMM, 0, 1, 0, 30))


def test_sm_stall_is_wait_minus_that_sms_compute():
    row = only_sm(analyze(stall_trace(), 1))
    assert (row["wait_ns"], row["stall_ns"]) == (100, 60)


def test_rank_stall_is_wait_minus_compute_on_any_of_its_sms():
    assert analyze(stall_trace(), 1).per_rank[0]["stall_ns"] == 30


def test_hta_overlap_ratio_uses_rank_wide_unions():
    # Rank 0: compute [0, 100) on SM 1; put [50, 150) on SM 0; wait [140, 200) on SM 2.
    # Communication or wait covers [50, 200) = 150 ns, compute covers 50 ns of it.
    events = make_events((GEMM, 0, 1, 0, 100), ("put", 0, 0, 50, 150), ("wait_until", 0, 2, 140, 200))
    rank = analyze(events, 1).per_rank[0]
    assert (rank["compute_during_comm_ns"], rank["comm_or_wait_ns"]) == (50, 150)
    assert rank["overlap_ratio"] == 1 / 3


def test_rank_overlap_is_not_the_sum_of_sm_overlaps():
    events = make_events((GEMM, 0, 1, 0, 100), ("put", 0, 0, 50, 150))
    report = analyze(events, 1)
    assert [r["overlap_ns"] for r in report.per_sm] == [0, 0]
    assert report.per_rank[0]["overlap_ns"] == 50


def test_overall_sums_ranks_and_pools_the_ratio():
    events = make_events(
        (GEMM, 0, 0, 0, 100),
        ("put", 0, 0, 0, 100),  # rank 0: ratio 100 / 100
        ("put", 1, 0, 0, 300),  # rank 1: ratio 0 / 300
    )
    overall = analyze(events, 2).overall
    assert (overall["comm_ns"], overall["compute_during_comm_ns"], overall["comm_or_wait_ns"]) == (
        400,
        100,
        400,
    )
    assert overall["overlap_ratio"] == 0.25


def test_end_before_start_counts_as_zero_length():
    events = make_events((GEMM, 0, 0, 0, 100), ("put", 0, 0, 50, 49))
    row = only_sm(analyze(events, 1))
    assert (row["comm_ns"], row["overlap_ns"], row["comm_events"]) == (0, 0, 1)


def test_idle_is_window_minus_busy():
    events = make_events((GEMM, 0, 0, 0, 10), ("put", 0, 0, 20, 30), (GEMM, 1, 0, 0, 100))
    report = analyze(events, 2)
    assert report.window_ns == 100
    assert [r["idle_ns"] for r in report.per_rank] == [80, 0]


def test_rank_without_events_gets_a_zero_row():
    report = analyze(make_events((GEMM, 0, 0, 0, 10)), 3)
    assert [r["rank"] for r in report.per_rank] == [0, 1, 2]
    assert report.per_rank[2]["busy_ns"] == 0 and report.per_rank[2]["idle_ns"] == 10


def test_event_order_does_not_matter():
    events = make_events(
        (GEMM, 0, 0, 0, 100), ("put", 0, 0, 50, 150), ("wait_until", 0, 0, 120, 300), (GEMM, 1, 3, 10, 20)
    )
    assert analyze(events[::-1].copy(), 2).to_dict() == analyze(events, 2).to_dict()


def test_rank_outside_world_is_rejected():
    with pytest.raises(ValueError, match="rank"):
        analyze(make_events((GEMM, 2, 0, 0, 10)), 2)


def waiter_and_signals():
    """Rank 1 waits [100, 300) for value 2 at address 64; rank 0 signals it twice."""
    return make_events(
        ("wait_until", 1, 5, 100, 300, {"address": 64, "value": 2, "pid": 7, "pid_m": 1, "pid_n": 3}),
        ("signal", 0, 2, 150, 151, {"target_rank": 1, "address": 64, "value": 2}),
        ("signal", 0, 4, 200, 201, {"target_rank": 1, "address": 64, "value": 1}),  # later, other value
        ("signal", 0, 4, 250, 251, {"target_rank": 0, "address": 64, "value": 2}),  # other target rank
        ("signal", 0, 4, 260, 261, {"target_rank": 1, "address": 72, "value": 2}),  # other address
        ("signal", 0, 4, 301, 302, {"target_rank": 1, "address": 64, "value": 2}),  # after the wait
    )


def test_releaser_prefers_the_signal_with_the_waited_value():
    assert match_releasers(waiter_and_signals()).tolist() == [1, -1, -1, -1, -1, -1]


def test_releaser_is_latest_release_when_no_value_matches():
    events = waiter_and_signals()
    events["value"][1] = 9
    assert match_releasers(events)[0] == 2


def test_releaser_may_be_a_put_from_the_same_rank():
    events = make_events(
        ("wait_until", 1, 0, 0, 50, {"address": 8, "value": 1}),
        ("put", 1, 1, 10, 20, {"target_rank": 1, "address": 8}),
    )
    assert match_releasers(events)[0] == 1


def test_top_stall_reports_its_releaser():
    (stall,) = analyze(waiter_and_signals(), 2, top=1).top_stalls
    assert stall == {
        "rank": 1,
        "cu_id": 5,
        "pid": 7,
        "pid_m": 1,
        "pid_n": 3,
        "op": "wait_until",
        "site": None,  # analyze() was not given the events' origins (Trace.origins)
        "launch": None,
        "address": 64,
        "start_ns": 0,  # from the window start (100)
        "duration_ns": 200,
        "value": 2,
        "releaser_rank": 0,
        "releaser_cu_id": 2,
        "releaser_op": "signal",
        "releaser_start_ns": 50,
        "producer": None,  # the releaser's SM ran no compute scope
        "producer_end_ns": None,
        "computing_ns": 0,
        "releaser_waiting_ns": 0,
        "in_flight_ns": 1,
        "late_look_ns": 149,
        "not_started_ns": 50,  # rank 0's first traced event is that signal
        "not_released_ns": 0,
        "unattributed_ns": 0,
    }


def test_wait_without_releaser_reports_none():
    events = make_events(("wait_until", 0, 0, 0, 10, {"address": 64}))
    (stall,) = analyze(events, 1).top_stalls
    assert match_releasers(events).tolist() == [-1]
    assert [stall[k] for k in ("releaser_rank", "releaser_cu_id", "releaser_op", "releaser_start_ns")] == [
        None
    ] * 4


def test_top_stalls_longest_first_ties_earliest_first():
    events = make_events(
        ("wait_until", 0, 0, 40, 90),
        ("wait_until", 0, 1, 10, 60),
        ("wait_until", 0, 2, 0, 80),
        ("put", 0, 0, 0, 500),
    )
    stalls = analyze(events, 1, top=2).top_stalls
    assert [(s["cu_id"], s["duration_ns"]) for s in stalls] == [(2, 80), (1, 50)]


def test_match_releasers_agrees_with_brute_force():
    rng = np.random.default_rng(0)
    n = 400
    events = np.zeros(n, dtype=EVENT_DTYPE)
    events["event_id"] = rng.choice(
        [ID["wait_until"], ID["signal"], ID["put"], ID["atomic_add"], ID["load"]], n
    )
    events["cur_rank"] = rng.integers(0, 3, n)
    events["target_rank"] = rng.integers(0, 3, n)
    events["address"] = rng.choice([0, 8, 16], n)
    events["value"] = rng.integers(0, 3, n)
    events["start_ns"] = rng.integers(0, 50, n)  # small range: many equal start times
    events["end_ns"] = events["start_ns"] + rng.integers(0, 20, n)

    def expected(i):
        w = events[i]
        if w["event_id"] != ID["wait_until"]:
            return -1
        found = [
            j
            for j, e in enumerate(events)
            if e["event_id"] in (ID["signal"], ID["put"], ID["atomic_add"])
            and e["target_rank"] == w["cur_rank"]
            and e["address"] == w["address"]
            and e["start_ns"] <= w["end_ns"]
        ]
        valued = [j for j in found if events[j]["event_id"] != ID["put"] and events[j]["value"] == w["value"]]
        pool = valued or found
        return max(pool, key=lambda j: (events[j]["start_ns"], j)) if pool else -1

    assert match_releasers(events).tolist() == [expected(i) for i in range(n)]


def test_coverage_union_and_intersection_agree_with_a_dense_timeline():
    rng = np.random.default_rng(1)
    n, horizon, n_keys = 300, 200, 4
    keys = rng.integers(0, n_keys, n)
    starts = rng.integers(0, horizon, n)
    ends = np.minimum(starts + rng.integers(0, 40, n), horizon)
    member = rng.random((n, 2)) < 0.5
    timeline = np.zeros((n_keys, 2, horizon), dtype=bool)
    for k, s, e, m in zip(keys, starts, ends, member):
        timeline[k, m, s:e] = True
    cover = Coverage(keys, starts, ends, member, n_keys)
    assert cover.union((0,)).tolist() == timeline[:, 0].sum(axis=1).tolist()
    assert cover.union((0, 1)).tolist() == timeline.any(axis=1).sum(axis=1).tolist()
    assert cover.intersection((0,), (1,)).tolist() == timeline.all(axis=1).sum(axis=1).tolist()
    assert cover.difference((0,), (1,)).tolist() == (timeline[:, 0] & ~timeline[:, 1]).sum(axis=1).tolist()


def test_coverage_length_within_agrees_with_a_dense_timeline():
    rng = np.random.default_rng(2)
    n, horizon, n_keys, n_queries = 200, 300, 5, 400
    keys = rng.integers(0, n_keys, n)
    starts = rng.integers(0, horizon, n)
    ends = np.minimum(starts + rng.integers(0, 50, n), horizon)
    member = rng.random((n, 2)) < 0.5
    timeline = np.zeros((n_keys, 2, horizon + 50), dtype=bool)
    for k, s, e, m in zip(keys, starts, ends, member):
        timeline[k, m, s:e] = True
    query_keys = rng.integers(0, n_keys + 1, n_queries) % n_keys  # key 0 twice as often
    lo = rng.integers(0, horizon, n_queries)
    hi = lo + rng.integers(0, 80, n_queries)
    cover = Coverage(keys, starts, ends, member, n_keys)
    got = cover.length_within((1,), query_keys, lo, hi)
    assert got.tolist() == [int(timeline[k, 1, a:b].sum()) for k, a, b in zip(query_keys, lo, hi)]
    empty = Coverage(keys[:0], starts[:0], ends[:0], member[:0], n_keys)
    assert empty.length_within((0,), query_keys, lo, hi).tolist() == [0] * n_queries


def test_empty_trace_gives_zeros():
    report = analyze(np.zeros(0, dtype=EVENT_DTYPE), 2)
    assert (report.window_ns, report.per_sm, report.top_stalls) == (0, [], [])
    assert [r["busy_ns"] + r["idle_ns"] + r["overlap_ratio"] for r in report.per_rank] == [0, 0]
    assert report.overall["overlap_ratio"] == 0.0


def test_empty_trace_formats_and_exports(tmp_path):
    report = analyze(np.zeros(0, dtype=EVENT_DTYPE), 2)
    assert "per rank" in report.format_table()
    assert len(report.to_csv(str(tmp_path))) == 6
    assert json.loads(report.to_json())["window_ns"] == 0


def mixed_trace():
    return np.concatenate(
        [
            make_events(
                (GEMM, 0, 0, 0, 100), ("put", 0, 0, 50, 150, {"target_rank": 1, "payload_bytes": 1024})
            ),
            waiter_and_signals(),
        ]
    )


def test_json_round_trip_keeps_every_number(tmp_path):
    report = analyze(mixed_trace(), 2, scope_names={0: "gemm"})
    path = str(tmp_path / "report.json")
    text = report.to_json(path)
    with open(path) as f:
        assert json.load(f) == json.loads(text) == report.to_dict()


def test_csv_round_trip_keeps_every_number(tmp_path):
    report = analyze(mixed_trace(), 2)
    paths = report.to_csv(str(tmp_path))
    names = [
        "per_sm.csv",
        "per_rank.csv",
        "top_stalls.csv",
        "wait_causes.csv",
        "seen_latency.csv",
        "call_sites.csv",
    ]
    assert [os.path.basename(p) for p in paths] == names
    with open(paths[0], newline="") as f:
        per_sm = [{k: int(v) for k, v in row.items()} for row in csv.DictReader(f)]
    with open(paths[1], newline="") as f:
        per_rank = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    assert per_sm == report.per_sm
    assert per_rank == report.per_rank


def test_addresses_are_hex_in_every_output(tmp_path):
    report = analyze(waiter_and_signals(), 2, top=1)
    assert report.to_dict()["top_stalls"][0]["address"] == "0x40"
    assert "0x40" in report.format_table()
    with open(report.to_csv(str(tmp_path))[2], newline="") as f:
        assert next(csv.DictReader(f))["address"] == "0x40"


def test_format_table_names_what_is_shown_and_explains_columns():
    report = analyze(mixed_trace(), 2, scope_names={0: "gemm"}, notes=["emulated"])
    text = report.format_table()
    assert text.startswith("note: emulated")
    assert "per SM, longest stall first (4 of 4 SMs)" in text
    assert "columns" in text and "computing / not sent / in flight / late look:" in text


def test_format_table_has_a_row_per_rank():
    report = analyze(mixed_trace(), 2, scope_names={0: "gemm"})
    lines = report.format_table().splitlines()
    rank_rows = lines[lines.index("per rank") + 2 : lines.index("per rank") + 5]
    assert [line.split()[0] for line in rank_rows] == ["0", "1", "all"]


def test_format_table_prints_microseconds_with_one_decimal():
    report = analyze(make_events(("wait_until", 0, 0, 0, 12345)), 1)
    assert "window 12.3 us" in report.format_table()


def test_binned_fractions_on_two_bins():
    # Window [0, 100): bins [0, 50) and [50, 100) on SM (0, 0).
    events = make_events(("wait_until", 0, 0, 0, 100), (GEMM, 0, 0, 25, 50), ("put", 0, 0, 40, 75))
    rows, edges, stall, overlap = binned_fractions(events, bins=2)
    assert rows.tolist() == [[0, 0]]
    assert edges.tolist() == [0.0, 50.0, 100.0]
    assert stall.tolist() == [[0.5, 1.0]]  # wait minus compute [25, 50)
    assert overlap.tolist() == [[0.2, 0.0]]  # compute and put share [40, 50)


def test_binned_fractions_agree_with_analysis_totals():
    events = mixed_trace()
    rows, edges, stall, overlap = binned_fractions(events, bins=7)
    report = analyze(events, 2)
    width = edges[1] - edges[0]
    assert np.allclose(stall.sum(axis=1) * width, [r["stall_ns"] for r in report.per_sm])
    assert np.allclose(overlap.sum(axis=1) * width, [r["overlap_ns"] for r in report.per_sm])


def test_binned_fractions_of_empty_trace():
    rows, edges, stall, overlap = binned_fractions(np.zeros(0, dtype=EVENT_DTYPE), bins=4)
    assert (rows.shape, stall.shape, overlap.shape) == ((0, 2), (0, 4), (0, 4))


def test_stall_heatmap_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = stall_heatmap(mixed_trace(), str(tmp_path / "stalls.png"), bins=20, title="synthetic")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_state_fractions_split_each_bin_by_priority():
    # SM (0, 0) over [0, 100): compute [0, 40), put [30, 60) (communicating only from 40),
    # wait [50, 90) (waiting only from 60), idle [90, 100).
    events = make_events((GEMM, 0, 0, 0, 40), ("put", 0, 0, 30, 60), ("wait_until", 0, 0, 50, 90))
    rows, edges, fractions = state_fractions(events, bins=1)
    assert rows.tolist() == [[0, 0]] and edges.tolist() == [0.0, 90.0]
    assert fractions[0, 0].tolist() == pytest.approx([40 / 90, 20 / 90, 30 / 90, 0.0])
    rows, edges, fractions = state_fractions(np.concatenate([events, make_events(("put", 0, 1, 0, 100))]), 2)
    assert fractions.sum(axis=-1) == pytest.approx(np.ones((2, 2)))  # every bin fully accounted


def test_many_sms_are_grouped_into_fewer_rows_and_each_rank_keeps_its_own():
    rows = np.array([[r, sm] for r in range(4) for sm in range(132)])
    fractions = np.zeros((len(rows), 3, 4))
    fractions[:, :, 0] = 1.0
    labels, owner, grouped, group = _group_rows(rows, fractions, max_rows=128)
    assert group == 5 and len(labels) == 4 * 27 <= 128
    assert labels[0] == "r0 sm0-4" and labels[26] == "r0 sm130-131" and labels[27] == "r1 sm0-4"
    assert owner.tolist() == sorted(owner.tolist()) and grouped.shape == (108, 3, 4)


def test_timeline_draws_every_state_that_occurs(tmp_path):
    mpimg = pytest.importorskip("matplotlib.image")
    events = np.concatenate([mixed_trace(), make_events(("put", 1, 9, 0, 300, {"target_rank": 0}))])
    path = timeline(events, str(tmp_path / "t.png"), 2, bins=30, title="synthetic", notes=["a note"])
    pixels = mpimg.imread(path)[..., :3]
    for state, colour in zip(STATES, COLOURS):
        if state != "idle":
            assert (np.abs(pixels - colour).max(axis=-1) < 0.02).any(), f"no {state} pixels"


def test_panels_without_information_are_left_out_with_a_note():
    from iris_trace.plot import _overview_panels

    varied, flat, none = np.array([[0.0, 1.0]]), np.array([[0.0, 0.0]]), np.full((1, 2), np.nan)
    moved, still = np.array([[10.0, 0.0]]), np.zeros((1, 2))
    assert _overview_panels(varied, moved, emulated=False) == (["overlap ratio", "GB/s moved"], [])
    panels, notes = _overview_panels(flat, still, emulated=False)
    assert panels == [] and "0 throughout" in notes[0] and "no data op" in notes[1]
    panels, notes = _overview_panels(none, moved, emulated=True)
    assert panels == [] and "no rank communicated" in notes[0] and "emulation" in notes[1]


def test_overview_gives_overlap_ratio_and_bytes_per_rank():
    put = ("put", 0, 1, 0, 40, {"payload_bytes": 1000, "target_rank": 1})
    edges, ratio, moved = rank_overview(make_events((GEMM, 0, 0, 0, 100), put), 2, bins=2)
    assert ratio[0, 0] == 1.0 and np.isnan(ratio[0, 1])  # the put runs under compute; then none
    assert moved[0].tolist() == [1000.0, 0.0] and np.isnan(ratio[1]).all()
