"""bench/vs_trl/trl_agent_side.py's pure parts: the tool, the parsing hook, the reward's reply and
turn accounting, the config mapping. No TRL needed (the script imports it only in main)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "vs_trl"))

import trl_agent_side as side  # noqa: E402
from vs_trl_lib import MappingError  # noqa: E402

from gyre.config import load_config  # noqa: E402
from gyre.harness.families import problems, score  # noqa: E402
from gyre.harness.reference_agent import AgentConfig, ReferenceAgent  # noqa: E402

EXAMPLE = ROOT / "examples" / "smollm2-agent.toml"


def test_the_tool_answers_as_the_reference_agent_does(tmp_path):
    agent = ReferenceAgent(client=None, workspace=tmp_path, config=AgentConfig(max_output_chars=5))
    for cmd in ['echo "123 * 45" | bc', "echo out; echo err >&2; exit 3", "echo 1234567890"]:
        want, _ = agent._run_tool("run_command", {"command": cmd}, 0)
        assert side.shell(cmd, str(tmp_path), max_chars=5) == want
    assert side.run_command('echo "123 * 45" | bc') == "exit status 0\n5535\n"


def test_the_tool_reports_a_timeout(tmp_path):
    assert side.shell("sleep 5", str(tmp_path), timeout_s=0.2) == "command timed out after 0.2s"


def test_parse_reply_reads_blocks_as_the_proxy_does():
    one = side.parse_reply('```bash\necho "9548 * 41" | bc\n```')
    assert one["tool_calls"] == [
        {
            "type": "function",
            "function": {"name": "run_command", "arguments": {"command": 'echo "9548 * 41" | bc'}},
        }
    ]
    assert one["unparsed"] == 0
    two = side.parse_reply("Let me compute.\n```bash\nls\n```\n```sh\npwd\n```")
    assert [c["function"]["arguments"]["command"] for c in two["tool_calls"]] == ["ls", "pwd"]
    assert two["content"].strip() == "Let me compute."
    plain = side.parse_reply("Answer: 5535")
    assert plain == {"role": "assistant", "content": "Answer: 5535", "unparsed": 0}
    cut = side.parse_reply("```bash\necho 12")  # cut off inside the block: text, counted
    assert "tool_calls" not in cut and cut["unparsed"] == 1 and "echo 12" in cut["content"]


def test_the_scored_reply_is_the_last_turn_without_a_call():
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}
    tool = {"role": "tool", "name": "run_command", "content": "exit status 0\n5535\n"}
    done = {"role": "assistant", "content": "Answer: 5535"}
    assert side.final_reply([call, tool, done]) == "Answer: 5535"
    assert side.final_reply([done, tool, call]) == ""  # the turn cap ended on a call
    assert side.final_reply([call, tool]) == ""  # a tool turn last: the last assistant turn called
    assert side.final_reply([]) == ""
    p = next(x for x in problems("calc", 0, "held-out", 8) if x.data["operations"] == 1)
    right = {"role": "assistant", "content": f"Answer: {p.answer}"}
    assert score(side.final_reply([call, tool, right]), p).reward == 1.0
    assert score(side.final_reply([right, tool, call]), p).reward == 0.0


def test_turn_stats_and_summary():
    call = {"role": "assistant", "content": "", "tool_calls": [{}, {}]}
    tool = {"role": "tool", "content": "x"}
    done = {"role": "assistant", "content": "Answer: 1"}
    assert side.turn_stats([call, tool, tool, done]) == {"model_calls": 2, "tool_calls": 2}
    assert side.turn_stats([done]) == {"model_calls": 1, "tool_calls": 0}
    rows = [
        {"reward": 1.0, "correct": 1, "model_calls": 2, "tool_calls": 1},
        {"reward": 0.1, "correct": 0, "model_calls": 1, "tool_calls": 0},
        {"reward": 0.0, "correct": 0, "model_calls": 4, "tool_calls": 4},
        {"reward": 0.0, "correct": 0, "model_calls": 1, "tool_calls": 0},
    ]
    s = side.summarize(rows)
    assert s["accuracy"] == 0.25 and s["tool_call_rate"] == 0.5
    assert s["tool_calls_per_execution"] == 1.25 and s["model_calls"] == {1: 2, 2: 1, 4: 1}
    assert s["reward_mean"] == pytest.approx(0.275)
    cut = side.brief([call, {"role": "tool", "content": "9" * 500}], chars=10)
    assert cut[0]["tool_calls"] == [{}, {}] and cut[1] == {"role": "tool", "content": "9" * 10}
    assert side.brief(None) == []


def test_agent_trl_args_carry_the_examples_turns_and_budget():
    c = load_config(EXAMPLE)
    kw = {"steps": 2, "seed": 1, "precision": "fp32", "micro_batch": 8, "output_dir": "o"}
    args, agent = side.agent_trl_args(c, **kw)
    assert agent == {"turns": 4, "max_tokens": 96, "system": side_system(c)}
    assert args["max_completion_length"] == 4 * 96 and args["max_tool_calling_iterations"] == 3
    assert args["num_generations"] == c.policy.group_size == 8
    assert args["gradient_accumulation_steps"] * 8 == c.policy.group_size * c.policy.batch_groups
    assert args["learning_rate"] == c.trainer.optim.lr
    c3 = load_config(
        EXAMPLE,
        [f"run.harness_args={side_args(c, '--max-turns', '6')}", "policy.group_size=4"],
    )
    args3, agent3 = side.agent_trl_args(c3, **kw)
    assert agent3["turns"] == 6 and args3["max_completion_length"] == 6 * 96
    assert args3["num_generations"] == 4
    with pytest.raises(MappingError, match="no-tools"):
        side.agent_trl_args(load_config(ROOT / "examples" / "smollm2-arith.toml"), **kw)


def side_system(c):
    args = list(c.run.harness_args)
    return args[args.index("--system") + 1]


def side_args(c, flag, value):
    import json

    return json.dumps([*c.run.harness_args, flag, value])


def test_the_parsing_hook_round_trips_the_shared_template():
    """The reply TRL re-renders (toolproto's template) parses back to the same call."""
    jinja2 = pytest.importorskip("jinja2")
    from gyre.harness.families.toolproto import CHAT_TEMPLATE

    msg = side.parse_reply('```bash\necho "382 * 686" | bc\n```')
    msg.pop("unparsed")
    env = jinja2.Environment(extensions=["jinja2.ext.do"])

    class Generation(jinja2.ext.Extension):  # transformers' {% generation %} marker, ignored
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    env.add_extension(Generation)
    text = env.from_string(CHAT_TEMPLATE).render(messages=[msg], add_generation_prompt=False)
    reply = text.split("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    again = side.parse_reply(reply)
    again.pop("unparsed")
    assert again == msg
