"""Compile to PTX and stop: the offline checks that read PTX alone skip ptxas and its machine code.

Inside ``with ptx_only():`` the backend's last stage (ptxas, PTX to cubin) gives an empty
cubin, through Triton's ``add_stages_inspection_hook``, and kernels are cached in a
directory of their own, so no empty cubin is ever handed to a launch or to a check that
reads registers or SASS (those compile outside the block). On two cores this takes a
third off compiling every collective.
"""

from __future__ import annotations

import contextlib
import os

from triton import knobs


def _no_cubin_after(previous):
    # The stages hook inside the block: the one installed before (Iris's site pass), then no cubin.
    def no_cubin(backend=None, stages=None, options=None, language=None, capability=None):
        # Called with no arguments for the cache key's share (Triton 3.9), with the stages otherwise.
        if stages is None:
            key, digest = previous() if previous is not None else ("", "")
            return key + "-ptx-only", digest + "ptx-only"
        if previous is not None:
            previous(backend, stages, options, language, capability)
        stages["cubin"] = lambda src, metadata: b""
        return None

    return no_cubin


@contextlib.contextmanager
def ptx_only():
    """Compiles inside the block stop at PTX, cached apart from complete kernels.

    Example:
        >>> with ptx_only():
        ...     ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    """
    directory, hook = knobs.cache.dir, knobs.runtime.add_stages_inspection_hook
    knobs.cache.dir = os.path.join(directory, "ptx-only")
    knobs.runtime.add_stages_inspection_hook = _no_cubin_after(hook)
    try:
        yield
    finally:
        knobs.cache.dir, knobs.runtime.add_stages_inspection_hook = directory, hook
