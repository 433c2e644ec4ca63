"""iris-trace: merge per-rank trace files, export them, report on them, plot them.

    iris-trace merge traces/rank*.npz -o run.pftrace [--json run.json]
    iris-trace report traces/rank*.npz [--json report.json] [--csv report/] [--top 10]
    iris-trace plot traces/rank*.npz -o timeline.png [--bins 300] [--title TEXT]
    iris-trace validate run.pftrace --trace-processor /path/to/trace_processor_shell
    iris-trace hang-report [--dir DIR] [--session ID] [--json report.json] [files...]
    iris-trace check traces/rank*.npz [--only stale-flag,...] [--json findings.json]
    iris-trace diff RUN_A RUN_B [--json diff.json] [--plot diff.png] [--threshold 0.1]

Per-rank files come from ctx.tracing.collect("traces") or ctx.tracing.export("traces")
(one rank<N>.npz each; the quick start leaves them in iris_traces/). Outputs are written
to a temporary file and renamed, so an interrupted command leaves the previous ones; an
output that names an input is refused. A file that cannot be read or written ends the
command with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import files
from .analysis import CSV_FILES
from .flight_file import FlightFileError
from .trace import Trace, TraceFileError

#: What a bad input or an unwritable output ends the command with.
EXIT_BAD_FILE = 2


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
    from .export.chrome import write_chrome_json
    from .export.perfetto import write_perfetto

    trace = _load(args.files)
    bar, advance = _progress(len(trace.events), "perfetto")
    with bar:
        stats = write_perfetto(trace, args.output, progress=advance)
    profiled = (
        f" (PyTorch profiler: {stats['torch_slices']} slices, {stats['torch_flows']} launch arrows)"
        if "torch_slices" in stats
        else ""
    )
    counts = f"{stats['slices']} slices, {stats['flows']} flows, {stats['tracks']} tracks"
    print(f"wrote {args.output}: {counts}{profiled}")
    if args.json:
        bar, advance = _progress(len(trace.events), "chrome json")
        with bar:
            stats = write_chrome_json(trace, args.json, progress=advance)
        print(f"wrote {args.json}: {stats['slices']} slices, {stats['flows']} flows")
    return 0


def report(args) -> int:
    from .analysis import analyze_trace

    trace = _load(args.files)
    result = analyze_trace(trace, top=args.top)
    print(result.format_table())
    if args.json:
        result.to_json(args.json)
        print(f"wrote {args.json}")
    if args.csv:
        for path in result.to_csv(args.csv):
            print(f"wrote {path}")
    return 0


def plot(args) -> int:
    from .analysis import analyze_trace
    from .plot import MARKED_STALLS, timeline

    trace = _load(args.files)
    report = analyze_trace(trace, top=MARKED_STALLS)
    title = args.title if args.title is not None else (trace.ranks[0].command or None)
    path = timeline(
        trace.events,
        args.output,
        trace.world_size,
        bins=args.bins,
        title=title,
        scope_names=trace.scope_names,
        notes=report.notes,
        report=report,
        emulated=trace.emulated,
    )
    print(f"wrote {path}")
    return 0


def validate(args) -> int:
    import os

    from .export.validate import check_with_trace_processor

    if not (os.path.isfile(args.trace_processor) and os.access(args.trace_processor, os.X_OK)):
        print(f"iris-trace: {args.trace_processor}: not an executable trace_processor_shell", file=sys.stderr)
        return 2
    try:
        result = check_with_trace_processor(args.trace, args.trace_processor)
    except Exception as error:  # noqa: BLE001 - the processor's own failures, as one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"iris-trace: the trace processor could not load {args.trace}: {first}", file=sys.stderr)
        return 2
    print(f"{args.trace}: {result.slices} slices, {result.flows} flows, {result.tracks} tracks")
    for name, count in result.errors.items():
        print(f"  error {name}: {count}")
    return 0 if result.clean else 1


def hang_report(args) -> int:
    import json

    from .flight_file import default_directory
    from .hang import HangReport

    if args.files:
        report = HangReport.from_files(args.files, last=args.last)
    else:
        report = HangReport.from_directory(args.dir or default_directory(), args.session, last=args.last)
    print(report.format())
    if args.json:
        with files.replace_atomically(args.json, "w") as handle:
            json.dump(report.to_dict(), handle, indent=2)
        print(f"wrote {args.json}")
    return 0


def check(args) -> int:
    import json

    from . import check as checks

    trace = _load(args.files)
    chosen = tuple(name for name in args.only.split(",") if name) if args.only else None
    findings = checks.run(trace, chosen)
    for finding in findings:
        print(f"{finding.check}: {finding.message}")
    names = ", ".join(chosen or checks.CHECKS)
    print(f"{len(findings)} finding(s) in {len(trace.events)} events of {trace.world_size} rank(s) ({names})")
    if args.json:
        with files.replace_atomically(args.json, "w") as handle:
            json.dump([finding.to_dict() for finding in findings], handle, indent=2)
        print(f"wrote {args.json}")
    return 1 if findings else 0


def diff(args) -> int:
    import glob

    from . import diff as differ

    runs = []
    for directory in (args.run_a, args.run_b):
        paths = sorted(glob.glob(os.path.join(directory, "rank*.npz")))
        if not paths:
            raise TraceFileError(f"{directory}: no rank<N>.npz files (a directory of ctx.tracing.collect)")
        runs.append(_load(paths))
    result = differ.compare(*runs, threshold=args.threshold, min_ns=int(args.min_us * 1000))
    print(result.format())
    if args.json:
        result.to_json(args.json)
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {differ.plot(result, args.plot)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .analysis import LEGEND

    parser = argparse.ArgumentParser(
        prog="iris-trace",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
        epilog="\n".join(__doc__.splitlines()[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    merging = commands.add_parser("merge", help="merge rank files into one Perfetto (and Chrome JSON) trace")
    merging.add_argument("files", nargs="+", help="one rank<N>.npz per rank")
    merging.add_argument("-o", "--output", required=True, help="the .pftrace to write")
    merging.add_argument("--json", help="also write Chrome trace JSON here")
    merging.set_defaults(run=merge)
    legend = "columns:\n" + "\n".join(f"  {name}: {meaning}" for name, meaning in LEGEND.items())
    reporting = commands.add_parser(
        "report",
        help="why ranks waited, and per-rank and per-SM overlap and stall tables",
        description="Why ranks waited (in words), how soon each rank saw each other rank's releases, per "
        "rank and per SM compute, communication, wait, overlap, stall and idle time, the longest stalls "
        "with what released them, the critical path.",
        epilog=legend,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reporting.add_argument("files", nargs="+", help="one rank<N>.npz per rank")
    reporting.add_argument("--json", help="write the report as JSON")
    reporting.add_argument(
        "--csv",
        help="write per_sm.csv, per_rank.csv, top_stalls.csv, wait_causes.csv and seen_latency.csv "
        "into this folder",
    )
    reporting.add_argument("--top", type=int, default=10, help="how many of the longest stalls to list")
    reporting.set_defaults(run=report)
    plotting = commands.add_parser(
        "plot", help="per-SM timeline of computing, communicating, waiting and idle time (PNG)"
    )
    plotting.add_argument("files", nargs="+", help="one rank<N>.npz per rank")
    plotting.add_argument("-o", "--output", required=True, help="the .png to write")
    plotting.add_argument(
        "--bins",
        type=int,
        default=300,
        help="time bins across the window (default 300; the width is on the axis)",
    )
    plotting.add_argument("--title", help="first line of the title (default: the traced command)")
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
    hanging.add_argument(
        "--dir",
        help="where the ranks keep flight files (IRIS_HANG_DIR; default this user's /dev/shm/iris-<uid>)",
    )
    hanging.add_argument("--session", help="the session to report on (default: this user's newest)")
    hanging.add_argument("--last", type=int, default=5, help="how many sent ops to list per rank")
    hanging.add_argument("--json", help="also write the report as JSON")
    hanging.set_defaults(run=hang_report)
    from .check import CHECKS

    checking = commands.add_parser(
        "check",
        help="protocol checks (a stale flag, data written after its signal, a lost raise, racing "
        "writes); exit 1 on a finding",
        epilog="checks:\n" + "\n".join(f"  {name}: {meaning}" for name, meaning in CHECKS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    checking.add_argument("files", nargs="+", help="one rank<N>.npz per rank")
    checking.add_argument("--only", help="comma-separated checks to run (default: all)")
    checking.add_argument("--json", help="also write the findings as JSON")
    checking.set_defaults(run=check)
    differing = commands.add_parser(
        "diff",
        help="what got slower or faster between two traced runs, per rank, op and SM; the critical path",
    )
    differing.add_argument("run_a", help="directory of the first run's rank<N>.npz (before)")
    differing.add_argument("run_b", help="directory of the second run's rank<N>.npz (after)")
    differing.add_argument("--threshold", type=float, default=0.10, help="smallest relative change reported")
    differing.add_argument("--min-us", type=float, default=1.0, help="smallest absolute change reported (us)")
    differing.add_argument("--json", help="also write the comparison as JSON")
    differing.add_argument("--plot", help="also draw total time per rank and op, A beside B (PNG)")
    differing.set_defaults(run=diff)
    args = parser.parse_args(argv)
    problem = files.refuse_overwriting(_outputs(args), list(getattr(args, "files", None) or []))
    if problem:
        return _fail(problem)
    try:
        return args.run(args)
    except (TraceFileError, FlightFileError, files.UnsafeFileError) as error:
        return _fail(str(error))
    except ValueError as error:  # a hang report's own refusals (no files, mixed sessions), a bad format
        return _fail(str(error).strip().splitlines()[0])
    except OSError as error:  # an output that cannot be written
        where = error.filename or ""
        return _fail(f"cannot write {where}: {error.strerror or error}" if where else str(error))
    except KeyboardInterrupt:
        print("iris-trace: interrupted; the outputs are as they were before", file=sys.stderr)
        return 130


def _outputs(args) -> list[str]:
    """Every file the command will write (for the check that none of them is an input)."""
    outputs = [getattr(args, "output", None), getattr(args, "json", None), getattr(args, "plot", None)]
    csv = getattr(args, "csv", None)
    if csv:
        outputs += [os.path.join(csv, name) for name in CSV_FILES]
    return [o for o in outputs if o]


def _fail(message: str) -> int:
    print(f"iris-trace: {message}", file=sys.stderr)
    return EXIT_BAD_FILE


if __name__ == "__main__":
    sys.exit(main())
