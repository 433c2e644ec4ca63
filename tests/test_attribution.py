"""Wait attribution, tile lifecycles and the critical path on synthetic traces with known causes."""

import numpy as np
import pytest

from iris_trace import schema
from iris_trace.analysis import analyze, analyze_trace, first_flag_notes
from iris_trace.attribution import (
    PARTS,
    attribute_waits,
    critical_path,
    lifecycle_summary,
    seen_latency,
    summarize_waits,
    tile_lifecycles,
    wait_groups,
)
from iris_trace.events import EVENT_DTYPE
from iris_trace.trace import RankTrace, Trace

GEMM = schema.SCOPE_BASE  # user scope 0, named "gemm tile" below
NAMES = {0: "gemm tile"}
FLAG = 0x100


def make_events(*specs) -> np.ndarray:
    """``(event_id, rank, sm, start, end, fields)`` tuples; unset fields -1 (tiles, target) or 0."""
    events = np.zeros(len(specs), dtype=EVENT_DTYPE)
    events["target_rank"] = events["pid_m"] = events["pid_n"] = -1
    for i, (event_id, rank, sm, start, end, *extra) in enumerate(specs):
        fields = {"event_id": event_id, "cur_rank": rank, "cu_id": sm, "start_ns": start, "end_ns": end}
        fields.update(extra[0] if extra else {})
        for name, value in fields.items():
            events[name][i] = value
    return events


def signal_to(rank, value=1, address=FLAG):
    return {"target_rank": rank, "address": address, "value": value}


def wait_for(value=1, address=FLAG):
    return {"address": address, "value": value}


def split_of(events, wait_index=-1):
    causes = attribute_waits(events)
    (row,) = np.flatnonzero(causes["index"] == (wait_index % len(events)))
    return {name: int(causes[name][row]) for name in PARTS}, causes, row


def test_a_producer_that_finishes_its_tile_late_is_computing_time():
    events = make_events(
        (GEMM, 0, 1, 0, 100),  # rank 0's tile ends at 100
        (schema.SIGNAL, 0, 1, 100, 102, signal_to(1)),
        (schema.WAIT_UNTIL, 1, 5, 10, 105, wait_for()),  # rank 1 waited from 10
    )
    split, causes, row = split_of(events)
    assert split == {
        "computing_ns": 90,
        "releaser_waiting_ns": 0,
        "in_flight_ns": 2,
        "late_look_ns": 3,
        "not_started_ns": 0,
        "not_released_ns": 0,
        "unattributed_ns": 0,
    }
    assert (causes["releaser"][row], causes["producer"][row]) == (1, 0)


def test_data_still_moving_is_in_flight_time():
    events = make_events(
        (GEMM, 0, 1, 0, 10),
        (schema.PUT, 0, 1, 10, 60, {"target_rank": 1, "address": 0x400, "payload_bytes": 1 << 20}),
        (schema.SIGNAL, 0, 1, 60, 62, signal_to(1)),
        (schema.WAIT_UNTIL, 1, 5, 5, 64, wait_for()),
    )
    split, _, _ = split_of(events)
    assert (split["computing_ns"], split["in_flight_ns"], split["late_look_ns"]) == (5, 52, 2)


def test_a_releaser_running_nothing_traced_before_its_release_is_not_released_time():
    # Rank 0's last wait ended at 10; host code (untraced) ran until it launched the
    # barrier whose arrival released rank 1: that gap is not data in flight.
    events = make_events(
        (schema.WAIT_UNTIL, 0, 0, 0, 10, wait_for(address=0x200)),
        (schema.ATOMIC_ADD, 0, 0, 900, 901, signal_to(1, value=2, address=0x0)),
        (schema.DEVICE_BARRIER_WAIT, 1, 0, 20, 905, wait_for(value=2, address=0x0)),
    )
    split, causes, _ = split_of(events)
    assert (split["not_released_ns"], split["in_flight_ns"], split["late_look_ns"]) == (880, 1, 4)
    # Rank 0's wait had ended before rank 1 began waiting: it held nothing up, so it is not named.
    (group,) = [g for g in wait_groups(events, causes) if g["rank"] == 1]
    assert (group["releaser_rank"], group["producer"]) == (0, None)


def test_a_releasing_rank_that_started_late_is_not_started_time_then_its_own_steps():
    # Rank 1's pushers wait from 0 for rank 0's entry flag; rank 0's kernel starts at 100
    # (the flag is its first event) and the flag lands at 101.
    events = make_events(
        (schema.SIGNAL, 0, 4, 100, 101, signal_to(1)),
        (GEMM, 0, 1, 100, 180),
        (schema.WAIT_UNTIL, 1, 5, 0, 102, wait_for()),
    )
    split, _, _ = split_of(events)
    assert (split["not_started_ns"], split["not_released_ns"], split["in_flight_ns"]) == (100, 0, 1)
    assert split["late_look_ns"] == 1
    (line, *_) = summarize_waits(wait_groups(events, attribute_waits(events)), 2)
    assert "the releasing rank had not started yet (98%)" in line


def test_ranks_that_started_far_apart_get_a_line_naming_the_late_one():
    events = make_events(
        (schema.WAIT_UNTIL, 1, 5, 0, 20_002, wait_for()),
        (schema.SIGNAL, 0, 4, 20_000, 20_001, signal_to(1)),  # rank 0's launch began 20 us later
    )
    summary = analyze(events, 2).summary
    (line,) = [line for line in summary if "first traced event" in line]
    assert line.startswith("rank 0's first traced event came 20.0 us after rank 1's")
    assert line.endswith("waits on a rank that had not started yet took 100% of all wait time")


def test_ranks_that_started_together_get_no_start_line():
    events = make_events(
        (schema.WAIT_UNTIL, 1, 5, 0, 9_002, wait_for()),
        (schema.SIGNAL, 0, 4, 9_000, 9_001, signal_to(1)),  # 9 us: under START_SPREAD_NS
    )
    assert not [line for line in analyze(events, 2).summary if "first traced event" in line]


def _waits_on_tiles(*tiles):
    # Rank 1 waits on one flag per tile; rank 0 signals each once its tile's scope ends.
    specs = []
    for i, (pid_m, pid_n, length) in enumerate(tiles):
        start = 1000 * i
        flag = {"pid_m": pid_m, "pid_n": pid_n}
        specs += [
            (GEMM, 0, 1, start, start + length, flag),
            (schema.SIGNAL, 0, 1, start + length, start + length + 1, {**signal_to(1, address=FLAG + 8 * i)}),
            (schema.WAIT_UNTIL, 1, 5, start + 1, start + length + 2, wait_for(address=FLAG + 8 * i)),
        ]
    events = make_events(*specs)
    return wait_groups(events, attribute_waits(events), NAMES)


def test_the_tile_that_held_most_of_the_wait_is_named():
    (group,) = _waits_on_tiles((2, 3, 300), (4, 1, 100))
    assert group["producer_tile"] == "(2,3)"
    assert "for rank 0's gemm tile (2,3):" in summarize_waits([group], 2)[0]


def test_tiles_of_one_row_or_one_column_are_named_by_it():
    assert _waits_on_tiles((2, 3, 100), (2, 5, 100), (2, 7, 100))[0]["producer_tile"] == "(2,*)"
    assert _waits_on_tiles((1, 3, 100), (2, 3, 100), (4, 3, 100))[0]["producer_tile"] == "(*,3)"
    assert _waits_on_tiles((1, 3, 100), (2, 5, 100), (4, 7, 100))[0]["producer_tile"] is None


def test_only_the_releasers_traced_pushes_count_as_in_flight():
    # After its tile, rank 0's SM pushes for 30 ns, runs untraced code for 40, then signals.
    events = make_events(
        (GEMM, 0, 1, 0, 10),
        (schema.PUT, 0, 1, 10, 40, {"target_rank": 1, "address": 0x400, "payload_bytes": 4096}),
        (schema.PUT, 0, 2, 40, 80, {"target_rank": 1, "address": 0x800, "payload_bytes": 4096}),  # another SM
        (schema.SIGNAL, 0, 1, 80, 82, signal_to(1)),
        (schema.WAIT_UNTIL, 1, 5, 0, 85, wait_for()),
    )
    split, _, _ = split_of(events)
    assert split == {
        "computing_ns": 10,
        "releaser_waiting_ns": 0,
        "in_flight_ns": 32,
        "late_look_ns": 3,
        "not_started_ns": 0,
        "not_released_ns": 40,
        "unattributed_ns": 0,
    }


def test_a_waiter_that_looks_late_is_late_look_time():
    events = make_events(
        (GEMM, 0, 1, 0, 10),
        (schema.SIGNAL, 0, 1, 10, 12, signal_to(1)),
        (schema.WAIT_UNTIL, 1, 5, 5, 100, wait_for()),
    )
    split, _, _ = split_of(events)
    assert (split["computing_ns"], split["in_flight_ns"], split["late_look_ns"]) == (5, 2, 88)


def test_a_barrier_released_by_a_rank_that_had_not_started_is_not_started_time():
    # Rank 0's arrival is its first traced event: its launch came 40 ns after rank 1 began waiting.
    events = make_events(
        (schema.ATOMIC_ADD, 0, 7, 40, 41, signal_to(1, value=2, address=0x0)),
        (schema.DEVICE_BARRIER_WAIT, 1, 3, 0, 45, wait_for(value=2, address=0x0)),
    )
    split, _, _ = split_of(events)
    assert split == {
        "computing_ns": 0,
        "releaser_waiting_ns": 0,
        "in_flight_ns": 1,
        "late_look_ns": 4,
        "not_started_ns": 40,
        "not_released_ns": 0,
        "unattributed_ns": 0,
    }
    (group,) = wait_groups(events, attribute_waits(events), NAMES)
    assert (group["op"], group["releaser_rank"], group["producer"]) == ("device_barrier_wait", 0, None)


def test_a_releaser_that_was_itself_waiting_is_releaser_waiting_time():
    # Rank 1 waits on rank 0, which only signals once its own wait (on rank 2) is over.
    events = make_events(
        (schema.WAIT_UNTIL, 0, 1, 0, 80, wait_for(address=0x200)),
        (schema.SIGNAL, 0, 1, 80, 82, signal_to(1)),
        (schema.WAIT_UNTIL, 1, 5, 10, 90, wait_for()),
    )
    split, causes, row = split_of(events)
    assert (split["releaser_waiting_ns"], split["in_flight_ns"], split["late_look_ns"]) == (70, 2, 8)
    assert split["computing_ns"] == 0 and causes["producer"][row] == 0
    (line,) = [g for g in wait_groups(events, causes) if g["rank"] == 1]
    assert line["producer"] == "wait_until"


def test_a_wait_nothing_traced_released_is_unattributed():
    events = make_events((schema.WAIT_UNTIL, 1, 5, 0, 50, wait_for()))
    split, _, _ = split_of(events)
    assert split["unattributed_ns"] == 50 and sum(split.values()) == 50


def test_parts_are_clipped_to_the_wait_when_clocks_disagree():
    # After alignment a release may seem to end after the wait it released.
    events = make_events(
        (GEMM, 0, 1, 0, 10),
        (schema.SIGNAL, 0, 1, 10, 30, signal_to(1)),
        (schema.WAIT_UNTIL, 1, 5, 0, 20, wait_for()),
    )
    split, _, _ = split_of(events)
    assert split["in_flight_ns"] == 10 and split["late_look_ns"] == 0 and sum(split.values()) == 20


def test_the_report_says_in_words_who_made_each_rank_wait():
    events = make_events(
        (GEMM, 0, 1, 0, 100),
        (schema.SIGNAL, 0, 1, 100, 102, signal_to(1)),
        (schema.WAIT_UNTIL, 1, 5, 10, 105, wait_for()),
        (schema.WAIT_UNTIL, 1, 6, 100, 104, wait_for(value=7, address=0x900)),  # unreleased, shorter
    )
    groups = wait_groups(events, attribute_waits(events), NAMES)
    assert [g["wait_ns"] for g in groups] == [95, 4]
    assert groups[0]["share"] == pytest.approx(95 / 99)
    (line,) = summarize_waits(groups, world_size=2)
    assert line.startswith("96% of wait time on rank 1 (99 ns summed over 2 waits) is wait_until for rank 0")
    assert "for rank 0's gemm tile:" in line, line
    assert "the producer was still computing (95%)" in line, line


def test_a_tile_lifecycle_from_computed_to_consumed():
    tile = {"pid_m": 2, "pid_n": 3}
    events = make_events(
        (GEMM, 0, 1, 0, 100, tile),
        # the handover inside rank 0 (computing program -> pushing program) is not the push
        (schema.SIGNAL, 0, 1, 100, 101, {**tile, **signal_to(0, address=0x800)}),
        (schema.WAIT_UNTIL, 0, 9, 90, 105, wait_for(address=0x800)),
        (schema.PUT, 0, 9, 110, 150, {**tile, "target_rank": 1, "address": 0x400, "payload_bytes": 64}),
        (schema.PUT, 0, 9, 120, 160, {**tile, "target_rank": 1, "address": 0x440, "payload_bytes": 64}),
        (schema.SIGNAL, 0, 9, 160, 162, {**tile, **signal_to(1)}),
        (schema.WAIT_UNTIL, 1, 5, 100, 170, wait_for()),
    )
    tiles = tile_lifecycles(events)
    assert tiles["rank"].tolist() == [0] and (tiles["pid_m"][0], tiles["pid_n"][0]) == (2, 3)
    assert [int(tiles[k][0]) for k in ("computed_ns", "push_start_ns", "visible_ns", "consumed_ns")] == [
        100,
        110,
        162,
        170,
    ]
    stats = lifecycle_summary(tiles)[0]
    assert {k: stats[k]["median"] for k in stats} == {
        "queued_ns": 10,
        "push_ns": 52,
        "latency_ns": 62,
        "consumed_ns": 8,
    }
    lines = summarize_waits(wait_groups(events, attribute_waits(events), NAMES), 2, lifecycle_summary(tiles))
    assert "rank 0: 1 tiles, median tile push latency (computed to visible at the peers) 62 ns" in lines[-1]


def test_the_critical_path_follows_compute_signal_wait():
    events = make_events(
        (GEMM, 0, 1, 0, 180),  # the producer's tile
        (schema.SIGNAL, 0, 1, 180, 182, signal_to(1)),
        (GEMM, 0, 2, 0, 50),  # off the path: another SM, done early
        (schema.WAIT_UNTIL, 1, 5, 20, 190, wait_for()),
        (schema.PUT, 1, 5, 200, 210, {"target_rank": 0, "address": 0x800, "payload_bytes": 64}),
    )
    assert critical_path(events) == [0, 1, 3, 4]


def test_the_critical_path_follows_a_late_waiter_to_its_own_work():
    # Rank 0 signalled at 10; rank 1 computed until 300 and only then waited: the flag was
    # there already, so rank 1's tile, not rank 0's signal, set the end.
    events = make_events(
        (schema.SIGNAL, 0, 1, 10, 12, signal_to(1)),
        (GEMM, 1, 5, 0, 300),
        (schema.WAIT_UNTIL, 1, 5, 300, 302, wait_for()),
    )
    assert critical_path(events) == [1, 2]


def test_the_report_points_out_untraced_gaps_on_the_critical_path():
    events = make_events(
        (GEMM, 0, 1, 0, 100),
        (schema.SIGNAL, 0, 1, 5_100, 5_102, signal_to(1)),  # 5 us of host code before it
        (schema.WAIT_UNTIL, 1, 5, 50, 5_110, wait_for()),
    )
    table = analyze(events, 2, NAMES).format_table()
    path = table[table.index("critical path") :].splitlines()
    assert path[1].startswith("  rank 0 SM 1: gemm tile")
    assert path[2] == "    ... 5.0 us with nothing traced on the path (host code, untraced work)"
    assert path[3].startswith("  rank 0 SM 1: signal")


def test_seen_latency_counts_only_waits_that_were_polling_when_the_release_was_issued():
    events = make_events(
        (schema.SIGNAL, 0, 1, 90, 100, signal_to(1)),
        (schema.WAIT_UNTIL, 1, 5, 50, 103, wait_for()),  # polling since 50: seen 3 ns after issue
        (schema.WAIT_UNTIL, 1, 6, 60, 109, wait_for()),  # 9 ns
        (schema.WAIT_UNTIL, 1, 7, 150, 152, wait_for()),  # began after the issue: the waiter was late
        (schema.SIGNAL, 1, 2, 10, 20, signal_to(0, address=0x200)),
        (schema.WAIT_UNTIL, 0, 3, 0, 18, wait_for(address=0x200)),  # ends before the issue: clocks off
    )
    rows = seen_latency(events, attribute_waits(events))
    keys = ("releaser_rank", "rank", "waits", "min_ns", "median_ns")
    assert [{key: row[key] for key in keys} for row in rows] == [
        {"releaser_rank": 0, "rank": 1, "waits": 2, "min_ns": 3, "median_ns": 6},
        {"releaser_rank": 1, "rank": 0, "waits": 1, "min_ns": -2, "median_ns": -2},
    ]
    table = analyze(events, 2).format_table()
    assert "  rank 0 -> rank 1: 2 waits, min 0.0 us, median 0.0 us\n" in table


def test_seen_latency_names_a_release_seen_far_later_than_the_rest():
    entry, tile = 0x300, 0x400
    events = make_events(
        (schema.SIGNAL, 0, 2, 0, 10, signal_to(1, address=entry)),  # rank 0's first release to rank 1
        (schema.WAIT_UNTIL, 1, 5, 5, 40_010, wait_for(address=entry)),
        (schema.WAIT_UNTIL, 1, 6, 5, 40_500, wait_for(address=entry)),
        (schema.SIGNAL, 0, 2, 60_000, 60_010, signal_to(1, address=tile)),
        (schema.WAIT_UNTIL, 1, 7, 50_000, 60_510, wait_for(address=tile)),  # seen 500 ns after issue
    )
    (row,) = seen_latency(events, attribute_waits(events))
    # The entry flag is timed by the first of its two waits to see it.
    assert row["slowest_ns"] == 40_000 and row["slowest_address"] == entry
    assert row["slowest_waits"] == 2 and row["slowest_is_first"] is True
    table = analyze(events, 2).format_table()
    expected = (
        "  rank 0 -> rank 1: 3 waits, min 0.5 us, median 40.0 us; slowest release 40.0 us "
        "(0x300, seen by 2 waits; rank 0's first release to rank 1)"
    )
    assert expected in table.splitlines()


def test_seen_latency_names_no_release_when_all_are_seen_alike():
    events = make_events(
        (schema.SIGNAL, 0, 2, 0, 10, signal_to(1, address=0x300)),
        (schema.WAIT_UNTIL, 1, 5, 5, 3_010, wait_for(address=0x300)),
        (schema.SIGNAL, 0, 2, 60_000, 60_010, signal_to(1, address=0x400)),
        (schema.WAIT_UNTIL, 1, 7, 50_000, 60_510, wait_for(address=0x400)),
    )
    (row,) = seen_latency(events, attribute_waits(events))
    assert row["slowest_ns"] == 3_000 and row["slowest_is_first"] is True
    assert "slowest release" not in analyze(events, 2).format_table()


def _latency_row(slowest_ns, min_ns=500, first=True):
    return {
        "releaser_rank": 0, "rank": 1, "waits": 17, "min_ns": min_ns, "median_ns": slowest_ns,
        "slowest_ns": slowest_ns, "slowest_address": 0x300, "slowest_waits": 16, "slowest_is_first": first,
    }  # fmt: skip


def test_a_first_release_seen_about_105_us_late_is_explained_in_a_note():
    (note,) = first_flag_notes([_latency_row(105_200)])
    assert note.startswith("rank 0's first release to rank 1 was seen 105.2 us after its issue")
    assert "links sleep after 50 ms without traffic" in note and "ctx.wake_links()" in note


def test_a_late_release_that_was_not_the_first_gets_no_note():
    assert first_flag_notes([_latency_row(105_200, first=False)]) == []


def test_a_first_release_late_by_other_amounts_gets_no_note():
    assert first_flag_notes([_latency_row(30_000), _latency_row(400_000)]) == []


def test_a_pair_whose_every_flag_is_that_late_gets_no_note():
    assert first_flag_notes([_latency_row(105_200, min_ns=90_000)]) == []


def _entry_flag_trace(domains):
    # Rank 0's first release to rank 1 seen 105 us after its issue, a later one at once.
    events = make_events(
        (schema.SIGNAL, 0, 2, 0, 10, signal_to(1, address=0x300)),
        (schema.WAIT_UNTIL, 1, 5, 5, 105_010, wait_for(address=0x300)),
        (schema.WAIT_UNTIL, 1, 6, 5, 105_200, wait_for(address=0x300)),
        (schema.SIGNAL, 0, 2, 160_000, 160_010, signal_to(1, address=0x400)),
        (schema.WAIT_UNTIL, 1, 7, 150_000, 160_510, wait_for(address=0x400)),
    )
    sync = np.zeros((2, 4, 4), np.int64)
    sync[1, :, :] = [[0, 10, 10, 20]] * 4  # no offset between the clocks
    ranks = []
    for r in range(2):
        mine = events[events["cur_rank"] == r]
        ranks.append(RankTrace(r, 2, mine, sync, sync, device="NVIDIA H100", clock_domain=domains[r]))
    return Trace(ranks)


def test_a_gpu_trace_with_a_gpu_per_rank_gets_the_first_flag_note():
    notes = analyze_trace(_entry_flag_trace(["gpu:a", "gpu:b"])).notes
    assert [note for note in notes if "first release to rank 1 was seen 105.0 us" in note]


def test_ranks_sharing_a_gpu_get_no_first_flag_note():
    notes = analyze_trace(_entry_flag_trace(["gpu:a", "gpu:a"])).notes
    assert not [note for note in notes if "first release" in note]


def test_the_table_shows_the_slowest_pairs_when_there_are_many():
    specs = []
    for source in range(5):
        for rank in range(5):
            if source != rank:
                address = 0x100 * (source * 8 + rank)
                specs.append((schema.SIGNAL, source, 0, 10, 20, signal_to(rank, address=address)))
                seen = 1020 + 100 * source + rank  # 1000 + 100 * source + rank after the issue
                specs.append((schema.WAIT_UNTIL, rank, 1, 0, seen, wait_for(address=address)))
    report = analyze(make_events(*specs), 5)
    assert len(report.seen_latency) == 20
    table = report.format_table().splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith("release to seen"))
    assert table[at].endswith("(the 12 slowest of 20 pairs by median)")
    assert table[at + 1] == "  rank 4 -> rank 3: 1 wait, min 1.4 us, median 1.4 us"
    assert table[at + 13] == ""
