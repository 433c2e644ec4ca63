"""A pool of rank processes that runs one test body on every rank at once.

Starting a rank (importing torch and triton, joining the process group) costs
seconds, so each pool is started once per test session and reused: a test sends
``(module, function, args)`` to every rank and gets back each rank's result or
traceback. A test that overruns its timeout kills the pool, which is restarted
for the next test, so one hang never takes the whole suite down.

Each rank's stderr goes to a file of its own (pytest shows nothing a pool's processes
print, as they outlive every test's capture), and a rank that dies is reported with its
exit code and the end of that file: a crash's faulthandler dump, a device trap's
message, a hang report. The ranks' flight files and hang dumps go to the same folder
(unless ``IRIS_HANG_DIR`` is set).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import shutil
import tempfile
import traceback

DEFAULT_TIMEOUT = float(os.environ.get("IRIS_TEST_TIMEOUT", "180"))
#: Lines of a dead rank's stderr quoted in the error.
STDERR_TAIL_LINES = 40
#: The stderr folders of every pool this process started (:func:`remove_stderr_folders`).
_STDERR_FOLDERS: list[str] = []


def remove_stderr_folders() -> None:
    """Remove the ranks' stderr files of every pool, killed ones included (after a passing session)."""
    while _STDERR_FOLDERS:
        shutil.rmtree(_STDERR_FOLDERS.pop(), ignore_errors=True)


class RankError(AssertionError):
    """One or more ranks raised; the message holds every failing rank's traceback."""


def _worker(rank: int, world_size: int, env: dict, conn, stderr_path: str) -> None:
    # Nothing of iris may be imported before this: it reads IRIS_* at import time.
    os.environ.update(env)
    with open(stderr_path, "a") as stderr:
        os.dup2(stderr.fileno(), 2)
    import faulthandler

    import torch

    faulthandler.enable()
    torch.set_num_threads(1)
    from iris import config
    from iris.backends import make_backend
    from iris.host.distributed.helpers import init_distributed

    init_distributed(make_backend(config.BACKEND).dist_backend)
    while True:
        task = conn.recv()
        if task is None:
            break
        module_name, function_name, args = task
        try:
            function = getattr(importlib.import_module(module_name), function_name)
            conn.send(("ok", function(rank, world_size, *args)))
        except BaseException:  # noqa: BLE001 - reported to the parent verbatim
            conn.send(("error", traceback.format_exc()))


class RankPool:
    """``world_size`` rank processes waiting for test bodies."""

    def __init__(self, world_size: int, extra_env: dict | None = None):
        self.world_size = world_size
        self.extra_env = dict(extra_env or {})
        from iris.host.launch import host_rendezvous_store, rank_environment

        context = mp.get_context("spawn")
        self._store = host_rendezvous_store()  # the ranks' rendezvous; a restarted pool gets a fresh one
        port = self._store.port
        self._conns = []
        self._procs = []
        self._stderr_dir = tempfile.mkdtemp(prefix="iris-test-ranks-")
        _STDERR_FOLDERS.append(self._stderr_dir)
        for rank in range(world_size):
            parent, child = context.Pipe()
            proc = context.Process(
                target=_worker,
                args=(
                    rank,
                    world_size,
                    {**rank_environment(rank, world_size, port), **self._hang_dir(), **self.extra_env},
                    child,
                    self._stderr_path(rank),
                ),
                daemon=True,
            )
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        self.alive = True

    def run(self, function, *args, timeout: float = DEFAULT_TIMEOUT) -> list:
        """Run ``function(rank, world_size, *args)`` on every rank; returns results in rank order."""
        if not self.alive:
            raise RuntimeError("rank pool is dead")
        task = (function.__module__, function.__name__, args)
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(task)
            except OSError:  # the rank is gone (it may have failed to start): restart the pool next time
                raise self._lost(rank, f"is dead; {function.__name__} was not run") from None
        results, errors = [], []
        for rank, conn in enumerate(self._conns):
            try:
                finished = conn.poll(timeout)
                if finished:
                    status, value = conn.recv()
            except (EOFError, OSError):
                raise self._lost(rank, f"died while running {function.__name__}") from None
            if not finished:  # the ranks before it may have failed first: their errors come along
                self.close(kill=True)
                said = "".join(f"\n{error}" for error in errors)
                raise TimeoutError(
                    f"rank {rank} did not finish {function.__name__} within {timeout:g} s{said}"
                )
            if status == "ok":
                results.append(value)
            else:
                errors.append(f"--- rank {rank} ---\n{value}")
        if errors:
            raise RankError("\n".join(errors))
        return results

    def _lost(self, rank: int, what_happened: str) -> RankError:
        # Rank ``rank`` is gone: the pool is killed (a new one starts for the next test) and
        # the error says how the rank ended and what it wrote last.
        self._procs[rank].join(timeout=5)
        code = self._procs[rank].exitcode
        self.close(kill=True)
        return RankError(f"rank {rank} {what_happened} (exit code {code})\n{self._stderr_tail(rank)}")

    def _hang_dir(self) -> dict:
        # Flight files and hang dumps go with the ranks' stderr (removed with it after a
        # passing session) rather than into /dev/shm, where `iris-trace hang-report` would
        # find test leftovers beside a user's own runs.
        return {} if "IRIS_HANG_DIR" in os.environ else {"IRIS_HANG_DIR": self._stderr_dir}

    def _stderr_path(self, rank: int) -> str:
        return os.path.join(self._stderr_dir, f"rank{rank}.stderr")

    def _stderr_tail(self, rank: int) -> str:
        # The last lines rank ``rank`` wrote to stderr, for the error that reports its death.
        try:
            with open(self._stderr_path(rank), errors="replace") as stderr:
                lines = stderr.read().splitlines()[-STDERR_TAIL_LINES:]
        except OSError:
            return f"(its stderr, {self._stderr_path(rank)}, cannot be read)"
        if not lines:
            return "(it wrote nothing to stderr)"
        return f"the end of its stderr ({self._stderr_path(rank)}):\n" + "\n".join(lines)

    def close(self, kill: bool = False) -> None:
        """Stop the ranks (politely unless ``kill``)."""
        if not self.alive:
            return
        self.alive = False
        for conn, proc in zip(self._conns, self._procs):
            if not kill:
                try:
                    conn.send(None)
                except OSError:
                    pass
            proc.join(timeout=0 if kill else 10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        if not kill:  # a killed pool keeps its ranks' stderr for the error that reported it
            shutil.rmtree(self._stderr_dir, ignore_errors=True)
