"""The two tracker back ends: W&B (offline by default) and MLflow (sqlite by default).

Each sink takes rows already reduced to ``{metrics.jsonl name: number}`` and knows only
its library; :mod:`gyre.runtime.tracking` decides what to send and when. Both libraries
are imported here only, lazily, so a run without sinks never loads them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Protocol

from gyre.runtime.tracking_config import TrackingConfig


class Sink(Protocol):
    name: str
    run_id: str

    def log_step(self, step: int, metrics: dict[str, float]) -> None: ...
    def log_eval(self, version: int, metrics: dict[str, float]) -> None: ...
    def log_summary(self, summary: dict[str, Any]) -> None: ...
    def finish(self, ok: bool) -> None: ...


def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (config keys as ``--set`` writes them)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class WandbSink:
    name = "wandb"

    def __init__(
        self, cfg: TrackingConfig, run_dir: Path, config: dict[str, Any], prior: str | None
    ):
        import wandb  # lazy: an optional extra, loaded only by a run that tracks to W&B

        env = os.environ.get("WANDB_MODE")
        mode = cfg.wandb_mode or ("online" if env == "online" else "offline")
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.wandb_entity,
            name=run_dir.name,
            dir=str(run_dir),
            config=config,
            id=prior,
            resume="allow",
            mode=mode,
            settings=wandb.Settings(console="off", silent=True),
        )
        if prior is not None:  # a --resume may override settings: the tracked config follows
            self.run.config.update(config, allow_val_change=True)
        self.run.define_metric("eval/*", step_metric="eval/version")
        self.run_id: str = self.run.id
        self._step = int(self.run.step or 0)  # where evaluations are filed (see log_eval)

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self._step = max(self._step, step)
        self.run.log(metrics, step=step)

    def log_eval(self, version: int, metrics: dict[str, float]) -> None:
        # Evaluations finish out of step order; their x axis is eval/version. They are filed
        # under the newest training step, never ahead of it: a W&B step that moved on (as a
        # log without a step moves it) drops every later row with a smaller step, and version
        # 0 is evaluated before step 0.
        row = {f"eval/{k}": v for k, v in metrics.items()} | {"eval/version": version}
        self.run.log(row, step=self._step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({f"summary/{k}": v for k, v in summary.items()})

    def finish(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


class MlflowSink:
    name = "mlflow"

    def __init__(
        self, cfg: TrackingConfig, run_dir: Path, config: dict[str, Any], prior: str | None
    ):
        uri = cfg.mlflow_uri or f"sqlite:///{run_dir / 'mlflow.db'}"
        if uri.startswith("file:"):  # chosen explicitly: MLflow refuses it unless told so
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient  # lazy: optional extra, only when tracking

        for noisy in ("mlflow", "alembic"):  # schema set-up notices would tear the live view;
            logging.getLogger(noisy).setLevel(logging.WARNING)  # after the import: it sets INFO

        self.client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        if prior is None:
            exp = self.client.get_experiment_by_name(cfg.project)
            exp_id = (
                exp.experiment_id
                if exp
                else self.client.create_experiment(
                    cfg.project, artifact_location=(run_dir / "mlartifacts").as_uri()
                )
            )
            self.run_id = self.client.create_run(exp_id, run_name=run_dir.name).info.run_id
            self._params(config)
        else:
            self.run_id = prior
            self.client.update_run(prior, status="RUNNING")
        self.client.log_dict(self.run_id, config, "config.json")

    def _params(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param  # lazy: optional extra (see __init__)

        params = [Param(k, json.dumps(v)[:6000]) for k, v in flat(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def _metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric  # lazy: optional extra (see __init__)

        ms = int(time.time() * 1000)
        batch = [Metric(k, v, ms, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        self._metrics(metrics, step)

    def log_eval(self, version: int, metrics: dict[str, float]) -> None:
        self._metrics({f"eval/{k}": v for k, v in metrics.items()}, version)

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.client.log_dict(self.run_id, summary, "summary.json")
        top = {
            k: v
            for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self._metrics({f"summary/{k}": float(v) for k, v in top.items()}, 0)

    def finish(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "KILLED")


def open_sink(
    name: str, cfg: TrackingConfig, run_dir: Path, config: dict[str, Any], prior: str | None
) -> Sink:
    """The sink called ``name``, continuing the tracked run ``prior`` when given."""
    if name == "wandb":
        return WandbSink(cfg, run_dir, config, prior)
    return MlflowSink(cfg, run_dir, config, prior)
