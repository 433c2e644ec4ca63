"""What device ops need to know about a block of pointers: its rank, element size, and order.

A device op takes a scalar pointer or a block of them (1 to 3 dimensions), built the
way Triton kernels build them (``base + offsets``). The tracing recorder names a
block by its first element in row-major order, and the cross-node path moves a block
that is one run of consecutive elements as a single transfer; both ask the same
questions of the block, answered here once.

Example:
    >>> index = blocks.row_major_index(ptr)            # 0, 1, 2, ... in row-major order
    >>> first = tl.sum(tl.where(index == 0, ptr.to(tl.int64), 0))
"""

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function


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
        index = tl.arange(0, ptr.shape[0])
    elif rank_of(ptr.type) == 2:
        index = tl.arange(0, ptr.shape[0])[:, None] * ptr.shape[1] + tl.arange(0, ptr.shape[1])[None, :]
    else:
        tl.static_assert(rank_of(ptr.type) == 3, "device ops take blocks of 1 to 3 dimensions")
        rows = tl.arange(0, ptr.shape[0])[:, None, None] * (ptr.shape[1] * ptr.shape[2])
        index = rows + tl.arange(0, ptr.shape[1])[None, :, None] * ptr.shape[2]
        index = index + tl.arange(0, ptr.shape[2])[None, None, :]
    return index
