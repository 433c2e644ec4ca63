"""Start N ranks on this machine, for either backend.

``iris.spawn(fn, nprocs)`` runs ``fn(rank, *args)`` in ``nprocs`` fresh processes
with the rendezvous variables torchrun would set, so ``iris.iris()`` inside
``fn`` just works. ``python -m iris.run -n N script.py`` does the same for a script.
"""

from __future__ import annotations

import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp

#: The one address a launcher's store listens on: every rank it starts runs on this host.
LOOPBACK = "127.0.0.1"


def host_rendezvous_store() -> dist.TCPStore:
    """Host the ranks' rendezvous store in this (launching) process, on loopback, on a port the OS picks.

    The launcher owns the store and every rank joins it as a client, as under torchrun,
    whose agent does the same. The alternative, picking a free port here and letting
    rank 0 bind it later, races: between the two, any process on the machine may take
    that port (an outgoing connection's ephemeral port is enough), and rank 0 then fails
    with EADDRINUSE. The store answers anyone who connects, without authentication, so
    it listens on the loopback address only (a socket bound here and handed to the
    store; the store's own bind would take every interface, IPv4 and IPv6): nobody on
    the network can reach it, though other users of this host can (docs/scale_out.md).
    Keep the returned store alive until the ranks have exited.

    Example:
        >>> store = host_rendezvous_store()
        >>> env = rank_environment(0, 2, store.port)
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, 0))
        listener.listen(128)
        port = listener.getsockname()[1]
        store = dist.TCPStore(
            LOOPBACK, port, is_master=True, wait_for_workers=False, master_listen_fd=listener.fileno()
        )
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the socket now
    return store


def rank_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment variables that tell rank ``rank`` to join the store on ``port``.

    ``port`` is that of a store from :func:`host_rendezvous_store`; the ranks join it as
    clients (``TORCHELASTIC_USE_AGENT_STORE``, torch's switch for a launcher-hosted store).
    """
    environment = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    # Gloo's ranks connect to each other on the interface of the host's name unless told
    # otherwise; ranks of one host need no other than loopback (unless the user chose one).
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        environment["GLOO_SOCKET_IFNAME"] = "lo"
    return environment


def backend_environment() -> dict[str, str]:
    """The variables that give a rank process this process's backend from its first import.

    Under emulation that includes ``TRITON_INTERPRET=1``, so a rank's kernels are
    interpreted even where its script imports Triton before ``iris``.
    """
    from ..backends import process_environment
    from ..config import BACKEND

    return process_environment(BACKEND)


def _run_rank(rank: int, fn, world_size: int, port: int, args: tuple) -> None:
    os.environ.update(rank_environment(rank, world_size, port))
    try:
        fn(rank, *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn, nprocs: int, args: tuple = (), join: bool = True):
    """Run ``fn(rank, *args)`` on ``nprocs`` ranks, like :func:`torch.multiprocessing.spawn`.

    If any rank raises, the others are terminated and the error (with the rank's
    traceback) is raised here.

    Example:
        >>> def main(rank):
        ...     ctx = iris.iris(1 << 24)
        ...     ...
        >>> iris.spawn(main, nprocs=2)
    """
    if nprocs < 1:
        raise ValueError(f"iris.spawn: nprocs must be at least 1, got {nprocs}")
    store = host_rendezvous_store()
    context = mp.start_processes(
        _run_rank, args=(fn, nprocs, store.port, tuple(args)), nprocs=nprocs, join=join, start_method="spawn"
    )
    if context is not None:
        context.rendezvous_store = store  # the ranks' store lives as long as the caller joins them
    return context
