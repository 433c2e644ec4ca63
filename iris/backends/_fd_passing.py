"""Passing file descriptors between the ranks of one host.

A CUDA virtual-memory allocation is shared as a POSIX file descriptor
(``cuMemExportToShareableHandle``), and a descriptor means something only inside its
own process: it travels to another process as ancillary data (``SCM_RIGHTS``) over a
Unix-domain socket, where the kernel installs a copy in the receiver.

Sockets are inputs from anyone on the host, so:

- Every rank listens under a random name in Linux's abstract namespace: there is no
  file in a shared directory to leave behind, to be pre-created or to be replaced, and
  a name nobody has seen cannot be squatted. The names travel through the process group.
- A descriptor is taken only from the process that the rank claims to be: the kernel's
  peer credentials (``SO_PEERCRED``) give the connecting process's id and user, which
  must be that rank's process (its id, published through the process group) and this
  process's user. A connection from anyone else is closed and whatever it sent dropped.
- The sender checks the listener the same way before it sends, so a descriptor never
  goes to a process that is not the rank it was meant for.

Every rank of the process group calls :func:`exchange_fds` (the names are gathered
collectively); each sends to and receives from the ranks it lists. The ranks' processes
must share a PID and a network namespace (one container, or none), as on one host they
usually do; where they do not, the exchange times out naming the ranks it missed.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import time
from collections.abc import Sequence

#: What a sender says first: its rank and how many descriptors follow.
_HEADER = struct.Struct("<ii")
#: Descriptors per message (the kernel takes at most SCM_MAX_FD, 253, in one).
_BATCH = 250
_NAME_PREFIX = b"\0iris-fd-"


def _credentials(connection: socket.socket) -> tuple[int, int]:
    """The process id and user id of the process at the other end of ``connection``."""
    raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


def _listener(backlog: int) -> tuple[socket.socket, bytes]:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        for _ in range(8):  # a name already taken by chance: draw another
            name = _NAME_PREFIX + secrets.token_hex(16).encode()
            try:
                listener.bind(name)
                break
            except OSError:
                continue
        else:
            raise RuntimeError("iris: could not bind a Unix socket to pass file descriptors")
        listener.listen(backlog)
    except BaseException:
        listener.close()
        raise
    return listener, name


def _send(name: bytes, pid: int, peer: int, rank: int, fds: Sequence[int], deadline: float) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            connection.connect(name)
        except OSError as error:
            raise RuntimeError(
                f"iris: rank {rank} could not reach rank {peer}'s socket to pass it memory: {error}"
            ) from None
        peer_pid, peer_uid = _credentials(connection)
        if peer_pid != pid or peer_uid != os.getuid():
            raise RuntimeError(
                f"iris: the socket published for a peer is held by process {peer_pid} (user "
                f"{peer_uid}), not the peer's process {pid}: refusing to send it memory"
            )
        socket.send_fds(connection, [_HEADER.pack(rank, len(fds))], list(fds[:_BATCH]))
        for first in range(_BATCH, len(fds), _BATCH):
            socket.send_fds(connection, [b"+"], list(fds[first : first + _BATCH]))


def _descriptors(connection: socket.socket, rank: int) -> list[int] | None:
    """What one sender sent: its descriptors, or None (all closed) where it is not ``rank`` or
    sent something else than it announced."""
    got: list[int] = []
    try:
        message, fds, _, _ = socket.recv_fds(connection, _HEADER.size, _BATCH)
        got += fds
        if len(message) != _HEADER.size:
            raise ValueError
        claimed, count = _HEADER.unpack(message)
        if claimed != rank or count < 1:
            raise ValueError
        while len(got) < count:
            message, fds, _, _ = socket.recv_fds(connection, 1, _BATCH)
            got += fds
            if message != b"+" or not fds:
                raise ValueError
        if len(got) != count:
            raise ValueError
    except (OSError, ValueError):
        for fd in got:
            os.close(fd)
        return None
    return got


def _receive(listener: socket.socket, expected: dict[int, int], deadline: float) -> dict[int, list[int]]:
    """Descriptors from the processes in ``expected`` (pid -> rank), each once: rank -> fds."""
    received: dict[int, list[int]] = {}
    try:
        while len(received) < len(expected):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            listener.settimeout(left)
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                break
            with connection:
                connection.settimeout(max(deadline - time.monotonic(), 0.001))
                pid, uid = _credentials(connection)
                rank = expected.get(pid)
                if uid != os.getuid() or rank is None or rank in received:
                    continue  # not a rank (or one heard already): nothing it sends is read
                fds = _descriptors(connection, rank)
                if fds is not None:
                    received[rank] = fds
    except BaseException:
        _close_all(received)
        raise
    return received


def _close_all(received: dict[int, list[int]]) -> None:
    for fds in received.values():
        for fd in fds:
            os.close(fd)


def exchange_fds(
    comm, fds: Sequence[int], peers: Sequence[int] | None = None, timeout: float = 60.0
) -> dict[int, list[int]]:
    """Send ``fds`` to each rank in ``peers`` and receive each one's: ``{rank: fds}``, new in this process.

    Collective over ``comm`` (every rank calls it; a rank with nothing to exchange passes
    no peers). Each received descriptor belongs to the caller, who closes it.

    Args:
        comm: the :class:`~iris.host.distributed.helpers.Communicator` of the ranks.
        fds (Sequence[int]): the descriptors to send, at least one (they stay open here).
        peers (Sequence[int], optional): ranks on this host to exchange with, each listing this
            rank too; every other rank of ``comm`` when not given.
        timeout (float): seconds to wait for the peers' descriptors.

    Returns:
        dict[int, list[int]]: for each rank in ``peers``, its descriptors as opened in this process, in order.

    Raises:
        RuntimeError: a peer's descriptor did not come within ``timeout`` (the message names
            the ranks), or a peer's socket is held by another process.

    Example:
        >>> fds = exchange_fds(comm, [exported_fd])   # with every other rank
        >>> handle = import_handle(fds[peer][0]); os.close(fds[peer][0])
    """
    fds = list(fds)
    if not fds:
        raise ValueError("iris: exchange_fds needs at least one descriptor to send")
    peers = sorted(set(range(comm.world_size) if peers is None else peers) - {comm.rank})
    listener, name = _listener(backlog=len(peers) + 1)
    try:
        published = comm.all_gather_object((name, os.getpid()))
        deadline = time.monotonic() + timeout
        for peer in peers:
            peer_name, peer_pid = published[peer]
            _send(peer_name, peer_pid, peer, comm.rank, fds, deadline)
        received = _receive(listener, {published[peer][1]: peer for peer in peers}, deadline)
    finally:
        listener.close()
    missing = [peer for peer in peers if peer not in received]
    if missing:
        _close_all(received)
        ranks = ", ".join(map(str, missing))
        raise RuntimeError(
            f"iris: rank {comm.rank} received no file descriptor from rank(s) {ranks} within {timeout:g} s "
            "(ranks of one host must share a PID and a network namespace to share GPU memory)"
        )
    return received
