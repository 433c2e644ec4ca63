"""Tensor creation on a symmetric heap, as module functions with upstream Iris's signatures.

Upstream Iris exports ``iris.tensor_creation``: ``zeros(heap, iris_device, size, ...)``,
``randint(heap, iris_device, low, high, size, ...)`` and so on, which its ``Iris``
methods call. This module is the same for this package: ``ctx.zeros(2, 3)`` is
``tensor_creation.zeros(ctx.heap, ctx.device, (2, 3))``, so a program written against
either form runs unchanged. ``size`` is what the method received as ``*size``: ``(2, 3)``,
``((2, 3),)`` or ``([2, 3],)``, one level of nesting taken off (:func:`parse_size`).

Each function allocates a contiguous view into the heap (or checks ``out=``) and fills
it with torch's own in-place op, so values, random streams included, are torch's. Bad
arguments raise :class:`iris.InvalidArgumentError`, a ``ValueError`` and a
``RuntimeError`` at once, for callers written against either library.
"""

from __future__ import annotations

import math

import torch

from .backends.base import names_device
from .errors import InvalidArgumentError
from .heap import SymmetricHeap
from .tensors import (
    TensorFactory,
    check_dtype,
    check_out,
    fill_random,
    full_dtype,
    normalize_size,
    normalize_steps,
)

__all__ = [
    "allocate", "parse_size", "is_valid_device", "throw_if_invalid_device", "throw_if_invalid_output_tensor",
    "apply_layout", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like",
    "arange", "linspace", "rand", "randn", "randint", "uniform",
]  # fmt: skip


def _factory(heap: SymmetricHeap, iris_device) -> TensorFactory:
    device = torch.device(iris_device)
    return TensorFactory(heap, lambda requested, _heap_device: heap.accepts_device(requested, device))


# ---------------------------------------------------------------------- helpers
def allocate(heap: SymmetricHeap, num_elements: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat, uninitialised tensor of ``num_elements`` on ``heap``.

    Example:
        >>> flat = tensor_creation.allocate(ctx.heap, 1024, torch.float32)
    """
    return heap.allocate(int(num_elements), check_dtype(dtype))


def parse_size(size) -> tuple[tuple[int, ...], int]:
    """``(shape, number of elements)`` of a size given as ``(2, 3)``, ``((2, 3),)`` or ``([2, 3],)``.

    Example:
        >>> tensor_creation.parse_size(((2, 3),))
        ((2, 3), 6)
    """
    shape = normalize_size(tuple(size) if isinstance(size, (tuple, list, torch.Size)) else (size,))
    return shape, math.prod(shape)


def is_valid_device(device, iris_device) -> bool:
    """Whether ``device`` (``None``, a string or a ``torch.device``) names the heap's device.

    ``None`` always does; a device without an index matches any index of the same type.

    Example:
        >>> tensor_creation.is_valid_device("cuda", ctx.device)
        True
    """
    return device is None or names_device(torch.device(device), torch.device(iris_device))


def throw_if_invalid_device(device, iris_device) -> None:
    """Raise :class:`iris.InvalidArgumentError` (a ``RuntimeError``) unless :func:`is_valid_device`.

    Example:
        >>> tensor_creation.throw_if_invalid_device("cuda:0", ctx.device)
    """
    if not is_valid_device(device, iris_device):
        raise InvalidArgumentError(
            f"iris: device={device!s} does not match this rank's heap device {iris_device}"
        )


def throw_if_invalid_output_tensor(
    heap: SymmetricHeap, tensor: torch.Tensor, num_elements: int, dtype
) -> None:
    """Raise :class:`iris.InvalidArgumentError` unless ``tensor`` can take ``num_elements`` of ``dtype``.

    It must have that many elements, that dtype, and live on ``heap``.

    Example:
        >>> tensor_creation.throw_if_invalid_output_tensor(ctx.heap, out, 6, torch.float32)
    """
    check_out(heap, tensor, num_elements, dtype)


def apply_layout(tensor: torch.Tensor, layout: torch.layout) -> torch.Tensor:
    """``tensor`` itself for ``torch.strided``; any other layout raises ``ValueError``.

    Example:
        >>> tensor_creation.apply_layout(t, torch.strided) is t
        True
    """
    if layout != torch.strided:
        raise ValueError(f"iris: only torch.strided tensors live on the heap, got layout={layout}")
    return tensor


# ---------------------------------------------------------------------- filled by size
def zeros(
    heap, iris_device, size, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False
):
    """A heap tensor of zeros, like :func:`torch.zeros`.

    Example:
        >>> tensor_creation.zeros(ctx.heap, ctx.device, (2, 3), dtype=torch.float16)
    """
    return _factory(heap, iris_device).filled(
        parse_size(size)[0],
        dtype,
        lambda t: t.zero_(),
        out=out,
        layout=layout,
        device=device,
        requires_grad=requires_grad,
    )


def ones(
    heap, iris_device, size, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False
):
    """A heap tensor of ones, like :func:`torch.ones`.

    Example:
        >>> tensor_creation.ones(ctx.heap, ctx.device, (4, 4), dtype=torch.int32)
    """
    return _factory(heap, iris_device).filled(
        parse_size(size)[0],
        dtype,
        lambda t: t.fill_(1),
        out=out,
        layout=layout,
        device=device,
        requires_grad=requires_grad,
    )


def full(
    heap,
    iris_device,
    size,
    fill_value,
    *,
    out=None,
    dtype=None,
    layout=torch.strided,
    device=None,
    requires_grad=False,
):
    """A heap tensor filled with ``fill_value``, like :func:`torch.full` (dtype inferred from it).

    Example:
        >>> tensor_creation.full(ctx.heap, ctx.device, (2, 3), 3.14)
    """
    dtype = full_dtype(fill_value) if dtype is None else dtype
    return _factory(heap, iris_device).filled(
        parse_size(size)[0],
        dtype,
        lambda t: t.fill_(fill_value),
        out=out,
        layout=layout,
        device=device,
        requires_grad=requires_grad,
    )


def empty(
    heap,
    iris_device,
    size,
    *,
    out=None,
    dtype=None,
    layout=torch.strided,
    device=None,
    requires_grad=False,
    memory_format=torch.contiguous_format,
):
    """An uninitialised heap tensor, like :func:`torch.empty` (contiguous, channels_last or channels_last_3d).

    Example:
        >>> buf = tensor_creation.empty(ctx.heap, ctx.device, (1 << 20,), dtype=torch.bfloat16)
    """
    return _factory(heap, iris_device).new(
        parse_size(size)[0],
        dtype,
        out=out,
        layout=layout,
        device=device,
        requires_grad=requires_grad,
        memory_format=memory_format,
    )


def uniform(heap, iris_device, size, low=0.0, high=1.0, dtype=torch.float):
    """Uniform samples on [low, high).

    Example:
        >>> tensor_creation.uniform(ctx.heap, ctx.device, (64,), low=-1.0, high=1.0)
    """
    return _factory(heap, iris_device).filled(parse_size(size)[0], dtype, lambda t: t.uniform_(low, high))


# ---------------------------------------------------------------------- random
def rand(
    heap,
    iris_device,
    size,
    *,
    generator=None,
    out=None,
    dtype=None,
    layout=torch.strided,
    device=None,
    requires_grad=False,
):
    """Uniform samples on [0, 1), like :func:`torch.rand`.

    ``generator`` may live on another device than the heap (values are copied).

    Example:
        >>> tensor_creation.rand(ctx.heap, ctx.device, (128, 128))
    """
    return _factory(heap, iris_device).filled(
        parse_size(size)[0],
        dtype,
        lambda t: fill_random(t, generator, lambda x, g: x.uniform_(0.0, 1.0, generator=g)),
        out=out,
        layout=layout,
        device=device,
        requires_grad=requires_grad,
    )


def randn(
    heap,
    iris_device,
    size,
    *,
    generator=None,
    out=None,
    dtype=None,
    layout=torch.strided,
    device=None,
    requires_grad=False,
):
    """Standard normal samples, like :func:`torch.randn`.

    Example:
        >>> tensor_creation.randn(ctx.heap, ctx.device, (128, 128), dtype=torch.bfloat16)
    """
    return _factory(heap, iris_device).filled(
        parse_size(size)[0],
        dtype,
        lambda t: fill_random(t, generator, lambda x, g: x.normal_(generator=g)),
        out=out,
        layout=layout,
        device=device,
        requires_grad=requires_grad,
    )


def randint(
    heap,
    iris_device,
    low,
    high,
    size,
    *,
    generator=None,
    out=None,
    dtype=None,
    layout=torch.strided,
    device=None,
    requires_grad=False,
):
    """Integers in [low, high), like :func:`torch.randint` (int64 unless ``dtype`` says otherwise).

    Example:
        >>> tensor_creation.randint(ctx.heap, ctx.device, 0, 10, (2, 3))
    """
    if low >= high:
        raise InvalidArgumentError(f"iris: randint needs low < high, got low={low}, high={high}")
    return _factory(heap, iris_device).filled(
        parse_size(size)[0],
        torch.int64 if dtype is None else dtype,
        lambda t: fill_random(t, generator, lambda x, g: x.random_(low, high, generator=g)),
        out=out,
        layout=layout,
        device=device,
        requires_grad=requires_grad,
    )


# ---------------------------------------------------------------------- ranges
def arange(
    heap,
    iris_device,
    start,
    end,
    step,
    *,
    out=None,
    dtype=None,
    layout=torch.strided,
    device=None,
    requires_grad=False,
):
    """Values from ``start`` to ``end`` (exclusive) by ``step``, like :func:`torch.arange`.

    An empty range raises (upstream's rule), where torch returns an empty tensor.

    Example:
        >>> tensor_creation.arange(ctx.heap, ctx.device, 0, 10, 2)   # [0, 2, 4, 6, 8]
    """
    if step == 0:
        raise InvalidArgumentError("iris: arange step must be non-zero")
    if (end - start) * step <= 0:
        raise InvalidArgumentError(f"iris: arange({start}, {end}, {step}) is an empty range")
    values = torch.arange(start, end, step, dtype=dtype, device=heap.device)
    return _factory(heap, iris_device).copy_of(
        values, out=out, layout=layout, device=device, requires_grad=requires_grad
    )


def linspace(
    heap,
    iris_device,
    start,
    end,
    steps,
    *,
    out=None,
    dtype=None,
    layout=torch.strided,
    device=None,
    requires_grad=False,
):
    """``steps`` evenly spaced values from ``start`` to ``end``, like :func:`torch.linspace`.

    ``steps`` may be an int or a one-element tuple or list.

    Example:
        >>> tensor_creation.linspace(ctx.heap, ctx.device, 0, 1, 5)   # [0.00, 0.25, 0.50, 0.75, 1.00]
    """
    values = torch.linspace(start, end, normalize_steps(steps), dtype=dtype, device=heap.device)
    return _factory(heap, iris_device).copy_of(
        values, out=out, layout=layout, device=device, requires_grad=requires_grad
    )


# ---------------------------------------------------------------------- shaped like another tensor
def _like(heap, iris_device, input, fill, dtype, layout, device, requires_grad, memory_format):
    return _factory(heap, iris_device).like(
        input,
        dtype,
        device,
        fill,
        layout=layout or torch.strided,
        requires_grad=requires_grad,
        memory_format=memory_format,
    )


def zeros_like(
    heap,
    iris_device,
    input,
    *,
    dtype=None,
    layout=None,
    device=None,
    requires_grad=False,
    memory_format=torch.preserve_format,
):
    """Heap zeros shaped like ``input``, like :func:`torch.zeros_like`.

    Example:
        >>> y = tensor_creation.zeros_like(ctx.heap, ctx.device, x)
    """
    return _like(
        heap, iris_device, input, lambda t: t.zero_(), dtype, layout, device, requires_grad, memory_format
    )


def ones_like(
    heap,
    iris_device,
    input,
    *,
    dtype=None,
    layout=None,
    device=None,
    requires_grad=False,
    memory_format=torch.preserve_format,
):
    """Heap ones shaped like ``input``, like :func:`torch.ones_like`.

    Example:
        >>> y = tensor_creation.ones_like(ctx.heap, ctx.device, x)
    """
    return _like(
        heap, iris_device, input, lambda t: t.fill_(1), dtype, layout, device, requires_grad, memory_format
    )


def full_like(
    heap,
    iris_device,
    input,
    fill_value,
    *,
    dtype=None,
    layout=None,
    device=None,
    requires_grad=False,
    memory_format=torch.preserve_format,
):
    """Heap tensor shaped like ``input`` filled with ``fill_value``, like :func:`torch.full_like`.

    Example:
        >>> y = tensor_creation.full_like(ctx.heap, ctx.device, x, 7)
    """
    fill = lambda t: t.fill_(fill_value)  # noqa: E731
    return _like(heap, iris_device, input, fill, dtype, layout, device, requires_grad, memory_format)


def empty_like(
    heap,
    iris_device,
    input,
    *,
    dtype=None,
    layout=None,
    device=None,
    requires_grad=False,
    memory_format=torch.preserve_format,
):
    """Uninitialised heap tensor shaped like ``input``, like :func:`torch.empty_like`.

    Example:
        >>> y = tensor_creation.empty_like(ctx.heap, ctx.device, x)
    """
    return _like(
        heap, iris_device, input, lambda t: None, dtype, layout, device, requires_grad, memory_format
    )
