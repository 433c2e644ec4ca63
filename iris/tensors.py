"""Tensor factories on the symmetric heap, with torch's argument conventions.

Each factory allocates a contiguous view into the heap and fills it with torch's
own in-place ops, so values (random streams included) match what torch gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .errors import InvalidArgumentError
from .heap import SymmetricHeap

#: dtypes a Triton kernel can read and write; anything else is refused up front.
SUPPORTED_DTYPES = frozenset(
    {
        torch.bool,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        # Complex tensors are stored as they are; kernels see them through torch.view_as_real.
        torch.complex64,
        torch.complex128,
    }
)

#: Memory formats a heap tensor can take: the rank of tensor each needs and the
#: dimension order in memory (slowest first), as torch lays them out.
_MEMORY_ORDERS = {
    torch.channels_last: (4, (0, 2, 3, 1)),
    torch.channels_last_3d: (5, (0, 2, 3, 4, 1)),
}


def normalize_size(size: Sequence) -> tuple[int, ...]:
    """Accept ``f(2, 3)``, ``f((2, 3))``, ``f([2, 3])``, ``f(((2, 3),))`` and ``f(torch.Size([2, 3]))``."""
    while len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dims = []
    for dim in size:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"iris: tensor sizes must be ints, got {dim!r}")
        if dim < 0:
            raise ValueError(f"iris: tensor sizes must be non-negative, got {tuple(size)}")
        dims.append(int(dim))
    return tuple(dims)


def normalize_steps(steps) -> int:
    """``linspace``'s ``steps`` as an int: ``5``, ``(5,)`` or ``[5]`` (upstream Iris accepts all three)."""
    while isinstance(steps, (tuple, list, torch.Size)):
        if len(steps) != 1:
            raise InvalidArgumentError(f"iris: linspace steps must be one number, got {steps!r}")
        steps = steps[0]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise InvalidArgumentError(f"iris: linspace steps must be a non-negative int, got {steps!r}")
    return steps


def memory_format_of(tensor: torch.Tensor):
    """The memory format ``torch.preserve_format`` keeps for ``tensor`` on the heap."""
    for memory_format, (ndim, _) in _MEMORY_ORDERS.items():
        if (
            tensor.dim() == ndim
            and not tensor.is_contiguous()
            and tensor.is_contiguous(memory_format=memory_format)
        ):
            return memory_format
    return torch.contiguous_format


def _in_memory_format(flat: torch.Tensor, size: tuple[int, ...], memory_format) -> torch.Tensor:
    """A view of the contiguous heap bytes ``flat`` with ``size`` laid out as ``memory_format``."""
    if memory_format in (torch.contiguous_format, torch.preserve_format):
        return flat.view(size)
    if memory_format not in _MEMORY_ORDERS:
        raise InvalidArgumentError(f"iris: memory_format={memory_format} is not supported on the heap")
    ndim, order = _MEMORY_ORDERS[memory_format]
    if len(size) != ndim:
        # Upstream Iris's rule (torch raises here): a layout for another rank is ignored.
        return flat.view(size)
    stored = flat.view(tuple(size[d] for d in order))
    return stored.permute(*(order.index(d) for d in range(ndim)))


def check_dtype(dtype: torch.dtype) -> torch.dtype:
    """Return ``dtype`` if the heap supports it, else raise ``TypeError``."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"iris: dtype must be a torch.dtype, got {dtype!r}")
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(sorted(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES))
        raise TypeError(f"iris: dtype {dtype} is not supported on the symmetric heap (supported: {names})")
    return dtype


def check_out(heap: SymmetricHeap, out: torch.Tensor, num_elements: int, dtype: torch.dtype) -> None:
    """Raise :class:`iris.InvalidArgumentError` unless ``out`` can hold ``num_elements`` of ``dtype``.

    It must have that many elements (heap tensors cannot be resized), that dtype, and
    live on ``heap``; the messages are upstream Iris's.

    Example:
        >>> check_out(ctx.heap, out, 6, torch.float32)
    """
    if out.numel() != num_elements:
        raise InvalidArgumentError(
            f"iris: The output tensor has {out.numel()} elements, but {num_elements} are required "
            "(heap tensors cannot be resized)"
        )
    if out.dtype != dtype:
        raise InvalidArgumentError(f"iris: The output tensor has dtype {out.dtype}, but {dtype} is required")
    if not heap.contains(out):
        raise InvalidArgumentError("iris: The output tensor is not on the symmetric heap")


class TensorFactory:
    """Makes heap tensors for one rank; the ``Iris`` methods delegate here."""

    def __init__(self, heap: SymmetricHeap, accepts_device: Callable[[torch.device, torch.device], bool]):
        self.heap = heap
        self._accepts_device = accepts_device

    def _check_device(self, device) -> None:
        if device is None:
            return
        requested = torch.device(device)
        if not self._accepts_device(requested, self.heap.device):
            raise InvalidArgumentError(
                f"iris: device={device!s} does not match this rank's heap device {self.heap.device}"
            )

    def new(
        self,
        size: tuple[int, ...],
        dtype: torch.dtype | None,
        *,
        device=None,
        layout=torch.strided,
        out: torch.Tensor | None = None,
        requires_grad: bool = False,
        memory_format=torch.contiguous_format,
    ) -> torch.Tensor:
        """Allocate (or validate ``out`` as) a heap tensor; the caller fills it.

        ``out`` must be a heap tensor of ``dtype`` with as many elements as ``size``;
        the result is ``out`` itself, or ``out`` viewed as ``size`` when its shape
        differs (upstream Iris's rule).
        """
        if layout != torch.strided:
            raise ValueError(f"iris: only torch.strided tensors live on the heap, got layout={layout}")
        self._check_device(device)
        dtype = check_dtype(torch.get_default_dtype() if dtype is None else dtype)
        if out is not None:
            check_out(self.heap, out, math.prod(size), dtype)
            if memory_format not in (torch.contiguous_format, torch.preserve_format):
                raise InvalidArgumentError("iris: out= and memory_format= cannot be combined")
            # torch returns out= itself; one of another shape is viewed as the size (upstream).
            tensor = out if tuple(out.shape) == tuple(size) else out.view(size)
        else:
            tensor = _in_memory_format(self.heap.allocate(math.prod(size), dtype), tuple(size), memory_format)
        if requires_grad:
            tensor.requires_grad_(True)
        return tensor

    def filled(self, size, dtype, fill: Callable[[torch.Tensor], object], **kwargs) -> torch.Tensor:
        """A new heap tensor written by ``fill`` (an in-place torch op)."""
        requires_grad = kwargs.pop("requires_grad", False)
        tensor = self.new(size, dtype, **kwargs)
        with torch.no_grad():
            fill(tensor)
        if requires_grad:
            tensor.requires_grad_(True)
        return tensor

    def copy_of(self, values: torch.Tensor, **kwargs) -> torch.Tensor:
        """A heap tensor holding ``values`` (computed by torch on the heap's device)."""
        return self.filled(tuple(values.shape), values.dtype, lambda t: t.copy_(values), **kwargs)

    def like(self, input: torch.Tensor, dtype, device, fill, **kwargs) -> torch.Tensor:
        """A heap tensor shaped like ``input``; ``dtype`` defaults to ``input.dtype``."""
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"iris: input must be a torch.Tensor, got {type(input).__name__}")
        dtype = input.dtype if dtype is None else dtype
        if kwargs.get("memory_format") == torch.preserve_format:
            kwargs["memory_format"] = memory_format_of(input)
        return self.filled(tuple(input.shape), dtype, fill, device=device, **kwargs)


def fill_random(tensor: torch.Tensor, generator: torch.Generator | None, draw) -> None:
    """Fill ``tensor`` in place with ``draw(t, generator)``.

    A generator on another device (say a CPU ``torch.Generator`` for a GPU heap)
    draws on its own device and the values are copied, so one seeded generator
    gives the same numbers on every backend.
    """
    if generator is None or generator.device.type == tensor.device.type:
        draw(tensor, generator)
        return
    staging = torch.empty(tensor.shape, dtype=tensor.dtype, device=generator.device)
    draw(staging, generator)
    tensor.copy_(staging)


def full_dtype(fill_value) -> torch.dtype:
    """The dtype torch.full infers from ``fill_value``."""
    if isinstance(fill_value, bool):
        return torch.bool
    if isinstance(fill_value, int):
        return torch.int64
    if isinstance(fill_value, float):
        return torch.get_default_dtype()
    if isinstance(fill_value, torch.Tensor):
        return fill_value.dtype
    raise TypeError(f"iris: cannot infer a dtype from fill_value={fill_value!r}; pass dtype=")
