"""What CUDA lets a heap do with memory allocated outside it (``as_symmetric``'s question).

Upstream's ``as_symmetric`` maps an outside tensor's memory into the symmetric heap.
On NVIDIA that needs the memory's virtual-memory handle (``cuMemRetainAllocationHandle``),
which only memory made with ``cuMemCreate`` has, and a heap that is itself a
virtual-address reservation to map it into. These tests keep the facts that
docs/upstream.md states true on the GPU machines; each case runs in a fresh
interpreter because PyTorch reads its allocator settings once.
"""

import json
import os
import subprocess
import sys

import pytest

import iris

pytestmark = pytest.mark.skipif(iris.BACKEND != "cuda", reason="asks the CUDA driver: GPUs only")

# Prints one JSON object: what the driver says about a fresh torch tensor's memory, and
# whether that memory maps at a second address of a new reservation (an alias), the step a
# virtual-memory heap would take to take it in.
_PROBE = r"""
import json
import torch
from cuda.bindings import driver

def ok(result):
    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(driver.cuGetErrorName(err)[1].decode())
    return values[0] if len(values) == 1 else values

facts = {}
t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
torch.cuda.synchronize()
address = t.data_ptr()
err, handle = driver.cuMemRetainAllocationHandle(address)
facts["retain"] = driver.cuGetErrorName(err)[1].decode()
if err == driver.CUresult.CUDA_SUCCESS:
    try:
        props = ok(driver.cuMemGetAllocationPropertiesFromHandle(handle))
        facts["handle_types"] = int(props.requestedHandleTypes)
        base, size = ok(driver.cuMemGetAddressRange(address))
        facts["range_bytes"] = int(size)
        facts["offset"] = address - int(base)
        # The handle's own size is not asked of the driver: try the range, then PyTorch's
        # segment sizes (20 MiB large, 2 MiB small).
        for size in dict.fromkeys((int(size), 20 << 20, 2 << 20)):
            window = int(ok(driver.cuMemAddressReserve(size, 0, 0, 0)))
            if driver.cuMemMap(window, size, 0, handle, 0)[0] == driver.CUresult.CUDA_SUCCESS:
                break
            ok(driver.cuMemAddressFree(window, size))
        else:
            raise RuntimeError("cuMemMap refused every size")
        facts["mapped_bytes"] = size
        access = driver.CUmemAccessDesc()
        access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = torch.cuda.current_device()
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        ok(driver.cuMemSetAccess(window, size, [access], 1))
        offset = address - int(base)

        class View:
            __cuda_array_interface__ = {
                "shape": (t.numel(),), "typestr": "<f4", "data": (window + offset, False), "version": 3,
            }

        seen = torch.as_tensor(View(), device="cuda")
        facts["alias_reads"] = bool(torch.equal(seen, t))
        seen.fill_(7.0)
        torch.cuda.synchronize()
        facts["alias_writes"] = bool((t == 7.0).all().item())
        err, fd = driver.cuMemExportToShareableHandle(
            handle, driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0
        )
        facts["export_fd"] = driver.cuGetErrorName(err)[1].decode()
        del seen
        ok(driver.cuMemUnmap(window, size))
        ok(driver.cuMemAddressFree(window, size))
        ok(driver.cuMemRelease(handle))
    except Exception as exc:
        facts["failed"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(facts))
"""


def _probe(allocator_settings: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if allocator_settings:
        env["PYTORCH_CUDA_ALLOC_CONF"] = allocator_settings
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    print(allocator_settings, facts)  # the run's log keeps the facts the docs quote
    return facts


def test_memory_from_torchs_default_allocator_has_no_handle_to_map_elsewhere():
    facts = _probe(None)
    assert facts["retain"] != "CUDA_SUCCESS", facts


def test_memory_from_torchs_expandable_segments_maps_at_a_second_address():
    facts = _probe("expandable_segments:True")
    assert facts["retain"] == "CUDA_SUCCESS", facts
    assert facts.get("alias_reads") and facts.get("alias_writes"), facts


def test_memory_from_torchs_expandable_segments_can_be_shared_as_a_file_descriptor():
    facts = _probe("expandable_segments:True")
    assert facts.get("export_fd") == "CUDA_SUCCESS", facts
