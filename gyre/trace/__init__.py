"""Token-level traces of model calls, trajectory trees, admission and packing.

Pure data and algorithms: no torch, no I/O beyond reading/writing trace files.
"""

from .record import TRACE_FORMAT_VERSION, OutputSegment, TraceFormatError, TraceRecord
from .store import TraceReadResult, TraceWriter, read_trace, trace_path

__all__ = [
    "TRACE_FORMAT_VERSION",
    "OutputSegment",
    "TraceFormatError",
    "TraceRecord",
    "TraceReadResult",
    "TraceWriter",
    "read_trace",
    "trace_path",
]
