"""ctx.tracing.enable(sample=...): one program in k records, and the report estimates the rest."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from conftest import get_pool
from test_exports import make_events

import iris
from iris.host.tracing.core import sample_period
from iris_trace import Trace, analyze_trace, check, diff, schema
from iris_trace.sampling import estimate_totals
from iris_trace.trace import RankTrace, TraceFileError

PROGRAMS, PERIOD = 64, 4


@triton.jit
def uneven_puts(buf, cur_rank, heap_bases):
    # Program p puts (p % 3) + 1 blocks to itself: the programs differ, so the estimate has a spread.
    offsets = tl.arange(0, 16)
    for _ in range(tl.program_id(0) % 3 + 1):
        iris.put(buf + offsets, buf + 16 + offsets, cur_rank, cur_rank, heap_bases)


def _sampled_body(rank, world_size, directory):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.zeros(32, dtype=torch.float32)
        ctx.tracing.enable(max_events=1 << 12, sample=1 / PERIOD)
        assert ctx.tracing.sample_period == PERIOD
        uneven_puts[(PROGRAMS,)](buf, rank, ctx.get_heap_bases())
        ctx.tracing.export(directory)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sampled")
    get_pool(1).run(_sampled_body, str(directory))
    return Trace.from_files([str(directory / "rank0.npz")])


def test_only_every_kth_program_records(sampled):
    puts = sampled.events[sampled.events["event_id"] == int(schema.Event.PUT)]
    assert sorted(set(puts["pid"].tolist())) == list(range(0, PROGRAMS, PERIOD))
    assert sampled.sample_period == PERIOD


def test_the_report_estimates_every_programs_puts_within_its_bound(sampled):
    report = analyze_trace(sampled)
    row = next(r for r in report.sampling["estimates"] if r["quantity"] == "comm_events")
    true_total = sum(p % 3 + 1 for p in range(PROGRAMS))
    assert row["recorded"] == sum(p % 3 + 1 for p in range(0, PROGRAMS, PERIOD))
    assert abs(row["estimate"] - true_total) <= row["bound"] and row["bound"] > 0, (row, true_total)
    assert "one program in 4 recorded" in report.notes[-1] and "estimated totals" in report.format_table()
    assert report.to_dict()["sampling"]["period"] == PERIOD


def test_program_zero_stands_for_itself_and_the_others_for_their_block():
    # Program 0 (a one-program kernel's) counts once; programs 4 and 8 stand for four each.
    rows = [(int(schema.Event.PUT), 0, 0, 1, pid, 0, 10, 0, 64, 0) for pid in (0, 4, 8, 8)]
    events = make_events(rows)
    comm = next(r for r in estimate_totals(events, 1, 4) if r["quantity"] == "comm_events")
    assert (comm["recorded"], comm["estimate"]) == (4, 1 + 4 * 3)
    assert comm["bound"] == pytest.approx(2 * 8 * np.std([1, 2], ddof=1) * np.sqrt(0.75 / 2))
    unsampled = next(r for r in estimate_totals(events, 1, 1) if r["quantity"] == "bytes_moved")
    assert (unsampled["estimate"], unsampled["bound"]) == (256, 0.0)


@pytest.mark.parametrize("bad", [0, 1.5, -0.5, "half", True, None])
def test_a_sample_outside_zero_to_one_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match=r"sample=\.\.\.\) must be a fraction in \(0, 1\]"):
        sample_period(bad)


def test_periods_are_the_nearest_power_of_two():
    samples = (1, 0.5, 0.3, 1 / 8, 0.1, 0.01, 1e-300)
    assert [sample_period(s) for s in samples] == [1, 2, 4, 8, 8, 128, 1 << 30]


def test_a_rank_file_keeps_its_period_and_refuses_an_impossible_one(sampled, tmp_path):
    rank = sampled.ranks[0]
    rank.save(str(tmp_path / "rank0.npz"))
    assert RankTrace.load(str(tmp_path / "rank0.npz")).sample_period == PERIOD
    rank.sample_period = 0
    rank.save(str(tmp_path / "bad.npz"))
    with pytest.raises(TraceFileError, match="sample_period 0 is not a period"):
        RankTrace.load(str(tmp_path / "bad.npz"))
    rank.sample_period = PERIOD


def test_protocol_checks_refuse_a_sampled_trace_in_one_line(sampled):
    with pytest.raises(ValueError, match="recorded one program in 4 .* need every program's ops"):
        check.run(sampled)


def test_a_diff_with_a_sampled_run_says_its_counts_are_of_what_was_recorded(sampled):
    notes = diff.compare(sampled, sampled).notes
    assert any("run A recorded one program in 4 and run B one in 4" in note for note in notes), notes
