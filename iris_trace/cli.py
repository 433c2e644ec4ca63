"""``iris-trace``: merge per-rank trace files, export them, report on them, plot them.

    iris-trace merge traces/rank*.npz -o run.pftrace [--json run.json]
    iris-trace report traces/rank*.npz [--json report.json] [--csv report/] [--top 10]
    iris-trace plot traces/rank*.npz -o stalls.png [--bins 200]
    iris-trace validate run.pftrace --trace-processor /path/to/trace_processor_shell
    iris-trace hang-report [--dir /dev/shm] [--session ID] [--json report.json] [files...]

Per-rank files come from ``ctx.tracing.collect("traces")`` (one ``rank<N>.npz`` each).
"""

from __future__ import annotations

import argparse
import sys

from .trace import Trace, TraceFileError


def _load(paths: list[str]) -> Trace:
    trace = Trace.from_files(paths)
    dropped = sum(trace.dropped)
    if dropped:
        print(
            f"iris-trace: warning: {dropped} events were dropped (per rank: {trace.dropped}); "
            "enable tracing with a larger max_events",
            file=sys.stderr,
        )
    return trace


def _progress(total: int, label: str):
    """A tqdm bar that advances by the number of events each chunk wrote."""
    from tqdm import tqdm

    bar = tqdm(total=total, unit="ev", unit_scale=True, desc=label, file=sys.stderr, disable=total < 200_000)
    return bar, bar.update


def merge(args) -> int:
    from viewer_exports.chrome import write_chrome_json
    from viewer_exports.perfetto import write_perfetto

    trace = _load(args.files)
    bar, advance = _progress(len(trace.events), "perfetto")
    with bar:
        stats = write_perfetto(trace, args.output, progress=advance)
    print(f"wrote {args.output}: {stats['slices']} slices, {stats['flows']} flows, {stats['tracks']} tracks")
    if args.json:
        bar, advance = _progress(len(trace.events), "chrome json")
        with bar:
            stats = write_chrome_json(trace, args.json, progress=advance)
        print(f"wrote {args.json}: {stats['slices']} slices, {stats['flows']} flows")
    return 0


def report(args) -> int:
    from .analysis import analyze

    trace = _load(args.files)
    result = analyze(trace.events, trace.world_size, trace.scope_names, top=args.top)
    print(result.format_table())
    if args.json:
        result.to_json(args.json)
        print(f"wrote {args.json}")
    if args.csv:
        for path in result.to_csv(args.csv):
            print(f"wrote {path}")
    return 0


def plot(args) -> int:
    from .plot import stall_heatmap

    trace = _load(args.files)
    print(f"wrote {stall_heatmap(trace.events, args.output, bins=args.bins)}")
    return 0


def validate(args) -> int:
    from viewer_exports.validate import check_with_trace_processor

    result = check_with_trace_processor(args.trace, args.trace_processor)
    print(f"{args.trace}: {result.slices} slices, {result.flows} flows, {result.tracks} tracks")
    for name, count in result.errors.items():
        print(f"  error {name}: {count}")
    return 0 if result.clean else 1


def hang_report(args) -> int:
    import json
    import os

    from .hang import HangReport

    try:
        if args.files:
            report = HangReport.from_files(args.files, last=args.last)
        else:
            directory = args.dir or os.environ.get("IRIS_HANG_DIR") or "/dev/shm"
            report = HangReport.from_directory(directory, args.session, last=args.last)
    except ValueError as error:
        print(f"iris-trace: {error}", file=sys.stderr)
        return 2
    print(report.format())
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report.to_dict(), handle, indent=2)
        print(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iris-trace", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    merging = commands.add_parser("merge", help="merge rank files into one Perfetto (and Chrome JSON) trace")
    merging.add_argument("files", nargs="+", help="one rank<N>.npz per rank")
    merging.add_argument("-o", "--output", required=True, help="the .pftrace to write")
    merging.add_argument("--json", help="also write Chrome trace JSON here")
    merging.set_defaults(run=merge)
    reporting = commands.add_parser("report", help="per-rank and per-SM overlap and stall tables")
    reporting.add_argument("files", nargs="+")
    reporting.add_argument("--json", help="write the report as JSON")
    reporting.add_argument("--csv", help="write per_sm.csv, per_rank.csv and top_stalls.csv into this folder")
    reporting.add_argument("--top", type=int, default=10, help="how many of the longest stalls to list")
    reporting.set_defaults(run=report)
    plotting = commands.add_parser("plot", help="per-SM stall and overlap heat map (PNG)")
    plotting.add_argument("files", nargs="+")
    plotting.add_argument("-o", "--output", required=True)
    plotting.add_argument("--bins", type=int, default=200)
    plotting.set_defaults(run=plot)
    validating = commands.add_parser("validate", help="load a .pftrace with Perfetto's trace processor")
    validating.add_argument("trace")
    validating.add_argument("--trace-processor", required=True, help="path to a trace_processor_shell binary")
    validating.set_defaults(run=validate)
    hanging = commands.add_parser(
        "hang-report", help="which rank waits on which, what each last sent, and the likely culprit"
    )
    hanging.add_argument(
        "files", nargs="*", help="flight or dump files (default: the newest session in --dir)"
    )
    hanging.add_argument("--dir", help="where the ranks keep flight files (IRIS_HANG_DIR, default /dev/shm)")
    hanging.add_argument("--session", help="the session to report on (default: the newest)")
    hanging.add_argument("--last", type=int, default=5, help="how many sent ops to list per rank")
    hanging.add_argument("--json", help="also write the report as JSON")
    hanging.set_defaults(run=hang_report)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except TraceFileError as error:
        print(f"iris-trace: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
