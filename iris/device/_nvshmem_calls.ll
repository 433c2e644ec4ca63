; Iris's calls into NVSHMEM's device library, linked into every kernel of a job whose
; device ops take the cross-node path on GPUs (iris/device/_crossnode_cuda.py calls them;
; iris/backends/cuda_nvshmem.py links this file, then libnvshmem_device.bc, into each kernel).
;
; Why a layer of our own between Triton and NVSHMEM:
;
; * Masks. A Triton extern call has no mask, so each element-wise call takes a predicate
;   and skips the NVSHMEM call where it is zero (a masked-off get returns `other`).
; * Replicated elements. Triton lays small blocks, and every scalar, out over more threads
;   than they have elements, so an extern call runs once per thread that holds a copy. A
;   repeated put or get is harmless (same value); a repeated atomic is not. The atomics
;   here are scalar: thread 0 of the CTA issues the NVSHMEM call and hands the old value to
;   every thread through a shared-memory word, between two CTA barriers. Every thread of
;   the CTA must therefore call them together, as Triton calls a scalar operation.
; * Types. Data moves as raw 8/16/32/64-bit words (NVSHMEM's uint<N> calls), so one set
;   of functions serves every dtype; floats are reinterpreted, not converted.
;
; The barriers and the thread index are inline PTX rather than NVVM intrinsics, whose
; names change between the LLVM versions of the Triton releases we support.

declare void @nvshmem_uint8_p(ptr, i8, i32)
declare void @nvshmem_uint16_p(ptr, i16, i32)
declare void @nvshmem_uint32_p(ptr, i32, i32)
declare void @nvshmem_uint64_p(ptr, i64, i32)
declare i8 @nvshmem_uint8_g(ptr, i32)
declare i16 @nvshmem_uint16_g(ptr, i32)
declare i32 @nvshmem_uint32_g(ptr, i32)
declare i64 @nvshmem_uint64_g(ptr, i32)
declare i32 @nvshmem_uint32_atomic_fetch_add(ptr, i32, i32)
declare i32 @nvshmem_uint32_atomic_swap(ptr, i32, i32)
declare i32 @nvshmem_uint32_atomic_fetch_and(ptr, i32, i32)
declare i32 @nvshmem_uint32_atomic_fetch_or(ptr, i32, i32)
declare i32 @nvshmem_uint32_atomic_fetch_xor(ptr, i32, i32)
declare i32 @nvshmem_uint32_atomic_compare_swap(ptr, i32, i32, i32)
declare i64 @nvshmem_uint64_atomic_fetch_add(ptr, i64, i32)
declare i64 @nvshmem_uint64_atomic_swap(ptr, i64, i32)
declare i64 @nvshmem_uint64_atomic_fetch_and(ptr, i64, i32)
declare i64 @nvshmem_uint64_atomic_fetch_or(ptr, i64, i32)
declare i64 @nvshmem_uint64_atomic_fetch_xor(ptr, i64, i32)
declare i64 @nvshmem_uint64_atomic_compare_swap(ptr, i64, i64, i32)
declare void @nvshmem_quiet()
declare void @nvshmemx_putmem_block(ptr, ptr, i64, i32)
declare void @nvshmemx_getmem_block(ptr, ptr, i64, i32)

; The word through which thread 0 hands an atomic's old value to the other threads.
@iris_xn_shared_word = internal addrspace(3) global i64 undef, align 8

define internal i32 @iris_xn_thread() {
  %tid = call i32 asm "mov.u32 $0, %tid.x;", "=r"()
  ret i32 %tid
}

; Nothing moves across it, though no instruction is emitted: a get in a spin loop is
; read again on every turn (NVSHMEM's get within a node is a plain load, which LLVM
; would otherwise hoist out of a loop that writes no memory).
define internal void @iris_xn_compiler_fence() {
  call void asm sideeffect "", "~{memory}"()
  ret void
}

define internal void @iris_xn_barrier() #0 {
  call void asm sideeffect "bar.sync 0;", "~{memory}"() #0
  ret void
}

; ---------------------------------------------------------------- element-wise puts
define i32 @iris_xn_put8(i32 %pred, i64 %addr, i8 %value, i32 %pe) {
entry:
  %go = icmp ne i32 %pred, 0
  br i1 %go, label %issue, label %done
issue:
  %p = inttoptr i64 %addr to ptr
  call void @nvshmem_uint8_p(ptr %p, i8 %value, i32 %pe)
  br label %done
done:
  ret i32 0
}

define i32 @iris_xn_put16(i32 %pred, i64 %addr, i16 %value, i32 %pe) {
entry:
  %go = icmp ne i32 %pred, 0
  br i1 %go, label %issue, label %done
issue:
  %p = inttoptr i64 %addr to ptr
  call void @nvshmem_uint16_p(ptr %p, i16 %value, i32 %pe)
  br label %done
done:
  ret i32 0
}

define i32 @iris_xn_put32(i32 %pred, i64 %addr, i32 %value, i32 %pe) {
entry:
  %go = icmp ne i32 %pred, 0
  br i1 %go, label %issue, label %done
issue:
  %p = inttoptr i64 %addr to ptr
  call void @nvshmem_uint32_p(ptr %p, i32 %value, i32 %pe)
  br label %done
done:
  ret i32 0
}

define i32 @iris_xn_put64(i32 %pred, i64 %addr, i64 %value, i32 %pe) {
entry:
  %go = icmp ne i32 %pred, 0
  br i1 %go, label %issue, label %done
issue:
  %p = inttoptr i64 %addr to ptr
  call void @nvshmem_uint64_p(ptr %p, i64 %value, i32 %pe)
  br label %done
done:
  ret i32 0
}

; ---------------------------------------------------------------- element-wise gets
define i8 @iris_xn_get8(i32 %pred, i64 %addr, i8 %other, i32 %pe) {
entry:
  %go = icmp ne i32 %pred, 0
  br i1 %go, label %issue, label %done
issue:
  %p = inttoptr i64 %addr to ptr
  call void @iris_xn_compiler_fence()
  %v = call i8 @nvshmem_uint8_g(ptr %p, i32 %pe)
  br label %done
done:
  %r = phi i8 [ %v, %issue ], [ %other, %entry ]
  ret i8 %r
}

define i16 @iris_xn_get16(i32 %pred, i64 %addr, i16 %other, i32 %pe) {
entry:
  %go = icmp ne i32 %pred, 0
  br i1 %go, label %issue, label %done
issue:
  %p = inttoptr i64 %addr to ptr
  call void @iris_xn_compiler_fence()
  %v = call i16 @nvshmem_uint16_g(ptr %p, i32 %pe)
  br label %done
done:
  %r = phi i16 [ %v, %issue ], [ %other, %entry ]
  ret i16 %r
}

define i32 @iris_xn_get32(i32 %pred, i64 %addr, i32 %other, i32 %pe) {
entry:
  %go = icmp ne i32 %pred, 0
  br i1 %go, label %issue, label %done
issue:
  %p = inttoptr i64 %addr to ptr
  call void @iris_xn_compiler_fence()
  %v = call i32 @nvshmem_uint32_g(ptr %p, i32 %pe)
  br label %done
done:
  %r = phi i32 [ %v, %issue ], [ %other, %entry ]
  ret i32 %r
}

define i64 @iris_xn_get64(i32 %pred, i64 %addr, i64 %other, i32 %pe) {
entry:
  %go = icmp ne i32 %pred, 0
  br i1 %go, label %issue, label %done
issue:
  %p = inttoptr i64 %addr to ptr
  call void @iris_xn_compiler_fence()
  %v = call i64 @nvshmem_uint64_g(ptr %p, i32 %pe)
  br label %done
done:
  %r = phi i64 [ %v, %issue ], [ %other, %entry ]
  ret i64 %r
}

; ---------------------------------------------------------------- scalar atomics
; %op: 0 fetch-add, 1 swap, 2 fetch-and, 3 fetch-or, 4 fetch-xor, 5 compare-swap
; (%compare is read only by 5). Returns the old value in every thread of the CTA.
define i32 @iris_xn_amo32(i32 %op, i64 %addr, i32 %value, i32 %compare, i32 %pe) #0 {
entry:
  %tid = call i32 @iris_xn_thread()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %issue, label %share
issue:
  %p = inttoptr i64 %addr to ptr
  switch i32 %op, label %cas [
    i32 0, label %add
    i32 1, label %swap
    i32 2, label %and
    i32 3, label %or
    i32 4, label %xor
  ]
add:
  %r0 = call i32 @nvshmem_uint32_atomic_fetch_add(ptr %p, i32 %value, i32 %pe)
  br label %publish
swap:
  %r1 = call i32 @nvshmem_uint32_atomic_swap(ptr %p, i32 %value, i32 %pe)
  br label %publish
and:
  %r2 = call i32 @nvshmem_uint32_atomic_fetch_and(ptr %p, i32 %value, i32 %pe)
  br label %publish
or:
  %r3 = call i32 @nvshmem_uint32_atomic_fetch_or(ptr %p, i32 %value, i32 %pe)
  br label %publish
xor:
  %r4 = call i32 @nvshmem_uint32_atomic_fetch_xor(ptr %p, i32 %value, i32 %pe)
  br label %publish
cas:
  %r5 = call i32 @nvshmem_uint32_atomic_compare_swap(ptr %p, i32 %compare, i32 %value, i32 %pe)
  br label %publish
publish:
  %old = phi i32 [ %r0, %add ], [ %r1, %swap ], [ %r2, %and ], [ %r3, %or ], [ %r4, %xor ], [ %r5, %cas ]
  %wide = zext i32 %old to i64
  store i64 %wide, ptr addrspace(3) @iris_xn_shared_word, align 8
  br label %share
share:
  call void @iris_xn_barrier() #0
  %word = load i64, ptr addrspace(3) @iris_xn_shared_word, align 8
  call void @iris_xn_barrier() #0
  %result = trunc i64 %word to i32
  ret i32 %result
}

define i64 @iris_xn_amo64(i32 %op, i64 %addr, i64 %value, i64 %compare, i32 %pe) #0 {
entry:
  %tid = call i32 @iris_xn_thread()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %issue, label %share
issue:
  %p = inttoptr i64 %addr to ptr
  switch i32 %op, label %cas [
    i32 0, label %add
    i32 1, label %swap
    i32 2, label %and
    i32 3, label %or
    i32 4, label %xor
  ]
add:
  %r0 = call i64 @nvshmem_uint64_atomic_fetch_add(ptr %p, i64 %value, i32 %pe)
  br label %publish
swap:
  %r1 = call i64 @nvshmem_uint64_atomic_swap(ptr %p, i64 %value, i32 %pe)
  br label %publish
and:
  %r2 = call i64 @nvshmem_uint64_atomic_fetch_and(ptr %p, i64 %value, i32 %pe)
  br label %publish
or:
  %r3 = call i64 @nvshmem_uint64_atomic_fetch_or(ptr %p, i64 %value, i32 %pe)
  br label %publish
xor:
  %r4 = call i64 @nvshmem_uint64_atomic_fetch_xor(ptr %p, i64 %value, i32 %pe)
  br label %publish
cas:
  %r5 = call i64 @nvshmem_uint64_atomic_compare_swap(ptr %p, i64 %compare, i64 %value, i32 %pe)
  br label %publish
publish:
  %old = phi i64 [ %r0, %add ], [ %r1, %swap ], [ %r2, %and ], [ %r3, %or ], [ %r4, %xor ], [ %r5, %cas ]
  store i64 %old, ptr addrspace(3) @iris_xn_shared_word, align 8
  br label %share
share:
  call void @iris_xn_barrier() #0
  %word = load i64, ptr addrspace(3) @iris_xn_shared_word, align 8
  call void @iris_xn_barrier() #0
  ret i64 %word
}

; ---------------------------------------------------------------- block transfers
; One run of consecutive bytes, moved by NVSHMEM's CTA-collective calls: every thread of
; the CTA calls these with the same arguments. The barrier before makes what any thread
; of the CTA wrote to the source visible to the threads that move it; the one after,
; what a get brought to every thread. The put is complete at the next quiet (its source
; may be reused on return), the get on return.
define i32 @iris_xn_putmem_block(i64 %dest, i64 %source, i64 %bytes, i32 %pe) #0 {
  call void @iris_xn_barrier() #0
  %d = inttoptr i64 %dest to ptr
  %s = inttoptr i64 %source to ptr
  call void @nvshmemx_putmem_block(ptr %d, ptr %s, i64 %bytes, i32 %pe)
  call void @iris_xn_barrier() #0
  ret i32 0
}

define i32 @iris_xn_getmem_block(i64 %dest, i64 %source, i64 %bytes, i32 %pe) #0 {
  call void @iris_xn_barrier() #0
  %d = inttoptr i64 %dest to ptr
  %s = inttoptr i64 %source to ptr
  call void @nvshmemx_getmem_block(ptr %d, ptr %s, i64 %bytes, i32 %pe)
  call void @iris_xn_barrier() #0
  ret i32 0
}

; ---------------------------------------------------------------- completion
; Every thread completes the puts it issued, then the CTA meets, so a release that
; follows (a signal, issued by one thread) comes after every thread's puts.
define i32 @iris_xn_quiet() #0 {
  call void @nvshmem_quiet()
  call void @iris_xn_barrier() #0
  ret i32 0
}

attributes #0 = { convergent }
