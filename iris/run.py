"""Run a script on N local ranks: ``python -m iris.run -n N script.py [args...]`` (or ``iris-run``).

Works for both backends; on GPUs ``torchrun --nproc-per-node N script.py`` works too.
If one rank fails, the others are stopped and its exit code is returned; so are
all of them when the launcher itself gets SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from .launch import backend_environment, host_rendezvous_store, rank_environment


def launch(script: str, script_args: list[str], nprocs: int, timeout: float | None) -> int:
    """Start ``nprocs`` copies of ``script`` and return the first non-zero exit code (or 0)."""
    store = host_rendezvous_store()  # lives until every rank has exited
    procs = []
    for rank in range(nprocs):
        env = {**os.environ, **backend_environment(), **rank_environment(rank, nprocs, store.port)}
        procs.append(subprocess.Popen([sys.executable, script, *script_args], env=env))
    # A launcher killed by ``timeout`` or Ctrl-C must not leave its ranks running.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: (_stop(procs), sys.exit(128 + signum)))
    deadline = None if timeout is None else time.monotonic() + timeout
    exit_code = 0
    while [p.poll() for p in procs].count(None):  # poll every rank, not just the first running one
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        timed_out = deadline is not None and time.monotonic() > deadline
        if failed or timed_out:
            exit_code = failed[0] if failed else 124
            if timed_out:
                print(f"iris.run: timed out after {timeout:g} s; stopping all ranks", file=sys.stderr)
            _stop(procs)
            break
        time.sleep(0.05)
    codes = [p.wait() for p in procs]
    return exit_code or next((c for c in codes if c != 0), 0)


def _stop(procs, grace: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(end - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()


def main(argv: list[str] | None = None) -> int:
    # Installed as ``iris-run``; run as ``python -m iris.run``: the help names the one used.
    invoked = os.path.basename(sys.argv[0])
    prog = "python -m iris.run" if invoked in ("run.py", "__main__.py", "-c") else invoked
    description = "Run a script on N local ranks, for either backend (IRIS_BACKEND)."
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("-n", "--nprocs", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument(
        "-t", "--timeout", type=float, default=None, help="stop all ranks after this many seconds"
    )
    parser.add_argument("script", help="Python script every rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    options = parser.parse_args(argv)
    if options.nprocs < 1:
        parser.error("--nprocs must be at least 1")
    return launch(options.script, options.args, options.nprocs, options.timeout)


if __name__ == "__main__":
    sys.exit(main())
