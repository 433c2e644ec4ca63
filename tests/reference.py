"""Reference collectives that results are checked against: torch.distributed on CPU copies.

The calls mirror :mod:`torch.distributed` (in place, same arguments) but always run
through gloo on the CPU, then copy back to the tensor's device. The same checks then
run where NCCL cannot: with ranks sharing a GPU (``IRIS_RANKS_PER_GPU``) NCCL refuses
to start ("Duplicate GPU detected").
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _on_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None) -> None:
    """Like :func:`torch.distributed.all_reduce`."""
    host = _on_cpu(tensor)
    dist.all_reduce(host, op=op, group=group)
    tensor.copy_(host)


def broadcast(tensor: torch.Tensor, src: int, group=None) -> None:
    """Like :func:`torch.distributed.broadcast`."""
    host = _on_cpu(tensor)
    dist.broadcast(host, src=src, group=group)
    tensor.copy_(host)


def all_gather(parts: list[torch.Tensor], tensor: torch.Tensor, group=None) -> None:
    """Like :func:`torch.distributed.all_gather`."""
    host = [torch.empty_like(p, device="cpu") for p in parts]
    dist.all_gather(host, _on_cpu(tensor), group=group)
    for part, value in zip(parts, host):
        part.copy_(value)


def all_gather_into_tensor(output: torch.Tensor, tensor: torch.Tensor, group=None) -> None:
    """Like :func:`torch.distributed.all_gather_into_tensor`."""
    host = torch.empty_like(output, device="cpu")
    dist.all_gather_into_tensor(host, _on_cpu(tensor).contiguous(), group=group)
    output.copy_(host)


def reduce_scatter_tensor(output: torch.Tensor, tensor: torch.Tensor, group=None) -> None:
    """Like :func:`torch.distributed.reduce_scatter_tensor` (sum)."""
    host = torch.empty_like(output, device="cpu")
    dist.reduce_scatter_tensor(host, _on_cpu(tensor).contiguous(), group=group)
    output.copy_(host)
