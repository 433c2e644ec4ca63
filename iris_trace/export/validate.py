"""Optional check of an exported trace with Perfetto's own trace processor.

The exporters are tested offline by parsing their output back; this goes one
step further when the user has a ``trace_processor_shell`` binary (nothing is
downloaded): it loads the trace as ui.perfetto.dev would and reports what the
trace processor saw, including every import error it counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProcessorCheck:
    """What the trace processor found in a trace."""

    slices: int
    flows: int
    tracks: int
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.errors


def check_with_trace_processor(trace_path: str, binary: str) -> ProcessorCheck:
    """Load ``trace_path`` with the trace processor at ``binary`` and count slices, flows and errors.

    Example:
        >>> result = check_with_trace_processor("run.pftrace", "/opt/perfetto/trace_processor_shell")
        >>> assert result.clean, result.errors
    """
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    config = TraceProcessorConfig(bin_path=binary)
    processor = TraceProcessor(trace=trace_path, config=config)
    try:

        def scalar(sql: str) -> int:
            return int(next(iter(processor.query(sql))).n)

        errors = {
            row.name: int(row.value)
            for row in processor.query(
                "select name, sum(value) as value from stats "
                "where severity in ('error', 'data_loss') and value > 0 group by name"
            )
        }
        return ProcessorCheck(
            slices=scalar("select count(*) as n from slice"),
            flows=scalar("select count(*) as n from flow"),
            tracks=scalar("select count(*) as n from track"),
            errors=errors,
        )
    finally:
        processor.close()
