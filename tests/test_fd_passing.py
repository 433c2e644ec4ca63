"""File descriptors between a host's ranks (``iris.backends._fd_passing``): each rank gets
every peer's; a process that is not the rank it claims gets nothing in; a silent peer is named."""

import multiprocessing
import os
import socket
import tempfile

import pytest

from iris.backends import _fd_passing as fd_passing

pytestmark = pytest.mark.skipif(not hasattr(socket, "SO_PEERCRED"), reason="Linux peer credentials")

WORLD = 3


class _Comm:
    """The one collective the exchange needs, over a multiprocessing manager. The second wait
    lets an outside process act between the publishing of the names and their use."""

    def __init__(self, rank, shared):
        self.rank, self._shared = rank, shared

    def all_gather_object(self, obj):
        board, barrier, leak = self._shared["board"], self._shared["barrier"], self._shared["leak"]
        board[self.rank] = obj
        barrier.wait()
        gathered = [board[r] for r in range(WORLD)]
        if self.rank == 0:
            leak.put(gathered)
        barrier.wait()
        return gathered


def _rank(rank, shared, results, timeout):
    with tempfile.TemporaryFile() as mine:
        mine.write(f"rank {rank}".encode())
        mine.flush()
        peers = [r for r in range(WORLD) if r != rank]
        try:
            got = fd_passing.exchange_fds(_Comm(rank, shared), [mine.fileno()] * 300, peers, timeout=timeout)
        except RuntimeError as error:
            results[rank] = str(error)
            return
        # 300 descriptors: two messages (at most 250 in one); every one is the peer's file.
        results[rank] = {peer: {os.pread(fd, 64, 0).decode() for fd in fds} for peer, fds in got.items()}
        results[rank, "counts"] = sorted({len(fds) for fds in got.values()})
        for fds in got.values():
            for fd in fds:
                os.close(fd)


def _silent_rank(rank, shared, results, timeout):
    # Publishes a socket that takes connections but never sends a descriptor back.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(b"\0iris-test-silent-" + str(os.getpid()).encode())
    listener.listen(WORLD)
    _Comm(rank, shared).all_gather_object((listener.getsockname(), os.getpid()))
    shared["done"].wait(timeout * 3)
    listener.close()


def _impostor(shared):
    # Another process of the host and user: it learns rank 0's socket and claims to be rank 1.
    shared["barrier"].wait()
    name, _ = shared["leak"].get(timeout=20)[0]
    with tempfile.TemporaryFile() as fake, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        fake.write(b"forged")
        fake.flush()
        s.connect(name)
        socket.send_fds(s, [fd_passing._HEADER.pack(1, 1)], [fake.fileno()])
    shared["barrier"].wait()


def _run(targets, timeout=20.0, impostor=False):
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        results = manager.dict()
        shared = {
            "board": manager.dict(),
            "barrier": manager.Barrier(WORLD + impostor),
            "leak": manager.Queue(),
            "done": manager.Event(),
        }
        processes = [
            context.Process(target=target, args=(rank, shared, results, timeout))
            for rank, target in enumerate(targets)
        ]
        if impostor:
            processes.append(context.Process(target=_impostor, args=(shared,)))
        for p in processes:
            p.start()
        for process, target in zip(processes, targets):
            if target is _rank:
                process.join(timeout * 3)
        shared["done"].set()  # the silent rank may go
        for p in processes:
            p.join(timeout * 3)
            assert p.exitcode == 0
        return dict(results)


def test_every_rank_receives_each_peers_descriptor():
    results = _run([_rank] * WORLD)
    for rank in range(WORLD):
        assert results[rank] == {peer: {f"rank {peer}"} for peer in range(WORLD) if peer != rank}
        assert results[rank, "counts"] == [300]


def test_a_process_that_is_not_the_rank_it_claims_is_not_heard():
    results = _run([_rank] * WORLD, impostor=True)
    assert results[0] == {1: {"rank 1"}, 2: {"rank 2"}}


def test_a_peer_that_never_sends_is_named_in_one_line():
    results = _run([_rank, _rank, _silent_rank], timeout=2.0)
    for rank in (0, 1):
        assert "received no file descriptor from rank(s) 2 within 2 s" in results[rank]
        assert "\n" not in results[rank]
