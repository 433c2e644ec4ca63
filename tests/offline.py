"""Run a compile check of ``tests/codegen/`` with the CUDA backend but no GPU (Triton compiles PTX offline).

The checks are scripts, runnable by hand as well (``IRIS_BACKEND=cuda python
tests/codegen/inspect_ptx.py``); the codegen tests run them in a process of their own,
since the backend is chosen at ``import iris``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODEGEN = os.path.join(ROOT, "tests", "codegen")


def run_cuda_script(name: str, *args: str, timeout: float = 600) -> str:
    """Stdout of ``tests/codegen/<name> args`` under ``IRIS_BACKEND=cuda``; a non-zero exit fails the test."""
    path = [CODEGEN, ROOT, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "IRIS_BACKEND": "cuda", "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    env.pop("TRITON_INTERPRET", None)  # set by importing iris in the (emulated) test process
    # The checks are of the default build: settings that change what is compiled stay out.
    for setting in (
        "IRIS_WAIT_TIMEOUT",
        "IRIS_DEBUG",
        "IRIS_FLIGHT",
        "IRIS_FLIGHT_ENTRIES",
        "IRIS_CROSS_NODE_ALWAYS",
    ):
        env.pop(setting, None)
    result = subprocess.run(
        [sys.executable, os.path.join(CODEGEN, name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@contextlib.contextmanager
def codegen_importable():
    """Import pure-Python helpers of ``tests/codegen/`` (ones that neither set the backend nor compile)."""
    sys.path.insert(0, CODEGEN)
    try:
        yield
    finally:
        sys.path.remove(CODEGEN)
