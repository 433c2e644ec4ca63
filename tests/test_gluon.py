"""iris.gluon: upstream's Gluon device API runs the same device ops in @gluon.jit kernels.

Gluon kernels are compiled, never interpreted: the kernels run in GPU passes
(IRIS_BACKEND=cuda), the offline sm_90 compile runs everywhere, and under emulation a
launch says in one line that it needs a GPU.
"""

import json

import numpy as np
import pytest
import torch
from conftest import get_pool
from kernels import gluon_every_op
from offline import run_cuda_script

import iris
from iris.gluon import GluonDeviceTracing, IrisDeviceCtx
from iris_trace.events import EVENT_NAMES

ON_GPU = iris.BACKEND == "cuda"
BLOCK = 128
OPS = ("load", "store", "put", "get", "atomic_add", "atomic_max", "atomic_cas", "signal", "wait_until")


def _every_op_body(rank, world_size, traced):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.arange(BLOCK, dtype=torch.float32)
        buf += 1000 * rank  # in place: on the heap, where peers read it
        out = ctx.full((4 * BLOCK,), float("nan"))
        flags = ctx.zeros(4, dtype=torch.int32)
        if traced:
            ctx.tracing.enable(max_events=1 << 12)
        ctx.barrier()
        gluon_every_op[(1,)](
            IrisDeviceCtx, ctx.get_device_context(), buf, out, flags, BLOCK=BLOCK, num_warps=4
        )
        ctx.barrier()
        left, right = (rank - 1) % world_size, (rank + 1) % world_size
        values = torch.arange(BLOCK, dtype=torch.float32)
        expected = torch.cat(
            [values + 1000 * right, values + 1000 * left, values + 1000 * left, values + 1000 * right]
        )
        torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)
        assert flags.cpu().tolist() == [1, left + 1, left + 1, 1]
        return ctx.tracing.collect() if traced else None


@pytest.mark.skipif(not ON_GPU, reason="Gluon kernels run on GPUs only (IRIS_BACKEND=cuda)")
def test_every_op_through_the_gluon_context_matches_what_each_peer_holds(world):
    world.run(_every_op_body, False)


@pytest.mark.skipif(not ON_GPU, reason="Gluon kernels run on GPUs only (IRIS_BACKEND=cuda)")
def test_a_traced_gluon_kernel_records_every_op_with_its_line(world):
    trace = world.run(_every_op_body, True)[0]
    names = {EVENT_NAMES[int(e)] for e in np.unique(trace.events["event_id"])}
    assert set(OPS) <= names, names
    lines = {trace.sites[s].line for s in np.unique(trace.events["site"]).tolist()}
    report = _compiled()
    assert {report["ops"][op] for op in OPS} <= lines


def _emulated_launch_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        buf, flags = ctx.zeros(4 * BLOCK), ctx.zeros(4, dtype=torch.int32)
        with pytest.raises(RuntimeError, match="cannot run under the emulation backend") as raised:
            gluon_every_op[(1,)](IrisDeviceCtx, ctx.get_device_context(), buf, buf, flags, BLOCK=BLOCK)
        return str(raised.value)


@pytest.mark.skipif(ON_GPU, reason="the emulation backend's refusal")
def test_under_emulation_a_gluon_launch_says_it_needs_a_gpu():
    message = get_pool(1).run(_emulated_launch_body)[0]
    assert "gluon_every_op" in message and "IRIS_BACKEND=cuda" in message and "\n" not in message


def _compiled() -> dict:
    return json.loads(run_cuda_script("compile_gluon.py").strip().splitlines()[-1])


@pytest.mark.codegen
def test_the_gluon_context_compiles_for_hopper_with_call_sites_only_when_traced():
    report = _compiled()
    assert report["untraced"]["sites"] == []
    assert sorted(line for _, _, line in report["traced"]["sites"]) == sorted(report["ops"].values())
    assert report["untraced"]["sys_atomics"] >= 3  # the add, the max, the compare-and-swap at least


def test_upstreams_gluon_names_are_this_packages():
    from iris.device import context, gluon

    assert IrisDeviceCtx is gluon.IrisDeviceCtx and GluonDeviceTracing is context.DeviceTracing


def _ccl_compiled() -> dict:
    return json.loads(run_cuda_script("compile_gluon_ccl.py").strip().splitlines()[-1])


@pytest.mark.codegen
def test_the_gluon_collectives_compile_for_hopper_with_their_handshakes_and_vector_stores():
    report = _ccl_compiled()
    for name in ("all_gather", "all_to_all", "all_gather_small", "all_to_all_small"):
        for variant in ("untraced", "traced"):
            assert report[f"{name}/{variant}"]["atomics"] > 0, (name, variant)  # the handshakes
    # Whole vectors, as the layouts promise (all-to-all's traced stores go element-wise, as in Triton).
    assert (
        report["all_gather/untraced"]["vector_stores"] > 0
        and report["all_gather/traced"]["vector_stores"] > 0
    )
    assert report["all_to_all/untraced"]["vector_stores"] > 0
