"""The cuda backend for jobs whose device ops reach other nodes: a heap NVSHMEM can address.

Within one node the cuda backend maps every peer's heap through CUDA IPC. A rank on
another node cannot be mapped, so a job that spans nodes needs two things more, and
this module is where both live:

* **The heap is NVSHMEM memory.** It comes from PyTorch's symmetric memory with its
  NVSHMEM backend (``torch.distributed._symmetric_memory``), which starts NVSHMEM on
  the job's process group, so the address of an object on the heap is the address
  NVSHMEM's device calls take (with the target rank as the PE). Peers on this node are
  still mapped (NVSHMEM hands out their pointers, ``nvshmem_ptr``) and reached with
  plain loads and stores at full NVLink speed; only ops to other nodes become NVSHMEM
  calls (``iris/device/_crossnode_cuda.py``).
* **Every kernel links NVSHMEM's device library.** A device op may take the cross-node
  path in any kernel, the user's included, so every kernel this process compiles links
  ``_nvshmem_calls.ll`` and ``libnvshmem_device.bc`` (Triton's ``extern_libs``), and
  every module that uses them is initialised for NVSHMEM after it is loaded
  (``nvshmemx_cumodule_init``, through PyTorch). PyTorch's ``requires_nvshmem`` does the
  same for one decorated kernel; here no decoration is needed.

NVSHMEM refuses several processes on one GPU without MPS, so ranks that share a GPU
(``IRIS_RANKS_PER_GPU``) cannot take this path; the error says so. One rank can
(``IRIS_CROSS_NODE_ALWAYS=1`` sends its ops to itself through NVSHMEM), which is how the
path is checked on a machine with one GPU.
"""

from __future__ import annotations

import glob
import os

import torch

from .. import _env
from .base import Allocation, outside_memory_refused
from .cuda_ipc import _PAGE, CudaBackend

#: Iris's calls into NVSHMEM (LLVM IR), linked before NVSHMEM's own library.
NVSHMEM_CALLS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "device", "_nvshmem_calls.ll")
#: Room NVSHMEM keeps beside the heap for PyTorch's own symmetric buffers (signal pads).
_NVSHMEM_SPARE_BYTES = 512 << 20
_INSTALL_HINT = (
    "install NVSHMEM's wheel for your CUDA (pip install nvidia-nvshmem-cu13 or -cu12) with a torch "
    "built with NVSHMEM support"
)


def nvshmem_device_library(capability: tuple[int, int] | None = None) -> str:
    """Path of NVSHMEM's device bitcode: ``NVSHMEM_LIB_DIR``, else where PyTorch finds it.

    NVSHMEM's wheels ship one ``libnvshmem_device.bc`` or, in newer releases, one per
    architecture (``libnvshmem_device_sm_90.bc``); either is taken.

    Example:
        >>> nvshmem_device_library((9, 0))
        '.../site-packages/nvidia/nvshmem/lib/libnvshmem_device.bc'
    """
    from torch.distributed._symmetric_memory._nvshmem_triton import NvshmemLibFinder

    try:
        return NvshmemLibFinder.find_device_library()
    except RuntimeError as exc:
        searched = [os.environ.get("NVSHMEM_LIB_DIR", "")]
        try:
            import nvidia.nvshmem

            searched += [os.path.join(p, "lib") for p in nvidia.nvshmem.__path__]
        except ImportError:
            pass
        arch = f"sm_{capability[0]}{capability[1]}" if capability else "sm_*"
        for directory in filter(None, searched):
            found = sorted(glob.glob(os.path.join(directory, f"libnvshmem_device_{arch}.bc")))
            if found:
                return found[-1]
        raise RuntimeError(
            f"iris: NVSHMEM's device library (libnvshmem_device*.bc) was not found ({exc}); "
            f"{_INSTALL_HINT}, or set NVSHMEM_LIB_DIR to the directory that holds it"
        ) from exc


class NvshmemBackend(CudaBackend):
    """The cuda backend with an NVSHMEM heap and NVSHMEM linked into every kernel."""

    name = "cuda"

    def __init__(self):
        super().__init__()
        import torch.distributed._symmetric_memory as symmetric_memory

        if not symmetric_memory.is_nvshmem_available():
            raise RuntimeError(
                "iris: this job reaches ranks on other nodes (or IRIS_CROSS_NODE_ALWAYS=1), which needs "
                f"NVSHMEM, and torch finds none: {_INSTALL_HINT}"
            )
        self._symmetric_memory = symmetric_memory
        self._heap: _NvshmemHeap | None = None
        _link_nvshmem_into_every_kernel(nvshmem_device_library(torch.cuda.get_device_capability()))

    def check_nodes(self, num_nodes: int) -> None:
        pass  # other nodes are reached through NVSHMEM

    def outside_memory(self, tensor: torch.Tensor):
        return outside_memory_refused("across nodes the heap is NVSHMEM's, which maps nothing else")

    def allocate(self, nbytes: int, device: torch.device, tag: str) -> Allocation:
        if self.shares_devices(_env.local_world_size()):
            raise RuntimeError(
                "iris: NVSHMEM does not run several ranks on one GPU (it needs MPS for that), so ranks "
                "that share a GPU (IRIS_RANKS_PER_GPU) cannot take the cross-node path; give each rank a "
                "GPU of its own"
            )
        # NVSHMEM frees memory collectively (every PE at once), which garbage collection
        # cannot promise, so a heap's memory is never given back: a later heap reuses it.
        # Every rank creates and closes its heaps at the same points, so every rank picks
        # the same one.
        heap = next((h for h in _HEAPS if not h.in_use and h.capacity >= nbytes and h.device == device), None)
        if heap is None:
            heap = _NvshmemHeap(self._symmetric_memory, nbytes, device)
            _HEAPS.append(heap)
        heap.in_use = True
        self._heap = heap
        tensor = heap.raw[heap.skip : heap.skip + nbytes]
        return Allocation(tensor=tensor, handle=(heap.rank, heap.skip), owner=heap)

    def map_peer(self, handle, nbytes: int, device: torch.device):
        rank, skip = handle
        if skip != self._heap.skip:
            raise RuntimeError(
                f"iris: NVSHMEM placed rank {rank}'s heap {skip} bytes past a page, this rank's "
                f"{self._heap.skip}: the heap bases cannot be aligned alike"
            )
        return self._heap.bases[rank], None

    def unmap_peer(self, token) -> None:
        pass  # NVSHMEM owns the mappings

    def free(self, allocation: Allocation) -> None:
        torch.cuda.synchronize()
        allocation.owner.in_use = False  # kept for the next heap (see allocate)

    def complete_remote_writes(self) -> None:
        from ..device._crossnode_cuda import quiet_kernel

        quiet_kernel[(1,)]()


class _NvshmemHeap:
    """One NVSHMEM allocation that backs a symmetric heap, and every rank's base of it."""

    def __init__(self, symmetric_memory, nbytes: int, device: torch.device):
        import torch.distributed as dist

        # NVSHMEM sizes its symmetric heap when it starts (at the first allocation).
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(nbytes + 2 * _PAGE + _NVSHMEM_SPARE_BYTES))
        symmetric_memory.set_backend("NVSHMEM")
        try:
            self.raw = symmetric_memory.empty(nbytes + _PAGE, dtype=torch.uint8, device=device)
        except RuntimeError as exc:
            raise RuntimeError(
                f"iris: NVSHMEM could not allocate a {nbytes}-byte heap ({exc}); NVSHMEM_SYMMETRIC_SIZE "
                f"({os.environ['NVSHMEM_SYMMETRIC_SIZE']} bytes) must hold every heap of the process"
            ) from exc
        self.device = device
        self.capacity = nbytes
        self.in_use = False
        # Page-aligned bases keep the translated pointers' alignment (iris.device.rma.translate).
        # NVSHMEM places an allocation at the same offset of every PE's heap, so the skip is
        # the same everywhere; map_peer checks it.
        self.skip = (-self.raw.data_ptr()) % _PAGE
        own = self.raw.data_ptr() + self.skip
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        if world > 1:
            # Peers NVSHMEM can map (this node's) get a pointer; the others 0.
            handle = symmetric_memory.rendezvous(self.raw, dist.group.WORLD.group_name)
            pointers = [int(p) for p in handle.buffer_ptrs]
        else:
            pointers = [self.raw.data_ptr()]  # PyTorch's rendezvous wants two ranks; one needs none
        # A rank on another node has no pointer here: its entry is this rank's own base,
        # the symmetric address NVSHMEM's calls take.
        self.bases = [p + self.skip if p else own for p in pointers]


#: Every NVSHMEM heap this process allocated, for reuse (NvshmemBackend.allocate).
_HEAPS: list[_NvshmemHeap] = []


def _link_nvshmem_into_every_kernel(device_library: str) -> None:
    """Make every kernel this process compiles link NVSHMEM, and initialise the ones that use it.

    Triton takes extra bitcode per launch (``extern_libs``); the CUDA compiler's option
    parsing is the one place every launch passes through, so the libraries are added
    there, and they become part of each kernel's cache key. Idempotent.
    """
    import triton
    from triton.backends.nvidia.compiler import CUDABackend as TritonCudaCompiler

    parse = TritonCudaCompiler.parse_options
    if getattr(parse, "iris_links_nvshmem", False):
        return
    libraries = {"iris_nvshmem_calls": NVSHMEM_CALLS, "libnvshmem_device": device_library}

    def parse_options(self, options):
        options = dict(options)
        # Ours first: the linker pulls only what is already referenced, so the calls must
        # come before the library they call.
        options["extern_libs"] = {**libraries, **dict(options.get("extern_libs") or ())}
        return parse(self, options)

    parse_options.iris_links_nvshmem = True
    TritonCudaCompiler.parse_options = parse_options
    triton.knobs.runtime.jit_post_compile_hook = _initialise_module


def _initialise_module(*args, **kwargs) -> None:
    # Triton's post-compile hook: a module that calls NVSHMEM must learn where NVSHMEM's
    # device state is before its first launch.
    from torch._C._distributed_c10d import _nvshmemx_cumodule_init

    function = kwargs["fn"].jit_function
    kernel = function.device_caches[kwargs["compile"]["device"]][0].get(kwargs["key"])
    if kernel is None or "nvshmemi_device_state_d" not in kernel.asm.get("ptx", ""):
        return
    kernel._init_handles()
    _nvshmemx_cumodule_init(kernel.module)
