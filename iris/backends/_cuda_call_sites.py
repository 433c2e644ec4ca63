"""The site pass: each traced op's call site gets its id in the compiled kernel.

A traced op's record carries the id of the source line that called it
(``iris_trace.schema.site_id``). The device recorder reads it through
``intrinsics.call_site()``, which compiles to a placeholder move (:data:`PLACEHOLDER_ASM`),
marked so it cannot be merged. Triton inlines every ``@triton.jit`` helper, so each call
of a traced op leaves its own copy of the placeholder in the kernel's LLVM IR, with a debug
location whose ``inlinedAt`` chain runs from the recorder out to the kernel. The pass runs
on that IR, a step added after Triton's LLVM stage (``knobs.runtime.add_stages_inspection_hook``):
for each copy it walks the chain outward to the first frame outside the ``iris`` package
(the user's line; the kernel's own line for Iris's kernels), replaces the placeholder
with that line's id, and lists the sites in the kernel's metadata (``iris_sites``), which
Triton keeps beside the binary in its cache. A kernel loaded while tracing is on, from
the cache too, hands its sites to :data:`iris.backends.call_sites.SITES`.

So the id costs a kernel one immediate move, fixed at compile time, and only in traced
variants (an untraced kernel has no recorder, so nothing changes in its code).

**Launches.** A record's launch tag is the GPU's launch number (``%gridid``), which the
host never sees. While tracing is enabled (:func:`log_launches`), Triton's launch hook
notes each launch of a kernel with sites, in order, with its grid (which the compiled
kernel's ``launch_metadata`` adds for the hook while launches are logged);
``iris_trace.sites.name_launches`` pairs them with the tags. Launches that bypass
Triton's launcher (Iris's prepared launches of its collectives, fused ops and device
barrier, a replayed CUDA graph) are not noted; their kernels' launches then keep their
order but no grid.
"""

from __future__ import annotations

import json
import os
import re

from . import call_sites

#: The pass's version, in the marker every placeholder carries: the placeholder is a
#: constant the recorder reads, so it is part of every traced kernel's cache key (and
#: Triton 3.9 asks the pass for its share of the key), and a change to the pass
#: recompiles every traced kernel.
PASS_VERSION = "iris.site/2"
MARKER = "// " + PASS_VERSION
#: What ``intrinsics.call_site()`` compiles to before this pass.
PLACEHOLDER_ASM = "mov.u32 $0, 0; " + MARKER
_PLACEHOLDER_IN_IR = re.escape('asm sideeffect "' + PLACEHOLDER_ASM + '"')
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assign_sites(llir: str) -> tuple[str, list[list]]:
    """``llir`` with every placeholder given its call site's id, and the sites as ``[id, file, line]``.

    Example:
        >>> llir, sites = assign_sites(llir)
    """
    if MARKER not in llir:
        return llir, []
    kernel = re.search(r"^define [^@]*@\"?([\w.$]+)\"?\(", llir, re.M).group(1)
    nodes = dict(re.findall(r"^!(\d+) = (?:distinct )?(.*)$", llir, re.M))
    sites: dict[int, tuple[str, int]] = {}

    def give_id(match: re.Match) -> str:
        file, line = _outermost_user_frame(nodes, match.group(2))
        site = call_sites.register(kernel, file, line)
        sites[site] = (file, line)
        return match.group(0).replace(PLACEHOLDER_ASM, PLACEHOLDER_ASM.replace(" 0;", f" {site};"))

    llir = re.sub(rf"^.*{_PLACEHOLDER_IN_IR}(.*), !dbg !(\d+)\s*$", give_id, llir, flags=re.M)
    return llir, [[site, file, line] for site, (file, line) in sorted(sites.items())]


def _outermost_user_frame(nodes: dict[str, str], location: str) -> tuple[str, int]:
    # Walk a DILocation's inlinedAt chain outward; the first frame outside the package,
    # else the last (the kernel's own line).
    frame = None
    while location is not None:
        node = nodes[location]
        line = int(re.search(r"\bline: (\d+)", node).group(1))
        frame = (_file_of(nodes, re.search(r"\bscope: !(\d+)", node).group(1)), line)
        if not frame[0].startswith(_PACKAGE + os.sep):
            return frame
        inlined = re.search(r"\binlinedAt: !(\d+)", node)
        location = inlined.group(1) if inlined else None
    return frame


def _file_of(nodes: dict[str, str], scope: str) -> str:
    # A scope (subprogram, lexical block) names its DIFile; the file, as a full path.
    node = nodes[scope]
    if node.startswith("!DIFile("):
        name = re.search(r'filename: "([^"]*)"', node).group(1)
        directory = re.search(r'directory: "([^"]*)"', node)
        return os.path.join(directory.group(1), name) if directory else name
    return _file_of(nodes, re.search(r"\bfile: !(\d+)", node).group(1))


def _site_stage(stages, options, language, capability) -> None:
    # Triton's stages hook: the pass runs on the LLVM IR each kernel's LLVM stage makes.
    make_llir = stages["llir"]

    def llir_with_sites(src, metadata):
        llir, sites = assign_sites(make_llir(src, metadata))
        if sites:
            metadata["iris_sites"] = sites
        return llir

    stages["llir"] = llir_with_sites


def _register_loaded(module, function, name, metadata_group, hash) -> None:
    # Triton's kernel-load hook: a kernel from the cache brings its sites with it.
    path = next((p for key, p in (metadata_group or {}).items() if key.endswith(".json")), None)
    if path is None:
        return
    try:
        with open(path) as handle:
            sites = json.load(handle).get("iris_sites") or []
        named = [(int(site), str(file), int(line)) for site, file, line in sites]
    except (OSError, ValueError, TypeError, AttributeError):
        return  # unreadable or not ours: the kernel's events name no line
    for site, file, line in named:
        call_sites.remember(site, str(name), file, line)
    if named:
        _WITH_SITES.add(function)


#: The launch functions of kernels with sites (their launches are logged).
_WITH_SITES: set[int] = set()


def _grid_of(grid) -> dict:
    return {"iris_grid": tuple(grid)}


def _launch_metadata_with_grid(original):
    # CompiledKernel.launch_metadata, adding the grid of a kernel with sites (the launch
    # hook sees only what this returns, and Triton adds the grid only for a kernel that
    # has a launch_metadata function of its own).
    def launch_metadata(self, grid, stream, *args):
        data = original(self, grid, stream, *args)
        if data is not None and self.function in _WITH_SITES:
            data.add(_grid_of, (grid,))
        return data

    launch_metadata.iris_original = original
    return launch_metadata


def _note_launch(launch_metadata) -> None:
    # Triton's launch hook, while launches are logged.
    if launch_metadata is None:
        return
    data = launch_metadata.get()
    if data.get("function") in _WITH_SITES:
        call_sites.LAUNCHES.note(data["name"], data.get("iris_grid"))


# Iris's prepared launches keep their fast path while only this hook is installed
# (iris.host.prepared): they are not logged.
_note_launch.iris_launch_log = True


def log_launches(on: bool) -> None:
    """Note launches of kernels with sites in ``call_sites.LAUNCHES``, with grids, while ``on``.

    Example:
        >>> log_launches(True)
    """
    from triton import knobs
    from triton.compiler.compiler import CompiledKernel

    call_sites.LAUNCHES.on = bool(on)
    current = CompiledKernel.launch_metadata
    if on:
        # Traced kernels load only once tracing is on, so untraced processes never read
        # metadata back; the hook stays for the process (it is idempotent).
        knobs.runtime.kernel_load_end_hook.add(_register_loaded)
        if not hasattr(current, "iris_original"):
            CompiledKernel.launch_metadata = _launch_metadata_with_grid(current)
        knobs.runtime.launch_enter_hook.add(_note_launch)
    else:
        knobs.runtime.launch_enter_hook.remove(_note_launch)
        CompiledKernel.launch_metadata = getattr(current, "iris_original", current)


def install() -> None:
    """Add the site pass to Triton's compiler (idempotent); :func:`log_launches` adds the
    load hook that reads a cached kernel's sites back.

    A stages hook installed before is kept and runs first.
    """
    from triton import knobs

    previous = knobs.runtime.add_stages_inspection_hook
    if getattr(previous, "iris_sites", False):
        return

    def add_stages(backend=None, stages=None, options=None, language=None, capability=None):
        if stages is None:  # Triton 3.9 asks each launch and compile for the hook's share of the cache key
            key, digest = previous() if previous is not None else ("", "")
            return key + "-" + PASS_VERSION, digest + PASS_VERSION
        if previous is not None:
            previous(backend, stages, options, language, capability)
        _site_stage(stages, options, language, capability)

    add_stages.iris_sites = True
    knobs.runtime.add_stages_inspection_hook = add_stages
