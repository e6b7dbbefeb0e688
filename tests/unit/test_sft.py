"""The optional warm-up of an agent run (issue 34): the calc oracle's demonstrations are right
(the command really prints the answer, the verifier gives them 1), only the assistant's
tokens are trained against, the warm-up lowers the loss and writes a model directory a run
loads, and a user's mistake is one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gyre.cli import app
from gyre.harness.families import problems, score
from gyre.harness.families.registry import demonstration
from gyre.harness.families.toolproto import CHAT_TEMPLATE, SYSTEM
from gyre.train.sft import IGNORE, SftSettings, encode, lr_at

runner = CliRunner()


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gyre.models.tiny import build_tiny_model

    d = build_tiny_model(tmp_path_factory.mktemp("tiny") / "m")
    (d / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return d


def test_calc_oracle_runs_and_scores_one() -> None:
    for p in problems("calc", 3, "train", 12):
        conv = demonstration(p)
        call = conv[1]["tool_calls"][0]["function"]
        out = subprocess.run(
            ["bash", "-c", call["arguments"]["command"]], capture_output=True, text=True, check=True
        ).stdout
        assert out.strip() == p.answer, (p.name, out)
        assert conv[2]["content"] == f"exit status 0\n{out}"  # what the agent sends back
        assert score(conv[3]["content"], p).reward == 1.0


def test_mini_swe_agent_demonstration_is_what_mini_parses_and_submits() -> None:
    """The mini-swe-agent warm-up's conversations: each reply is one action under mini's own
    regex, each observation is what mini renders for that command's real output, and the
    submit command's output is a submission mini accepts and the verifier scores 1."""
    import re

    import yaml  # type: ignore[import-untyped]

    from gyre.harness.mini_tools import CONFIG, SUBMIT
    from gyre.harness.mini_tools import demonstration as mini_demonstration

    cfg = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    regex = cfg["model"]["action_regex"]
    for p in problems("calc", 3, "train", 6):
        conv = mini_demonstration(demonstration(p))
        assert [m["role"] for m in conv] == ["system", "user", "assistant", "user", "assistant"]
        assert conv[0]["content"] == cfg["agent"]["system_template"] and "tools" not in conv[0]
        assert conv[1]["content"] == p.instruction
        outputs = []
        for reply in (conv[2], conv[4]):
            (action,) = re.findall(regex, reply["content"], re.DOTALL)
            outputs.append(
                subprocess.run(["bash", "-c", action], capture_output=True, text=True, check=True)
            )
        assert conv[3]["content"] == f"exit status 0\n{outputs[0].stdout}"
        first, *rest = outputs[1].stdout.splitlines(keepends=True)
        assert first.strip() == SUBMIT  # mini's own test for a finished run
        assert score("".join(rest), p).reward == 1.0


def test_family_without_oracle_is_refused() -> None:
    (p,) = problems("lookup", 0, "train", 1)
    with pytest.raises(ValueError, match="no oracle"):
        demonstration(p)


def test_only_the_assistant_tokens_are_targets(tool_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_model)
    (p,) = problems("calc", 0, "train", 1)
    msgs = [{"role": "system", "content": SYSTEM}, *demonstration(p)]
    tools = [{"type": "function", "function": {"name": "run_command", "parameters": {}}}]
    ids, labels = encode(tok, msgs, tools)
    assert len(ids) == len(labels)
    target = tok.decode([t for t, lab in zip(ids, labels, strict=True) if lab != IGNORE])
    cmd = msgs[2]["tool_calls"][0]["function"]["arguments"]["command"]
    # the two replies of this problem, not the worked exchange's, the prompt or the tool output
    assert target == f"```bash\n{cmd}\n```<|im_end|>Answer: {p.answer}<|im_end|>"
    assert "5535" in tok.decode(ids)  # the worked exchange is context (tools offered)
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(ValueError, match="generation"):
        encode(tok, msgs, tools)


def test_lr_schedule_warms_up_and_decays() -> None:
    s = SftSettings(steps=10, lr=1.0, warmup_steps=2)
    lrs = [lr_at(i, s) for i in range(10)]
    assert lrs[0] == 0.5 and lrs[1] == 1.0
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:], strict=False))
    assert lrs[-1] == pytest.approx(0.1)


def test_sft_cli_lowers_loss_and_writes_a_model(tool_model: Path, tmp_path: Path) -> None:
    demos = tmp_path / "demos.jsonl"
    r = runner.invoke(app, ["harness", "demos", "calc", str(demos), "--n", "4"])
    assert r.exit_code == 0, r.output
    assert len(demos.read_text().splitlines()) == 4
    out = tmp_path / "sft"
    r = runner.invoke(
        app,
        ["train", "sft", str(tool_model), str(demos), str(out), "--steps", "12", "--lr", "3e-3"],
    )
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "sft.json").read_text())
    assert rec["demonstrations"] == 4 and len(rec["losses"]) == 12
    assert rec["losses"][-1] < 0.7 * rec["losses"][0]  # 4 demos, 3 epochs: memorised in part
    assert (out / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out)  # a model directory a run can load


def test_sft_user_mistakes_are_one_line(tool_model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{"nope": 1}\n')
    cases = [
        (["train", "sft", str(tool_model), str(bad), str(tmp_path / "o")], "bad.jsonl:2"),
        (["train", "sft", str(tool_model), str(tmp_path / "none"), str(tmp_path / "o")], "no such"),
        (["train", "sft", str(tmp_path), str(bad), str(tmp_path / "o")], "MODEL_DIR"),
        (["harness", "demos", "lookup", str(tmp_path / "d.jsonl")], "no oracle"),
        (["harness", "demos", "calc", str(tmp_path / "d.jsonl"), "--harness", "x"], "--harness"),
        (
            ["harness", "demos", "calc", str(tmp_path / "d.jsonl"), "--harness", "mini-swe-agent"]
            + ["--system", "x"],
            "mini_tools.yaml",
        ),
    ]
    for args, needle in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert needle in r.output and "Traceback" not in r.output
        assert len(r.output.strip().splitlines()) == 1, r.output
