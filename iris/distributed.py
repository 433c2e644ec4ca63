"""Host-side coordination between ranks, through torch.distributed.

Iris keeps its own gloo group for the small control messages of set-up (heap
handles, sizes, broadcasts), so it works whichever backend the user's default
process group has, and never pushes Python objects through NCCL.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

_control_groups: dict[int, Any] = {}


@dataclass
class Communicator:
    """Who this process is among the ranks, and a group to coordinate them."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    control_group: Any

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self.control_group)
        return gathered

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """``obj`` as passed on rank ``src``."""
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.control_group)
        return box[0]

    def barrier(self, group=None) -> None:
        """Host barrier over ``group`` (all ranks when None)."""
        dist.barrier(group=self.control_group if group is None else group)


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
            dist.init_process_group(backend=backend, init_method="env://")
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        # Iris created the group, so Iris tears it down when the process exits.
        atexit.register(_destroy_default_group)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return Communicator(rank, world_size, local_rank, local_world_size, _control_group())


def _destroy_default_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _control_group():
    default = dist.group.WORLD
    key = id(default)
    if key not in _control_groups:
        if dist.get_backend(default) == "gloo":
            _control_groups[key] = default
        else:
            _control_groups[key] = dist.new_group(backend="gloo")
    return _control_groups[key]
