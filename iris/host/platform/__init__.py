"""Upstream's platform module paths: device queries (``iris.hip``) and ``iris.do_bench``.

Upstream keeps its HIP runtime bindings in ``iris.host.platform.hip`` and its timing
helper in ``iris.host.platform.utils``; programs call ``iris.hip.get_num_xcc()``,
``iris.hip.get_wall_clock_rate(...)`` and ``iris.do_bench(...)``. Here the same names
answer for the backend's devices (NVIDIA GPUs, or the emulation's CPU), through the
backend interface.
"""
