"""Every compiled kernel's code, kept on disk: ``IRIS_KERNEL_ARTIFACTS_DIR``.

With ``IRIS_KERNEL_ARTIFACTS_DIR=DIR``, each kernel specialization this process compiles
(Iris's collectives, fused ops and barriers, and the user's own ``@triton.jit`` kernels)
is written out with what each compiler stage made of it, so that a change in generated
code can be seen and diffed without rerunning the job::

    DIR/<algorithm>/<kernel>/rank_<r>/<specialization>/<codegen hash>/
        kernel.ttir  kernel.ttgir  kernel.llir  kernel.ptx  kernel.cubin  kernel.sass
        metadata.json     (kernel, module, rank, constexprs, signature, warps, stages,
                           shared memory, Triton's hash, ...)

``algorithm`` is the collective or fused op that launched the kernel (``all_reduce``,
``matmul_all_gather``, whichever protocol module holds the kernel), else the Iris module the
kernel lives in (``barrier``), the name given to :func:`iris_launch` or :func:`filed_under`,
or for a user's kernel its source file's stem. ``specialization`` names the constexprs
(``BLOCK_SIZE_M=128`` as ``BM128``), the element type of the first pointer and the warps;
the codegen hash is the SHA-256 of the machine code (the cubin), so a recompilation that
changes the code gets a directory of its own beside the old one. Registers are not in
metadata.json: Triton knows them only once a kernel is loaded on a GPU, after it is written.

Mechanism: Triton calls a compilation listener (``triton.knobs.compilation.listener``) for
every kernel it compiles or takes from its cache, with the kernel's source object and the
paths of every stage's output in Triton's cache. The listener is installed only when the
variable is set (a listener the program had is still called), so with it unset nothing
is added to compiling or launching. A kernel already compiled in this process before
:func:`enable` (Triton keeps it in memory) is not compiled again, so it is not written:
set the variable before the job starts. Under the emulation backend kernels run in Triton's
interpreter and nothing is compiled: there is nothing to write, and a warning says so.

Each directory is written under a temporary name and renamed into place once complete,
so a reader never sees half a kernel, and an interrupted job leaves no partial directory.
``DIR`` must be a directory of this user's that others cannot write (made, mode 0700, if
it is missing), since everything below it is created by this process.

Example:
    $ IRIS_KERNEL_ARTIFACTS_DIR=$HOME/iris-artifacts torchrun --nproc-per-node 2 my_job.py
    $ ls $HOME/iris-artifacts/all_reduce/one_shot_kernel/rank_0/*/*/
    kernel.cubin  kernel.llir  kernel.ptx  kernel.sass  kernel.ttgir  kernel.ttir  metadata.json
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import re
import shutil
import tempfile
from datetime import datetime, timezone

from iris_trace import files

from ..log import WARNING, logger

#: Triton's stage outputs kept, by the suffix Triton's cache gives them, and the name each gets.
STAGES = {"ttir": "kernel.ttir", "ttgir": "kernel.ttgir", "llir": "kernel.llir", "ptx": "kernel.ptx"}
#: Longest specialization directory name; longer ones end in a hash of the rest.
_MAX_SPEC_NAME = 96

_state = {"directory": None, "rank": None, "previous": None, "listener": None}
# What iris_launch names for the launch in progress (per thread and task).
_algorithm: contextvars.ContextVar = contextvars.ContextVar("iris_artifact_algorithm", default=None)
_dtype: contextvars.ContextVar = contextvars.ContextVar("iris_artifact_dtype", default=None)


def is_enabled() -> bool:
    """Whether compiled kernels are being written out (``IRIS_KERNEL_ARTIFACTS_DIR`` or :func:`enable`).

    Example:
        >>> iris.host.tracing.kernel_artifacts.is_enabled()
        False
    """
    return _state["directory"] is not None


def enable(directory: str, rank: int | None = None) -> None:
    """Write every kernel compiled from now on under ``directory`` (see the module docstring).

    Args:
        directory (str): made (mode 0700) if missing; else it must be this user's and
            not writable by others.
        rank (int, optional): the rank in the paths; default: the Iris context's, else the
            launcher's ``RANK``, else 0.

    Raises:
        iris_trace.files.UnsafeFileError: ``directory`` is a link, another user's, or
            writable by others.

    Example:
        >>> kernel_artifacts.enable("/home/me/artifacts")
        >>> kernel[grid](x, n, BLOCK=256)        # writes .../kernel/rank_0/BLOCK256_fp32_w4/<hash>/
    """
    import triton

    directory = os.path.abspath(directory)
    if not os.path.lexists(directory):
        os.makedirs(directory, mode=0o700)
    files.check_private_directory(directory)
    if rank is not None:
        _state["rank"] = int(rank)
    if _state["directory"] is None:
        _state["previous"] = triton.knobs.compilation.listener
        _state["listener"] = _listener
        triton.knobs.compilation.listener = _listener
    _state["directory"] = directory


def disable() -> None:
    """Stop writing compiled kernels; the listener the program had before is put back.

    Example:
        >>> kernel_artifacts.disable()
    """
    import triton

    if _state["directory"] is None:
        return
    if triton.knobs.compilation.listener is _state["listener"]:
        triton.knobs.compilation.listener = _state["previous"]
    _state.update(directory=None, previous=None, listener=None)


def set_rank(rank: int) -> None:
    """The rank named in the paths from now on (the Iris context sets its own).

    Example:
        >>> kernel_artifacts.set_rank(ctx.get_rank())
    """
    _state["rank"] = int(rank)


def iris_launch(kernel_fn, grid, *args, algorithm: str, rank: int, dtype=None, **kwargs):
    """``kernel_fn[grid](*args, **kwargs)``, its artifacts filed under ``algorithm`` (upstream Iris's helper).

    Kernels compiled by any other launch are written out too; this only chooses the
    directory name and the element type in the specialization's name.

    Args:
        kernel_fn: a ``@triton.jit`` function.
        grid: its launch grid.
        algorithm (str): the first directory level (``"all_reduce"``).
        rank (int): this process's rank.
        dtype (torch.dtype, optional): named in the specialization's directory.

    Example:
        >>> iris_launch(my_kernel, (n_tiles,), out, inp, n, algorithm="my_reduce", rank=ctx.get_rank(),
        ...             dtype=out.dtype, BLOCK=1024)
    """
    if not is_enabled():
        return kernel_fn[grid](*args, **kwargs)
    set_rank(rank)
    with _filing(algorithm, dtype):
        return kernel_fn[grid](*args, **kwargs)


@contextlib.contextmanager
def _filing(algorithm: str, dtype):
    algorithm_token, dtype_token = _algorithm.set(str(algorithm)), _dtype.set(dtype)
    try:
        yield
    finally:
        _algorithm.reset(algorithm_token)
        _dtype.reset(dtype_token)


_NOT_FILING = contextlib.nullcontext()


def filed_under(algorithm: str, dtype=None):
    """A context in which compiled kernels are filed under ``algorithm`` (nothing when disabled).

    The library's collectives and fused ops use it, so that a collective's kernels are
    found under its name (``all_reduce``) whichever protocol module holds them.

    Example:
        >>> with kernel_artifacts.filed_under("my_reduce"):
        ...     my_kernel[grid](out, inp, n, BLOCK=1024)
    """
    if _state["directory"] is None:
        return _NOT_FILING
    return _filing(algorithm, dtype)


def enable_from_environment() -> None:
    """Start writing artifacts when ``IRIS_KERNEL_ARTIFACTS_DIR`` is set (at ``import iris``).

    Example:
        >>> kernel_artifacts.enable_from_environment()
    """
    import triton

    from ... import config

    directory = config.kernel_artifacts_dir()
    if directory is None:
        return
    if triton.knobs.runtime.interpret:
        logger.log(
            WARNING,
            "IRIS_KERNEL_ARTIFACTS_DIR is set, but kernels run in Triton's interpreter (the "
            "emulation backend) and nothing is compiled: no artifacts will be written",
            extra={"iris_internal": True},
        )
        return
    enable(directory)


# ---------------------------------------------------------------------------- the listener
def _listener(*, src, metadata, metadata_group, times, cache_hit) -> None:
    previous = _state["previous"]
    if previous is not None:
        previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)
    directory = _state["directory"]
    if directory is None or getattr(src, "fn", None) is None:
        return  # compiled from an IR file, not a kernel function: nothing to name it by
    try:
        _write(directory, src, metadata, metadata_group, cache_hit)
    except OSError as error:
        # A full disk must not fail the user's launch: say so once per kernel and go on.
        logger.log(
            WARNING,
            f"iris: could not write the artifacts of {_kernel_name(src)}: {error}",
            extra={"iris_internal": True},
        )


def _write(directory: str, src, metadata: dict, metadata_group: dict, cache_hit: bool) -> None:
    stage_paths = {name.rsplit(".", 1)[-1]: path for name, path in metadata_group.items()}
    cubin = _read(stage_paths.get("cubin"), binary=True)
    code = cubin if cubin is not None else (metadata.get("hash") or "").encode()
    codegen_hash = hashlib.sha256(code).hexdigest()[:12]
    constexprs = _constexprs(src)
    kernel = _kernel_name(src)
    parent = os.path.join(
        directory,
        _safe(_algorithm.get() or _algorithm_of(src.fn)),
        _safe(kernel),
        f"rank_{_rank()}",
        _spec_name(constexprs, _element_type(src, _dtype.get()), metadata.get("num_warps")),
    )
    target = os.path.join(parent, codegen_hash)
    if os.path.isdir(target):
        return  # this code is on disk already
    os.makedirs(parent, mode=0o700, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=f".{codegen_hash}.", suffix=".partial", dir=parent)
    try:
        written = []
        for stage, filename in STAGES.items():
            text = _read(stage_paths.get(stage), binary=False)
            if text is not None:
                _write_file(os.path.join(partial, filename), text)
                written.append(filename)
        if cubin is not None:
            _write_file(os.path.join(partial, "kernel.cubin"), cubin)
            written.append("kernel.cubin")
            sass = _disassemble(cubin)
            if sass:
                _write_file(os.path.join(partial, "kernel.sass"), sass)
                written.append("kernel.sass")
        record = _metadata(src, metadata, kernel, constexprs, codegen_hash, cache_hit, written)
        _write_file(os.path.join(partial, "metadata.json"), json.dumps(record, indent=2, default=str) + "\n")
        with contextlib.suppress(FileExistsError, OSError):
            os.rename(partial, target)  # another rank or thread may have filed the same code first
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _metadata(src, metadata, kernel, constexprs, codegen_hash, cache_hit, written) -> dict:
    target = metadata.get("target")
    return {
        "kernel_name": kernel,
        "module": src.fn.fn.__module__,
        "algorithm": _algorithm.get() or _algorithm_of(src.fn),
        "rank": _rank(),
        "codegen_hash": codegen_hash,
        "hash": metadata.get("hash"),
        "target": {
            "backend": getattr(target, "backend", None),
            "arch": getattr(target, "arch", None),
            "warp_size": getattr(target, "warp_size", None),
        },
        "constexprs": constexprs,
        "signature": {str(k): str(v) for k, v in getattr(src, "signature", {}).items()},
        "num_warps": metadata.get("num_warps"),
        "num_ctas": metadata.get("num_ctas"),
        "num_stages": metadata.get("num_stages"),
        "shared_memory_bytes": metadata.get("shared"),
        "triton_version": metadata.get("triton_version"),
        "from_triton_cache": cache_hit,
        "files": written,
        "timestamp": datetime.now(timezone.utc).isoformat(),
    }


def _kernel_name(src) -> str:
    return src.fn.fn.__name__


def _algorithm_of(jit_function) -> str:
    """The Iris module a kernel lives in (``iris.ccl.all_reduce`` -> ``all_reduce``), else its file's stem."""
    module = jit_function.fn.__module__ or ""
    if module == "iris" or module.startswith("iris."):
        return module.rsplit(".", 1)[-1]
    if module in ("", "__main__"):
        return os.path.splitext(os.path.basename(jit_function.fn.__code__.co_filename))[0]
    return module.rsplit(".", 1)[-1]


def _constexprs(src) -> dict:
    """The kernel's constexpr arguments by name (Triton keys them by argument index)."""
    names = src.fn.arg_names
    values = {}
    for key, value in getattr(src, "constants", {}).items():
        index = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        if isinstance(index, int) and 0 <= index < len(names):
            value = getattr(value, "value", value)
            simple = isinstance(value, (bool, int, float, str, type(None)))
            values[names[index]] = value if simple else repr(value)
    return values


def _element_type(src, dtype) -> str | None:
    if dtype is not None:
        return str(dtype).replace("torch.", "").replace("float", "fp").replace("bfp", "bf")
    for kind in getattr(src, "signature", {}).values():
        if isinstance(kind, str) and kind.startswith("*"):
            return kind.lstrip("*k")
    return None


def _spec_name(constexprs: dict, element_type: str | None, num_warps) -> str:
    """``BM128_BN64_fp16_w4``: the constexprs (``BLOCK_SIZE_M`` as ``BM``), element type and warps."""
    parts = []
    for name, value in constexprs.items():
        if isinstance(value, (bool, int)) or (isinstance(value, str) and len(value) <= 16):
            short = re.sub(r"^BLOCK_SIZE_(\w)$", r"B\1", name)
            parts.append(f"{short}{int(value) if isinstance(value, bool) else value}")
    if element_type:
        parts.append(element_type)
    if num_warps is not None:
        parts.append(f"w{num_warps}")
    name = _safe("_".join(parts) or "default")
    if len(name) > _MAX_SPEC_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = f"{name[: _MAX_SPEC_NAME - 11]}-{digest}"
    return name


def _safe(name: str) -> str:
    """A single path component: no separators, no leading dot."""
    return re.sub(r"[^\w.=+-]", "-", str(name)).lstrip(".") or "unnamed"


def _rank() -> int:
    if _state["rank"] is not None:
        return _state["rank"]
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _read(path: str | None, binary: bool):
    if path is None:
        return None
    try:
        with open(path, "rb" if binary else "r") as handle:
            return handle.read()
    except OSError:
        return None


def _write_file(path: str, content) -> None:
    with open(path, "wb" if isinstance(content, bytes) else "w") as handle:
        handle.write(content)


def _disassemble(cubin: bytes) -> str | None:
    """SASS through Triton's own ``cuobjdump`` (``None`` where it cannot run)."""
    try:
        from triton.tools.disasm import get_sass

        return get_sass(cubin)
    except Exception as error:  # noqa: BLE001 - a missing tool costs the SASS file only
        logger.log(
            WARNING,
            f"iris: no SASS for a kernel ({type(error).__name__}: {error})",
            extra={"iris_internal": True},
        )
        return None
