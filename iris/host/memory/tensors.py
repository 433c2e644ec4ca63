"""Tensors on the symmetric heap: torch's factories, each defined once, in two call forms.

``ctx.zeros(2, 3)`` is the context's method; ``tensors.zeros(ctx.heap, ctx.device, (2, 3))``
is the same factory as the module function upstream Iris exports (``iris.tensor_creation``,
``iris.host.memory.tensors``), so a program written against either form runs unchanged.
Each function here is the one definition; :func:`as_method` makes the context's method
from it. ``size`` is what the method received as ``*size``: ``(2, 3)``, ``((2, 3),)`` or
``([2, 3],)``, one level of nesting taken off (:func:`parse_size`).

Each factory allocates a contiguous view into the heap (or checks ``out=``) and fills it
with torch's own in-place op, so values, random streams included, are torch's. Bad
arguments raise :class:`iris.InvalidArgumentError`, a ``ValueError`` and a
``RuntimeError`` at once, for callers written against either library.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

import torch

from ...backends.base import names_device
from ...errors import ArgumentCountError, InvalidArgumentError
from .heap import SymmetricHeap

__all__ = [
    "allocate", "parse_size", "is_valid_device", "throw_if_invalid_device", "throw_if_invalid_output_tensor",
    "apply_layout", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like",
    "arange", "linspace", "rand", "randn", "randint", "uniform",
]  # fmt: skip


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


def _factory(heap: SymmetricHeap, iris_device) -> TensorFactory:
    device = torch.device(iris_device)
    return TensorFactory(heap, lambda requested, _heap_device: heap.accepts_device(requested, device))


# ---------------------------------------------------------------------- helpers
def allocate(heap: SymmetricHeap, num_elements: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat, uninitialised tensor of ``num_elements`` on ``heap``.

    Example:
        >>> flat = tensors.allocate(ctx.heap, 1024, torch.float32)
    """
    return heap.allocate(int(num_elements), check_dtype(dtype))


def parse_size(size) -> tuple[tuple[int, ...], int]:
    """``(shape, number of elements)`` of a size given as ``(2, 3)``, ``((2, 3),)`` or ``([2, 3],)``.

    Example:
        >>> tensors.parse_size(((2, 3),))
        ((2, 3), 6)
    """
    shape = normalize_size(tuple(size) if isinstance(size, (tuple, list, torch.Size)) else (size,))
    return shape, math.prod(shape)


def is_valid_device(device, iris_device) -> bool:
    """Whether ``device`` (``None``, a string or a ``torch.device``) names the heap's device.

    ``None`` always does; a device without an index matches any index of the same type.

    Example:
        >>> tensors.is_valid_device("cuda", ctx.device)
        True
    """
    return device is None or names_device(torch.device(device), torch.device(iris_device))


def throw_if_invalid_device(device, iris_device) -> None:
    """Raise :class:`iris.InvalidArgumentError` (a ``RuntimeError``) unless :func:`is_valid_device`.

    Example:
        >>> tensors.throw_if_invalid_device("cuda:0", ctx.device)
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
        >>> tensors.throw_if_invalid_output_tensor(ctx.heap, out, 6, torch.float32)
    """
    check_out(heap, tensor, num_elements, dtype)


def apply_layout(tensor: torch.Tensor, layout: torch.layout) -> torch.Tensor:
    """``tensor`` itself for ``torch.strided``; any other layout raises ``ValueError``.

    Example:
        >>> tensors.apply_layout(t, torch.strided) is t
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
        >>> ctx.zeros(2, 3, dtype=torch.float16)
        >>> tensors.zeros(ctx.heap, ctx.device, (2, 3), dtype=torch.float16)  # upstream's form
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
        >>> ctx.ones((4, 4), dtype=torch.int32)
        >>> tensors.ones(ctx.heap, ctx.device, (4, 4), dtype=torch.int32)  # upstream's form
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
        >>> ctx.full((2, 3), 3.14)
        >>> tensors.full(ctx.heap, ctx.device, (2, 3), 3.14)  # upstream's form
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
    pin_memory=False,
):
    """An uninitialised heap tensor, like :func:`torch.empty` (contiguous, channels_last or channels_last_3d).

    ``pin_memory`` is taken and has no effect, as upstream's (pinning is for host memory;
    the heap is the device's).

    Example:
        >>> buf = ctx.empty(1 << 20, dtype=torch.bfloat16)
        >>> buf = tensors.empty(ctx.heap, ctx.device, (1 << 20,), dtype=torch.bfloat16)  # upstream's form
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
        >>> ctx.uniform((64,), low=-1.0, high=1.0)
        >>> tensors.uniform(ctx.heap, ctx.device, (64,), low=-1.0, high=1.0)  # upstream's form
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
    pin_memory=False,
):
    """Uniform samples on [0, 1), like :func:`torch.rand`.

    ``pin_memory`` is taken and has no effect (see :func:`empty`).

    ``generator`` may live on another device than the heap (values are copied).

    Example:
        >>> ctx.rand(128, 128)
        >>> tensors.rand(ctx.heap, ctx.device, (128, 128))  # upstream's form
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
    pin_memory=False,
):
    """Standard normal samples, like :func:`torch.randn`.

    ``pin_memory`` is taken and has no effect (see :func:`empty`).

    Example:
        >>> ctx.randn(128, 128, dtype=torch.bfloat16)
        >>> tensors.randn(ctx.heap, ctx.device, (128, 128), dtype=torch.bfloat16)  # upstream's form
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
        >>> ctx.randint(0, 10, (2, 3))
        >>> tensors.randint(ctx.heap, ctx.device, 0, 10, (2, 3))  # upstream's form
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
        >>> ctx.arange(0, 10, 2)   # [0, 2, 4, 6, 8]
        >>> tensors.arange(ctx.heap, ctx.device, 0, 10, 2)  # upstream's form
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
        >>> ctx.linspace(0, 1, 5)   # [0.00, 0.25, 0.50, 0.75, 1.00]
        >>> tensors.linspace(ctx.heap, ctx.device, 0, 1, 5)  # upstream's form
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
        >>> y = ctx.zeros_like(x)
        >>> y = tensors.zeros_like(ctx.heap, ctx.device, x)  # upstream's form
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
        >>> y = ctx.ones_like(x)
        >>> y = tensors.ones_like(ctx.heap, ctx.device, x)  # upstream's form
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
        >>> y = ctx.full_like(x, 7)
        >>> y = tensors.full_like(ctx.heap, ctx.device, x, 7)  # upstream's form
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
        >>> y = ctx.empty_like(x)
        >>> y = tensors.empty_like(ctx.heap, ctx.device, x)  # upstream's form
    """
    return _like(
        heap, iris_device, input, lambda t: None, dtype, layout, device, requires_grad, memory_format
    )


# ---------------------------------------------------------------------- the context's methods
def _sizes(*size):
    """``ctx.zeros(2, 3)``: the sizes are the method's positional arguments."""
    return (size,)


def _arange_arguments(start=0, end=None, step=1):
    """``ctx.arange(5)`` counts from 0, as :func:`torch.arange` does."""
    return (0, start, step) if end is None else (start, end, step)


def _randint_arguments(*args):
    """``ctx.randint(high, size)`` or ``ctx.randint(low, high, size)``, as :func:`torch.randint` takes."""
    if len(args) == 2:
        return (0, *args)
    if len(args) == 3:
        return args
    raise ArgumentCountError(
        f"iris: randint expects (high, size) or (low, high, size), got {len(args)} arguments"
    )


def as_method(function: Callable, arguments: Callable | None = None) -> Callable:
    """The context's method for a factory of this module: ``ctx.f(*args, **kw)`` is
    ``f(ctx.heap, ctx.heap.device, *arguments(*args), **kw)``.

    ``arguments`` maps the method's positional arguments to the function's after
    ``(heap, iris_device)`` (the same ones when omitted); the method's signature is its
    positional parameters followed by the function's keyword-only ones, and its
    docstring is the function's.

    Example:
        >>> class Iris:
        ...     zeros = as_method(zeros, _sizes)   # ctx.zeros(2, 3)
    """

    named = [
        p.name
        for p in (inspect.signature(arguments).parameters.values() if arguments else ())
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]

    def method(self, *args, **kwargs):
        # ``ctx.arange(start=1, end=4)``: the mapped parameters may come by name too.
        mapped = {name: kwargs.pop(name) for name in named if name in kwargs}
        positional = args if arguments is None else arguments(*args, **mapped)
        return function(self.heap, self.heap.device, *positional, **kwargs)

    parameters = list(inspect.signature(function).parameters.values())[2:]
    if arguments is not None:
        positional = list(inspect.signature(arguments).parameters.values())
        parameters = positional + [p for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    method.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *parameters]
    )
    method.__name__ = method.__qualname__ = function.__name__
    method.__doc__ = function.__doc__
    return method
