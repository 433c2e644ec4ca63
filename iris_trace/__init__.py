"""Trace collection format, clock alignment, analysis and the ``iris-trace`` command line.

Importing it needs numpy only (no torch), so traces can be studied anywhere.

Example:
    >>> from iris_trace import Trace, analyze
    >>> trace = Trace.from_files(["traces/rank0.npz", "traces/rank1.npz"])
    >>> print(analyze(trace.events, trace.world_size).format_table())
"""

from . import check, diff
from .analysis import Report, analyze, analyze_trace
from .matching import match_releasers
from .trace import RankTrace, Trace, TraceFileError

__all__ = [
    "RankTrace",
    "Report",
    "Trace",
    "TraceFileError",
    "analyze",
    "analyze_trace",
    "check",
    "diff",
    "match_releasers",
]
