"""No silent deadlocks: wait timeouts that name the culprit, and hang reports on demand.

``ctx.hang`` (one per :class:`iris.Iris`) owns this rank's flight recorder
(:mod:`iris.host.flight`) and turns what it holds into errors and reports:

* a wait that times out stops its kernel; :meth:`Hang.check` (run by
  ``ctx.barrier()``) raises :class:`WaitTimeoutError` with the wait's facts and the
  cross-rank report; under emulation the kernel launch itself raises them;
* a process-wide watchdog thread notices a timeout report as soon as the GPU
  writes it, and prints and dumps it even if the host never synchronises;
* SIGTERM and SIGINT make every live context dump its flight file and print the
  report before the signal takes its usual effect, also while the main thread is
  blocked in a CUDA call (the signal is seen through a wakeup pipe);
* :meth:`Hang.report` (or ``iris-trace hang-report`` from a shell) shows, per rank,
  what it waits on and what it last sent, and names the likely culprit.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import select
import signal
import sys
import threading
import time
import weakref

from iris_trace.hang import HangReport

from ..device import intrinsics as hw
from ..errors import WaitTimeoutError
from .flight import FlightRecorder
from .signal_notes import note_signal

#: Seconds between two looks of the watchdog at the timeout reports.
POLL_SECONDS = 0.1
#: Seconds a second dump for the same reason waits for the first one's report to be printed.
_DUMP_WAIT_S = 20.0


class Hang:
    """Timeouts, flight recorder and hang reports of one context, reached as ``ctx.hang``.

    Example:
        >>> ctx.set_wait_timeout(10)          # any wait with heap_bases gives up after 10 s
        >>> print(ctx.hang.report().format())  # who waits on whom, what each rank last sent
    """

    def __init__(self, ctx):
        # A proxy: the context's parts must not keep it alive (see Iris.close).
        self._ctx = weakref.proxy(ctx)
        self.recorder = FlightRecorder(ctx)
        self._reported = False
        #: Each reason's dump so far: its thread, an event set once its report is out, its file.
        self._dumped: dict[str, tuple[int, threading.Event, str]] = {}
        self._lock = threading.Lock()
        ctx._comm.describe_peers = self.describe_peers
        hw.set_hang_describer(_describe_latest)
        _registry.add(self)
        _install_signal_handlers()
        _watchdog.ensure_running()

    # ------------------------------------------------------------------ settings
    def set_timeout(self, seconds: float) -> None:
        """Wait timeout of this rank's later kernels, in seconds (0: wait forever).

        Example:
            >>> ctx.hang.set_timeout(5.0)
        """
        if not seconds >= 0:
            raise ValueError(
                f"iris: the wait timeout must be a non-negative number of seconds, got {seconds}"
            )
        self.recorder.set_timeout(float(seconds))

    @property
    def timeout(self) -> float:
        """The wait timeout in seconds (0: none).

        Example:
            >>> ctx.hang.timeout
            60.0
        """
        return self.recorder.timeout

    # ------------------------------------------------------------------ reports
    def report(self, last: int = 5) -> HangReport:
        """Every rank's flight state of this session, read from the flight files (not collective).

        Example:
            >>> report = ctx.hang.report()
            >>> report.culprit()
            (1, 'rank 0 waits for ..., which rank 1 releases, but it is in no Iris wait on the device: ...')
        """
        self.recorder.publish()  # the other ranks publish when the report asks them to
        return HangReport.from_directory(self.recorder.directory, self.recorder.session, last)

    def describe_peers(self) -> str:
        """The hang report as text, for error messages."""
        return self.report().format()

    def check(self) -> None:
        """Raise :class:`WaitTimeoutError` if a wait of this rank timed out.

        Example:
            >>> kernel[grid](...); torch.cuda.synchronize(); ctx.hang.check()
        """
        if self.recorder.timed_out():
            raise self._error()

    def guard(self, function, *args):
        """Run ``function(*args)`` (a synchronisation); a failure caused by a timed-out wait
        becomes a :class:`WaitTimeoutError` with the report.

        Example:
            >>> ctx.hang.guard(torch.cuda.synchronize)
        """
        try:
            result = function(*args)
        except Exception as error:
            if self.recorder.timed_out():
                raise self._error() from error
            raise
        self.check()
        return result

    def _error(self) -> WaitTimeoutError:
        state = self.recorder.state()
        try:
            report = self.report()
            culprit, _ = report.culprit()
            text = report.format()
        except Exception as error:  # noqa: BLE001 - the rank's own facts are still worth raising
            culprit, text = None, f"(no cross-rank report: {error!r})"
        timeout = state.timeout
        facts = timeout.describe() if timeout is not None else "a wait timed out"
        if culprit is not None and self._ctx.spans_nodes:
            text = f"{text}\nnodes: the likely culprit is {_rank_name(self._ctx, culprit)}"
        return WaitTimeoutError(
            f"iris: {_rank_name(self._ctx, self._ctx.cur_rank)}: {facts}. The kernel was stopped.\n{text}",
            timeout=timeout,
            culprit=culprit,
        )

    def dump(self, reason: str = "request") -> str:
        """Copy this rank's flight file to a dump, print the hang report to stderr; returns the dump's path.

        Done automatically on a timeout and on the first SIGTERM or SIGINT (once per reason;
        the two signals count as one).

        Example:
            >>> ctx.hang.dump()
            '/dev/shm/iris-hang-3f2a...-rank0.bin'
        """
        # The signals share one dump: a Ctrl-C reaches every rank as SIGINT, and the
        # launcher then stops them with SIGTERM; the first signal's dump is the record.
        key = "signal" if reason in _SIGNAL_NAMES else reason
        with self._lock:
            earlier = self._dumped.get(key) if reason != "request" else None
            if earlier is None:
                done = threading.Event()
                try:
                    path = self.recorder.dump()
                except BaseException:
                    done.set()  # nothing will be printed: nobody waits for it
                    raise
                self._dumped[key] = (threading.get_ident(), done, path)
        if earlier is not None:
            # A signal reaches both the main thread's handler and the watchdog thread, and
            # the one that dumps second goes on to end the process: it must not do so while
            # the first is still printing the report (unless it is the first, interrupted).
            dumper, done, path = earlier
            if dumper != threading.get_ident():
                done.wait(_DUMP_WAIT_S)
            return path
        try:
            try:
                text = self.report().format()
            except Exception as error:  # noqa: BLE001
                text = f"(no report: {error!r})"
            sys.stderr.write(
                f"[iris] rank {self._ctx.cur_rank}: flight recorder dumped to {path} ({reason})\n{text}\n"
            )
            sys.stderr.flush()
        finally:
            done.set()
        return path

    # ------------------------------------------------------------------ watchdog and lifetime
    def _poll(self) -> None:
        self.recorder.heartbeat()
        if self.recorder.publish_requested():
            self.recorder.publish()
        if not self._reported and self.recorder.timed_out():
            self._reported = True
            self.dump("timeout")

    def _clear_report(self) -> None:
        with self._lock:
            self.recorder.clear_report()
            self._dumped.pop("timeout", None)
            self._reported = False

    def close(self) -> None:
        """Remove the flight file (dumps stay) and stop watching.

        The file goes first: stopping the watchdog waits for its thread, which may be
        about to end the process (a SIGTERM seen while the main thread was in native code).
        """
        _registry.discard(self)
        with self._lock:
            self.recorder.close()
        _watchdog.stop_if_idle()


_registry: weakref.WeakSet[Hang] = weakref.WeakSet()


def _rank_name(ctx, rank) -> str:
    """``rank 3``, or ``rank 3 (node 1)`` in a job that spans nodes; ``none`` for no rank."""
    if rank is None:
        return "none"
    return f"rank {rank} (node {ctx.node_of(rank)})" if ctx.spans_nodes else f"rank {rank}"


def _describe_latest(facts: dict) -> tuple[str, int | None]:
    """The culprit line and rank for a timeout the interpreter is about to raise; the full report
    goes to stderr.

    The report record is then cleared: the exception carries it, so a later barrier must
    not raise it again, and a later timeout gets a record of its own.
    """
    for hang in list(_registry):
        if hang._ctx.cur_rank != facts["rank"]:
            continue
        hang._reported = True
        path = hang.dump("timeout")
        culprit, reason = hang.report().culprit()
        hang._clear_report()
        who = _rank_name(hang._ctx, culprit)
        return f"Likely culprit: {who}: {reason}. Full report on stderr and in {path}.", culprit
    return "", None


class _Watchdog:
    """One daemon thread per process: polls the timeout reports and handles signals seen through a pipe."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._mutex = threading.Lock()

    def ensure_running(self) -> None:
        with self._mutex:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="iris-hang-watchdog", daemon=True)
                self._thread.start()

    def stop_if_idle(self) -> None:
        with self._mutex:
            if len(_registry) or self._thread is None:
                return
            self._stop.set()
            _poke()
            thread, self._thread = self._thread, None
        if thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            if _signal_pipe is not None:
                ready, _, _ = select.select([_signal_pipe[0]], [], [], POLL_SECONDS)
                if ready:
                    _drain_signals()
            else:
                self._stop.wait(POLL_SECONDS)
            for hang in list(_registry):
                try:
                    hang._poll()
                except Exception:  # noqa: BLE001 - a closed context between listing and polling
                    pass


_watchdog = _Watchdog()


@atexit.register
def _close_every_context() -> None:
    # A program that never calls ctx.close() still leaves no flight file behind, and the
    # watchdog thread is stopped before the interpreter finalises: a daemon thread caught
    # in a torch call at that moment is killed inside C++ code, which aborts the process
    # ("terminate called without an active exception"). Local: it needs no process group,
    # which torch.distributed's own exit handler may already have destroyed.
    for hang in list(_registry):
        try:
            hang.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    _watchdog.stop_if_idle()


_signal_pipe: tuple[int, int] | None = None
_previous_handlers: dict[int, object] = {}
_HANDLED = (signal.SIGTERM, signal.SIGINT)
_SIGNAL_NAMES = {signum.name for signum in _HANDLED}


def _install_signal_handlers() -> None:
    """Dump on SIGTERM/SIGINT, then let the signal do what it did before (once per process)."""
    global _signal_pipe
    if _previous_handlers or os.environ.get("IRIS_HANG_SIGNALS", "1") in ("", "0"):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _HANDLED:
        _previous_handlers[signum] = signal.getsignal(signum)
        signal.signal(signum, _on_signal)
    # The Python handler runs only when the main thread returns to the interpreter, which
    # it does not while blocked in a CUDA synchronize; the wakeup pipe tells the watchdog
    # thread at once. Only taken if nobody (asyncio, ...) owns the wakeup fd already.
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if previous != -1:
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
    else:
        _signal_pipe = (read_end, write_end)


def _poke() -> None:
    # Wakes the watchdog's select so a stop takes effect at once (0 is no signal number).
    if _signal_pipe is not None:
        try:
            os.write(_signal_pipe[1], b"\0")
        except OSError:
            pass


def _dump_all(reason: str) -> None:
    for hang in list(_registry):
        try:
            hang.dump(reason)
        except Exception as error:  # noqa: BLE001 - dump what can be dumped
            sys.stderr.write(f"[iris] flight dump failed: {error!r}\n")


def _drain_signals() -> None:
    try:
        data = os.read(_signal_pipe[0], 512)
    except (BlockingIOError, OSError):
        return
    for signum in set(data):
        if signum not in _HANDLED:
            continue
        _dump_all(signal.Signals(signum).name)
        if signum == signal.SIGTERM and _previous_handlers.get(signum) == signal.SIG_DFL:
            # The main thread would have died by now unless it is stuck in native code: end
            # the process by the signal itself, as its default action would have.
            time.sleep(2.0)
            _close_every_context()
            _die_by(signum)


def _die_by(signum: int) -> None:
    """End the process by ``signum``'s default action, from any thread.

    Python lets only the main thread change a signal's handler; the C library's
    ``signal()`` does not ask, and the process then dies as it would have without Iris.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal.restype = ctypes.c_void_p
    libc.signal(signum, None)  # SIG_DFL
    os.kill(os.getpid(), signum)
    time.sleep(5.0)
    os._exit(128 + signum)  # only if the signal was blocked in this thread


def _on_signal(signum, frame) -> None:
    note_signal(signum)
    _dump_all(signal.Signals(signum).name)
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        # The default action ends the process at once, skipping atexit: remove the flight
        # files first (the dumps stay), so nothing of a live context is left behind.
        _close_every_context()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
