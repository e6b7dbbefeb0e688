#!/usr/bin/env bash
# Train the real model to use a shell tool: SmolLM2-135M-Instruct on the calc family through
# Gyre's reference agent, several turns per execution (examples/smollm2-agent.toml).
#   bash scripts/smollm2-agent.sh              # prepare (once), then gyre run the example
#   bash scripts/smollm2-agent.sh --prepare    # only: .venv, the model, its tool template, tasks,
#                                              # the warm-up (runs/smollm2-sft)
#   bash scripts/smollm2-agent.sh --set policy.total_steps=6 ...   # extra args go to gyre run
#   bash scripts/smollm2-agent.sh --mini [--prepare | ARGS...]      # mini-swe-agent instead
set -euo pipefail
cd "$(dirname "$0")/.."
mini=0
if [ "${1:-}" = "--mini" ]; then
  mini=1
  shift
fi
bash scripts/setup.sh
bash scripts/get-smollm2.sh
. "${GYRE_VENV:-.venv}/bin/activate"
if [ "$mini" = 1 ] && ! command -v mini >/dev/null; then
  bash scripts/install-harnesses.sh
fi
# the imported model with the shared tool-call chat template (weights linked, not copied)
python -m gyre.harness.families.toolproto runs/smollm2 runs/smollm2-tools >/dev/null
if [ ! -d runs/tasks/calc ]; then
  gyre harness generate calc runs/tasks/calc --seed 0 --train 256 --held-out 64
fi
# the warm-up (issue 34, docs/real-model.md): the base model gets no calc problem right, so
# RL's groups have nothing to rank; 2 supervised steps on oracle executions of other
# train-split problems (seed 1) give it the protocol. Skipped once runs/smollm2-sft exists,
# and with --mini, which has its own (below).
if [ "$mini" = 0 ] && [ ! -f runs/smollm2-sft/sft.json ]; then
  gyre harness demos calc runs/demos/calc.jsonl --n 128 --seed 1
  gyre train sft runs/smollm2-tools runs/demos/calc.jsonl runs/smollm2-sft --steps 2
fi
# mini-swe-agent (docs/real-model.md): its warm-up is in its own format (the answer is its submit
# command), its launcher imports litellm (4.4 s of CPU and 234 MB each), so at most 8 run at once
# and the micro-steps are halved to leave it the memory
if [ "$mini" = 1 ] && [ ! -f runs/smollm2-sft-mini/sft.json ]; then
  gyre harness demos calc runs/demos/calc-mini.jsonl --n 128 --seed 1 --harness mini-swe-agent
  gyre train sft runs/smollm2-tools runs/demos/calc-mini.jsonl runs/smollm2-sft-mini --steps 2
fi
if [ "${1:-}" = "--prepare" ]; then
  exit 0
fi
if [ "$mini" = 1 ]; then
  exec gyre run examples/smollm2-agent.toml --set model_dir=runs/smollm2-sft-mini \
    --set run.profile=gyre/harness/mini_tools.toml --set 'run.harness_args=[]' \
    --set executor.max_concurrency=8 --set trainer.stream.token_budget=2048 "$@"
fi
exec gyre run examples/smollm2-agent.toml "$@"
