"""Gyre's reference agent: a small coding agent for any OpenAI-compatible endpoint.

``python -m gyre.harness.reference_agent --base-url http://127.0.0.1:PORT/v1 --model policy
--workspace DIR --instruction-file FILE``

It exists so Gyre has one harness whose behaviour we fully know, and which
produces the trace shapes the paper trains on:

- a **main** loop with tools ``read_file``, ``write_file``, ``run_command``,
  ``submit`` and ``delegate``;
- ``delegate(task)`` starts a **sub-agent** with a fresh context (its own system
  prompt, no ``delegate`` tool); its ``submit`` summary becomes the tool result,
  so the execution's trace branches;
- when the context grows past ``--context-limit`` (estimated tokens,
  chars / 4) the agent asks the model for a **summary** (a separate request
  with its own system prompt and no tools) and continues from
  ``[system, instruction + summary]`` -- the compaction that makes a trace's
  later paths diverge from its earlier ones.

Each of those four request kinds starts with a distinct system prompt, which
is how ``gyre.harness.roles`` tells main / main-summary / sub-agent /
sub-agent-summary apart. A final message without tool calls ends the run and
is written to ``--answer-file`` (the quickstart tasks score that file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from gyre.harness.calls_file import write_calls_file

# Only the standard library's lightest modules before the first model call: no pathlib,
# dataclasses or typing (together ~40 ms of each execution's start on a loaded machine).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

MAIN_SYSTEM = (
    "You are Gyre's reference coding agent. You work in a repository and solve the user's task by "
    "calling tools: read_file, write_file, run_command, delegate (give a self-contained sub-task to "
    "a sub-agent) and submit (when the task is done). Keep changes minimal."
)
SUB_SYSTEM = (
    "You are a sub-agent of Gyre's reference coding agent. Solve only the sub-task you are given, "
    "using read_file, write_file and run_command, then call submit with a short report."
)
MAIN_SUMMARY_SYSTEM = (
    "You compact the working context of Gyre's reference coding agent. Summarize the task, what "
    "was done, what was learned and what remains, in a few sentences."
)
SUB_SUMMARY_SYSTEM = (
    "You compact the working context of a sub-agent of Gyre's reference coding agent. Summarize "
    "the sub-task, what was done and what remains, in a few sentences."
)


def _tool(name: str, desc: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


TOOLS = {
    "read_file": _tool(
        "read_file", "Read a text file of the workspace.", {"path": {"type": "string"}}, ["path"]
    ),
    "write_file": _tool(
        "write_file",
        "Create or overwrite a file of the workspace.",
        {"path": {"type": "string"}, "content": {"type": "string"}},
        ["path", "content"],
    ),
    "run_command": _tool(
        "run_command",
        "Run a shell command in the workspace; returns exit status and output.",
        {"command": {"type": "string"}},
        ["command"],
    ),
    "submit": _tool(
        "submit", "Finish: report what was done.", {"summary": {"type": "string"}}, ["summary"]
    ),
    "delegate": _tool(
        "delegate",
        "Hand a self-contained sub-task to a sub-agent with a fresh context; returns its report.",
        {"task": {"type": "string"}},
        ["task"],
    ),
}


class AgentConfig:
    model: str = "policy"
    max_turns: int = 30
    max_sub_turns: int = 15
    context_limit: int = 6000  # estimated tokens before compaction
    max_tokens: int = 512
    temperature: float | None = None
    command_timeout_s: float = 60.0
    max_output_chars: int = 4000
    allow_delegate: bool = True
    # A chat policy rather than a coding agent: no tools, and the main system prompt replaced
    # ("" sends none, so the model's chat template supplies its default). The generated task
    # families use this: the reply is the answer, and a peer trainer renders the same prompt.
    system: str | None = None
    tools: bool = True

    def __init__(self, **fields: Any) -> None:
        """Any of the fields above by keyword; the rest keep their defaults."""
        for k, v in fields.items():
            if not hasattr(AgentConfig, k) or k.startswith("_"):
                raise TypeError(f"AgentConfig has no field {k!r}")
            setattr(self, k, v)


class RunStats:
    def __init__(self) -> None:
        self.requests = 0
        self.answered = 0  # requests the model answered (the rest raised)
        self.compactions = 0
        self.sub_agents = 0
        self.tool_calls = 0
        self.submitted = False
        self.final = ""
        self.errors: list[str] = []
        self.first_call_at: float | None = None  # time.monotonic(): the first call sent
        self.last_answer_at: float | None = None  # and the last answer received


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """Cheap context size estimate (chars / 4); the agent cannot see the model's tokenizer."""
    return sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) // 4


class ReferenceAgent:
    def __init__(
        self, client: Any, workspace: str | Path, config: AgentConfig | None = None
    ) -> None:
        self.client = client
        self.ws = os.path.realpath(workspace)  # a str: pathlib is not imported (above)
        self.cfg = config or AgentConfig()
        self.stats = RunStats()

    # ---- tools ---------------------------------------------------------------
    def _path(self, p: str) -> str:
        q = os.path.realpath(os.path.join(self.ws, p))
        if os.path.commonpath([self.ws, q]) != self.ws:
            raise ValueError(f"path {p!r} is outside the workspace")
        return q

    def _run_tool(self, name: str, args: dict[str, Any], depth: int) -> tuple[str, bool]:
        """(result text, done)."""
        self.stats.tool_calls += 1
        if name == "read_file":
            with open(self._path(str(args["path"])), encoding="utf-8", errors="replace") as f:
                text = f.read()
            return text[: self.cfg.max_output_chars], False
        if name == "write_file":
            p = self._path(str(args["path"]))
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w", encoding="utf-8") as f:
                f.write(str(args["content"]))
            return f"wrote {len(str(args['content']))} characters to {args['path']}", False
        if name == "run_command":
            import subprocess  # here: most executions never run a command

            try:
                cp = subprocess.run(
                    ["bash", "-c", str(args["command"])],
                    cwd=self.ws,
                    capture_output=True,
                    text=True,
                    timeout=self.cfg.command_timeout_s,
                    stdin=subprocess.DEVNULL,
                )
                out = (cp.stdout + cp.stderr)[-self.cfg.max_output_chars :]
                return f"exit status {cp.returncode}\n{out}", False
            except subprocess.TimeoutExpired:
                return f"command timed out after {self.cfg.command_timeout_s}s", False
        if name == "submit":
            return str(args.get("summary", "")), True
        if name == "delegate" and depth == 0 and self.cfg.allow_delegate:
            self.stats.sub_agents += 1
            report = self._loop(SUB_SYSTEM, str(args["task"]), depth=1)
            return report or "(the sub-agent reported nothing)", False
        raise ValueError(f"unknown tool {name!r}")

    # ---- model calls -----------------------------------------------------------
    def _complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Any:
        st = self.stats
        st.requests += 1
        if st.first_call_at is None:
            st.first_call_at = time.monotonic()
        first = st.first_call_at
        # counted before and after the call, so a kill mid-call leaves the attempt on record
        write_calls_file(
            st.requests, st.answered, first_call_at=first, last_answer_at=st.last_answer_at
        )
        kw: dict[str, Any] = {
            "model": self.cfg.model,
            "messages": messages,
            "max_tokens": self.cfg.max_tokens,
        }
        if tools:
            kw["tools"] = tools
        if self.cfg.temperature is not None:
            kw["temperature"] = self.cfg.temperature
        try:
            msg = self.client.chat.completions.create(**kw).choices[0].message
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
            write_calls_file(
                st.requests, st.answered, err, first_call_at=first, last_answer_at=st.last_answer_at
            )
            raise
        st.answered += 1
        st.last_answer_at = time.monotonic()
        write_calls_file(
            st.requests, st.answered, first_call_at=first, last_answer_at=st.last_answer_at
        )
        return msg

    def _compact(
        self, system: str, task: str, messages: list[dict[str, Any]], depth: int
    ) -> list[dict[str, Any]]:
        self.stats.compactions += 1
        transcript = "\n".join(
            f"[{m['role']}] {m.get('content') or ''}"
            + (
                "".join(
                    f" <call {c['function']['name']} {c['function']['arguments']}>"
                    for c in m.get("tool_calls") or []
                )
            )
            for m in messages
            if m["role"] != "system"
        )
        summary_system = MAIN_SUMMARY_SYSTEM if depth == 0 else SUB_SUMMARY_SYSTEM
        msg = self._complete(
            [
                {"role": "system", "content": summary_system},
                {"role": "user", "content": transcript[-4 * self.cfg.context_limit :]},
            ],
            None,
        )
        summary = msg.content or ""
        head = [{"role": "system", "content": system}] if system else []
        return [
            *head,
            {"role": "user", "content": f"{task}\n\nSummary of your progress so far:\n{summary}"},
        ]

    def _loop(self, system: str, task: str, depth: int) -> str:
        names = ["read_file", "write_file", "run_command", "submit"]
        if depth == 0 and self.cfg.allow_delegate:
            names.insert(3, "delegate")
        tools = [TOOLS[n] for n in names] if self.cfg.tools else None
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": task})
        turns = self.cfg.max_turns if depth == 0 else self.cfg.max_sub_turns
        for _ in range(turns):
            if estimate_tokens(messages) > self.cfg.context_limit and len(messages) > 2:
                messages = self._compact(system, task, messages, depth)
            msg = self._complete(messages, tools)
            calls = list(msg.tool_calls or [])
            entry: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
            if calls:
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in calls
                ]
            messages.append(entry)
            if not calls:
                return msg.content or ""
            done_report = None
            for c in calls:
                try:
                    args = json.loads(c.function.arguments or "{}")
                    if not isinstance(args, dict):
                        raise ValueError("arguments must be a JSON object")
                    result, done = self._run_tool(c.function.name, args, depth)
                except Exception as e:  # a bad call is reported to the model, not fatal
                    result, done = f"error: {type(e).__name__}: {e}", False
                messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
                if done:
                    done_report = result
            if done_report is not None:
                if depth == 0:
                    self.stats.submitted = True
                return done_report
        return ""

    def run(self, instruction: str) -> RunStats:
        system = MAIN_SYSTEM if self.cfg.system is None else self.cfg.system
        self.stats.final = self._loop(system, instruction, depth=0)
        return self.stats


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter at a fixed width: its default asks ``shutil`` for the terminal's,
    and importing shutil (bz2, lzma, zlib) is ~10 ms of every agent's start, in every
    execution, to format a help nobody reads there."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gyre.harness.reference_agent",
        description="Gyre's reference coding agent (OpenAI-compatible endpoint).",
        formatter_class=_Formatter,
    )
    ap.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    ap.add_argument("--model", default="policy")
    ap.add_argument("--workspace", default=".")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--instruction")
    g.add_argument("--instruction-file")
    ap.add_argument(
        "--answer-file",
        default=None,
        help="write the final message here (relative to the workspace)",
    )
    ap.add_argument("--max-turns", type=int, default=AgentConfig.max_turns)
    ap.add_argument("--context-limit", type=int, default=AgentConfig.context_limit)
    ap.add_argument("--max-tokens", type=int, default=AgentConfig.max_tokens)
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--no-delegate", action="store_true")
    ap.add_argument(
        "--system",
        default=None,
        help="replace the main system prompt ('' sends none: the chat template's default applies)",
    )
    ap.add_argument(
        "--no-tools", action="store_true", help="offer no tools: the first reply is the answer"
    )
    ap.add_argument("--request-timeout", type=float, default=3600.0)
    ap.add_argument(
        "--client",
        choices=["openai", "stdlib"],
        default="openai",
        help="HTTP client: the official SDK, or a stdlib one (same requests, ~1.5 s less start-up)",
    )
    a = ap.parse_args(argv)
    if not a.base_url:
        ap.error("--base-url (or OPENAI_BASE_URL) is required")
    instruction = a.instruction
    if instruction is None:
        with open(a.instruction_file, encoding="utf-8") as f:
            instruction = f.read()

    api_error: type[Exception]  # what a failed model call raises, per client
    if a.client == "stdlib":
        from gyre.harness.http_client import APIError, StdlibClient

        api_error = APIError
        client: Any = StdlibClient(a.base_url, a.api_key, timeout=a.request_timeout, max_retries=2)
    else:
        if sys.flags.no_site:  # the profile starts the agent with -S: the SDK is in site-packages
            import site

            site.main()
        import openai  # here, so --help is instant

        api_error = openai.APIError
        client = openai.OpenAI(
            base_url=a.base_url, api_key=a.api_key, timeout=a.request_timeout, max_retries=2
        )
    cfg = AgentConfig(
        model=a.model,
        max_turns=a.max_turns,
        context_limit=a.context_limit,
        max_tokens=a.max_tokens,
        temperature=a.temperature,
        allow_delegate=not a.no_delegate,
        system=a.system,
        tools=not a.no_tools,
    )
    agent = ReferenceAgent(client, a.workspace, cfg)
    try:
        stats = agent.run(instruction)
    except api_error as e:
        # stop at the first call that failed after the client's retries: going on without the
        # model would leave a workspace that says nothing about the policy
        err = f"{type(e).__name__}: {e}"
        print(json.dumps({"error": err, "requests": agent.stats.requests}), flush=True)
        what = "is unreachable" if agent.stats.answered == 0 else "failed"
        print(f"reference agent: the model at {a.base_url} {what}: {err}", file=sys.stderr)
        return 2
    if a.answer_file and not stats.submitted:
        with open(os.path.join(agent.ws, a.answer_file), "w", encoding="utf-8") as f:
            f.write(stats.final)
    print(
        json.dumps(
            {
                "requests": stats.requests,
                "compactions": stats.compactions,
                "sub_agents": stats.sub_agents,
                "tool_calls": stats.tool_calls,
                "submitted": stats.submitted,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
