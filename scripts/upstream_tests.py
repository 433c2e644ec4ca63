"""Run upstream Iris's own test files, unchanged, against this package on this machine's GPUs.

Upstream's CI launches each test file on its own under torchrun
(``.github/scripts/run_tests.sh``: ``torchrun --nproc_per_node=N
tests/run_tests_distributed.py FILE``); this script does the same for every file of the
folders asked for, at every rank count asked for, and prints one line per file and
rank count with rank 0's passed / failed / skipped counts, then the totals::

    python scripts/upstream_tests.py ~/src/iris              # its five test folders, 2 and 4 ranks
    python scripts/upstream_tests.py ~/src/iris --ranks 2 --dirs ccl --jobs 4
    python scripts/upstream_tests.py ~/src/iris --examples   # its application examples
    python scripts/upstream_tests.py ~/src/iris --benchmarks # its benchmark files (iris.bench)

``--benchmarks`` runs upstream's benchmark files (``benchmark/**/bench_*.py``, written
for ``iris.bench``) one at a time, every combination of their axes at each rank count,
timed briefly (``BENCH_TIMING``: correctness runs, not timings of record), and keeps their
JSON rows. ``--examples`` runs upstream's application examples (flash decode, all-gather + GEMM,
the ring all-reduces, the independent-stream GEMMs, the ccl and ops examples,
expert-sharded MoE, message passing, the Gluon all-gather) with validation on, one at a
time (several pick one fixed rendezvous port), each as upstream's READMEs launch it; a
run passes when it exits 0 and no line reports a failed validation, and the lines that
report times are kept.

UPSTREAM is a checkout of upstream Iris, or any folder that holds its ``tests/`` and
``examples/``. Only those two folders are copied (into a private temporary folder), so
``import iris`` in upstream's tests always finds this package, never upstream's own.
Nothing of upstream is kept in this repository.

The copies get two vendor changes, the same in every file (:func:`port_to_nvidia`): the
launch options only AMD's Triton takes (``waves_per_eu``, ``matrix_instr_nonkdim``,
``kpack``), which NVIDIA's Triton refuses (``KeyError: Keyword argument ... unrecognised``),
are dropped from kernel launches (``kernel[grid](..., waves_per_eu=2)``), and Gluon layouts
written for AMD's 64-lane wavefront (``gl.BlockedLayout([1], [64], ...)``, or lanes given
by a name that the file sets to 64) get NVIDIA's 32 lanes. The results say how
many changes each copy got; ``--unported`` runs the files exactly as they are.

Several files run at once (``--jobs``); a launch of N ranks takes N GPUs in turn, so
concurrent launches share GPUs (these are correctness runs, not timings). A launch needs a
GPU per rank (upstream's runner calls ``torch.cuda.set_device(local_rank)``): rank counts
above the GPU count are refused. ``--results FILE`` (default
``$OUT/upstream_tests_<card>x<gpus>.json``) is rewritten after every file, so a run cut
short keeps what finished; each failing file keeps the end of its output in it.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Upstream's test folders, in the order its CI runs them.
DIRS = ("unittests", "ccl", "context", "ops", "examples")
#: A rank's lines as torchrun --tee prefixes them (``[default0]:...``).
_RANK_LINE = re.compile(r"^\[[A-Za-z_]*(\d+)\]:(.*)$")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
_OUTCOME = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")
#: Launch options of AMD's Triton backend that NVIDIA's does not take (the vendor change).
AMD_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
#: Lanes of a warp: AMD's wavefront, NVIDIA's warp.
AMD_LANES, NVIDIA_LANES = 64, 32
#: Lines of a failing file's rank-0 output kept in the results.
TAIL_LINES = 60
#: Upstream's application examples: (folder, entry file, arguments; {n} is the rank count).
#: Entries that take ``--num_ranks``/``-r`` spawn their ranks; the others run under torchrun.
EXAMPLES = (
    ("13_flash_decode", "example_run.py", "--num_ranks {n}"),
    ("14_all_gather_gemm", "example_run_pull.py", "--num_ranks {n}"),
    ("14_all_gather_gemm", "example_run_push.py", "--num_ranks {n}"),
    ("15_gemm_all_reduce_ring_based", "benchmark.py", "-v -b -r {n}"),
    ("16_all_reduce_ring_based", "benchmark.py", "-v -b -r {n}"),
    ("20_gemm_all_scatter_independent", "benchmark.py", "-v -b -r {n}"),
    ("21_gemm_one_shot_all_reduce_independent", "benchmark.py", "-v -b -r {n}"),
    ("22_gemm_one_shot_reduce_scatter_wg_specialization", "benchmark.py", "-v -b -r {n}"),
    ("23_gemm_all_scatter_tracing", "benchmark.py", "-v -b --trace -r {n}"),
    ("24_ccl_all_reduce", "example.py", "-v"),
    ("25_ccl_all_gather", "example.py", "-v"),
    ("26_ccl_all_to_all", "example.py", "-v"),
    ("27_ccl_reduce_scatter", "example.py", "-v"),
    ("28_ops_matmul_all_reduce", "example.py", "-v"),
    ("29_ops_all_gather_matmul", "example.py", "-v"),
    ("30_ops_matmul_all_gather", "example.py", "-v"),
    ("31_expert_sharded_moe", "example_run.py", "--num_ranks {n}"),
    ("31_message_passing", "example.py", "-v"),
    ("32_gluon_all_gather_tracing", "all_gather_tracing.py", "--trace"),
)
#: Examples upstream runs at one rank count only.
EXAMPLE_RANKS = {"31_message_passing": (2,)}
#: How upstream's benchmark files are timed here: correctness runs, not timings of record.
BENCH_TIMING = ("--n_warmup=2", "--n_repeat=5")
_FAILED_VALIDATION = re.compile(r"validation failed|failed validation|mismatch|not close", re.IGNORECASE)
_TIMING = re.compile(r"\d\s*(ms|us|tflops|gb/s)\b", re.IGNORECASE)


def port_to_nvidia(source: str) -> tuple[str, int]:
    """``source`` with the vendor changes (module docstring) made; and how many were made.

    A launch is a call of a subscript (``kernel[grid](...)``): an option in
    :data:`AMD_LAUNCH_OPTIONS` goes with the comma after it. A ``BlockedLayout`` call whose
    lanes per warp (its second argument) are the list ``[64]`` gets ``[32]``. The rest of
    the text is kept as it was. Where a layout's lanes are a name (``[BLOCK_SIZE]``, a
    kernel's parameter), the file's assignments of 64 to that name get 32.

    Example:
        >>> port_to_nvidia("k[g](a, waves_per_eu=2, num_warps=4)")
        ('k[g](a, num_warps=4)', 1)
        >>> port_to_nvidia("layout = gl.BlockedLayout([1], [64], [4], [0])")
        ('layout = gl.BlockedLayout([1], [32], [4], [0])', 1)
        >>> port_to_nvidia("L = gl.BlockedLayout([1], [B], [1], [0]); B = 64")
        ('L = gl.BlockedLayout([1], [B], [1], [0]); B = 32', 1)
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, UnicodeError):
        return source, 0
    # The parser counts lines at newlines only (not str.splitlines's form feeds and the like)
    # and columns in UTF-8 bytes: positions here are characters of ``source``.
    lines = re.findall(r"[^\n]*\n|[^\n]+$", source)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def position(lineno: int, byte_column: int) -> int:
        text = lines[lineno - 1].encode("utf-8", "surrogateescape")[:byte_column]
        return offsets[lineno - 1] + len(text.decode("utf-8", "surrogateescape"))

    def span(node) -> tuple[int, int]:
        return position(node.lineno, node.col_offset), position(node.end_lineno, node.end_col_offset)

    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    edits = []  # (start, end, replacement)
    for call in calls:
        if isinstance(call.func, ast.Subscript):  # a launch
            for keyword in call.keywords:
                if keyword.arg in AMD_LAUNCH_OPTIONS:
                    start, end = span(keyword)
                    edits.append((start, end + len(re.match(r"\s*,?\s*", source[end:]).group()), ""))
    lanes = [
        call.args[1]
        for call in calls
        if _called(call) == "BlockedLayout" and len(call.args) > 1 and isinstance(call.args[1], ast.List)
    ]
    lanes = [list_ for list_ in lanes if len(list_.elts) == 1]
    edits += [(*span(list_), f"[{NVIDIA_LANES}]") for list_ in lanes if _number(list_.elts[0]) == AMD_LANES]
    # Lanes given by name (``[BLOCK_SIZE]``, a kernel's parameter): the file's assignments of 64 to it.
    named = {list_.elts[0].id for list_ in lanes if isinstance(list_.elts[0], ast.Name)}
    edits += [
        (*span(node.value), str(NVIDIA_LANES))
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and getattr(node.targets[0], "id", None) in named
        and _number(node.value) == AMD_LANES
    ]
    for start, end, replacement in sorted(edits, reverse=True):
        source = source[:start] + replacement + source[end:]
    return source, len(edits)


def _called(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _number(node: ast.AST):
    value = getattr(node, "value", None) if isinstance(node, ast.Constant) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def port_folder(folder: Path) -> int:
    """Apply :func:`port_to_nvidia` to every ``.py`` file below ``folder``; the changes made."""
    changes = 0
    for path in sorted(folder.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        ported, count = port_to_nvidia(text)
        if count:
            path.write_text(ported, encoding="utf-8", errors="surrogateescape")
            changes += count
    return changes


def rank_lines(output: str) -> dict[int, list[str]]:
    """Each rank's lines of a torchrun ``--tee 3`` output, prefix removed."""
    ranks: dict[int, list[str]] = {}
    for match in filter(None, map(_RANK_LINE.match, output.splitlines())):
        ranks.setdefault(int(match.group(1)), []).append(match.group(2))
    return ranks


def summary(lines: list[str]) -> dict[str, int]:
    """Pytest's final counts from one rank's lines (``{}`` when pytest printed none)."""
    for line in reversed(lines):
        if " in " in line and _COUNT.search(line):
            counts = {kind: int(n) for n, kind in _COUNT.findall(line)}
            if "error" in counts:
                counts["errors"] = counts.pop("error")
            return counts
    return {}


def run_file(upstream: Path, test: Path, ranks: int, gpus: list[int], timeout: float) -> dict:
    """One torchrun launch of one upstream test file at ``ranks`` ranks on ``gpus``."""
    env = _environment(upstream, gpus)
    runner = str(upstream / "tests" / "run_tests_distributed.py")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
        "--nnodes=1", f"--nproc_per_node={ranks}", "--tee=3", runner,
        str(test), "-q", "-rfE", "-p", "no:cacheprovider",
    ]  # fmt: skip
    output, returncode, seconds = _run(command, upstream, env, timeout)
    # Rank 0's report; torchrun stops the other ranks when one exits with a failure, so
    # where rank 0 was stopped before its summary, the first rank that printed one.
    by_rank = rank_lines(output)
    reporter = next((r for r in sorted(by_rank) if summary(by_rank[r])), 0)
    lines = by_rank.get(reporter, [])
    result = {
        "file": str(test.relative_to(upstream)),
        "ranks": ranks,
        "seconds": seconds,
        "returncode": returncode,
        "reported_by_rank": reporter,
        **summary(lines),
        "failures": [" ".join(filter(None, m.groups()[1:])) for m in map(_OUTCOME.match, lines) if m],
    }
    if returncode != 0:
        result["tail"] = (lines or output.splitlines())[-TAIL_LINES:]
        # The other ranks' ends: where one rank fails first, its error is there.
        result["other_ranks"] = {r: by_rank[r][-TAIL_LINES // 3 :] for r in sorted(by_rank) if r != reporter}
    return result


def run_example(
    upstream: Path, folder: str, entry: str, arguments: str, ranks: int, gpus: list[int], timeout: float
):
    """One upstream example at ``ranks`` ranks: its own spawner or torchrun, from upstream's root."""
    env = _environment(upstream, gpus)
    argv = arguments.format(n=ranks).split()
    script = str(upstream / "examples" / folder / entry)
    if "{n}" in arguments:
        command = [sys.executable, script, *argv]
    else:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
            script, *argv,
        ]  # fmt: skip
    output, returncode, seconds = _run(command, upstream, env, timeout)
    lines = output.splitlines()
    failed = [line for line in lines if _FAILED_VALIDATION.search(line)]
    result = {
        "example": f"{folder}/{entry}",
        "ranks": ranks,
        "seconds": seconds,
        "returncode": returncode,
        "ok": returncode == 0 and not failed,
        "failed_validation": failed[:10],
        "timings": [line.strip() for line in lines if _TIMING.search(line)][:40],
    }
    if not result["ok"]:
        result["tail"] = lines[-TAIL_LINES:]
    return result


def run_benchmark(upstream: Path, bench: Path, ranks: int, gpus: list[int], timeout: float) -> dict:
    """One upstream benchmark file (``iris.bench``) at ``ranks`` ranks: every combination of its
    axes, timed briefly (``BENCH_TIMING``); the results are its JSON records."""
    env = _environment(upstream, gpus)
    records_path = bench.with_name(f".{bench.stem}_{ranks}.json")
    command = [
        sys.executable, str(bench), f"--axis_num_ranks={ranks}", *BENCH_TIMING, "--benchmark_format=json",
        f"--benchmark_out={records_path}",
    ]  # fmt: skip
    output, returncode, seconds = _run(command, upstream, env, timeout)
    records = json.loads(records_path.read_text()) if returncode == 0 and records_path.is_file() else []
    result = {
        "benchmark": str(bench.relative_to(upstream)),
        "ranks": ranks,
        "seconds": seconds,
        "returncode": returncode,
        "ok": returncode == 0,
        "combinations": len(records),
        "skipped": sum(bool(r.get("skipped")) for r in records),
        "records": records,
    }
    if returncode != 0:
        result["tail"] = output.splitlines()[-TAIL_LINES:]
    return result


def recorded_settings(environment) -> list[str]:
    """The settings of ``environment`` that change what upstream's files do here, as the command's
    ``NAME=value`` prefix: PyTorch's allocator settings and this package's, but the backend.

    Example:
        >>> recorded_settings({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "HOME": "/root"})
        ['PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True']
    """
    names = sorted(
        name
        for name in environment
        if name == "PYTORCH_CUDA_ALLOC_CONF" or (name.startswith("IRIS_") and name != "IRIS_BACKEND")
    )
    return [f"{name}={shlex.quote(environment[name])}" for name in names]


def _environment(upstream: Path, gpus: list[int]) -> dict:
    # This package first, then upstream's root (its tests import ``examples.common``; it
    # holds no ``iris``).
    path = [str(REPO), str(upstream), os.environ.get("PYTHONPATH")]
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, path)),
        CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)),
    )


def _run(command: list[str], cwd: Path, env: dict, timeout: float) -> tuple[str, int | str, float]:
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        output, returncode = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode(errors="replace") + (expired.stderr or b"").decode(
            errors="replace"
        )
        returncode = "timeout"
    return output, returncode, round(time.monotonic() - started, 1)


def gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d])
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    return len(listed.splitlines())


def card_name() -> str:
    """The first GPU's name as nvidia-smi gives it (``NVIDIA H200``)."""
    names = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout
    return names.splitlines()[0].strip() if names.strip() else "GPU"


def package_commit() -> str | None:
    """This package's commit (``+`` when the tree has changes), or None outside a git checkout."""
    here = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    return (commit + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")) or None


def default_results(name: str, card: str) -> Path:
    match = re.search(r"[HhAaBb]\d00", card)
    tag = f"{match.group(0).lower() if match else 'gpu'}x{gpu_count()}"
    return Path(os.environ.get("OUT", "out")) / f"{name}_{tag}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "upstream", type=Path, help="a checkout of upstream Iris (its tests/ and examples/ are read)"
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="rank counts (default: 2 4)")
    parser.add_argument("--dirs", nargs="+", default=list(DIRS), choices=DIRS, help="upstream's test folders")
    parser.add_argument("-k", dest="match", default="", help="only paths holding one of a,b,...")
    parser.add_argument(
        "--examples", action="store_true", help="run upstream's application examples, not its tests"
    )
    parser.add_argument(
        "--benchmarks", action="store_true", help="run upstream's benchmark files (iris.bench), not its tests"
    )
    parser.add_argument("--jobs", type=int, default=4, help="files run at once (default 4)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one file may take (default 900)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run each file this many times (for intermittent failures)"
    )
    parser.add_argument(
        "--results", type=Path, help="results JSON (default $OUT/upstream_tests_<card>x<gpus>.json)"
    )
    parser.add_argument(
        "--unported", action="store_true", help="run the files as they are (no vendor changes)"
    )
    args = parser.parse_args(argv)

    if not (args.upstream / "tests" / "run_tests_distributed.py").is_file():
        parser.error(
            f"{args.upstream} has no tests/run_tests_distributed.py: give a checkout of upstream Iris"
        )
    gpus = gpu_count()
    too_many = [n for n in args.ranks if n > gpus]
    if too_many:
        parser.error(
            f"--ranks {too_many} exceed the {gpus} GPU(s) here: upstream's runner takes one GPU per rank"
        )
    if args.jobs < 1 or args.repeat < 1:
        parser.error("--jobs and --repeat must be at least 1")
    if args.examples and args.benchmarks:
        parser.error("--examples and --benchmarks are two runs: give one")
    kind = "examples" if args.examples else "benchmarks" if args.benchmarks else "tests"
    card = card_name()
    results_path = args.results or default_results(f"upstream_{kind}", card)
    results_path.parent.mkdir(parents=True, exist_ok=True)

    record = {
        "command": " ".join(
            [
                *recorded_settings(os.environ),
                "python",
                "scripts/upstream_tests.py",
                *(argv if argv is not None else sys.argv[1:]),
            ]
        ),
        "gpus": gpus,
        "device": f"{gpus} x {card}, one GPU per rank",
        "package": package_commit(),
        "vendor_changes": 0,
        "results": [],
    }
    private = Path(tempfile.mkdtemp(prefix="iris-upstream-tests-"))
    try:
        for folder in ("tests", "examples", "benchmark"):
            if (args.upstream / folder).is_dir():
                shutil.copytree(args.upstream / folder, private / folder, symlinks=True)
                if not args.unported:
                    record["vendor_changes"] += port_folder(private / folder)
        if args.examples:
            jobs = [
                (functools.partial(run_example, private, folder, entry, arguments), n)
                for n in args.ranks
                for _ in range(args.repeat)
                for folder, entry, arguments in EXAMPLES
                if n in EXAMPLE_RANKS.get(folder, (n,)) and _chosen(args.match, f"{folder}/{entry}")
            ]
            workers = 1  # several examples rendezvous on one fixed port
        elif args.benchmarks:
            jobs = [
                (functools.partial(run_benchmark, private, bench), n)
                for n in args.ranks
                for _ in range(args.repeat)
                for bench in sorted((private / "benchmark").rglob("bench_*.py"))
                if _chosen(args.match, str(bench.relative_to(private)))
            ]
            workers = 1  # timed runs: one at a time
        else:
            jobs = [
                (functools.partial(run_file, private, test), n)
                for n in args.ranks
                for _ in range(args.repeat)
                for folder in args.dirs
                for test in sorted((private / "tests" / folder).glob("test_*.py"))
                if _chosen(args.match, str(test.relative_to(private)))
            ]
            workers = args.jobs
        lock = threading.Lock()
        turn = iter(range(len(jobs)))

        def launch(job):
            run, n = job
            with lock:  # a launch of n ranks takes the next n GPUs, round the machine
                first = next(turn) * n
            return run(n, [(first + i) % gpus for i in range(n)], args.timeout)

        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for future in concurrent.futures.as_completed([pool.submit(launch, job) for job in jobs]):
                result = future.result()
                record["results"].append(result)
                partial = results_path.with_name(f".{results_path.name}.partial")
                partial.write_text(json.dumps(record, indent=1) + "\n")
                partial.replace(results_path)  # a run cut short keeps the last whole file
                _print_result(result)
    finally:
        shutil.rmtree(private, ignore_errors=True)

    for n in args.ranks:
        rows = [r for r in record["results"] if r["ranks"] == n]
        if args.examples:
            print(f"{n} ranks: {sum(r['ok'] for r in rows)} of {len(rows)} examples ran and validated")
            continue
        if args.benchmarks:
            combinations = sum(r["combinations"] for r in rows)
            ran = sum(r["ok"] for r in rows)
            print(f"{n} ranks: {ran} of {len(rows)} benchmark files ran, {combinations} rows")
            continue
        totals = {k: sum(r.get(k, 0) for r in rows) for k in ("passed", "failed", "errors", "skipped")}
        broken = [
            r["file"] for r in rows if r["returncode"] != 0 and not r.get("failed") and not r.get("errors")
        ]
        print(f"{n} ranks: {len(rows)} files, " + ", ".join(f"{v} {k}" for k, v in totals.items()))
        if broken:
            print(f"  files that ended without a pytest failure but not cleanly: {', '.join(broken)}")
    print(f"results: {results_path}")
    return 0 if all(r["returncode"] == 0 for r in record["results"]) else 1


def _chosen(match: str, path: str) -> bool:
    return any(part in path for part in match.split(","))


def _print_result(result: dict) -> None:
    head = (
        f"{result['ranks']} ranks  {result.get('file') or result.get('example') or result['benchmark']:58s}"
    )
    if "benchmark" in result:
        verdict = "ok" if result["ok"] else "FAILED"
        rows = f"{result['combinations']} rows, {result['skipped']} skipped"
        print(f"{head} {verdict}  {rows}  rc {result['returncode']}  {result['seconds']:.0f} s", flush=True)
        for line in result.get("tail", [])[-8:]:
            print(f"    {line[:200]}", flush=True)
        return
    if "example" in result:
        verdict = "ok" if result["ok"] else "FAILED"
        print(f"{head} {verdict}  rc {result['returncode']}  {result['seconds']:.0f} s", flush=True)
        for line in result["failed_validation"] + result["timings"][:6]:
            print(f"    {line[:200]}", flush=True)
        return
    counts = ", ".join(f"{result.get(k, 0)} {k}" for k in ("passed", "failed", "errors", "skipped"))
    print(f"{head} {counts}  rc {result['returncode']}  {result['seconds']:.0f} s", flush=True)
    for failure in result["failures"]:
        print(f"    {failure[:200]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
