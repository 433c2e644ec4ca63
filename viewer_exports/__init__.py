"""The old name of :mod:`iris_trace.export` (the Perfetto and Chrome JSON writers), kept for old programs.

Example:
    >>> from viewer_exports import write_perfetto   # same as: from iris_trace.export import write_perfetto
"""

import sys

from iris_trace import export
from iris_trace.export import chrome, perfetto, validate, wire, write_chrome_json, write_perfetto

# ``import viewer_exports.perfetto`` and the like find the modules under their new name.
for _module in (chrome, perfetto, validate, wire):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module

__all__ = ["export", "write_chrome_json", "write_perfetto"]
