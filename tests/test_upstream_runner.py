"""``scripts/upstream_tests.py``: its vendor changes (AMD-only launch options dropped, 32-lane Gluon
layouts) and what its results record."""

import ast
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "upstream_tests", os.path.join(ROOT, "scripts", "upstream_tests.py")
)
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)

#: A launch as upstream's examples write it (``matmul_wrapper.py``), and a wrapper's own call.
LAUNCH = """\
kk = gemm_kernel[(grid,)](
    a,
    b,
    num_warps=num_warps,
    waves_per_eu=waves_per_eu,
    matrix_instr_nonkdim=mfma,
    kpack=kpack,
)
matmul._call(a, waves_per_eu=waves_per_eu, kpack=kpack)
"""


def test_amd_launch_options_are_dropped_from_launches_only():
    ported, dropped = runner.port_to_nvidia(LAUNCH)
    assert dropped == 3
    launch, wrapper = ast.parse(ported).body
    assert [k.arg for k in launch.value.keywords] == ["num_warps"]
    assert [k.arg for k in wrapper.value.keywords] == ["waves_per_eu", "kpack"]


def test_the_last_option_of_a_launch_and_one_before_unpacked_options_go_cleanly():
    assert runner.port_to_nvidia("k[g](a, kpack=1)") == ("k[g](a, )", 1)
    assert runner.port_to_nvidia("k[g](a, waves_per_eu=2, **opts)") == ("k[g](a, **opts)", 1)


def test_positions_hold_past_wide_characters_and_form_feeds():
    source = 'print("été")\x0c\nk[g]("—", waves_per_eu=2, num_warps=4)\n'
    assert runner.port_to_nvidia(source) == (source.replace("waves_per_eu=2, ", ""), 1)


def test_a_file_with_nothing_to_port_or_that_does_not_parse_is_left_as_it_is():
    for source in ("k[g](a, num_warps=4)\n", "def broken(:\n    k[g](kpack=1)\n"):
        assert runner.port_to_nvidia(source) == (source, 0)


def test_gluon_layouts_for_a_64_lane_wavefront_get_32_lanes():
    source = "layout: gl.constexpr = gl.BlockedLayout([SPT], [64], [NUM_WARPS], [0])\n"
    assert runner.port_to_nvidia(source) == (source.replace("[64]", "[32]"), 1)
    for kept in ("gl.BlockedLayout([1], [BLOCK], [1], [0])\n", "gl.BlockedLayout([64], [32], [1], [0])\n"):
        assert runner.port_to_nvidia(kept) == (kept, 0)


def test_lanes_given_by_name_get_32_where_the_file_sets_that_name_to_64():
    kernel = "@gluon.jit\ndef k(B: gl.constexpr):\n    lay = gl.BlockedLayout([1], [B], [1], [0])\n"
    host = "def test():\n    B = 64  # AMD wavefront size\n    k[(1,)](B)\n    other = 64\n    B2 = 64\n"
    assert runner.port_to_nvidia(kernel + host) == (kernel + host.replace("B = 64", "B = 32"), 1)
    for kept in (host, kernel + "B = 128\n", kernel + "B, C = 64, 64\n"):
        assert runner.port_to_nvidia(kept) == (kept, 0)


def test_a_folder_is_ported_file_by_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "wrapper.py").write_text(LAUNCH)
    (tmp_path / "plain.py").write_text("x = 1\n")
    assert runner.port_folder(tmp_path) == 3
    assert "matrix_instr_nonkdim" not in (tmp_path / "sub" / "wrapper.py").read_text()
    assert (tmp_path / "plain.py").read_text() == "x = 1\n"


#: A stand-in for an upstream benchmark file: it writes one JSON row per flag it was given.
STUB_BENCH = """\
import json, sys
flags = [a for a in sys.argv[1:] if not a.startswith("--benchmark_out=")]
out = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--benchmark_out="))
rows = [{"benchmark": "stub", "params": {"flag": f}} for f in flags] + [{"skipped": True}]
open(out, "w").write(json.dumps(rows))
"""


def test_a_benchmark_file_runs_at_the_rank_count_asked_and_its_rows_are_kept(tmp_path):
    bench = tmp_path / "benchmark" / "ccl" / "bench_stub.py"
    bench.parent.mkdir(parents=True)
    bench.write_text(STUB_BENCH)
    result = runner.run_benchmark(tmp_path, bench, 2, [0], timeout=60)
    assert result["ok"] and result["benchmark"] == "benchmark/ccl/bench_stub.py" and result["ranks"] == 2
    flags = [row["params"]["flag"] for row in result["records"] if not row.get("skipped")]
    assert flags == ["--axis_num_ranks=2", *runner.BENCH_TIMING, "--benchmark_format=json"]
    assert result["combinations"] == 5 and result["skipped"] == 1


def test_the_settings_that_change_upstreams_files_are_kept_with_the_command():
    environment = {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "IRIS_BACKEND": "cuda",
        "PATH": "/bin",
    }
    environment["IRIS_DEBUG"] = "1 2"
    assert runner.recorded_settings(environment) == [
        "IRIS_DEBUG='1 2'",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    ]
