"""TRL's GRPOTrainer on the agent task (calc through a shell tool), beside ``examples/smollm2-agent.toml``.

    bash scripts/install-trl.sh        # once: TRL 1.16 in its own venv, .venv-trl
    bash scripts/smollm2-agent.sh --prepare   # once: the model, its tool template, runs/tasks/calc
    PYTHONPATH=$PWD .venv-trl/bin/python bench/vs_trl/trl_agent_side.py \\
        --config examples/smollm2-agent.toml --model runs/smollm2 --steps 2 --out bench/results/trl_agent

Runs in .venv-trl. It imports TRL, transformers and torch, and of Gyre only modules that
need none of Ray or the engine: the config (to read the example's N, B, lr, turn cap and
token budget), the task families and the task set loader (the same problems, in Gyre's
task order), the tool protocol (``toolproto``: system prompt, chat template, worked
exchange) and the proxy's output parser (``gyre.proxy.parsing.BashBlockParser``).

What is the same as the Gyre side, by construction:

- **prompts**: ``[system: toolproto.SYSTEM (the example's --system), user: instruction.md]``
  rendered with ``toolproto.CHAT_TEMPLATE`` with tools offered, so the worked exchange
  follows the system turn, as the proxy renders the reference agent's first call;
- **tool-call parsing**: TRL parses a reply with ``tokenizer.parse_response``; this script
  sets that to the proxy's own ``BashBlockParser`` (``bash_parse``), so each fenced bash
  block becomes a ``run_command {"command": ...}`` call exactly as Gyre's proxy makes it;
- **the tool** (``run_command``): ``bash -c COMMAND`` with the reference agent's timeout
  (60 s) and output truncation (the last 4000 characters), answering
  ``exit status N\\n<output>`` (the same text, so the same next-turn tokens);
- **continuation**: TRL appends the tool turn's ids to the generated ids (no re-render),
  as the proxy does: token-exact across turns on both sides;
- **reward**: the family's verifier on the final reply (the last assistant turn with no
  tool call; "" when the turn cap ends on a call, as the reference agent writes then);
- **N, B, lr, optimizer, clip band, sampling**: ``vs_trl_lib.trl_args`` (the single place
  a Gyre setting becomes a GRPOConfig field), with the turn cap as
  ``max_tool_calling_iterations = turns - 1`` and each model call capped at the
  example's ``--max-tokens`` (a hook on TRL's per-turn generate);
- **held-out evaluation**: the same held-out tasks, one sample each, through TRL's own
  multi-turn loop (``trainer._generate``), every ``run.eval_interval`` steps and at the end.

What differs is listed in docs/vs-trl-agent.md. Writes ``--out``/trl_agent.jsonl: one row
per step (``kind: "step"``) and per evaluation (``kind: "eval"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "vs_trl"))  # vs_trl_lib
T_PROCESS = time.time()

COMMAND_TIMEOUT_S = 60.0  # gyre.harness.reference_agent.AgentConfig.command_timeout_s
MAX_OUTPUT_CHARS = 4000  # AgentConfig.max_output_chars
TOOL_NAME = "run_command"


def say(msg: str) -> None:
    print(f"[trl-agent] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ pure pieces (unit-tested)
def run_command(command: str) -> str:
    """Run a shell command in a fresh scratch directory; returns its exit status and output.

    Args:
        command: the shell command, run with bash -c
    """
    with tempfile.TemporaryDirectory(prefix="trl-agent-") as ws:
        return shell(command, ws)


def shell(
    command: str,
    cwd: str,
    timeout_s: float = COMMAND_TIMEOUT_S,
    max_chars: int = MAX_OUTPUT_CHARS,
) -> str:
    """The reference agent's ``run_command`` (gyre.harness.reference_agent), verbatim."""
    try:
        cp = subprocess.run(
            ["bash", "-c", str(command)],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"command timed out after {timeout_s}s"
    out = (cp.stdout + cp.stderr)[-max_chars:]
    return f"exit status {cp.returncode}\n{out}"


def parse_reply(text: str) -> dict[str, Any]:
    """A reply's text as the assistant message TRL expects, parsed by the proxy's ``bash``
    parser: each fenced bash block a ``run_command`` call, the text around them content.
    Also returns the blocks the parser could not read (``unparsed``: cut off or empty)."""
    from gyre.proxy.parsing import BashBlockParser
    from gyre.proxy.types import TextDelta, ToolCallEvent

    n = iter(range(1 << 30))
    p = BashBlockParser(lambda: f"call_{next(n)}")
    content, calls = [], []
    for ev in [*p.feed(text), *p.finish()]:
        if isinstance(ev, TextDelta):
            content.append(ev.text)
        elif isinstance(ev, ToolCallEvent):
            args = json.loads(ev.call.arguments)
            calls.append(
                {"type": "function", "function": {"name": ev.call.name, "arguments": args}}
            )
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if calls:
        msg["tool_calls"] = calls
    msg["unparsed"] = p.n_unparsed
    return msg


def final_reply(completion: list[dict[str, Any]]) -> str:
    """What the reference agent writes as its answer: the content of the last assistant
    turn if that turn called no tool; "" when the execution ended on a call (turn cap)."""
    for m in reversed(completion):
        if m.get("role") == "assistant":
            return "" if m.get("tool_calls") else str(m.get("content") or "")
    return ""


def turn_stats(completion: list[dict[str, Any]]) -> dict[str, int]:
    """Model calls (assistant turns) and tool calls of one execution."""
    turns = [m for m in completion if m.get("role") == "assistant"]
    return {
        "model_calls": len(turns),
        "tool_calls": sum(len(m.get("tool_calls") or []) for m in turns),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rates over executions: each row ``{reward, correct, model_calls, tool_calls}``."""
    n = max(1, len(rows))
    return {
        "executions": len(rows),
        "accuracy": sum(r["correct"] for r in rows) / n,
        "reward_mean": sum(r["reward"] for r in rows) / n,
        "tool_call_rate": sum(r["tool_calls"] > 0 for r in rows) / n,
        "tool_calls_per_execution": sum(r["tool_calls"] for r in rows) / n,
        "model_calls": dict(sorted(Counter(r["model_calls"] for r in rows).items())),
    }


def brief(completion: list[dict[str, Any]] | None, chars: int = 200) -> list[dict[str, Any]]:
    """An execution's turns for the log: contents cut to ``chars``, tool calls kept."""
    return [
        {
            "role": m.get("role"),
            "content": str(m.get("content") or "")[:chars],
            **({"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {}),
        }
        for m in completion or []
    ]


def agent_trl_args(cfg: Any, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(GRPOConfig kwargs, the agent's settings) for the Gyre agent run ``cfg``.

    Everything but the turns goes through ``vs_trl_lib.trl_args`` (the comparison's single
    mapping, checked by its tests) on a copy of ``cfg`` whose harness is one reply; the
    turn cap becomes ``max_tool_calling_iterations = turns - 1`` and the token budget
    ``max_completion_length = turns x max_tokens`` (TRL counts every turn in it, tool
    results included), each model call still capped at ``max_tokens``."""
    from vs_trl_lib import MappingError, harness_flag, trl_args

    hargs = list(cfg.run.harness_args)
    if "--no-tools" in hargs:
        raise MappingError(
            "the agent task needs the reference agent with its tools (no --no-tools)"
        )
    turns = int(harness_flag(hargs, "--max-turns") or 30)
    one = cfg.model_copy(
        update={
            "run": cfg.run.model_copy(
                update={"harness_args": [*hargs, "--max-turns", "1", "--no-tools"]}
            )
        }
    )
    args = trl_args(one, **kw)
    per_call = int(args["max_completion_length"])
    args["max_completion_length"] = turns * per_call
    args["max_tool_calling_iterations"] = turns - 1
    system = harness_flag(hargs, "--system")
    return args, {"turns": turns, "max_tokens": per_call, "system": system}


# ------------------------------------------------------------------------------ the run
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="examples/smollm2-agent.toml")
    ap.add_argument("--model", default="runs/smollm2", help="HF model directory")
    ap.add_argument("--taskset", default=None, help="default: the config's run.taskset")
    ap.add_argument("--family", default="calc", help="the task set's family")
    ap.add_argument("--task-seed", type=int, default=0, help="the task set's --seed")
    ap.add_argument("--steps", type=int, default=None, help="default: the config's total_steps")
    ap.add_argument("--seed", type=int, default=None, help="default: the config's seed")
    ap.add_argument(
        "--held-out", type=int, default=None, help="first K held-out tasks (default all)"
    )
    ap.add_argument("--eval-every", type=int, default=None, help="default: run.eval_interval")
    ap.add_argument("--micro-batch", type=int, default=8, help="completions per TRL forward")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Gyre config override, as gyre run --set (e.g. policy.group_size=4)",
    )
    ap.add_argument("--out", default="bench/results/trl_agent")
    return ap.parse_args(argv)


def load_tasks(
    taskset: str, cfg: Any, seed: int, n_train: int, n_held: int | None, fam: str, tseed: int
):
    """Training problems in Gyre's task order (its TaskStream) and the held-out problems,
    each with the instruction as the harness reads it (instruction.md)."""
    from gyre.harness.families import problems
    from gyre.harness.families.write import folder_name
    from gyre.runtime.tasks import TaskStream

    stream = TaskStream(taskset, cfg.run.train_tasks, cfg.run.eval_tasks, seed)
    known = {}
    for split, k in (("train", len(stream.train)), ("held-out", len(stream.eval))):
        for p in problems(fam, tseed, split, k):
            known[folder_name(p)] = p

    def problem(task) -> Any:
        p = known.get(task.name)
        if p is None:
            raise SystemExit(
                f"trl_agent_side: task {task.name} is not a {fam} seed-{tseed} problem"
            )
        # the file as the reference agent reads it (--instruction-file: its final "\n" too)
        text = (Path(task.root) / "instruction.md").read_text(encoding="utf-8")
        return dataclasses.replace(p, instruction=text)

    train = [problem(stream.task(g)) for g in range(n_train)]
    held = [problem(t) for t in sorted(stream.eval, key=lambda t: t.name)]
    return train, held[:n_held] if n_held else held


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from gyre.config import load_config

    try:
        cfg = load_config(a.config, a.sets)
    except (OSError, ValueError) as e:
        print(f"trl_agent_side: {e}", file=sys.stderr)
        return 2
    seed = cfg.seed if a.seed is None else a.seed
    steps = a.steps or cfg.policy.total_steps
    taskset = a.taskset or cfg.run.taskset
    if not (Path(a.model) / "config.json").is_file():
        print(f"trl_agent_side: --model {a.model} is not a model directory", file=sys.stderr)
        return 2
    if not Path(taskset).is_dir():
        print(
            f"trl_agent_side: no task set {taskset} (bash scripts/smollm2-agent.sh --prepare)",
            file=sys.stderr,
        )
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        targs, agent = agent_trl_args(
            cfg,
            steps=steps,
            seed=seed,
            precision="fp32",
            micro_batch=a.micro_batch,
            output_dir=str(out / "trainer"),
        )
    except ValueError as e:
        print(f"trl_agent_side: {e}", file=sys.stderr)
        return 2
    B, N = cfg.policy.batch_groups, cfg.policy.group_size
    train, held = load_tasks(taskset, cfg, seed, steps * B, a.held_out, a.family, a.task_seed)
    every = cfg.run.eval_interval if a.eval_every is None else a.eval_every
    eval_steps = {0, steps} | ({s for s in range(every, steps + 1, every)} if every else set())

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from gyre.harness.families import score
    from gyre.harness.families.toolproto import CHAT_TEMPLATE, SYSTEM

    torch.manual_seed(seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    system = agent["system"] if agent["system"] is not None else SYSTEM
    tok = AutoTokenizer.from_pretrained(a.model)
    tok.chat_template = CHAT_TEMPLATE  # the shared tool-call template (toolproto)

    def bash_parse(ids, prefix=None, tools=None):  # TRL's parsing hook: the proxy's parser
        text = tok.decode(ids, skip_special_tokens=False)
        for end in (tok.eos_token, "<|endoftext|>"):
            text = text.removesuffix(end)
        msg = parse_reply(text)
        msg.pop("unparsed")
        return msg

    tok.parse_response = bash_parse
    tok.response_template = "gyre bash blocks (gyre.proxy.parsing.BashBlockParser)"
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    by_name = {p.name: p for p in [*train, *held]}

    def prompt(p) -> list[dict[str, str]]:
        return [{"role": "system", "content": system}, {"role": "user", "content": p.instruction}]

    ds = Dataset.from_list([{"prompt": prompt(p), "name": p.name} for p in train])
    log: dict[str, Any] = {"t0": None, "gen_s": 0.0, "model_tokens": 0, "rows": [], "eval_s": 0.0}
    jsonl = (out / "trl_agent.jsonl").open("w")

    def now() -> float:
        return time.time() - (log["t0"] or T_PROCESS)

    def rss_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def scored(completion, name) -> dict[str, Any]:
        s = score(final_reply(completion), by_name[name])
        return {"reward": s.reward, "correct": int(s.correct), **turn_stats(completion)}

    def reward(prompts, completions, name, **_):
        rows = [scored(c, n) for c, n in zip(completions, name, strict=True)]
        log["rows"] += rows
        if log.get("sample") is None:  # the step's first execution that called the tool
            log["sample"] = next((c for c, r in zip(completions, rows) if r["tool_calls"]), None)
        return [r["reward"] for r in rows]

    class AgentGRPO(GRPOTrainer):
        """Each model call capped at the example's --max-tokens; generation timed."""

        def _generate_single_turn(self, prompt_ids, *args, **kw):
            t = time.perf_counter()
            self.generation_config.max_new_tokens = agent["max_tokens"]
            out_ids, lp = super()._generate_single_turn(prompt_ids, *args, **kw)
            log["gen_s"] += time.perf_counter() - t
            log["model_tokens"] += sum(len(x) for x in out_ids)
            return out_ids, lp

    def write(row: dict[str, Any]) -> None:
        jsonl.write(json.dumps(row) + "\n")
        jsonl.flush()

    def evaluate(trainer, step: int) -> None:
        t = time.perf_counter()
        m = trainer.model
        was = m.training
        m.eval()
        gen, toks = log["gen_s"], log["model_tokens"]
        # TRL builds the per-rollout tool tables in _generate_and_score_completions, which
        # evaluation bypasses: the same table (the one tool), one per held-out rollout
        trainer._sync_tool_dicts = [{TOOL_NAME: run_command} for _ in held]
        trainer._async_tool_dicts = [{} for _ in held]
        with torch.random.fork_rng():
            torch.manual_seed(seed * 1_000_003 + step)
            res = trainer._generate([prompt(p) for p in held])
        completions = res[3]
        log["gen_s"], log["model_tokens"] = gen, toks  # evaluation is not the step's
        if was:
            m.train()
        rows = [scored(c, p.name) for c, p in zip(completions, held, strict=True)]
        dt = time.perf_counter() - t
        log["eval_s"] += dt
        s = summarize(rows)
        write(
            {
                "kind": "eval",
                "step": step,
                "wall_s": round(now() - dt, 3),
                "eval_s": round(dt, 3),
                **s,
                "peak_rss_mb": round(rss_mb(), 1),
                "sample": brief(completions[0]),
            }
        )
        say(
            f"eval step {step}: held-out accuracy {s['accuracy']:.3f}, tool-call rate "
            f"{s['tool_call_rate']:.3f} ({len(held)} tasks, {dt:.1f} s)"
        )

    class Callback(TrainerCallback):
        trainer: Any = None
        last = 0.0

        def on_train_begin(self, args, state, control, **kw):
            log["t0"] = time.time()
            if 0 in eval_steps:
                evaluate(self.trainer, 0)
            self.last = now()

        def on_step_end(self, args, state, control, **kw):
            step, t = state.global_step, now()
            sec = t - self.last
            s = summarize(log["rows"])
            write(
                {
                    "kind": "step",
                    "step": step,
                    "wall_s": round(t, 3),
                    "step_s": round(sec, 3),
                    "generation_s": round(log["gen_s"], 3),
                    "model_tokens": log["model_tokens"],
                    "tokens_per_s": round(log["model_tokens"] / sec, 2) if sec > 0 else None,
                    "train_reward_mean": s["reward_mean"],
                    "train_pass_rate": s["accuracy"],
                    "tool_call_rate": s["tool_call_rate"],
                    "tool_calls_per_execution": s["tool_calls_per_execution"],
                    "model_calls": s["model_calls"],
                    "peak_rss_mb": round(rss_mb(), 1),
                    "sample_tool_execution": brief(log["sample"]),
                }
            )
            say(
                f"step {step}/{args.max_steps}: {sec:.1f} s (generation {log['gen_s']:.1f} s, "
                f"{log['model_tokens']} tokens), reward {s['reward_mean']:.3f}, "
                f"tool-call rate {s['tool_call_rate']:.2f}, turns {s['model_calls']}"
            )
            log.update(gen_s=0.0, model_tokens=0, rows=[], sample=None)
            if step in eval_steps:
                evaluate(self.trainer, step)
            self.last = now()

    cb = Callback()
    trainer = AgentGRPO(
        model=model,
        reward_funcs=[reward],
        args=GRPOConfig(**targs),
        train_dataset=ds,
        processing_class=tok,
        tools=[run_command],
        callbacks=[cb],
    )
    cb.trainer = trainer
    own = trainer.chat_template is None
    say(
        f"{steps} steps, N={N} B={B} lr={targs['learning_rate']}, {agent['turns']} turns of at most "
        f"{agent['max_tokens']} tokens, max_completion_length {targs['max_completion_length']}, "
        f"{len(held)} held-out tasks at steps {sorted(eval_steps)}; chat template: "
        f"{'toolproto.CHAT_TEMPLATE' if own else 'TRL replaced it (not prefix-preserving)'}"
    )
    ids0 = tok.apply_chat_template(
        prompt(train[0]),
        tools=[run_command],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    (out / "spec.json").write_text(
        json.dumps(
            {
                "config": a.config,
                "model": a.model,
                "taskset": taskset,
                "seed": seed,
                "steps": steps,
                "trl_args": targs,
                "agent": {**agent, "system": system},
                "eval_steps": sorted(eval_steps),
                "held_out": [p.name for p in held],
                "train_order": [p.name for p in train],
                "template_kept": own,
                "first_prompt_ids": list(ids0),
            },
            indent=1,
        )
    )
    trainer.train()
    jsonl.close()
    say(
        f"done: {steps} steps in {now():.1f} s (evaluations included), peak RSS {rss_mb():.0f} MB; "
        f"{out / 'trl_agent.jsonl'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
