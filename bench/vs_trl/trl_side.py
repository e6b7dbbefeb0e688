"""TRL's side of bench_vs_trl.py: GRPOTrainer (GSPO) on the spec the driver wrote; runs in .venv-trl.

    .venv-trl/bin/python bench/vs_trl/trl_side.py SPEC.json      (bench_vs_trl.py writes SPEC and runs this)

The spec holds the ``GRPOConfig`` arguments (``vs_trl_lib.trl_args``: Gyre's values), the
training problems in Gyre's task order, the held-out problems and the steps to evaluate
at. Prompts are ``[{"role": "user", "content": instruction}]``, rendered by TRL with the
model's chat template (the same one Gyre's proxy renders); the reward is the family's own
``score(reply, problem).reward`` (gyre.harness.families is pure Python: the repository root
goes on sys.path, nothing else of Gyre is imported). Held-out evaluation: one sample per
problem at the training sampling settings, under its own RNG stream (so evaluating does not
change the training draws), correct = reward >= 1, as Gyre's ``pass_rate``.

Writes the spec's ``out`` JSON: per-step times (since training began, evaluations
included, and the evaluation seconds apart), generation seconds, prompt and completion
tokens, rewards, the evaluations, the prompt ids of the first step (the driver checks them
against Gyre's traces) and the process's own peak RSS.
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import time
from pathlib import Path

T_PROCESS = time.time()
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # gyre.harness.families


def say(msg: str) -> None:
    print(f"[trl] {msg}", file=sys.stderr, flush=True)


class Log:
    """What the run measures about itself (plain data: written as JSON at the end)."""

    def __init__(self) -> None:
        self.t0: float | None = None  # unix time training began (on_train_begin)
        self.eval_s = 0.0  # evaluation seconds so far
        self.gen_s = 0.0  # generation seconds of the step in progress
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.rewards: list[float] = []
        self.correct = 0
        self.first_prompts: list[list[int]] | None = None
        self.steps: list[dict] = []
        self.evals: list[dict] = []
        self.logs: list[dict] = []

    def now(self) -> float:
        return time.time() - (self.t0 or T_PROCESS)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from gyre.harness.families import Problem, score

    seed, bf16 = int(spec["seed"]), spec["precision"] == "bf16"
    torch.manual_seed(seed)
    if spec.get("threads"):  # default: torch's own (one per core)
        torch.set_num_threads(int(spec["threads"]))
    train = [Problem(**p) for p in spec["train"]]
    held = [Problem(**p) for p in spec["held_out"]]
    by_name = {p.name: p for p in [*train, *held]}
    eval_steps = set(spec["eval_steps"])
    log = Log()

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    ds = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p.instruction}], "name": p.name} for p in train]
    )

    def family_reward(prompts, completions, completion_ids, name, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = [score(t, by_name[n]) for t, n in zip(texts, name, strict=True)]
        log.completion_tokens += sum(len(c) for c in completion_ids)
        log.rewards += [s.reward for s in scores]
        log.correct += sum(s.correct for s in scores)
        return [s.reward for s in scores]

    class TimedGRPO(GRPOTrainer):
        """GRPOTrainer with its generation timed and counted (bf16: under autocast, as the
        training forward is; TRL's transformers path would otherwise generate in float32)."""

        def _generate_single_turn(self, prompt_ids, *a, **k):
            t = time.perf_counter()
            with autocast():
                out = super()._generate_single_turn(prompt_ids, *a, **k)
            log.gen_s += time.perf_counter() - t
            log.prompt_tokens += sum(len(p) for p in prompt_ids)
            if log.first_prompts is None:
                uniq: list[list[int]] = []
                for p in prompt_ids:
                    if list(p) not in uniq:
                        uniq.append(list(p))
                log.first_prompts = uniq
            return out

    def evaluate(trainer, step: int) -> None:
        t = time.perf_counter()
        m = trainer.model
        was = m.training
        m.eval()
        msgs = [[{"role": "user", "content": p.instruction}] for p in held]
        ids = tok.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        ids = ids["input_ids"]
        width = max(len(x) for x in ids)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        inp = torch.tensor([[pad] * (width - len(x)) + list(x) for x in ids])
        att = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        with torch.random.fork_rng(), torch.no_grad(), autocast():
            torch.manual_seed(seed * 1_000_003 + step)
            out = m.generate(
                input_ids=inp, attention_mask=att, generation_config=trainer.generation_config
            )
        eos = set(trainer.eos_token_ids)
        texts = []
        for row in out[:, width:].tolist():
            cut = next((i + 1 for i, x in enumerate(row) if x in eos), len(row))
            texts.append(tok.decode(row[:cut], skip_special_tokens=True))
        scores = [score(x, p) for x, p in zip(texts, held, strict=True)]
        if was:
            m.train()
        dt = time.perf_counter() - t
        log.eval_s += dt
        acc = sum(s.correct for s in scores) / len(scores)
        log.evals.append(
            {
                "step": step,
                "time": log.now() - dt,  # when these weights existed (before this evaluation ran)
                "accuracy": acc,
                "reward_mean": sum(s.reward for s in scores) / len(scores),
                "formatted": sum(s.formatted for s in scores) / len(scores),
                "seconds": dt,
                "sample": texts[0][:300],
            }
        )
        say(f"eval step {step}: held-out accuracy {acc:.3f} ({len(held)} problems, {dt:.1f} s)")

    class Callback(TrainerCallback):
        trainer = None

        def on_train_begin(self, args, state, control, **kw):
            log.t0 = time.time()
            say(f"training begins {log.t0 - T_PROCESS:.1f} s after the process started")
            if 0 in eval_steps:
                evaluate(self.trainer, 0)

        def on_step_end(self, args, state, control, **kw):
            step, n = state.global_step, max(1, len(log.rewards))
            prev = log.steps[-1] if log.steps else {"time": log.eval_s, "eval_s": log.eval_s}
            now = log.now()
            row = {
                "step": step,
                "time": now,
                "eval_s": log.eval_s,
                "seconds": now - prev["time"] - (log.eval_s - prev["eval_s"]),
                "generation_s": log.gen_s,
                "prompt_tokens": log.prompt_tokens,
                "completion_tokens": log.completion_tokens,
                "reward_mean": sum(log.rewards) / n,
                "pass_rate": log.correct / n,
            }
            log.steps.append(row)
            say(
                f"step {step}/{args.max_steps}: {row['seconds']:.1f} s (generation "
                f"{log.gen_s:.1f} s), reward {row['reward_mean']:.3f}, pass {row['pass_rate']:.3f}"
            )
            log.gen_s, log.prompt_tokens, log.completion_tokens = 0.0, 0, 0
            log.rewards, log.correct = [], 0
            if step in eval_steps:
                evaluate(self.trainer, step)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                log.logs.append({"step": state.global_step, **logs})

    cb = Callback()
    trainer = TimedGRPO(
        model=model,
        reward_funcs=[family_reward],
        args=GRPOConfig(**spec["trl_args"]),
        train_dataset=ds,
        processing_class=tok,
        callbacks=[cb],
    )
    cb.trainer = trainer
    say(
        f"model {spec['model_dir']} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M "
        f"params), {spec['trl_args']['max_steps']} steps, precision {spec['precision']}"
    )
    trainer.train()
    t_end = log.now()
    result = {
        "t_process": T_PROCESS,
        "t_train_begin": log.t0,
        "train_s": log.steps[-1]["time"] if log.steps else None,
        "end_s": t_end,
        "steps": log.steps,
        "evals": log.evals,
        "first_prompts": log.first_prompts,
        "first_prompt_names": [p.name for p in train[: len(log.first_prompts or [])]],
        "trl_logs": log.logs,
        "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": torch.get_num_threads(),
    }
    Path(spec["out"]).write_text(json.dumps(result, indent=1))
    say(f"done: {len(log.steps)} steps in {result['train_s']:.1f} s (evaluations included)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.split("\n")[2].strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
