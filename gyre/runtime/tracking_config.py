"""The ``[run.tracking]`` section: which experiment trackers receive the run's metrics.

Kept apart from :mod:`gyre.runtime.tracking` so that validating a config never imports
W&B or MLflow (both are optional extras: ``pip install 'gyre[tracking]'``).
"""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Sink = Literal["wandb", "mlflow"]


class TrackingConfig(BaseModel):
    """Trackers fed from the run directory's ``metrics.jsonl`` / ``evals.jsonl`` (same names)."""

    model_config = ConfigDict(extra="forbid")

    sinks: list[Sink] = Field(
        default_factory=list, description="trackers to log to: 'wandb', 'mlflow' (empty: none)"
    )
    project: str = Field("gyre", min_length=1, description="W&B project / MLflow experiment")
    wandb_mode: Literal["offline", "online"] | None = Field(
        None,
        description="W&B mode; None: 'online' only when $WANDB_MODE says so, else 'offline' "
        "(files under RUN_DIR/wandb, no network; `wandb sync` uploads them later)",
    )
    wandb_entity: str | None = Field(None, description="W&B entity (team or user); online only")
    mlflow_uri: str | None = Field(
        None,
        description="MLflow tracking URI; None: sqlite:///RUN_DIR/mlflow.db. A 'file:' URI "
        "uses MLflow's (maintenance-mode) file store",
    )
    interval_s: float = Field(
        5.0, gt=0, description="how often new metric lines are forwarded to the trackers"
    )


_NEEDS: dict[str, tuple[str, ...]] = {"wandb": ("wandb",), "mlflow": ("mlflow",)}


def missing_packages(cfg: TrackingConfig) -> str | None:
    """One line naming what a configured sink needs and is not installed, else None."""
    for sink in cfg.sinks:
        needs = list(_NEEDS[sink])
        uri = cfg.mlflow_uri or "sqlite:"
        if sink == "mlflow" and uri.startswith("sqlite:"):
            needs += ["sqlalchemy", "alembic"]  # MLflow's SQL store (mlflow-skinny lacks them)
        absent = [m for m in needs if importlib.util.find_spec(m) is None]
        if absent:
            return (
                f"run.tracking.sinks: {sink!r} needs {', '.join(absent)}, which is not installed "
                "(pip install 'gyre[tracking]')"
            )
    return None
