"""`gyre train` sub-commands (the demo itself spawns processes and is exercised by the cell tests)."""

import json

from typer.testing import CliRunner

from gyre.train.checkpoint import TrainerState
from gyre.train.cli import app


def test_checkpoint_command(tmp_path):
    r = CliRunner().invoke(app, ["checkpoint", str(tmp_path)])
    assert r.exit_code == 1 and "no complete checkpoint" in r.output
    ck = tmp_path / "step-3"
    ck.mkdir()
    (ck / "trainer_state.json").write_text(json.dumps(TrainerState(3, 3, ["a", "b"], "m").__dict__))
    (tmp_path / "latest").write_text("step-3")
    r = CliRunner().invoke(app, ["checkpoint", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {
        "path": str(ck),
        "step": 3,
        "policy_version": 3,
        "consumed_groups": 2,
        "model_source": "m",
    }
    assert "demo" in CliRunner().invoke(app, ["--help"]).output
