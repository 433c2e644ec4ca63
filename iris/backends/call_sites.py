"""Where traced ops were called from, and which launches ran them: this process's tables.

A trace record carries two 24-bit tags (``iris_trace.schema``): the id of the source line
that called the op, fixed when the kernel is compiled, and the tag of the launch that ran
it, read at run time. The backends fill the two tables here: :data:`SITES` (id -> kernel,
file, line), from each kernel's compile (``_cuda_call_sites``) or, under emulation, from
the interpreter's frames; and :data:`LAUNCHES`, the launches of kernels that have call
sites while tracing is on. ``ctx.tracing.collect()`` puts both, for the events it holds,
into the rank file, where ``iris_trace.sites`` names every event's kernel, launch and line.
"""

from __future__ import annotations

from iris_trace import schema
from iris_trace.sites import Site

#: Call sites this process has compiled or run, by id.
SITES: dict[int, Site] = {}
#: Ids that two different call sites hash to (24 bits: rare, but possible): their events
#: name the first one remembered, and the trace says so.
SHARED: set[int] = set()


def register(kernel: str, file: str, line: int) -> int:
    """The id of a call site (``schema.site_id``), remembered in :data:`SITES`.

    Example:
        >>> site = register("my_kernel", "/work/app.py", 42)
        >>> SITES[site].line
        42
    """
    return remember(schema.site_id(kernel, file, line), kernel, file, line)


def remember(site: int, kernel: str, file: str, line: int) -> int:
    """Put call site ``site`` in :data:`SITES` as a compiled kernel names it (its id as given).

    Example:
        >>> remember(4102, "my_kernel", "/work/app.py", 42)
        4102
    """
    named = Site(str(kernel), str(file), int(line))
    first = SITES.setdefault(int(site), named)
    if first != named and (first.kernel, first.line) != (named.kernel, named.line):
        SHARED.add(int(site))  # not merely the same line in another copy of its file
    return int(site)


class LaunchLog:
    """The launches of kernels with call sites, in order, while :attr:`on` (tracing is enabled):
    ``(kernel, grid, tag)`` each, the tag None where the host cannot know it (on GPUs).

    Example:
        >>> LAUNCHES.note("my_kernel", (8, 1, 1))
    """

    def __init__(self):
        self.on = False
        self.entries: list[tuple[str, tuple[int, int, int] | None, int | None]] = []

    def note(self, kernel: str, grid, tag: int | None = None) -> None:
        if self.on:
            grid = None if grid is None else tuple(int(g) for g in (*grid, 1, 1)[:3])
            self.entries.append((str(kernel), grid, tag))

    def clear(self) -> None:
        self.entries.clear()


LAUNCHES = LaunchLog()
