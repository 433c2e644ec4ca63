"""Host-side coordination between ranks, through torch.distributed.

Iris keeps its own gloo group for the small control messages of set-up (heap
handles, sizes, broadcasts), so it works whichever backend the user's default
process group has, and never pushes Python objects through NCCL.
"""

from __future__ import annotations

import atexit
import gc
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ... import config

_control_groups: dict[int, Any] = {}
#: Every Communicator made, so that their process groups can be let go of at exit.
_communicators: weakref.WeakSet = weakref.WeakSet()


class HostTimeoutError(RuntimeError):
    """A host barrier or collective failed because a rank is gone or never arrived.

    The message names the ranks that did not arrive (from the rendezvous store) and,
    when contexts exist, what each rank is doing (from the flight files).
    """


@dataclass(eq=False)  # identity, not field values: communicators are kept in a WeakSet
class Communicator:
    """Who this process is among the ranks, and a group to coordinate them."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    control_group: Any
    #: Returns what the other ranks are doing, for error messages (installed by ``iris.host.hang``).
    describe_peers: Callable[[], str] | None = field(default=None, repr=False)

    def __post_init__(self):
        _communicators.add(self)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        gathered: list[Any] = [None] * self.world_size
        self._collective(
            "all_gather_object", lambda: dist.all_gather_object(gathered, obj, group=self.control_group)
        )
        return gathered

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """``obj`` as passed on rank ``src``."""
        box = [obj]
        self._collective(
            "broadcast_object", lambda: dist.broadcast_object_list(box, src=src, group=self.control_group)
        )
        return box[0]

    def barrier(self, group=None) -> None:
        """Host barrier over ``group`` (all ranks when None)."""
        if group is None:
            self._collective("barrier", lambda: dist.barrier(group=self.control_group))
        else:
            self._collective("group barrier", lambda: dist.barrier(group=group), counted=False)

    def _collective(self, what: str, run: Callable[[], Any], counted: bool = True) -> None:
        # Each rank counts its control collectives in the rendezvous store, so when one
        # fails the survivors can say which ranks never arrived, not just "timed out".
        arrived = _arrive(self.rank) if counted and self.world_size > 1 else None
        try:
            run()
        except RuntimeError as error:
            raise HostTimeoutError(self._explain(what, arrived, error)) from error

    def _explain(self, what: str, arrived: int | None, error: Exception) -> str:
        lines = [f"iris: rank {self.rank}: host {what} failed: {str(error).strip().splitlines()[0]}"]
        if arrived is not None:
            lines.append(_who_is_behind(self.rank, self.world_size, arrived, what))
        if self.describe_peers is not None:
            try:
                lines.append(self.describe_peers())
            except Exception as describe_error:  # noqa: BLE001 - the original failure matters more
                lines.append(f"(no flight report: {describe_error!r})")
        return "\n".join(line for line in lines if line)


def _arrival_key(rank: int) -> str:
    return f"iris/arrivals/{rank}"


def _arrive(rank: int) -> int | None:
    try:
        return dist.distributed_c10d._get_default_store().add(_arrival_key(rank), 1)
    except Exception:  # noqa: BLE001 - counting is a diagnostic; never fail a collective for it
        return None


def _who_is_behind(rank: int, world_size: int, arrived: int, what: str) -> str:
    try:
        store = dist.distributed_c10d._get_default_store()
        counts = [store.add(_arrival_key(r), 0) for r in range(world_size)]
    except Exception:  # noqa: BLE001
        return "the rendezvous store is unreachable: the process hosting it (the launcher, or rank 0) is gone"
    behind = [r for r, count in enumerate(counts) if count < arrived]
    if not behind:
        return f"every rank reached this host {what} (call {arrived}); a rank failed inside it"
    return (
        f"rank(s) {behind} never reached this host {what} (call {arrived} of rank {rank}; they made "
        f"{[counts[r] for r in behind]} calls): they exited, hang, or make different calls"
    )


def _default_pg_backend(device_backend: str) -> str:
    # Object collectives go through gloo on CPU tensors; device tensors through NCCL.
    return "cpu:gloo,cuda:nccl" if device_backend == "nccl" else "gloo"


def init_distributed(device_backend: str) -> Communicator:
    """Join (or create) the default process group and return a :class:`Communicator`.

    With ``RANK`` and ``WORLD_SIZE`` in the environment (torchrun, ``python -m iris.run``,
    :func:`iris.spawn`) the ranks rendezvous through ``MASTER_ADDR``/``MASTER_PORT``;
    without them the process is a world of one.
    """
    if not dist.is_initialized():
        backend = _default_pg_backend(device_backend)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            # A bounded timeout: a rank that never arrives fails the others instead of hanging them.
            dist.init_process_group(backend=backend, init_method="env://", timeout=_host_timeout())
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        # Iris created the group, so Iris tears it down when the process exits.
        atexit.register(_destroy_default_group)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return Communicator(rank, world_size, local_rank, local_world_size, _control_group())


#: Seconds rank 0 waits at exit for the other ranks to let go of the rendezvous store.
EXIT_GRACE_SECONDS = 10.0


def _destroy_default_group() -> None:
    """Tear the process groups down at exit, rank 0 last, and free them while Python is alive.

    Rank 0 may host the rendezvous store (TCPStore). Left to chance, it may exit while a
    peer's process group is still being destroyed and talking to that store, which
    fails in the peer's background threads at exit. So every other rank destroys its
    group first and then says so in the store; rank 0 waits for that (at most
    EXIT_GRACE_SECONDS: a peer that died says nothing) before destroying its own.

    Destroying a group leaves its C++ object alive while Python objects refer to it (our
    control group, a context the program kept in a global, reference cycles). Freed only
    during interpreter finalization, gloo's worker threads then release the tensors of
    their last work, which needs the GIL the finalizing interpreter no longer hands out:
    the process aborts ("terminate called without an active exception"), now and then.
    So the references are dropped and collected here, with the interpreter intact.
    """
    if not dist.is_initialized():
        return
    try:
        _tear_down_in_order()
    finally:
        _release_groups()


def _release_groups() -> None:
    _control_groups.clear()
    for communicator in list(_communicators):
        communicator.control_group = None
    gc.collect()


def _tear_down_in_order() -> None:
    try:
        store = dist.distributed_c10d._get_default_store()
        rank, world_size = dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - no store to order by: tear down as is
        dist.destroy_process_group()
        return
    if world_size == 1:
        dist.destroy_process_group()
    elif rank != 0:
        dist.destroy_process_group()
        try:
            # set() waits for no reply, so nothing is left listening when rank 0 goes.
            store.set(f"{_EXITED_KEY}/{rank}", "1")
        except Exception:  # noqa: BLE001 - rank 0 is gone already: nothing to tell
            pass
    else:
        keys = [f"{_EXITED_KEY}/{peer}" for peer in range(1, world_size)]
        deadline = time.monotonic() + EXIT_GRACE_SECONDS
        try:
            while not store.check(keys) and time.monotonic() < deadline:
                time.sleep(0.01)
        except Exception:  # noqa: BLE001
            pass
        dist.destroy_process_group()


_EXITED_KEY = "iris/exited"


def _control_group():
    default = dist.group.WORLD
    key = id(default)
    if key not in _control_groups:
        if dist.get_backend(default) == "gloo":
            _control_groups[key] = default
        else:
            _control_groups[key] = dist.new_group(backend="gloo", timeout=_host_timeout())
    return _control_groups[key]


def _host_timeout() -> timedelta:
    return timedelta(seconds=config.host_timeout())


def extract_group_info(group, rank: int, num_ranks: int) -> tuple[int, int, int, int, int]:
    """Where ``rank`` stands in ``group``, as upstream Iris's kernels address a group.

    Returns ``(rank_in_group, rank_global, group_size, rank_start, rank_stride)``: the
    group's members are the global ranks ``rank_start + i * rank_stride``. Upstream's
    ``iris.host.distributed.helpers.extract_group_info``; this package's collectives
    take any member list, but programs written for upstream address groups this way.

    Args:
        group: a torch process group, or ``None`` for every rank.
        rank: this process's global rank.
        num_ranks: ranks in the job.

    Raises:
        RuntimeError: ``rank`` is not a member of ``group``.
        NotImplementedError: the members are not evenly spaced (upstream's limit).

    Example:
        >>> extract_group_info(dist.new_group([0, 2]), rank=2, num_ranks=4)
        (1, 2, 2, 0, 2)
    """
    if group is None:
        return rank, rank, num_ranks, 0, 1
    members = dist.get_process_group_ranks(group)
    if rank not in members:
        raise RuntimeError(f"iris: rank {rank} is not a member of the group {members}")
    steps = {b - a for a, b in zip(members, members[1:])} or {1}
    if len(steps) != 1 or 0 in steps:
        raise NotImplementedError(
            f"iris: the group {members} is not evenly spaced; upstream's group addressing "
            "(rank_start + i * rank_stride) needs members like [0, 1, 2, 3] or [0, 4, 8, 12]"
        )
    return members.index(rank), rank, len(members), members[0], steps.pop()


def distributed_allgather_multidim(data) -> np.ndarray:
    """Every rank's ``data`` (array-like, one shape on every rank) as the rows of a
    ``(world_size, -1)`` NumPy array, in rank order (upstream's helper of that name).

    Goes through the default process group: on the CPU where it has a CPU backend
    (gloo; this package's own groups), else on the current GPU (an NCCL-only group,
    as torchrun scripts make).

    Example:
        >>> rows = distributed_allgather_multidim(np.array([rank, rank * 10]))
        >>> rows.shape
        (4, 2)
    """
    if not dist.is_initialized():
        raise RuntimeError("iris: distributed_allgather_multidim needs torch.distributed initialised")
    on_cpu = "gloo" in str(dist.get_backend()).lower()
    local = torch.as_tensor(np.asarray(data)).to("cpu" if on_cpu else torch.cuda.current_device())
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return torch.stack(gathered).reshape(len(gathered), -1).cpu().numpy()
