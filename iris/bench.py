"""Upstream Iris's benchmark framework (``import iris.bench as bench``), on this package.

A benchmark is a function ``fn(state, ctx)`` marked with :func:`register` and swept over
the axes of its :func:`axis` decorators. Its body is the untimed setup: it reads the
axis values (``state["M"]``), declares what one call moves or computes
(:meth:`State.set_bytes`, :meth:`State.set_flops`) and hands the call to time to
:meth:`State.exec`; the framework then times it with :func:`iris.do_bench` (barriers
around every repetition, ``preamble_fn`` before each, untimed). :func:`main` launches one
group of ranks per value of the ``num_ranks`` axis (8 where none is declared, as
upstream) through ``torch.distributed``'s ``elastic_launch`` (its default process group
NCCL on GPUs, gloo where ranks share GPUs or run emulated), runs every other axis
combination inside it and prints a table (or JSON, or CSV) on the launching process.

Upstream's command line is kept: ``--benchmark_filter``, ``--benchmark_format``,
``--benchmark_out``, ``--heap_size``, ``--n_warmup``, ``--n_repeat``, ``--use_gluon``
(taken; the Triton collectives run) and ``--axis_<name>=`` / ``--skip_<name>=`` with
values ``1024,2048``, ``pow2:8:13``, ``lin:64:256:64`` or dtype names.

One difference: a time here is the slowest rank's. Every rank times every repetition;
``all_times_ms`` holds, per repetition, the largest time over the ranks, and
``gpu_time_ms`` their mean (upstream reports rank 0's alone).

Example::

    import iris.bench as bench

    @bench.register
    @bench.axis("num_ranks", [2, 4])
    @bench.axis("M", bench.power_of_two(10, 14))
    def all_gather(state, ctx):
        inp = ctx.zeros(state["M"], 1024, dtype=torch.float16)
        out = ctx.zeros(ctx.get_num_ranks() * state["M"], 1024, dtype=torch.float16)
        state.set_bytes((ctx.get_num_ranks() - 1) * inp.numel() * inp.element_size())
        state.exec(lambda: ctx.ccl.all_gather(out, inp), preamble_fn=out.zero_)

    if __name__ == "__main__":
        bench.main()
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import os
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: The axis that sets how many ranks a launch has, and its value where no benchmark names it.
NUM_RANKS_AXIS = "num_ranks"
DEFAULT_NUM_RANKS = 8
#: Dtype names the command line takes.
DTYPES = {
    "fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp32": torch.float32, "float32": torch.float32,
}  # fmt: skip


@dataclass
class AxisDef:
    """One swept axis: its name and values."""

    name: str
    values: list[Any]


@dataclass
class BenchmarkDef:
    """A registered benchmark: its name, function and axes (outermost first)."""

    name: str
    fn: Callable
    axes: list[AxisDef]


@dataclass
class Result:
    """What one combination of one benchmark gave (times in ms, the slowest rank's)."""

    benchmark_name: str
    params: dict[str, Any]
    gpu_time_ms: float
    all_times_ms: list[float]
    bandwidth_gbps: float | None = None
    tflops: float | None = None
    counters: dict[str, float] = field(default_factory=dict)
    skipped: bool = False
    skip_reason: str = ""
    world_size: int = 1


_registry: list[BenchmarkDef] = []


class _Skip(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class State:
    """What a benchmark function reads its axis values from and declares its call to.

    Example:
        >>> def gemm(state, ctx):
        ...     a = ctx.randn(state["M"], state["K"])
        ...     state.set_flops(2 * state["M"] * state["K"] * state["N"])
        ...     state.exec(lambda: a @ b)
    """

    def __init__(self, params: dict[str, Any], n_warmup: int, n_repeat: int):
        self._params = params
        self._bytes: int | None = None
        self._flops: int | None = None
        self._counters: dict[str, float] = {}
        self._exec_fn: Callable | None = None
        self._preamble_fn: Callable = lambda: None
        self._n_warmup, self._n_repeat = n_warmup, n_repeat

    def __getitem__(self, name: str) -> Any:
        if name not in self._params:
            raise KeyError(f"iris.bench: no axis {name!r}; this combination has {sorted(self._params)}")
        return self._params[name]

    def get(self, name: str, default: Any = None) -> Any:
        """The axis value ``name``, or ``default``.

        Example:
            >>> dtype = state.get("dtype", torch.float16)
        """
        return self._params.get(name, default)

    def set_bytes(self, n: int) -> None:
        """Bytes one call moves: the table gains GB/s (``n / time``).

        Example:
            >>> state.set_bytes(inp.numel() * inp.element_size())
        """
        self._bytes = _count(n, "set_bytes")

    def set_flops(self, n: int) -> None:
        """Floating-point operations of one call: the table gains TFLOPS.

        Example:
            >>> state.set_flops(2 * M * N * K)
        """
        self._flops = _count(n, "set_flops")

    def add_counter(self, name: str, value: float) -> None:
        """A column of the benchmark's own.

        Example:
            >>> state.add_counter("tiles", tiles)
        """
        self._counters[str(name)] = float(value)

    def set_warmup(self, n: int) -> None:
        """Untimed repetitions for this combination (default ``--n_warmup``, 25).

        Example:
            >>> state.set_warmup(5)
        """
        self._n_warmup = _count(n, "set_warmup")

    def set_repeat(self, n: int) -> None:
        """Timed repetitions for this combination (default ``--n_repeat``, 100).

        Example:
            >>> state.set_repeat(20)
        """
        self._n_repeat = _count(n, "set_repeat", minimum=1)

    def exec(self, fn: Callable, *, preamble_fn: Callable | None = None) -> None:
        """The call to time; ``preamble_fn`` runs before every repetition, untimed.

        Example:
            >>> state.exec(lambda: ctx.ccl.all_gather(out, inp), preamble_fn=out.zero_)
        """
        if not callable(fn) or (preamble_fn is not None and not callable(preamble_fn)):
            raise TypeError("iris.bench: state.exec takes callables (fn, preamble_fn=)")
        self._exec_fn = fn
        if preamble_fn is not None:
            self._preamble_fn = preamble_fn

    def skip(self, reason: str = "") -> None:
        """Skip this combination: it is listed as skipped, with ``reason``.

        Example:
            >>> if state["M"] < state["N"]:
            ...     state.skip("M must be >= N")
        """
        raise _Skip(str(reason))


def _count(n, what: str, minimum: int = 0) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise ValueError(f"iris.bench: {what} takes an int >= {minimum}, got {n!r}")
    return n


def power_of_two(start_exp: int, end_exp: int) -> list[int]:
    """``[2**start_exp, ..., 2**end_exp]``.

    Example:
        >>> power_of_two(8, 10)
        [256, 512, 1024]
    """
    return [1 << e for e in range(start_exp, end_exp + 1)]


def linear_range(start: int, end: int, step: int) -> list[int]:
    """``[start, start + step, ..., end]``.

    Example:
        >>> linear_range(64, 256, 64)
        [64, 128, 192, 256]
    """
    if step <= 0:
        raise ValueError(f"iris.bench: linear_range needs a positive step, got {step}")
    return list(range(start, end + 1, step))


def axis(name: str, values):
    """Sweep the benchmark over ``values`` of axis ``name`` (stacked: the outermost varies slowest).

    ``num_ranks`` sets how many ranks each launch has.

    Example:
        >>> @bench.axis("M", bench.power_of_two(10, 14))
    """
    values = list(values) if not isinstance(values, (str, bytes)) else None
    if not isinstance(name, str) or not name.isidentifier() or not values:
        raise ValueError(f"iris.bench: axis takes a name and a non-empty list of values, got {name!r}")
    if name == NUM_RANKS_AXIS and not all(isinstance(v, int) and v >= 1 for v in values):
        raise ValueError(f"iris.bench: num_ranks values must be positive ints, got {values}")

    def decorate(fn: Callable) -> Callable:
        fn._bench_axes = [AxisDef(name, values), *getattr(fn, "_bench_axes", [])]
        return fn

    return decorate


def register(fn: Callable) -> Callable:
    """Register ``fn(state, ctx)`` as a benchmark (the outermost decorator).

    Example:
        >>> @bench.register
        ... @bench.axis("M", [1024])
        ... def copy(state, ctx): ...
    """
    _registry.append(BenchmarkDef(fn.__name__, fn, list(getattr(fn, "_bench_axes", []))))
    return fn


# ---------------------------------------------------------------- the command line
def parse_values(raw: str, name: str) -> list[Any]:
    """An ``--axis_<name>=`` / ``--skip_<name>=`` value as a list.

    Example:
        >>> parse_values("pow2:8:10", "M"), parse_values("fp16,bf16", "dtype")
        ([256, 512, 1024], [torch.float16, torch.bfloat16])
    """
    raw = raw.strip()
    for prefix, parts, helper in (("pow2:", 2, power_of_two), ("lin:", 3, linear_range)):
        if raw.startswith(prefix):
            numbers = raw[len(prefix) :].split(":")
            if len(numbers) != parts or not all(re.fullmatch(r"-?\d+", n) for n in numbers):
                form = ":".join(["<int>"] * parts)
                raise ValueError(f"iris.bench: --axis_{name}={raw!r}: expected {prefix}{form}")
            return helper(*map(int, numbers))
    tokens = [t.strip() for t in raw.split(",")]
    if name == "dtype" or all(t.lower() in DTYPES for t in tokens):
        unknown = [t for t in tokens if t.lower() not in DTYPES]
        if unknown:
            raise ValueError(f"iris.bench: unknown dtype(s) {unknown} for {name!r}; known: {sorted(DTYPES)}")
        return [DTYPES[t.lower()] for t in tokens]
    for kind in (int, float):
        try:
            return [kind(t) for t in tokens]
        except ValueError:
            pass
    return tokens


def _values(ax: AxisDef, overrides: dict, skips: dict) -> list[Any]:
    values = list(overrides.get(ax.name, ax.values))
    return [v for v in values if v not in skips.get(ax.name, ())]


def _rank_counts(bdef: BenchmarkDef, overrides: dict, skips: dict) -> list[int]:
    declared = next((ax for ax in bdef.axes if ax.name == NUM_RANKS_AXIS), None)
    if declared is None:
        declared = AxisDef(NUM_RANKS_AXIS, overrides.get(NUM_RANKS_AXIS, [DEFAULT_NUM_RANKS]))
    return _values(declared, overrides, skips)


# ---------------------------------------------------------------- each rank
def _run_worker(benchmarks, overrides, skips, heap_size, n_warmup, n_repeat) -> list[Result]:
    """Every chosen combination at this launch's rank count; rank 0 returns the results."""
    import torch.distributed as dist

    import iris

    from ._env import ranks_per_gpu

    on_gpus = torch.cuda.is_available() and iris.BACKEND != "emulated"
    if on_gpus:
        torch.cuda.set_device(iris.get_device_id_for_rank(int(os.environ["LOCAL_RANK"])))
    # NCCL takes one GPU per rank: where ranks share GPUs (IRIS_RANKS_PER_GPU) the group is gloo.
    dist.init_process_group(backend="nccl" if on_gpus and ranks_per_gpu() == 1 else "gloo")
    results: list[Result] = []
    with iris.iris(heap_size) as ctx:
        world_size = ctx.get_num_ranks()
        for bdef in benchmarks:
            if world_size not in _rank_counts(bdef, overrides, skips):
                continue
            axes = [
                AxisDef(a.name, _values(a, overrides, skips)) for a in bdef.axes if a.name != NUM_RANKS_AXIS
            ]
            for combo in itertools.product(*(a.values for a in axes)):
                params = {NUM_RANKS_AXIS: world_size} if len(axes) < len(bdef.axes) else {}
                params.update(zip((a.name for a in axes), combo))
                results.append(_run_one(ctx, bdef, params, n_warmup, n_repeat))
        ctx.barrier()
    dist.destroy_process_group()
    return results if int(os.environ["RANK"]) == 0 else []


def _run_one(ctx, bdef: BenchmarkDef, params: dict, n_warmup: int, n_repeat: int) -> Result:
    import torch.distributed as dist

    import iris

    state = State(params, n_warmup, n_repeat)
    world_size = ctx.get_num_ranks()
    try:
        bdef.fn(state, ctx)
    except _Skip as skip:
        return Result(
            bdef.name, params, 0.0, [], skipped=True, skip_reason=skip.reason, world_size=world_size
        )
    if state._exec_fn is None:
        raise RuntimeError(f"iris.bench: benchmark {bdef.name!r} at {params} never called state.exec(fn)")
    mine = iris.do_bench(
        state._exec_fn,
        barrier_fn=ctx.barrier,
        preamble_fn=state._preamble_fn,
        n_warmup=state._n_warmup,
        n_repeat=state._n_repeat,
        return_mode="all",
    )
    every = [None] * world_size
    dist.all_gather_object(every, list(mine))
    times = [max(column) for column in zip(*every)]  # the slowest rank's, repetition by repetition
    mean_ms = statistics.mean(times)
    seconds = mean_ms * 1e-3
    return Result(
        bdef.name,
        params,
        mean_ms,
        times,
        bandwidth_gbps=state._bytes / 1e9 / seconds if state._bytes is not None and seconds > 0 else None,
        tflops=state._flops / 1e12 / seconds if state._flops is not None and seconds > 0 else None,
        counters=dict(state._counters),
        world_size=world_size,
    )


# ---------------------------------------------------------------- output
def _text(value: Any) -> str:
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else str(value)


def _fixed(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def format_console(results: list[Result]) -> str:
    """The results as one aligned table per benchmark.

    Example:
        >>> print(format_console(results))
    """
    blocks = []
    for name in dict.fromkeys(r.benchmark_name for r in results):
        rows = [r for r in results if r.benchmark_name == name]
        params = list(dict.fromkeys(p for r in rows for p in r.params))
        measured = [("GPU Time (ms)", lambda r: _fixed(r.gpu_time_ms, 3))]
        if any(r.bandwidth_gbps is not None for r in rows):
            measured.append(("BW (GB/s)", lambda r: _fixed(r.bandwidth_gbps, 1)))
        if any(r.tflops is not None for r in rows):
            measured.append(("TFLOPS", lambda r: _fixed(r.tflops, 1)))
        for counter in dict.fromkeys(c for r in rows for c in r.counters):
            measured.append((counter, lambda r, c=counter: _fixed(r.counters.get(c), 3)))
        table = [[*params, *(title for title, _ in measured)]]
        for r in rows:
            cells = [_text(r.params.get(p, "")) for p in params]
            if r.skipped:  # the reason stands in the time column
                cells += [f"(skipped) {r.skip_reason}".strip()] + [""] * (len(measured) - 1)
            else:
                cells += [cell(r) for _, cell in measured]
            table.append(cells)
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in table]
        blocks.append("\n".join([name, *lines]))
    return "".join(f"\n{block}\n" for block in blocks)


def _record(r: Result) -> dict:
    record = {
        "benchmark": r.benchmark_name,
        "world_size": r.world_size,
        "params": {k: _text(v) for k, v in r.params.items()},
        "gpu_time_ms": r.gpu_time_ms,
        "all_times_ms": r.all_times_ms,
    }
    extras = {"bandwidth_gbps": r.bandwidth_gbps, "tflops": r.tflops, "counters": r.counters or None}
    record.update({k: v for k, v in extras.items() if v is not None})
    if r.skipped:
        record.update(skipped=True, skip_reason=r.skip_reason)
    return record


def format_json(results: list[Result]) -> str:
    """The results as upstream's JSON records.

    Example:
        >>> json.loads(format_json(results))[0]["gpu_time_ms"]
    """
    return json.dumps([_record(r) for r in results], indent=2) + "\n"


def format_csv(results: list[Result]) -> str:
    """The results as upstream's CSV rows.

    Example:
        >>> print(format_csv(results))
    """
    params = list(dict.fromkeys(p for r in results for p in r.params))
    counters = list(dict.fromkeys(c for r in results for c in r.counters))
    columns = ["benchmark", "world_size", *params, "gpu_time_ms", "bandwidth_gbps", "tflops", *counters]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*columns, "skipped", "skip_reason"])
    writer.writeheader()
    for r in results:
        row = {"benchmark": r.benchmark_name, "world_size": r.world_size, "skipped": r.skipped}
        row.update({p: _text(r.params.get(p, "")) for p in params}, skip_reason=r.skip_reason)
        row["gpu_time_ms"] = "" if r.skipped else _fixed(r.gpu_time_ms, 4)
        row.update(bandwidth_gbps=_fixed(r.bandwidth_gbps, 2), tflops=_fixed(r.tflops, 2))
        row.update({c: _fixed(r.counters.get(c), 4) for c in counters})
        writer.writerow(row)
    return buffer.getvalue()


FORMATS = {"console": format_console, "json": format_json, "csv": format_csv}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="iris.bench: run this file's benchmarks",
        epilog="--axis_<name>=VALUES replaces an axis, --skip_<name>=VALUES leaves values out "
        "(VALUES: 1024,2048 | pow2:8:13 | lin:64:256:64 | fp16,bf16,fp32)",
    )
    parser.add_argument("--benchmark_filter", help="only benchmarks whose name this regular expression finds")
    parser.add_argument("--benchmark_format", default="console", choices=sorted(FORMATS))
    parser.add_argument("--benchmark_out", help="also write the output to this file")
    parser.add_argument("--heap_size", type=int, default=1 << 34, help="symmetric heap bytes per rank")
    parser.add_argument("--use_gluon", action="store_true", help="taken for upstream's scripts; no effect")
    parser.add_argument("--n_warmup", type=int, default=25, help="untimed repetitions")
    parser.add_argument("--n_repeat", type=int, default=100, help="timed repetitions")
    return parser


def main(argv: list[str] | None = None) -> list[Result]:
    """Run the registered benchmarks: one launch per rank count; print and return the results.

    Example:
        >>> if __name__ == "__main__":
        ...     bench.main()
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    overrides, skips = {}, {}
    for token in rest:
        match = re.fullmatch(r"--(axis|skip)_(\w+)=(.+)", token)
        if match is None:
            parser.error(f"unrecognized argument: {token}")
        kind, name, raw = match.groups()
        try:
            (overrides if kind == "axis" else skips)[name] = parse_values(raw, name)
        except ValueError as exc:
            parser.error(str(exc))
    if args.n_repeat < 1 or args.n_warmup < 0 or args.heap_size < 1:
        parser.error("--n_repeat must be >= 1, --n_warmup >= 0 and --heap_size >= 1")
    pattern = args.benchmark_filter
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            parser.error(f"--benchmark_filter {pattern!r} is not a regular expression: {exc}")
    chosen = [b for b in _registry if not pattern or re.search(pattern, b.name)]
    counts = sorted({n for b in chosen for n in _rank_counts(b, overrides, skips)})
    if not counts:
        sys.exit("iris.bench: nothing to run (no benchmark registered, or filters and skips left none)")
    if not all(isinstance(n, int) and n >= 1 for n in counts):
        parser.error(f"num_ranks values must be positive ints, got {counts}")
    results: list[Result] = []
    for n in counts:
        launch = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=n, rdzv_backend="c10d", rdzv_endpoint="localhost:0",
            max_restarts=0,
        )  # fmt: skip
        try:
            by_rank = elastic_launch(launch, _run_worker)(
                chosen, overrides, skips, args.heap_size, args.n_warmup, args.n_repeat
            )
        except ChildFailedError as failed:
            # The rank's own traceback is above (the ranks write to this process's stderr).
            rank, failure = failed.get_first_failure()
            code = failure.exitcode
            sys.exit(f"iris.bench: rank {rank} of a {n}-rank launch failed (exit {code}); its error is above")
        results += by_rank[0]
    output = FORMATS[args.benchmark_format](results)
    print(output, end="")
    if args.benchmark_out:
        from iris_trace import files

        with files.replace_atomically(args.benchmark_out, "w") as handle:
            handle.write(output)
    return results
