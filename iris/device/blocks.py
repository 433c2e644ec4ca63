"""What device ops need to know about a block of pointers: its rank, element size, and order.

A device op takes a scalar pointer or a block of them (1 to 3 dimensions), built the
way Triton kernels build them (``base + offsets``). The tracing recorder names a
block by its first element in row-major order, and the cross-node path moves a block
that is one run of consecutive elements as a single transfer; both ask the same
questions of the block, answered here once.

The device ops serve Gluon kernels too (``iris.gluon``): there a range of lanes needs a
layout, so :func:`lanes` gives one whose layout the compiler infers from its use
(Gluon's ``AutoLayout``), and a plain Triton range otherwise (:func:`in_gluon`).

Example:
    >>> index = blocks.row_major_index(ptr)            # 0, 1, 2, ... in row-major order
    >>> first = tl.sum(tl.where(index == 0, ptr.to(tl.int64), 0))
"""

import triton
import triton.language as tl
from triton.experimental.gluon import language as gl
from triton.runtime.jit import constexpr_function


def in_gluon(_semantic=None):
    """Whether the kernel being compiled is a Gluon kernel (``@gluon.jit``), as a constexpr.

    A builtin: the compiler hands it the semantic it compiles with (the interpreter, which
    runs only Triton kernels, calls it without one).
    """
    return tl.constexpr(type(_semantic).__name__ == "GluonSemantic")


in_gluon.__triton_builtin__ = True


@triton.jit
def lanes(n: tl.constexpr):
    """``arange(0, n)``: in a Gluon kernel with the layout its use gives it (``AutoLayout``).

    Example:
        >>> index = blocks.lanes(ptr.shape[0])[:, None] * ptr.shape[1] + blocks.lanes(ptr.shape[1])[None, :]
    """
    if in_gluon():
        values = gl.arange(0, n, layout=gl.AutoLayout())
    else:
        values = tl.arange(0, n)
    return values


@triton.jit
def spread(value, n: tl.constexpr, dtype: tl.constexpr):
    """A vector of ``n`` lanes that all hold ``value``; in a Gluon kernel laid out over the CTA.

    Example:
        >>> uniform = tl.max(blocks.spread(per_thread, 1024, tl.int64), axis=0)   # a CTA-wide max
    """
    if in_gluon():
        layout: tl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        values = gl.full([n], value, dtype, layout=layout)
    else:
        values = tl.full([n], value, dtype)
    return values


@triton.jit
def word_lanes(n: tl.constexpr):
    """``arange(0, n)`` for a vector of its own (a record's words): in a Gluon kernel laid out
    one word per thread, as Triton lays out a short range.

    Example:
        >>> word = blocks.word_lanes(8)
    """
    if in_gluon():
        layout: tl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        values = gl.arange(0, n, layout=layout)
    else:
        values = tl.arange(0, n)
    return values


@constexpr_function
def is_block(value_type):
    """Whether ``value_type`` (a pointer's or a value's ``.type``) is a block, not a scalar."""
    return hasattr(value_type, "is_block") and value_type.is_block()


@constexpr_function
def element_bytes(pointer_type):
    """Bytes of one element that a pointer (block or scalar) of ``pointer_type`` points to."""
    element = pointer_type.element_ty if pointer_type.is_block() else pointer_type
    return element.element_ty.primitive_bitwidth // 8


@constexpr_function
def numel(pointer_type):
    """Elements of a block of ``pointer_type`` (1 for a scalar)."""
    return pointer_type.numel if pointer_type.is_block() else 1


@constexpr_function
def rank_of(pointer_type):
    """Dimensions of a block of ``pointer_type``."""
    return len(pointer_type.shape)


@triton.jit
def row_major_index(ptr):
    """Each element's position in row-major order of the block ``ptr`` (1 to 3 dimensions).

    Example:
        >>> index = row_major_index(base + offs_m[:, None] * stride + offs_n[None, :])
    """
    if rank_of(ptr.type) == 1:
        index = lanes(ptr.shape[0])
    elif rank_of(ptr.type) == 2:
        index = lanes(ptr.shape[0])[:, None] * ptr.shape[1] + lanes(ptr.shape[1])[None, :]
    else:
        tl.static_assert(rank_of(ptr.type) == 3, "device ops take blocks of 1 to 3 dimensions")
        rows = lanes(ptr.shape[0])[:, None, None] * (ptr.shape[1] * ptr.shape[2])
        index = rows + lanes(ptr.shape[1])[None, :, None] * ptr.shape[2]
        index = index + lanes(ptr.shape[2])[None, None, :]
    return index


@triton.jit
def sum_all(values):
    """The sum of every element of a block of 1 to 3 dimensions, one axis at a time.

    For Gluon kernels, which have no reshape that may reorder elements (Triton kernels
    flatten the block and let the compiler order the sum).

    Example:
        >>> count = blocks.sum_all(mask.to(tl.int64))
    """
    if len(values.shape) == 3:
        total = tl.sum(tl.sum(tl.sum(values, 2), 1), 0)
    elif len(values.shape) == 2:
        total = tl.sum(tl.sum(values, 1), 0)
    else:
        total = tl.sum(values, 0)
    return total
