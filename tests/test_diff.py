"""iris-trace diff: what changed between two traced runs (iris_trace/diff.py)."""

import json

import pytest
import torch
import triton
import triton.language as tl
from conftest import SMALL_WORLD, get_pool
from test_check import send_after

import iris
from iris_trace import Trace, diff
from iris_trace.cli import main as iris_trace_main

pytestmark = pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")


@triton.jit
def handoff_kernel(data, flag, cur_rank, heap_bases, LATE_NS: tl.constexpr, BLOCK: tl.constexpr):
    # Rank 1 puts a block to rank 0 and raises its flag, after LATE_NS of other work;
    # rank 0 waits for it: rank 1's lateness becomes rank 0's wait.
    if cur_rank == 1:
        send_after(data, flag, 1, 0, heap_bases, LATE_NS, BLOCK)
    elif cur_rank == 0:
        iris.wait_until(flag, "ge", 1, heap_bases=heap_bases)


def _run_body(rank, world_size, directory, late_ns):
    with iris.iris(1 << 20) as ctx:
        data = ctx.full((64,), float(rank))
        flag = ctx.zeros(1, dtype=torch.int32)
        ctx.tracing.enable(max_events=1 << 10)
        # The first launch compiles the traced kernel, on a GPU in each rank's own time; the
        # second, which the trace keeps, starts on every rank together (a device barrier).
        for _ in range(2):
            flag.zero_()
            ctx.barrier()
            ctx.device_barrier()
            ctx.tracing.reset()
            handoff_kernel[(1,)](data, flag, rank, ctx.get_heap_bases(), LATE_NS=late_ns, BLOCK=64)
        ctx.barrier()
        return ctx.tracing.collect(directory)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Run A, then run B in which rank 1 is 400 ms later: (directory A, directory B)."""
    pool = get_pool(SMALL_WORLD)
    runs = []
    for name, late_ns in (("a", 0), ("b", 400_000_000)):
        directory = tmp_path_factory.mktemp(f"run_{name}")
        pool.run(_run_body, str(directory), late_ns)
        runs.append(directory)
    return runs


def _trace(directory):
    return Trace.from_files(sorted(str(path) for path in directory.glob("rank*.npz")))


def test_a_later_release_shows_as_the_waiters_longer_wait_and_a_longer_window(two_runs):
    result = diff.compare(_trace(two_runs[0]), _trace(two_runs[1]))
    assert result.findings[0].startswith("window: ") and "(+" in result.findings[0], result.findings
    waits = [line for line in result.findings if line.startswith("rank 0 wait_until: total")]
    assert waits and "(+" in waits[0], result.findings
    row = next(r for r in result.ops if (r["rank"], r["op"]) == (0, "wait_until"))
    assert row["total_ns_b"] - row["total_ns_a"] > 300_000_000 and row["events_a"] == row["events_b"] == 1
    assert any(line.startswith("rank 0 stall:") for line in result.findings), result.findings


def test_a_run_compared_with_itself_has_no_finding(two_runs):
    trace = _trace(two_runs[0])
    result = diff.compare(trace, trace)
    assert result.findings == [] and "none above the threshold" in result.format()
    assert result.paths[0] == result.paths[1] and result.paths[0]["ends_on"]["rank"] in (0, 1)


def test_the_command_writes_the_comparison_and_its_picture(two_runs, tmp_path, capsys):
    out_json, out_png = tmp_path / "diff.json", tmp_path / "diff.png"
    args = ["diff", str(two_runs[0]), str(two_runs[1]), "--json", str(out_json), "--plot", str(out_png)]
    assert iris_trace_main(args) == 0
    assert "findings:" in capsys.readouterr().out
    written = json.loads(out_json.read_text())
    assert written["findings"] and {"rank", "op", "total_ns_a", "total_ns_b"} <= set(written["ops"][0])
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_directory_without_rank_files_is_refused_in_one_line(two_runs, tmp_path, capsys):
    assert iris_trace_main(["diff", str(two_runs[0]), str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no rank<N>.npz files" in err, err


def test_bad_thresholds_are_refused(two_runs):
    trace = _trace(two_runs[0])
    with pytest.raises(ValueError, match="non-negative"):
        diff.compare(trace, trace, threshold=-1)
