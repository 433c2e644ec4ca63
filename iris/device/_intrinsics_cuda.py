"""Hardware primitives for NVIDIA GPUs, written as PTX inline assembly."""

import triton
import triton.language as tl


@triton.jit
def load_acquire(pointer, scope: tl.constexpr):
    """Read a 32- or 64-bit flag with acquire semantics at ``scope`` (sys, gpu or cta)."""
    tl.static_assert(scope == "sys" or scope == "gpu" or scope == "cta", "scope must be sys, gpu or cta")
    bits: tl.constexpr = pointer.dtype.element_ty.primitive_bitwidth
    tl.static_assert(bits == 32 or bits == 64, "flags must be 32 or 64 bits wide")
    if bits == 64:
        raw = tl.inline_asm_elementwise(
            "ld.acquire." + scope + ".global.b64 $0, [$1];",
            "=l,l",
            [pointer.to(tl.int64)],
            dtype=tl.int64,
            is_pure=False,
            pack=1,
        )
    else:
        raw = tl.inline_asm_elementwise(
            "ld.acquire." + scope + ".global.b32 $0, [$1];",
            "=r,l",
            [pointer.to(tl.int64)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
    return raw.to(pointer.dtype.element_ty, bitcast=True)


@triton.jit
def spin_start():
    """Marks the start of a spin-wait (used by the emulator's timeout)."""
    return 0


@triton.jit
def spin_check(start, pointer, seen, expected, op: tl.constexpr):
    """Called on every spin iteration; a no-op on GPUs."""
    pass


@triton.jit
def device_check(condition, message: tl.constexpr):
    """Fails the kernel with ``message`` where ``condition`` is false (debug builds)."""
    tl.device_assert(condition, message)


@triton.jit
def timer_ns():
    """The GPU's %globaltimer in nanoseconds (not synchronised across GPUs)."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def sm_id():
    """The SM this program runs on (%smid)."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
