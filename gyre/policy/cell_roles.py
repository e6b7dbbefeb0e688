"""Cell roles (rollout, training and the switches between): what a cell is doing.

Named ``CellRole`` so it is never confused with a request's role
(:class:`gyre.trace.roles.Role`: main, main-summary, sub-agent, sub-agent-summary).
"""

from __future__ import annotations

from enum import Enum

CORE = 0  # the cell that holds optimizer state and the authoritative weights


class CellRole(str, Enum):
    """What a cell is doing. A cell serves rollouts only in ROLLOUT."""

    ROLLOUT = "rollout"
    TO_TRAINING = "to_training"  # left rollout (serves nothing), loading training state
    TRAINING = "training"
    TO_ROLLOUT = "to_rollout"  # dropped training state, loading an engine (serves nothing yet)
    LOST = "lost"  # its process died (or hung): serves and trains nothing until it is back
