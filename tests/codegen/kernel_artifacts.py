"""Compile a kernel offline with IRIS_KERNEL_ARTIFACTS_DIR set and list what was written.

Usage: IRIS_BACKEND=cuda IRIS_KERNEL_ARTIFACTS_DIR=DIR python tests/codegen/kernel_artifacts.py
Prints one line per directory with files: its path under DIR, then its files.
"""

import os
import sys

import triton
from inspect_ptx import PUT_SIGNATURE, put_kernel
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import iris

if iris.BACKEND != "cuda":
    sys.exit("run with IRIS_BACKEND=cuda (no GPU is needed)")

signature = {**PUT_SIGNATURE, "src": "*fp16", "dst": "*fp16", "BLOCK": "constexpr"}
for block in (1024, 2048, 1024):  # the third compiles the first again: the same code, no new directory
    triton.compile(ASTSource(put_kernel, signature, {"BLOCK": block}), target=GPUTarget("cuda", 90, 32))
root = os.environ["IRIS_KERNEL_ARTIFACTS_DIR"]
for directory, _, names in sorted(os.walk(root)):
    if names:
        print(os.path.relpath(directory, root), " ".join(sorted(names)))
