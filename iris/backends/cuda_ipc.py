"""CUDA backend: one ``cudaMalloc`` heap per GPU, shared with peers through CUDA IPC.

Memory comes straight from the CUDA runtime (not PyTorch's caching allocator) so
the heap is exactly one allocation whose IPC handle maps from its first byte.
"""

from __future__ import annotations

import ctypes
import os
import sys
import weakref

import torch

from .. import _env
from . import _cuda_call_sites, _cuda_topology
from .base import Allocation, Backend, CopyLanes, byte_interface, describe_bytes, outside_memory_refused


def _runtime():
    try:
        from cuda.bindings import runtime
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError(
            "iris: the CUDA backend needs NVIDIA's cuda-bindings (pip install 'cuda-bindings')"
        ) from exc
    return runtime


def _check(result, what: str):
    """Unpack a cuda-bindings result tuple, raising on any error code."""
    runtime = _runtime()
    err, *values = result
    if err != runtime.cudaError_t.cudaSuccess:
        _, name = runtime.cudaGetErrorName(err)
        raise RuntimeError(f"iris: {what} failed with {name.decode()}")
    return values[0] if len(values) == 1 else values


_IPC_HANDLE_BYTES = 64
_PAGE = 2 << 20


def _handle_to_bytes(handle) -> bytes:
    # Some cuda-bindings releases expose the 64-byte handle only as raw struct memory.
    return ctypes.string_at(handle.getPtr(), _IPC_HANDLE_BYTES)


def _handle_from_bytes(data: bytes):
    handle = _runtime().cudaIpcMemHandle_t()
    ctypes.memmove(handle.getPtr(), data, _IPC_HANDLE_BYTES)
    return handle


class _DeviceBuffer:
    """Exposes a raw device pointer to torch through ``__cuda_array_interface__``.

    With ``owned``, the buffer frees the memory (``cudaFree``) when it goes, and the
    tensors torch makes of it keep it alive: the heap's memory is returned once neither
    the context nor any tensor of the heap is left, and never while a tensor still views it.
    """

    def __init__(self, address: int, nbytes: int, owned: bool = False):
        self.__cuda_array_interface__ = byte_interface(address, nbytes)
        if owned:
            weakref.finalize(self, _free_device_memory, address)


def _free_device_memory(address: int) -> None:
    # cudaFree waits for the work queued on the memory; an error (a device already
    # gone at exit) has nowhere to go but the log.
    try:
        _check(_runtime().cudaFree(address), "cudaFree")
    except Exception as error:  # noqa: BLE001 - called by the garbage collector
        sys.stderr.write(f"iris: freeing the heap at {address:#x} failed: {error}\n")


class _StreamLanes(CopyLanes):
    """One CUDA stream per lane; copies are ``cudaMemcpy2DAsync`` (a DMA copy engine, no SM)."""

    def __init__(self, device: torch.device, count: int):
        self._device = device
        self._streams: list[torch.cuda.Stream | None] = [None] * count
        self._forked: torch.cuda.Event | None = None
        self._waited: set[int] = set()  # lanes that already wait for the latest fork
        self._used: set[int] = set()  # lanes with work the current stream has not joined
        self._memcpy = self._device_to_device = self._success = None

    def _stream(self, lane: int) -> torch.cuda.Stream:
        stream = self._streams[lane]
        if stream is None:
            stream = self._streams[lane] = torch.cuda.Stream(self._device)
        if lane not in self._waited:
            if self._forked is not None:
                stream.wait_event(self._forked)
            self._waited.add(lane)
        self._used.add(lane)
        return stream

    def fork(self) -> None:
        self._forked = torch.cuda.Event()
        self._forked.record(torch.cuda.current_stream(self._device))
        self._waited.clear()

    def copy_2d(self, lane, dst, dst_pitch, src, src_pitch, width, rows):
        if self._memcpy is None:
            runtime = _runtime()
            self._memcpy = runtime.cudaMemcpy2DAsync
            self._device_to_device = runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice
            self._success = runtime.cudaError_t.cudaSuccess
        stream = self._stream(lane)
        # Called for every put of every plan replay: no per-call lookups on the happy path.
        result = self._memcpy(
            dst, dst_pitch, src, src_pitch, width, rows, self._device_to_device, stream.cuda_stream
        )
        if result[0] != self._success:
            _check(result, "cudaMemcpy2DAsync")

    def run(self, lane, launch):
        with torch.cuda.stream(self._stream(lane)):
            launch()

    def join(self) -> None:
        current = torch.cuda.current_stream(self._device)
        for lane in sorted(self._used):
            current.wait_stream(self._streams[lane])
        self._used.clear()


class CudaBackend(Backend):
    name = "cuda"
    interpreted = False

    def __init__(self):
        self._side_streams: dict[int, torch.cuda.Stream] = {}
        self._capture_streams: dict[int, torch.cuda.Stream] = {}

    def log_launches(self, on: bool) -> None:
        # Triton's launch hook notes each launch with its grid (the GPU numbers launches itself).
        _cuda_call_sites.log_launches(on)

    @property
    def dist_backend(self) -> str:
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): ranks that share
        # GPUs coordinate through gloo alone, which also takes CUDA tensors for the
        # collectives it implements.
        return "gloo" if self.shares_devices(_env.local_world_size()) else "nccl"

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def shares_devices(self, local_world_size: int) -> bool:
        count = visible_gpu_count()
        return 0 < count < local_world_size and _env.ranks_per_gpu() > 1

    def select_device(self, local_rank: int, local_world_size: int) -> torch.device:
        count = self.device_count()
        if count == 0:
            raise RuntimeError("iris: IRIS_BACKEND=cuda but no CUDA GPU is visible")
        index = gpu_for_rank(local_rank, local_world_size, count, _env.ranks_per_gpu())
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        _check(_runtime().cudaSetDevice(device.index), "cudaSetDevice")
        return device

    def multiprocessor_count(self, device: torch.device) -> int:
        return torch.cuda.get_device_properties(device).multi_processor_count

    def current_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def set_current_device(self, index: int) -> None:
        torch.cuda.set_device(index)

    def architecture(self, device: torch.device) -> str:
        properties = torch.cuda.get_device_properties(device)
        return f"sm_{properties.major}{properties.minor}"

    def timing_event(self):
        return torch.cuda.Event(enable_timing=True)

    def memory_bandwidth(self, device: torch.device) -> float:
        # Double data rate: two transfers per memory clock (kHz) over the bus (bits).
        runtime = _runtime()

        def attribute(name: str) -> int:
            which = getattr(runtime.cudaDeviceAttr, name)
            return _check(runtime.cudaDeviceGetAttribute(which, device.index), name)

        try:
            clock_khz = attribute("cudaDevAttrMemoryClockRate")
            bus_bits = attribute("cudaDevAttrGlobalMemoryBusWidth")
        except (RuntimeError, AttributeError):  # an attribute this driver or binding lacks
            return 0.0
        return 2.0 * clock_khz * 1e3 * bus_bits / 8

    def device_name(self, device: torch.device) -> str:
        return torch.cuda.get_device_name(device)

    def describe_gpu(self, device: torch.device) -> dict:
        return _cuda_topology.describe_gpu(device)

    def local_links(self) -> dict:
        return _cuda_topology.local_links()

    def clock_domain(self, device: torch.device) -> str:
        # %globaltimer is per GPU: ranks on one GPU (IRIS_RANKS_PER_GPU) share it.
        return f"gpu:{torch.cuda.get_device_properties(device).uuid}"

    def heap_problem(self, nbytes: int, device: torch.device) -> str:
        padded = self.padded_size(nbytes, device)
        local = _env.local_world_size()
        sharing = -(-local // visible_gpu_count()) if self.shares_devices(local) else 1
        free, total = torch.cuda.mem_get_info(device)
        if padded * sharing <= free:
            return ""
        ranks = (
            f" ({describe_bytes(padded * sharing)} for the {sharing} ranks that share it)"
            if sharing > 1
            else ""
        )
        return (
            f"a heap of {describe_bytes(padded)} per rank{ranks} does not fit on {device}, which has "
            f"{describe_bytes(free)} of {describe_bytes(total)} free: lower heap_size"
        )

    def allocation_granularity(self, device: torch.device) -> int:
        return _PAGE

    def allocate(self, nbytes: int, device: torch.device, tag: str) -> Allocation:
        runtime = _runtime()
        # Whole 2 MiB pages: the allocation is never sub-allocated, so its IPC handle
        # maps from the heap's first byte and every base is page aligned.
        padded = self.padded_size(nbytes, device)
        address = int(_check(runtime.cudaMalloc(padded), f"cudaMalloc({padded} bytes)"))
        handle = _check(runtime.cudaIpcGetMemHandle(address), "cudaIpcGetMemHandle")
        tensor = torch.as_tensor(_DeviceBuffer(address, nbytes, owned=True), device=device)
        return Allocation(tensor=tensor, handle=_handle_to_bytes(handle), owner=address)

    def map_peer(self, handle, nbytes: int, device: torch.device):
        runtime = _runtime()
        ipc_handle = _handle_from_bytes(handle)
        address = int(
            _check(
                runtime.cudaIpcOpenMemHandle(ipc_handle, runtime.cudaIpcMemLazyEnablePeerAccess),
                "cudaIpcOpenMemHandle",
            )
        )
        return address, address

    def unmap_peer(self, token) -> None:
        _check(_runtime().cudaIpcCloseMemHandle(token), "cudaIpcCloseMemHandle")

    def free(self, allocation: Allocation) -> None:
        pass  # the memory goes with the last tensor of it (_DeviceBuffer)

    def outside_memory(self, tensor: torch.Tensor):
        return outside_memory_refused("this heap is one cudaMalloc allocation")

    def host_visible_zeros(self, count: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        # Pinned memory is mapped into every GPU's address space; unlike a registered
        # file mapping it works whatever filesystem the flight files live on.
        tensor = torch.zeros(count, dtype=dtype, device="cpu", pin_memory=True)
        address = _check(
            _runtime().cudaHostGetDevicePointer(tensor.data_ptr(), 0), "cudaHostGetDevicePointer"
        )
        return tensor, int(address)

    def copy_while_running(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        # A non-blocking stream of its own: kernels that spin on the default stream do
        # not hold the copy back (the copy engine needs no SM).
        with torch.cuda.device(source.device):
            stream = self._side_streams.get(source.device.index)
            if stream is None:
                stream = self._side_streams[source.device.index] = torch.cuda.Stream(source.device)
            with torch.cuda.stream(stream):
                destination.copy_(source, non_blocking=True)
            stream.synchronize()

    def copy_lanes(self, device: torch.device, count: int) -> CopyLanes:
        return _StreamLanes(device, count)

    def wait_value(self, flag: torch.Tensor, value: int) -> None:
        from cuda.bindings import driver

        if flag.dtype != torch.int32 or not flag.is_cuda:
            raise TypeError(f"iris: wait_value needs an int32 CUDA tensor, got {flag.dtype} on {flag.device}")
        stream = driver.CUstream(torch.cuda.current_stream(flag.device).cuda_stream)
        geq = driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        (err,) = driver.cuStreamWaitValue32(stream, driver.CUdeviceptr(flag.data_ptr()), value, geq)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"iris: cuStreamWaitValue32 failed with {err!r}")

    def capture(self, steps):
        if torch.cuda.is_current_stream_capturing():
            return None
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream()
        # A stream of its own (capture cannot run on the default stream); unlike
        # torch.cuda.graph this neither synchronizes the device nor empties the
        # allocator's cache, which a caller's loop would pay for at every new plan.
        side = self._capture_streams.get(current.device.index)
        if side is None:
            side = self._capture_streams[current.device.index] = torch.cuda.Stream(current.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            # thread_local: torch.distributed's watchdog thread may query its events meanwhile.
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                for step in steps:
                    step()
            finally:
                graph.capture_end()
        current.wait_stream(side)
        return graph.replay

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def completion_event(self, device: torch.device):
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event

    def side_stream(self, device: torch.device):
        return torch.cuda.Stream(device=device)

    def run_beside(self, side, first, second, hold=None) -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)  # the side's kernels must not see work queued before
        first()
        with torch.cuda.stream(side):
            if hold is not None:
                self.wait_value(*hold)
            second()
        main.wait_stream(side)

    def synchronize(self, device: torch.device, stream=None) -> None:
        if stream is None:
            torch.cuda.synchronize(device)
        else:
            stream.synchronize()


def gpu_for_rank(local_rank: int, local_world_size: int, gpus: int, ranks_per_gpu: int) -> int:
    """The GPU of a host's rank ``local_rank``: ``local_rank mod gpus``; raises when the ranks do not fit.

    Example:
        >>> gpu_for_rank(3, 4, gpus=2, ranks_per_gpu=2)
        1
    """
    if local_world_size > gpus * ranks_per_gpu:
        if ranks_per_gpu == 1:
            needed = -(-local_world_size // gpus)
            advice = (
                f"start at most one rank per GPU, or set IRIS_RANKS_PER_GPU={needed} to let ranks "
                "share GPUs (for correctness runs, traces and teaching: kernels of ranks on one GPU "
                "take turns, so timings mean nothing)"
            )
        else:
            advice = f"IRIS_RANKS_PER_GPU={ranks_per_gpu} allows at most {gpus * ranks_per_gpu}: raise it"
        raise RuntimeError(f"iris: {local_world_size} ranks on this host but only {gpus} GPU(s); {advice}")
    return local_rank % gpus


def visible_gpu_count() -> int:
    """GPUs this process may use, without creating a CUDA context."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
