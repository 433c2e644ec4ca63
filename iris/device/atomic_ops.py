"""One read-modify-write on a block of pointers, by name: the dispatch every atomic path shares.

``rma`` applies it to a peer's mapped copy (within a node) and the emulated cross-node
path to the target's copy on the mapped heaps, so both give ``op`` the same meaning.
"""

import triton
import triton.language as tl


@triton.jit
def apply(op: tl.constexpr, pointer, val, mask, sem: tl.constexpr, scope: tl.constexpr):
    """``op`` (add, sub, xchg, xor, and, or, min, max) of ``val`` at ``pointer``; returns the old values.

    Example:
        >>> old = atomic_ops.apply("add", remote, 1, mask, "relaxed", "sys")
    """
    if op == "add":
        old = tl.atomic_add(pointer, val, mask=mask, sem=sem, scope=scope)
    elif op == "sub":
        old = tl.atomic_add(pointer, -val, mask=mask, sem=sem, scope=scope)
    elif op == "xchg":
        old = tl.atomic_xchg(pointer, val, mask=mask, sem=sem, scope=scope)
    elif op == "xor":
        old = tl.atomic_xor(pointer, val, mask=mask, sem=sem, scope=scope)
    elif op == "and":
        old = tl.atomic_and(pointer, val, mask=mask, sem=sem, scope=scope)
    elif op == "or":
        old = tl.atomic_or(pointer, val, mask=mask, sem=sem, scope=scope)
    elif op == "min":
        old = tl.atomic_min(pointer, val, mask=mask, sem=sem, scope=scope)
    else:
        tl.static_assert(op == "max", "unknown atomic op")
        old = tl.atomic_max(pointer, val, mask=mask, sem=sem, scope=scope)
    return old
