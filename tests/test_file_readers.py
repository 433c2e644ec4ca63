"""The trace and flight-file readers and the iris-trace command against bad, hostile and
interrupted files: every input is read or refused in one line (exit status 2), no output
replaces an input, an interrupted write leaves the previous file, runs are never mixed."""

import json
import os
import random
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from conftest import small_world_pool

from iris_trace import cli
from iris_trace import flight_file as fmt
from iris_trace.hang import HangReport
from iris_trace.trace import CLAIM_FILE, RankTrace, Trace, TraceFileError, claim_directory

#: Mutations the fuzzer tries, in all (shared out over FUZZ_SHARDS tests that may run in parallel).
FUZZ_MUTATIONS = 10_000
FUZZ_SHARDS = 4


def _traced_run_body(rank, world_size, directory):
    import torch
    from test_tracing import BLOCK, N, put_blocks

    import iris

    with iris.iris(1 << 22) as ctx:
        src, dst = ctx.randn(BLOCK), ctx.zeros(BLOCK)
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        ctx.ccl.all_reduce(ctx.zeros(64, dtype=torch.float32), ctx.ones(64, dtype=torch.float32))
        put_blocks[(2,)](src, dst, N, 1, rank, world_size, ctx.get_heap_bases(), BLOCK=BLOCK)
        ctx.barrier()
        path = ctx.tracing.collect(directory)
        recorder = ctx.hang.recorder
        recorder.publish()
        live = os.path.join(directory, os.path.basename(recorder.path))
        shutil.copyfile(recorder.path, live)
        dump = ctx.hang.dump("request")
        shutil.move(dump, os.path.join(directory, os.path.basename(dump)))
        return path, ctx.tracing.run


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """A real two-rank run's rank files, live flight files and dumps (one run per module)."""
    directory = tmp_path_factory.mktemp("run")
    results = small_world_pool().run(_traced_run_body, str(directory))
    ranks = [path for path, _ in results]
    flights = sorted(str(p) for p in directory.glob("iris-flight-*.bin"))
    dumps = sorted(str(p) for p in directory.glob("iris-hang-*.bin"))
    return {"ranks": ranks, "flights": flights, "dumps": dumps, "run": results[0][1], "directory": directory}


def _one_line_failure(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("iris-trace: "), err
    return err


# ---------------------------------------------------------------- outputs
def test_an_output_that_names_an_input_is_refused(run_files, capsys):
    first = run_files["ranks"][0]
    before = open(first, "rb").read()
    assert cli.main(["merge", *run_files["ranks"], "-o", first]) == cli.EXIT_BAD_FILE
    assert "is an input of this command" in _one_line_failure(capsys)
    assert open(first, "rb").read() == before


def test_an_interrupted_merge_leaves_the_previous_output(run_files, tmp_path, monkeypatch, capsys):
    from iris_trace.export import perfetto

    output = tmp_path / "run.pftrace"
    assert cli.main(["merge", *run_files["ranks"], "-o", str(output)]) == 0
    good = output.read_bytes()

    def interrupted(*args, **kwargs):  # after every slice is written, before the counters
        raise KeyboardInterrupt

    monkeypatch.setattr(perfetto._SliceWriter, "write_counters", interrupted)
    capsys.readouterr()
    assert cli.main(["merge", *run_files["ranks"], "-o", str(output)]) == 130
    assert output.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pftrace"]  # no partial file left


def test_an_unwritable_output_is_refused_in_one_line(run_files, capsys):
    assert cli.main(["plot", *run_files["ranks"], "-o", "/nonexistent/timeline.png"]) == cli.EXIT_BAD_FILE
    assert "cannot write /nonexistent" in _one_line_failure(capsys)


# ---------------------------------------------------------------- runs
def _second_run_body(rank, world_size, directory):
    return _traced_run_body(rank, world_size, directory)[0]


def test_rank_files_of_two_runs_are_refused_naming_them(run_files, tmp_path, capsys):
    other = small_world_pool().run(_second_run_body, str(tmp_path))
    mixed = [run_files["ranks"][0], other[1]]
    assert cli.main(["report", *mixed]) == cli.EXIT_BAD_FILE
    message = _one_line_failure(capsys)
    assert "different runs" in message and all(path in message for path in mixed)


def test_rank_files_carry_their_run(run_files):
    loaded = [RankTrace.load(path) for path in run_files["ranks"]]
    assert {r.run for r in loaded} == {run_files["run"]} and run_files["run"]


def test_a_directory_a_live_job_writes_is_left_to_it(tmp_path):
    import socket

    (tmp_path / CLAIM_FILE).write_text(json.dumps({"run": "other-1", "host": socket.gethostname(), "pid": 1}))
    warnings = []
    chosen = claim_directory(str(tmp_path), "mine-1", warn=lambda text, **_: warnings.append(text))
    assert chosen == f"{tmp_path}-mine-1" and "other-1" in warnings[0]
    assert json.loads((tmp_path / CLAIM_FILE).read_text())["run"] == "other-1"  # untouched


def test_a_directory_whose_writer_has_exited_is_taken_over(tmp_path):
    import socket

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    claim = {"run": "other-1", "host": socket.gethostname(), "pid": gone.pid}
    (tmp_path / CLAIM_FILE).write_text(json.dumps(claim))
    assert claim_directory(str(tmp_path), "mine-1", warn=None) == str(tmp_path)
    assert json.loads((tmp_path / CLAIM_FILE).read_text())["run"] == "mine-1"


# ---------------------------------------------------------------- bad inputs, one line each
def test_hang_report_on_a_missing_file_is_one_line(tmp_path, capsys):
    assert cli.main(["hang-report", str(tmp_path / "iris-hang-00-rank0.bin")]) == cli.EXIT_BAD_FILE
    assert "no such flight file" in _one_line_failure(capsys)


def _truncated(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def _flipped(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 16)):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def _zeroed(data: bytes, rng: random.Random) -> bytes:
    start = rng.randrange(len(data))
    end = min(len(data), start + rng.randint(1, 4096))
    return data[:start] + bytes(end - start) + data[end:]


def _spliced(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data))
    return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + data[at:]


BYTE_MUTATIONS = (_truncated, _flipped, _zeroed, _spliced)
EXTREMES = (0, -1, 1, 2**15 - 1, -(2**15), 2**31 - 1, -(2**31), 2**62, -(2**62), 2**63 - 1, -(2**63))


def _rank_file_arrays(path: str) -> dict:
    with np.load(path) as data:
        return {name: data[name].copy() for name in data.files}


def _mutated_rank_file(arrays: dict, rng: random.Random) -> dict:
    """A rank file changed where it means something: the metadata, an event field, a shape."""
    arrays = {name: value.copy() for name, value in arrays.items()}
    meta = json.loads(str(arrays["meta"]))
    choice = rng.randrange(6)
    if choice == 0:
        key = rng.choice(sorted(meta))
        meta[key] = rng.choice([None, "x", -3, 2**40, [], {}, True, 1.5])
    elif choice == 1:
        del meta[rng.choice(sorted(meta))]
    elif choice == 2 and len(arrays["events"]):
        events = arrays["events"]
        field = rng.choice(events.dtype.names)
        index = rng.randrange(len(events))
        info = np.iinfo(events.dtype[field])
        events[field][index] = max(info.min, min(info.max, rng.choice(EXTREMES)))
    elif choice == 3:
        name = rng.choice(["sync_enable", "sync_collect"])
        arrays[name] = arrays[name].reshape(-1)[: rng.randrange(1, arrays[name].size + 1)]
    elif choice == 4:
        arrays[rng.choice(["sync_enable", "sync_collect"])] *= rng.choice(EXTREMES)
    else:
        meta = rng.choice([[], "text", 7, None])
    arrays["meta"] = np.array(json.dumps(meta))
    return arrays


def _lying_header(arrays: dict, rng: random.Random, path: str) -> None:
    """An npz whose events header claims far more elements than it holds."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, value in arrays.items():
            header = {"descr": np.lib.format.dtype_to_descr(value.dtype), "fortran_order": False}
            header["shape"] = (
                (rng.choice([2**34, 2**20, len(value) + 1]),) if name == "events" else value.shape
            )
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array_header_1_0(member, header)
                member.write(value.tobytes())


def _read_rank_files(paths: list[str]) -> None:
    Trace.from_files(paths)


def _read_flight_files(paths: list[str]) -> None:
    HangReport.from_files(paths).format()


@pytest.mark.parametrize("shard", range(FUZZ_SHARDS))
def test_every_reader_reads_or_refuses_in_one_line_under_mutation(run_files, tmp_path, shard):
    """Seeded mutations of a real run's rank files, flight files and dumps (FUZZ_MUTATIONS in
    all): each set of files is read (and reported on), or refused with one line."""
    rng = random.Random(1000 + shard)
    rank_paths = run_files["ranks"]
    rank_bytes = [open(p, "rb").read() for p in rank_paths]
    rank_arrays = [_rank_file_arrays(p) for p in rank_paths]
    flight_paths = run_files["flights"] + run_files["dumps"]
    flight_bytes = [open(p, "rb").read() for p in flight_paths]
    read, refused = 0, 0
    for trial in range(FUZZ_MUTATIONS // FUZZ_SHARDS):
        target = tmp_path / f"trial{trial % 2}"
        target.mkdir(exist_ok=True)
        kind = rng.randrange(4)
        if kind < 3:  # a rank file: bytes, meaning, or a lying header; the other rank intact
            victim = rng.randrange(len(rank_paths))
            paths = [str(target / f"rank{r}.npz") for r in range(len(rank_paths))]
            for r, path in enumerate(paths):
                if r != victim:
                    open(path, "wb").write(rank_bytes[r])
                elif kind == 0:
                    open(path, "wb").write(rng.choice(BYTE_MUTATIONS)(rank_bytes[r], rng))
                elif kind == 1:
                    np.savez(path, **_mutated_rank_file(rank_arrays[r], rng))
                else:
                    _lying_header(rank_arrays[r], rng, path)
            reader = _read_rank_files
        else:  # a flight file or dump: bytes, or a header word set to an extreme
            index = rng.randrange(len(flight_paths))
            data = flight_bytes[index]
            if rng.random() < 0.5:
                data = rng.choice(BYTE_MUTATIONS)(data, rng)
            else:
                words = bytearray(data)
                word = rng.randrange(fmt.H_PENDING + 1)
                value = rng.choice(EXTREMES).to_bytes(8, "little", signed=True)
                words[word * 8 : word * 8 + 8] = value
                data = bytes(words)
            path = target / os.path.basename(flight_paths[index])
            path.write_bytes(data)
            paths = [str(path)]
            reader = _read_flight_files
        try:
            reader(paths)
            read += 1
        except (TraceFileError, fmt.FlightFileError, ValueError) as error:
            assert "\n" not in str(error) and str(error), repr(error)
            refused += 1
    assert read and refused  # the mutations reached both outcomes


def _plausible_events(arrays: dict, rng: random.Random, world: int) -> dict:
    """Events that pass every check yet make no sense: shuffled times, kinds, SMs and peers."""
    arrays = {name: value.copy() for name, value in arrays.items()}
    events = arrays["events"]
    if not len(events):
        return arrays
    start = int(events["start_ns"].min())
    for index in rng.sample(range(len(events)), k=min(len(events), rng.randint(1, 8))):
        event = events[index]
        event["start_ns"] = start + rng.randint(-(10**9), 10**9)
        event["end_ns"] = event["start_ns"] + rng.choice([0, -5, 1, 10**6, rng.randint(0, 10**9)])
        event["event_id"] = rng.choice([0, 1, 4, 7, 9, 11, 13, 20, 63, 64, 65, 200])
        event["cu_id"] = rng.choice([0, 1, 131, 4095, 0x7F00, 0x7F01])
        event["target_rank"] = rng.randint(-1, world - 1)
        event["address"] = rng.choice([0, -1, 2**40, event["address"]])
        event["value"] = rng.choice(EXTREMES)
    return arrays


@pytest.mark.parametrize("seed", range(3))
def test_the_command_reads_or_refuses_mutated_files_in_one_line(run_files, tmp_path, capsys, seed):
    """Through ``iris-trace report``, ``merge`` and ``plot`` (analysis, exporters, picture), on rank
    files mutated where it means something, some of which load and make no sense."""
    rng = random.Random(seed)
    arrays = _rank_file_arrays(run_files["ranks"][0])
    world = len(run_files["ranks"])
    outcomes = []
    for trial in range(40):
        paths = [str(tmp_path / f"rank{r}.npz") for r in range(world)]
        for r, path in enumerate(paths):
            shutil.copyfile(run_files["ranks"][r], path)
        mutated = _plausible_events(arrays, rng, world) if trial % 2 else _mutated_rank_file(arrays, rng)
        np.savez(paths[0], **mutated)
        command = rng.choice([["report"], ["merge", "-o", str(tmp_path / "out.pftrace")]])
        if trial % 8 == 7:
            command = ["plot", "-o", str(tmp_path / "timeline.png")]
        status = cli.main([command[0], *paths, *command[1:]])
        err = capsys.readouterr().err.strip()
        assert status in (0, cli.EXIT_BAD_FILE), (trial, status, err)
        if status:
            assert len(err.splitlines()) == 1 and err.startswith("iris-trace: "), err
        outcomes.append(status)
    assert outcomes.count(0) >= 10, outcomes  # the analysis and exporters ran on nonsense


def test_a_truncated_flight_ring_is_refused_in_one_line(run_files, tmp_path, capsys):
    original = run_files["dumps"][0]
    path = tmp_path / os.path.basename(original)
    path.write_bytes(open(original, "rb").read()[: fmt.RING_OFFSET + 64])
    assert cli.main(["hang-report", str(path)]) == cli.EXIT_BAD_FILE
    assert "truncated" in _one_line_failure(capsys)


def test_hang_report_reads_a_runs_dumps(run_files, capsys):
    assert cli.main(["hang-report", *run_files["dumps"]]) == 0
    assert "iris hang report" in capsys.readouterr().out
