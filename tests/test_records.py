"""``benchmarks/records.py --keep``: runs of ``scripts/upstream_tests.py`` made into a file of record."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import records
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

TESTS_RUN = {
    "command": "python scripts/upstream_tests.py up --ranks 2 --dirs ccl",
    "gpus": 2,
    "vendor_changes": 61,
    "results": [
        {
            "file": "tests/ccl/test_all_reduce.py",
            "ranks": 2,
            "seconds": 36.0,
            "returncode": 1,
            "reported_by_rank": 0,
            "passed": 48,
            "failed": 1,
            "failures": ["tests/ccl/test_all_reduce.py::test_x[a] Assert..."],
            "tail": ["E   AssertionError"],
            "other_ranks": {"1": ["1 failed"]},
        }
    ],
}


def test_a_kept_run_holds_counts_and_failing_names_not_output():
    record = records.keep_upstream([TESTS_RUN], "2 x H200", "abd3f2ad", ["be44ef0"])
    (run,) = record["runs"]
    assert (record["device"], record["upstream"], run["package"]) == ("2 x H200", "abd3f2ad", "be44ef0")
    (result,) = run["results"]
    assert "tail" not in result and "other_ranks" not in result
    assert result["failures"] == ["tests/ccl/test_all_reduce.py::test_x[a]"]
    assert json.loads(json.dumps(record)) == record


def test_a_run_that_does_not_name_its_package_needs_one():
    with pytest.raises(ValueError, match="no package commit"):
        records.keep_upstream([TESTS_RUN], "2 x H200", "abd3f2ad")
    with pytest.raises(ValueError, match="one per run"):
        records.keep_upstream([TESTS_RUN], "2 x H200", "abd3f2ad", ["a", "b"])
    named = {**TESTS_RUN, "package": "ed13515"}
    assert records.keep_upstream([named], "2 x H200", "abd3f2ad")["runs"][0]["package"] == "ed13515"


def test_a_run_of_a_changed_tree_takes_the_commit_given():
    changed = {**TESTS_RUN, "package": "76ec333+"}  # a GPU machine's copy of a newer working tree
    with pytest.raises(ValueError, match="had changes from 76ec333: give --package"):
        records.keep_upstream([changed], "2 x H200", "abd3f2ad")
    kept = records.keep_upstream([changed, {**TESTS_RUN, "package": "ed13515"}], "x", "y", ["aaf96a1", "z"])
    assert [run["package"] for run in kept["runs"]] == ["aaf96a1", "ed13515"]


def _kept(kind_results, package="be44ef0", device="2 x H200"):
    run = {"command": "python scripts/upstream_tests.py up", "vendor_changes": 61, "results": kind_results}
    return {**records.keep_upstream([run], device, "abd3f2ad", [package]), "file": f"{device}.json"}


def test_the_upstream_block_leads_with_the_most_gpus_and_says_only_what_was_run():
    passing = {"file": "tests/ccl/test_all_gather.py", "ranks": 4, "returncode": 0, "passed": 30}
    failing = {**TESTS_RUN["results"][0], "ranks": 2}
    example = {"example": "13_flash_decode/example_run.py", "ranks": 2, "returncode": 0, "ok": True}
    machines = {
        "h200x2": {"tests": _kept([failing]), "examples": _kept([example])},
        "h200x4": {"tests": _kept([passing], device="4 x H200")},
    }
    block = records.upstream_block({"upstream": machines})
    four, two = block.index("4 x H200"), block.index("2 x H200")
    assert four < two
    assert "| `ccl/test_all_reduce.py` | 48 | 1 | 0 |" in block[two:]
    assert "1 of 1 ran and validated" in block[two:] and "benchmark files" not in block
    assert block.count("application examples") == 1


def test_the_upstream_block_names_the_benchmark_files_that_stopped():
    ran = {"benchmark": "benchmark/ccl/bench_all_reduce.py", "ok": True, "combinations": 50, "skipped": 0}
    stopped = {"benchmark": "benchmark/ccl/bench_all_to_all.py", "ok": False, "combinations": 0, "skipped": 0}
    passing = {"file": "tests/ccl/test_all_gather.py", "ranks": 4, "returncode": 0, "passed": 30}
    machines = {"h200x4": {"tests": _kept([passing]), "benchmarks": _kept([ran, stopped])}}
    block = records.upstream_block({"upstream": machines})
    assert "1 of 2 ran, 50 combinations" in block
    assert "Stopped with an error: `benchmark/ccl/bench_all_to_all.py`" in block


@pytest.mark.parametrize("case", ["missing", "not_json", "not_a_run", "a_path_for_a_name"])
def test_keep_refuses_what_is_not_a_run_in_one_line_and_writes_nothing(tmp_path, case):
    run = tmp_path / "run.json"
    name = "upstream_tests_h200x2"
    if case == "not_json":
        run.write_text("{ half")
    elif case == "not_a_run":
        run.write_text(json.dumps([1, 2]))
    elif case == "a_path_for_a_name":
        run.write_text(json.dumps({**TESTS_RUN, "package": "be44ef0"}))
        name = "../../escaped"
    before = sorted(p.name for p in (ROOT / "benchmarks" / "results").iterdir())
    command = [sys.executable, str(ROOT / "benchmarks" / "records.py"), "--keep", name, str(run)]
    command += ["--device", "2 x H200", "--upstream", "abd3f2ad"]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("records.py: error: --keep"), done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in (ROOT / "benchmarks" / "results").iterdir()) == before
    assert not (tmp_path.parent.parent / "escaped.json").exists()
