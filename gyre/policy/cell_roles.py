"""Cell roles."""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    """What a cell is doing. A cell serves rollouts only in ROLLOUT."""

    ROLLOUT = "rollout"
    TO_TRAINING = "to_training"  # left rollout (serves nothing), loading training state
    TRAINING = "training"
    TO_ROLLOUT = "to_rollout"  # dropped training state, loading an engine (serves nothing yet)
