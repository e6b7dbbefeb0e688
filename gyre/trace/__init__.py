"""Token-level traces of model calls, trajectory trees, admission and packing.

Pure data and algorithms: no torch, no I/O beyond reading/writing trace files.
"""

# Trees, roles, admission and packing (trace helper; additive to the lead's exports).
from .admission import Admission, AdmittedPath, admit, execution_seed
from .packing import MicroStep, PackedSequence, PackingError, pack
from .record import TRACE_FORMAT_VERSION, OutputSegment, TraceFormatError, TraceRecord
from .roles import ROLE_ORDER, Condition, Role, RoleProfile, RoleRule, default_profile
from .store import TraceReadResult, TraceWriter, read_trace, trace_path
from .tree import TrajectoryTree, TreeBuildError, build_tree

__all__ = [
    "TRACE_FORMAT_VERSION",
    "OutputSegment",
    "TraceFormatError",
    "TraceRecord",
    "TraceReadResult",
    "TraceWriter",
    "read_trace",
    "trace_path",
    "Admission",
    "AdmittedPath",
    "admit",
    "execution_seed",
    "MicroStep",
    "PackedSequence",
    "PackingError",
    "pack",
    "ROLE_ORDER",
    "Condition",
    "Role",
    "RoleProfile",
    "RoleRule",
    "default_profile",
    "TrajectoryTree",
    "TreeBuildError",
    "build_tree",
]
