"""Writers that turn a merged Iris trace into files viewers open (``viewer_exports`` is their old name).

Example:
    >>> from iris_trace.export import write_chrome_json, write_perfetto
    >>> write_perfetto(trace, "run.pftrace")      # ui.perfetto.dev
    >>> write_chrome_json(trace, "run.json")      # chrome://tracing
"""

from .chrome import write_chrome_json
from .perfetto import write_perfetto

__all__ = ["write_chrome_json", "write_perfetto"]
