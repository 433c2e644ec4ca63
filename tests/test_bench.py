"""iris.bench, upstream's benchmark framework: axes, the command line, the tables, a launch."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import iris
import iris.bench as bench
from iris.bench import Result


def test_axis_values_from_the_command_line():
    assert bench.parse_values("pow2:8:10", "M") == [256, 512, 1024]
    assert bench.parse_values("lin:64:256:64", "N") == [64, 128, 192, 256]
    assert bench.parse_values("fp16,BF16", "dtype") == [torch.float16, torch.bfloat16]
    assert bench.parse_values("1024, 2048", "M") == [1024, 2048]
    assert bench.parse_values("0.5,1", "alpha") == [0.5, 1.0]
    assert bench.parse_values("ring,tree", "algo") == ["ring", "tree"]


@pytest.mark.parametrize("raw, name", [("pow2:8", "M"), ("lin:1:x:2", "N"), ("fp8", "dtype")])
def test_a_malformed_axis_value_is_refused_in_one_line(raw, name):
    with pytest.raises(ValueError, match=name):
        bench.parse_values(raw, name)


def test_axes_stack_outermost_first_and_bad_axes_are_refused():
    @bench.axis("M", [1, 2])
    @bench.axis("dtype", [torch.float16])
    def fn(state, ctx): ...

    assert [a.name for a in fn._bench_axes] == ["M", "dtype"]
    for name, values in (
        ("M", []),
        ("M", "12"),
        ("not a name", [1]),
        ("num_ranks", [0]),
        ("num_ranks", [2.0]),
    ):
        with pytest.raises(ValueError, match="iris.bench"):
            bench.axis(name, values)


def test_state_reads_axes_and_checks_what_it_is_told():
    state = bench.State({"M": 4}, n_warmup=1, n_repeat=2)
    assert state["M"] == 4 and state.get("N", 7) == 7
    with pytest.raises(KeyError, match="no axis 'N'"):
        state["N"]
    with pytest.raises(ValueError, match="set_bytes"):
        state.set_bytes(-1)
    with pytest.raises(ValueError, match="set_repeat"):
        state.set_repeat(0)
    with pytest.raises(TypeError, match="callables"):
        state.exec(42)


RESULTS = [
    Result("copy", {"num_ranks": 2, "dtype": torch.float16}, 1.5, [1.5], bandwidth_gbps=80.0, world_size=2),
    Result("copy", {"num_ranks": 2, "dtype": torch.float32}, 0.0, [], skipped=True, skip_reason="too big"),
    Result("gemm", {"M": 8}, 2.0, [2.0], tflops=1.25, counters={"tiles": 4.0}),
]


def test_the_table_json_and_csv_hold_every_result():
    table = bench.format_console(RESULTS)
    assert "BW (GB/s)" in table and "80.0" in table and "(skipped) too big" in table
    assert "TFLOPS" in table and "tiles" in table and "float16" in table
    records = json.loads(bench.format_json(RESULTS))
    assert records[0]["params"] == {"num_ranks": "2", "dtype": "float16"} and records[1]["skipped"]
    assert records[2]["counters"] == {"tiles": 4.0} and "bandwidth_gbps" not in records[2]
    rows = bench.format_csv(RESULTS).splitlines()
    assert rows[0].startswith("benchmark,world_size,num_ranks,dtype,M,gpu_time_ms") and len(rows) == 4


SCRIPT = """
    import torch
    import iris.bench as bench

    @bench.register
    @bench.axis("num_ranks", [2])
    @bench.axis("n", [64, 128])
    def put_ring(state, ctx):
        src = ctx.ones(state["n"], dtype=torch.float32)
        dst = ctx.zeros(state["n"], dtype=torch.float32)
        state.set_bytes(src.numel() * src.element_size())
        state.add_counter("ranks", ctx.get_num_ranks())
        state.exec(lambda: dst.copy_(src), preamble_fn=dst.zero_)

    @bench.register
    @bench.axis("num_ranks", [2])
    def never(state, ctx):
        state.skip("left out on purpose")

    @bench.register
    @bench.axis("num_ranks", [2])
    def broken(state, ctx):
        if ctx.get_rank() == 1:
            raise ValueError("this benchmark's own mistake")
        state.exec(lambda: None)

    if __name__ == "__main__":
        bench.main()
"""


def _bench(tmp_path, *arguments, backend="emulated"):
    path = tmp_path / "bench_put.py"
    path.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_BACKEND")}
    env["IRIS_BACKEND"] = backend
    if backend == "cuda" and torch.cuda.device_count() < 2:
        env["IRIS_RANKS_PER_GPU"] = "2"  # the two ranks share the GPU (and a gloo group)
    return subprocess.run(
        [sys.executable, str(path), *arguments], env=env, capture_output=True, text=True, timeout=240
    )


# Under emulation always; on GPUs in GPU passes (IRIS_BACKEND=cuda).
BACKENDS = ["emulated"] + ["cuda"] * (iris.BACKEND == "cuda")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_benchmark_file_runs_its_ranks_and_writes_upstreams_json(tmp_path, backend):
    out = tmp_path / "results.json"
    done = _bench(
        tmp_path, "--benchmark_filter=put_ring|never", "--axis_n=64", "--n_warmup=1", "--n_repeat=3",
        "--heap_size=4194304", "--benchmark_format=json", f"--benchmark_out={out}", backend=backend,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    assert json.loads(done.stdout) == records
    timed, skipped = records
    assert timed["benchmark"] == "put_ring" and timed["params"] == {"num_ranks": "2", "n": "64"}
    assert len(timed["all_times_ms"]) == 3 and timed["gpu_time_ms"] > 0 and timed["bandwidth_gbps"] > 0
    assert timed["counters"] == {"ranks": 2.0} and timed["world_size"] == 2
    assert skipped["skipped"] and skipped["skip_reason"] == "left out on purpose"


def test_a_failing_rank_is_named_in_one_line_under_its_own_error(tmp_path):
    done = _bench(tmp_path, "--benchmark_filter=broken", "--n_repeat=1", "--heap_size=4194304")
    assert done.returncode == 1 and "this benchmark's own mistake" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == (
        "iris.bench: rank 1 of a 2-rank launch failed (exit 1); its error is above"
    )


def test_an_unknown_argument_is_refused_in_one_line_before_any_launch(tmp_path):
    done = _bench(tmp_path, "--axis_n=pow2:x:2")
    assert done.returncode == 2 and "expected pow2:<int>:<int>" in done.stderr
    assert _bench(tmp_path, "--frobnicate").returncode == 2
