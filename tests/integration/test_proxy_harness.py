"""Real harnesses, unmodified, end to end through the proxy (scripted engine: a test double that
replays fixed tool calls through the real tokenizer and parser).

mini-swe-agent speaks OpenAI chat completions with one ``bash`` tool; Claude Code
speaks Anthropic messages (always streaming, ``?beta=true``, a ``role: system``
message inside ``messages``, 12 tools with ``cache_control``). Each run must do
the scripted work in its workspace, and every call after the first must be
recorded as a token-exact continuation.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.servers import running_engine, running_proxy

from gyre.proxy import ProxyAdminClient
from gyre.trace.store import read_trace, trace_path

pytestmark = [pytest.mark.harness, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CLAUDE = REPO / ".cache/harnesses/claude-code/node_modules/.bin/claude"


def _check_chain(records, n):
    assert len(records) == n, [r.meta.get("bridge") for r in records]
    for prev, cur in zip(records, records[1:]):
        assert (
            cur.base == prev.request_id and cur.meta["bridge"] == "continuation" and not cur.forked
        )
        assert cur.base_len == prev.base_len + len(prev.input_suffix) + len(prev.output_ids)


def test_mini_swe_agent_end_to_end(tiny_model_dir, tiny_tokenizer, tmp_path):
    mini = Path(sys.executable).parent / "mini"
    if not mini.exists():
        pytest.skip(
            f"mini-swe-agent is not installed ({mini} missing; see scripts/install-harnesses.sh)"
        )
    turns = [
        {
            "text": "Let me look.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}],
        },
        {"tool_calls": [{"name": "bash", "arguments": {"command": "echo hello > out.txt"}}]},
        {
            "tool_calls": [
                {
                    "name": "bash",
                    "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"},
                }
            ]
        },
    ]
    ws = tmp_path / "ws"
    ws.mkdir()
    with (
        running_engine("scripted", tiny_model_dir, turns=turns) as eng,
        running_proxy(
            tiny_model_dir,
            [eng.url],
            tmp_path / "traces",
            tiny_tokenizer,
            mode="managed",
            admin_token="adm",
        ) as px,
    ):
        key = ProxyAdminClient(px.admin_socket, "adm").register("mini-1", label="main")
        env = {
            **os.environ,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENAI_API_KEY": key,
            "HOME": str(tmp_path / "home"),
        }
        proc = subprocess.run(
            [
                str(mini),
                "-m",
                "openai/tiny",
                "-c",
                "mini.yaml",
                "-c",
                f"model.model_kwargs.api_base={px.url}/v1",
                "-t",
                "Write hello to out.txt",
                "-y",
                "--exit-immediately",
                "-o",
                str(tmp_path / "traj.json"),
            ],
            cwd=ws,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=150,
        )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (ws / "out.txt").read_text().strip() == "hello"
    assert json.loads((tmp_path / "traj.json").read_text())["info"]["exit_status"] == "Submitted"
    res = read_trace(trace_path(tmp_path / "traces", "mini-1"), vocab_size=len(tiny_tokenizer))
    assert res.errors == []
    _check_chain(res.records, 3)
    assert res.records[0].meta["tools"] == ["bash"] and res.records[0].meta["key_label"] == "main"


def test_claude_code_end_to_end(tiny_model_dir, tiny_tokenizer, tmp_path):
    if not CLAUDE.exists() or shutil.which("node") is None:
        pytest.skip(
            f"Claude Code is not installed ({CLAUDE} missing; run scripts/install-harnesses.sh)"
        )
    book = {
        "scripts": [
            {
                "name": "main",
                "match": "GYRE-TASK-42",
                "turns": [
                    {
                        "text": "I will write the file.",
                        "tool_calls": [
                            {
                                "name": "Bash",
                                "arguments": {
                                    "command": "echo hello > out.txt",
                                    "description": "write",
                                },
                            }
                        ],
                    },
                    {"text": "Done: out.txt contains hello."},
                ],
            },
            {"name": "side", "turns": [{"text": "ok"}]},
        ]
    }  # any side call Claude Code makes
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    with (
        running_engine("scripted", tiny_model_dir, turns=book) as eng,
        running_proxy(
            tiny_model_dir,
            [eng.url],
            tmp_path / "traces",
            tiny_tokenizer,
            mode="managed",
            admin_token="adm",
        ) as px,
    ):
        key = ProxyAdminClient(px.admin_socket, "adm").register("cc-1", label="main")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "CLAUDE"))}
        env.update(
            {
                "HOME": str(home),
                "ANTHROPIC_BASE_URL": px.url,
                "ANTHROPIC_API_KEY": key,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_AUTOUPDATER": "1",
            }
        )
        proc = subprocess.run(
            [
                str(CLAUDE),
                "-p",
                "GYRE-TASK-42: write hello to out.txt",
                "--output-format",
                "json",
                "--model",
                "tiny",
                "--allowedTools",
                "Bash,Read,Write,Edit",
            ],
            cwd=ws,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=150,
        )
        stats = px.service.stats()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["is_error"] is False and out["result"] == "Done: out.txt contains hello."
    assert (ws / "out.txt").read_text().strip() == "hello"
    assert stats["counters"]["errors_4xx"] == 0 and stats["counters"]["errors_5xx"] == 0
    res = read_trace(trace_path(tmp_path / "traces", "cc-1"), vocab_size=len(tiny_tokenizer))
    assert res.errors == []
    main = [
        r for r in res.records if "GYRE-TASK-42" in r.meta["last_user_head"] or r.base is not None
    ]
    _check_chain(main, 2)
    first = main[0]
    assert first.api == "anthropic.messages" and first.meta["stream"] is True
    assert len(first.meta["tools"]) >= 10 and "Bash" in first.meta["tools"]
    assert "x-claude-code-session-id" in first.meta["headers"]
    assert first.meta[
        "system_head"
    ]  # system blocks (and the in-messages system message) were rendered
