"""The backend interface: what host code may ask a backend instead of branching on its name."""

import pytest
import torch

from iris.backends import make_backend, process_environment


def test_a_new_process_gets_the_backend_and_the_interpreter_it_needs():
    assert process_environment("emulated") == {"IRIS_BACKEND": "emulated", "TRITON_INTERPRET": "1"}
    assert process_environment("cuda") == {"IRIS_BACKEND": "cuda"}


def test_the_emulated_backend_runs_launches_one_after_another():
    backend = make_backend("emulated")
    device = torch.device("cpu")
    assert backend.interpreted
    assert backend.completion_event(device) is None  # its work is done when the launch returns
    side = backend.side_stream(device)
    assert side is None
    order = []
    backend.run_beside(side, lambda: order.append("first"), lambda: order.append("second"))
    assert order == ["first", "second"]


def test_a_launch_cache_builds_once_and_keeps_the_latest_entries():
    from iris.host.prepared import LaunchCache

    built = []
    cache = LaunchCache(2)
    for key in ("a", "a", "b", "c", "a"):
        cache.get_or_build(key, lambda key=key: built.append(key) or key.upper())
    assert built == ["a", "b", "c", "a"]  # "a" was dropped for "c", then built again
    assert "a" in cache and "c" in cache and "b" not in cache and len(cache) == 2
    with pytest.raises(ZeroDivisionError):
        cache.get_or_build("d", lambda: 1 / 0)
    assert "d" not in cache and len(cache) == 2  # a failed build keeps nothing and drops nothing


class _RecordingBackend:
    """A backend that records plans as a GPU one would: capture returns a replay, unless capturing."""

    def __init__(self, calls):
        self.calls, self.recording, self.captured = calls, False, 0

    def capture(self, steps):
        if self.recording:
            return None
        self.captured += 1
        return lambda: self.calls.append("replay")

    def capturing(self):
        return self.recording


def test_a_captured_plan_runs_once_then_records_once_and_replays():
    from iris.host.prepared import CapturedPlan

    calls = []
    backend = _RecordingBackend(calls)
    plan = CapturedPlan([lambda: calls.append("step")], backend)
    for _ in range(3):
        plan()
    assert calls == ["step", "replay", "replay"] and backend.captured == 1


def test_a_captured_plan_inside_a_callers_recording_runs_its_steps():
    from iris.host.prepared import CapturedPlan

    calls = []
    backend = _RecordingBackend(calls)
    plan = CapturedPlan([lambda: calls.append("step")], backend)
    plan(), plan()  # recorded by now
    backend.recording = True  # the caller records its own graph: the steps must go into it
    plan()
    assert calls == ["step", "replay", "step"] and backend.captured == 1


def test_the_emulated_backend_records_nothing():
    from iris.host.prepared import CapturedPlan

    backend, calls = make_backend("emulated"), []
    assert backend.capture([lambda: calls.append("step")]) is None and not backend.capturing()
    plan = CapturedPlan([lambda: calls.append("step")], backend)
    plan(), plan()
    assert calls == ["step", "step"]


class _FailingBackend(_RecordingBackend):
    def capture(self, steps):
        self.captured += 1
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_plan_that_cannot_be_recorded_warns_once_and_runs_its_steps():
    from iris.host.prepared import CapturedPlan

    calls = []
    backend = _FailingBackend(calls)
    plan = CapturedPlan([lambda: calls.append("step")], backend)
    plan()
    with pytest.warns(RuntimeWarning, match="runs step by step"):
        plan()
    plan()
    assert calls == ["step"] * 3 and backend.captured == 1


def _fake_cuda_runtime(attributes):
    # Just enough of cuda.bindings.runtime for cudaDeviceGetAttribute (which answers
    # cudaErrorInvalidValue for an attribute not in ``attributes``).
    from types import SimpleNamespace

    names = ("cudaDevAttrMemoryClockRate", "cudaDevAttrGlobalMemoryBusWidth")
    return SimpleNamespace(
        cudaDeviceAttr=SimpleNamespace(**{name: name for name in names}),
        cudaError_t=SimpleNamespace(cudaSuccess=0),
        cudaGetErrorName=lambda err: (0, b"cudaErrorInvalidValue"),
        cudaDeviceGetAttribute=lambda name, index: (0, attributes[name]) if name in attributes else (1, 0),
    )


def test_the_cuda_backend_reads_peak_memory_bandwidth_from_clock_and_bus(monkeypatch):
    from iris.backends import cuda_ipc

    # An H200 as its driver describes it: 3.2 GHz (in kHz) on a 6144-bit bus.
    h200 = {"cudaDevAttrMemoryClockRate": 3_201_000, "cudaDevAttrGlobalMemoryBusWidth": 6144}
    monkeypatch.setattr(cuda_ipc, "_runtime", lambda: _fake_cuda_runtime(h200))
    bandwidth = cuda_ipc.CudaBackend().memory_bandwidth(torch.device("cuda", 0))
    assert bandwidth == pytest.approx(4.917e12, rel=1e-3)


def test_memory_bandwidth_is_zero_where_it_is_not_known(monkeypatch):
    from iris.backends import cuda_ipc

    monkeypatch.setattr(cuda_ipc, "_runtime", lambda: _fake_cuda_runtime({"cudaDevAttrMemoryClockRate": 1}))
    assert cuda_ipc.CudaBackend().memory_bandwidth(torch.device("cuda", 0)) == 0.0
    assert make_backend("emulated").memory_bandwidth(torch.device("cpu")) == 0.0


def test_each_backends_device_primitives_define_every_name():
    import importlib

    from iris.device import intrinsics

    for module in ("iris.device._intrinsics_cuda", "iris.device._intrinsics_emulated"):
        missing = [name for name in intrinsics.NAMES if not hasattr(importlib.import_module(module), name)]
        assert not missing, (module, missing)
