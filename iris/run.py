"""Run a script on N local ranks: ``python -m iris.run -n N script.py [args...]`` (or ``iris-run``).

Works for both backends; on GPUs ``torchrun --nproc-per-node N script.py`` works too.
If one rank fails, the launcher says which and how (its exit status, or the signal that
ended it, with what to try next), stops the others, and exits with that rank's status
(``128 + N`` for a rank ended by signal N, as a shell reports it); so are all of them
stopped when the launcher itself gets SIGTERM or SIGINT. A rank killed by a signal is
named before peers that exited with a status: those usually failed because it went. A
rank with a context notes a signal it gets as it gets it (``note_signal``), so it is
named even while its shutdown is still under way; one without is waited for up to
``BLAME_GRACE_S`` after a peer exits with a status.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .host.launch import backend_environment, host_rendezvous_store, rank_environment
from .host.signal_notes import SIGNAL_NOTES, noted_signals


def launch(script: str, script_args: list[str], nprocs: int, timeout: float | None) -> int:
    """Start ``nprocs`` copies of ``script`` and return the first failing rank's exit status (or 0)."""
    store = host_rendezvous_store()  # lives until every rank has exited
    notes = tempfile.mkdtemp(prefix="iris-run-signals-")  # private: where ranks note signals they get
    try:
        return _launch(script, script_args, nprocs, timeout, store, notes)
    finally:
        shutil.rmtree(notes, ignore_errors=True)


def _launch(script, script_args, nprocs, timeout, store, notes) -> int:
    procs = []
    for rank in range(nprocs):
        env = {**os.environ, **backend_environment(), **rank_environment(rank, nprocs, store.port)}
        env[SIGNAL_NOTES] = notes
        procs.append(subprocess.Popen([sys.executable, script, *script_args], env=env))
    # A launcher killed by ``timeout`` or Ctrl-C must not leave its ranks running.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: (_stop(procs), sys.exit(128 + signum)))
    deadline = None if timeout is None else time.monotonic() + timeout
    exit_code = 0
    while [p.poll() for p in procs].count(None):  # poll every rank, not just the first running one
        failed = failures([p.returncode for p in procs])
        if failed and failed[0][1] >= 0:
            failed = _settled_failures(procs, notes)
        timed_out = deadline is not None and time.monotonic() > deadline
        if failed or timed_out:
            if timed_out:
                exit_code = 124
                print(f"iris.run: timed out after {timeout:g} s; stopping all ranks", file=sys.stderr)
            else:
                rank, code = failed[0]
                exit_code = shell_status(code)
                print(f"iris.run: {describe_exit(rank, code)}; stopping the other ranks", file=sys.stderr)
            _stop(procs)
            break
        time.sleep(0.05)
    codes = [p.wait() for p in procs]
    if not exit_code:
        # Every rank ended between two looks (a launcher kept off the CPU sees them all at
        # once): name the one to blame by the same rules, not the first in rank order.
        failed = _to_blame(codes, notes)
        if failed:
            rank, code = failed[0]
            exit_code = shell_status(code)
            print(f"iris.run: {describe_exit(rank, code)}", file=sys.stderr)
    _keep_flight_files_of_lost_ranks({p.pid for p in procs})
    return exit_code


#: Seconds the launcher, having seen a rank exit with a status, waits for a peer to die by a
#: signal (then named instead) before it names that rank and stops the others.
BLAME_GRACE_S = 2.0


def _to_blame(returncodes: list[int | None], notes: str) -> list[tuple[int, int]]:
    # ``failures``, but where the first is an exit status, ranks that noted a signal come
    # first, as if it had ended them (it will).
    failed = failures(returncodes)
    noted = noted_signals(notes)
    if not failed or failed[0][1] < 0 or not noted:
        return failed
    others = [failure for failure in failed if failure[0] not in noted]
    return sorted((rank, -signum) for rank, signum in noted.items()) + others


def _settled_failures(procs, notes: str) -> list[tuple[int, int]]:
    # A rank that exits with a status is often a peer of one being killed: its collective
    # failed when the other closed its connections, which the dying rank does before it ends
    # (interpreter shutdown). A rank that noted a signal is named at once; otherwise wait a
    # little for one to note a signal or end by one, so it is the one named.
    give_up = time.monotonic() + BLAME_GRACE_S
    while True:
        failed = _to_blame([p.returncode for p in procs], notes)
        ended = None not in [p.returncode for p in procs]
        if ended or failed[0][1] < 0 or time.monotonic() >= give_up:
            return failed
        time.sleep(0.05)
        for p in procs:
            p.poll()


def failures(returncodes: list[int | None]) -> list[tuple[int, int]]:
    """The failed ranks' ``(rank, returncode)``, the one to blame first.

    Those killed by a signal come first: the others' nonzero statuses are usually its
    consequence (a peer's collective fails when a rank dies), and a launcher polling every
    50 ms cannot tell which of them ended first.

    Example:
        >>> failures([1, -2, None, 0])
        [(1, -2), (0, 1)]
    """
    failed = [(rank, code) for rank, code in enumerate(returncodes) if code not in (None, 0)]
    return sorted(failed, key=lambda failure: (failure[1] >= 0, failure[0]))


def _keep_flight_files_of_lost_ranks(pids: set[int]) -> None:
    """A rank killed or crashed leaves its flight file: keep it as a dump and say where."""
    from . import config
    from .host.flight import keep_as_dumps

    try:
        dumps = keep_as_dumps(config.hang_dir(), pids)
    except OSError as error:
        print(f"iris.run: the lost ranks' flight files stay where they were: {error}", file=sys.stderr)
        return
    if dumps:
        listing = " ".join(dumps)
        print(f"iris.run: kept the flight files of ranks that did not close as dumps: {listing} "
              f"(iris-trace hang-report {listing})", file=sys.stderr)  # fmt: skip


def shell_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: ``128 + N`` for one ended by signal N.

    Example:
        >>> shell_status(-9), shell_status(3)
        (137, 3)
    """
    return 128 - returncode if returncode < 0 else returncode


#: What to try when a rank was ended by a signal of its own making, or from outside.
_SIGNAL_ADVICE = {
    signal.SIGSEGV: "a crash in native code, often a device op given a rank or pointer out of range: "
    "rerun with IRIS_DEBUG=1, which checks every op's ranks and heap bounds and names the op",
    signal.SIGBUS: "a memory access that no memory backs, such as a heap in a shared-memory directory "
    "that ran out of room: see IRIS_EMU_SHM_DIR, or rerun with IRIS_DEBUG=1",
    signal.SIGABRT: "an abort in native code (its message is above)",
    signal.SIGKILL: "killed from outside (by the out-of-memory killer, or a user)",
}


def describe_exit(rank: int, returncode: int) -> str:
    """One line saying how rank ``rank`` ended (``Popen.returncode``), with advice for a signal.

    Example:
        >>> describe_exit(1, -11)
        'rank 1 was killed by SIGSEGV (signal 11): a crash in native code, ...'
    """
    if returncode >= 0:
        return f"rank {rank} exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    advice = _SIGNAL_ADVICE.get(-returncode)
    return f"rank {rank} was killed by {name} (signal {-returncode})" + (f": {advice}" if advice else "")


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
