"""Disk at real size: the checkpoint interval, the final checkpoint, and bounded retention."""

from __future__ import annotations

import json

import pytest
import torch

from gyre.config import GyreConfig
from gyre.train.checkpoint import TrainerState, latest_checkpoint, save_checkpoint
from gyre.train.config import CheckpointConfig


@pytest.mark.parametrize(
    ("every", "total", "want"),
    [
        (1, 5, [1, 2, 3, 4, 5]),
        (
            2,
            5,
            [2, 4, 5],
        ),  # the last step always ends with one (resume never repeats a finished run)
        (3, 7, [3, 6, 7]),
        (10, 4, [4]),
    ],
)
def test_checkpoint_due_every_n_and_at_the_end(every, total, want):
    ck = CheckpointConfig(every_steps=every)
    assert [s for s in range(1, total + 1) if ck.due(s, total)] == want
    # without a known end, only the interval
    assert [s for s in range(1, total + 1) if ck.due(s)] == [s for s in want if s % every == 0]


class _Tiny(torch.nn.Module):
    """Enough of a PreTrainedModel for save_checkpoint (weights + save_pretrained)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4))

    def save_pretrained(self, out, safe_serialization=True):
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"w": self.w.tolist()}))


def test_save_checkpoint_keeps_the_newest(tmp_path):
    model = _Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ck = CheckpointConfig(every_steps=2, keep=2)
    for step in range(1, 8):
        if ck.due(step, 7):
            save_checkpoint(tmp_path, model, opt, TrainerState(step=step), keep=ck.keep)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-6", "step-7"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step-7"
    assert not list(tmp_path.glob(".tmp-*"))


def test_retention_is_config_with_documented_defaults():
    cfg = GyreConfig.model_validate({"model_dir": "m"})
    assert cfg.trainer.checkpoint.every_steps == 1 and cfg.trainer.checkpoint.keep == 2
    assert cfg.run.keep_published == 2
    with pytest.raises(ValueError, match="keep_published"):
        GyreConfig.model_validate({"model_dir": "m", "run": {"keep_published": 0}})
