"""`gyre run` end to end: Ray cells, the proxy, real reference-agent harnesses, the trainer.

One short elastic run (K=3, N=4, B=2, 4 steps, an evaluation every 2 versions) is shared by
most tests, which check what it wrote against itself and against a local re-computation:
the runtime's first steps, retrained on one local core from the run's own traces and
rewards, must give the weights the runtime checkpointed. Fault tests (slow) each do their
own short run: the driver SIGKILLed mid-run and resumed; a harness process SIGKILLed.

Runs go through ``python -m gyre.cli run`` in a subprocess (Ray state stays out of pytest).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.sockets import ListenerLog

N, B = 4, 2  # group size, groups per step
STEPS = 4

# The quickstart's settings at a smaller scale, written out here so the test does not move with it:
# all four tasks of the quickstart set, one turn of at most 24 tokens through the reference agent.
CONFIG = f"""
seed = 0

[policy]
placement = "elastic"
cells = 3
cell_capacity = {N}
group_size = {N}
batch_groups = {B}
phi = 0.5
mu = 3
streaming = true
rho_min = 0.25
hold_tau = 0.0

[engine]
max_batch = 16

[trainer]
j_max = 5

[trainer.optim]
lr = 0.003
grad_clip = 1.0

[trainer.objective]
clip_low = 0.8
clip_high = 1.25

[trainer.stream]
token_budget = 4096

[trainer.checkpoint]
keep = 10

[executor]
max_concurrency = 64

[run]
taskset = "quickstart"
profile = "reference"
harness_args = ["--max-turns", "1", "--max-tokens", "24", "--no-delegate", "--client", "stdlib"]

[run.cell]
calibrate_s = 0.0  # the start-up calibration (2 s) only where a test reads it
"""

pytestmark = pytest.mark.timeout(1200)

# Ray's raylet gives its dashboard agent 15 s to come up; on an overloaded machine it sometimes
# does not, and ray.init fails before anything of Gyre's started. That is retried once.
RAY_START_FAILED = "timed out during startup"


def _env() -> dict[str, str]:
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def _sets(model_dir: Path, out_dir: Path, name: str, steps: int, *extra: str) -> list[str]:
    return [
        f"model_dir={model_dir}",
        f"policy.total_steps={steps}",
        f"run.out_dir={out_dir}",
        f"run.name={name}",
        *extra,
    ]


def _args(model_dir: Path, out_dir: Path, name: str, steps: int, *extra: str) -> list[str]:
    cfg = out_dir / "config.toml"
    cfg.write_text(CONFIG)
    out = [sys.executable, "-m", "gyre.cli", "run", str(cfg), "--log-format", "plain"]
    for s in _sets(model_dir, out_dir, name, steps, *extra):
        out += ["--set", s]
    return out


def _wait(p: subprocess.Popen, timeout: float, watch: Callable[[int], None] | None) -> int:
    """``p.wait(timeout)``; with ``watch``, calls ``watch(p.pid)`` about every second meanwhile."""
    if watch is None:
        return p.wait(timeout=timeout)
    end = time.monotonic() + timeout
    while (rc := p.poll()) is None:
        if time.monotonic() > end:
            raise subprocess.TimeoutExpired(p.args, timeout)
        watch(p.pid)
        time.sleep(1.0)
    return rc


def _gyre(
    argv: list[str], log: Path, timeout: float = 600, watch: Callable[[int], None] | None = None
) -> subprocess.CompletedProcess:
    """Run ``gyre run ...`` to its end; its output goes to ``log`` (and into assertion messages).
    ``watch(pid)`` is called about every second while it runs."""
    for attempt in range(2):
        with open(log, "w") as f:
            p = subprocess.Popen(
                argv,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=_env(),
                cwd=log.parent,
                start_new_session=True,
            )
            try:
                rc = _wait(p, timeout, watch)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                raise AssertionError(
                    f"gyre run did not finish in {timeout}s:\n{log.read_text()[-4000:]}"
                )
        text = log.read_text()
        if rc != 0 and RAY_START_FAILED in text and attempt == 0:
            continue
        return subprocess.CompletedProcess(argv, rc, text, "")
    return subprocess.CompletedProcess(argv, rc, text, "")


def _jsonl(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def _reap_group(pgid: int, wait_s: float = 20.0) -> None:
    """After a SIGKILLed driver: give what it left (Ray's agents, harnesses) time to go, then end it."""
    t = time.monotonic()
    while time.monotonic() - t < wait_s:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class _Watch:
    """While the shared run runs: every listening socket of its process tree (what `ss -ltnp`
    shows), and, once, what its first engine answers a caller without the run's engine key."""

    def __init__(self, rd: Path) -> None:
        self.rd, self.log, self.driver = rd, None, 0
        self.probe: dict[str, int] = {}
        self.harness_envs: list[bool] = []  # per harness process seen: holds the engine key var

    def __call__(self, pid: int) -> None:
        if self.log is None or self.driver != pid:  # a retried start is a new tree
            self.log, self.driver = ListenerLog(pid), pid
        self.log.sample()
        for q in self.log.tree:
            try:
                if b"gyre.harness.reference_agent" in Path(f"/proc/{q}/cmdline").read_bytes():
                    env = Path(f"/proc/{q}/environ").read_bytes()
                    self.harness_envs.append(b"GYRE_ENGINE_API_KEY=" in env)
            except OSError:
                continue
        cells = self.rd / "cells.json"
        if not self.probe and cells.exists():
            try:
                url = json.loads(cells.read_text())[0]["url"]
            except (ValueError, KeyError, IndexError):
                return  # being written, or cell 0 trains at start: next time
            for path in ("/get_model_info", "/health"):
                try:
                    with urllib.request.urlopen(url + path, timeout=5) as r:
                        self.probe[path] = r.status
                except urllib.error.HTTPError as e:
                    self.probe[path] = e.code
                except OSError:
                    self.probe.clear()  # the engine went (a switch): try another time
                    return


# ------------------------------------------------------------------------------ the shared run
@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gyre-run")
    t0 = time.monotonic()
    extra = ("run.eval_interval=2", "run.eval_attempts=1", "run.cell.calibrate_s=1")
    watch = _Watch(out / "main")
    r = _gyre(_args(tiny_model_dir, out, "main", STEPS, *extra), out / "main.log", watch=watch)
    return {
        "watch": watch,
        "rc": r.returncode,
        "log": r.stdout,
        "dir": out / "main",
        "model": Path(tiny_model_dir),
        "seconds": time.monotonic() - t0,
        "sets": _sets(tiny_model_dir, out, "main", STEPS, *extra),
        "config": out / "config.toml",
    }


@pytest.fixture(scope="module")
def done(run):
    assert run["rc"] == 0, run["log"][-6000:]
    rd = run["dir"]
    return {
        **run,
        "summary": json.loads((rd / "summary.json").read_text()),
        "metrics": _jsonl(rd / "metrics.jsonl"),
        "executions": _jsonl(rd / "executions.jsonl"),
    }


def test_run_exits_0_and_summary(done):
    s = done["summary"]
    assert s["placement"] == "elastic"
    assert s["steps"] == STEPS and s["steps_this_segment"] == STEPS and s["segment"] == 0
    assert s["interrupted_executions"] == 0
    assert s["proxy"]["errors_5xx"] == 0 and s["proxy"]["engine_errors"] == 0
    assert s["executions"]["failed"] == 0 and s["executions"]["missing"] == 0
    # every execution that finished is in executions.jsonl, every call answered has a trace record
    assert s["executions"]["finished"] == len(done["executions"])
    assert s["proxy"]["records"] == s["proxy"]["answered"] > 0
    assert 0 < s["makespan_s"] < done["seconds"]
    assert len(s["cells"]) == 3 and len({c["pid"] for c in s["cells"]}) == 3
    assert len(s["role_shares"]) == 3
    up = s["startup"]  # where this segment's start-up went, phase by phase
    assert {"ray_s", "cells_s", "engines_s", "proxy_s"} <= set(up), up
    assert all(v > 0 for v in up.values()) and sum(up.values()) < done["seconds"], up
    assert f"cells up in {sum(up.values()):.1f} s (ray " in done["log"]
    for share in s["role_shares"]:
        assert sum(share.values()) == pytest.approx(1.0, abs=1e-3)
    assert s["policy"]["steps_done"] == STEPS and s["policy"]["done"] is True
    # the regime the run measured: training took part of the cells' time, steps cost time,
    # the engines answered, and the start-up calibration timed its fixed compute
    r = s["regime"]
    assert 0 < r["compute_share"] < r["training_share"] < 1, r
    assert r["microstep_s"] > 0 and r["optim_s"] > 0 and r["engine_tokens_per_s"] > 0, r
    cal = r["calibration"]
    assert cal["iterations"] > 0 and cal["gflops"] > 0 and "error" not in cal, cal
    assert cal["cpus"] == os.cpu_count() and cal["load_before"] >= 0, cal
    # the main loop's own cost per event: every handled event was carried out and timed, and
    # each step assigned its groups (AssignGroup's spans are in it)
    ctl = s["controller"]
    assert ctl["per_event"]["n"] == ctl["handle"]["n"] == ctl["carry_out"]["n"] > 0, ctl
    assert ctl["with_assign"]["n"] + ctl["without_assign"]["n"] == ctl["per_event"]["n"], ctl
    assert ctl["assign"]["all"]["n"] >= STEPS and ctl["assign_tasks"] > 0, ctl
    assert 0 < ctl["per_event"]["p50_ms"] <= ctl["per_event"]["max_ms"], ctl
    assert 0 < ctl["per_event"]["total_s"] < s["makespan_s"], ctl
    # the final progress line counts every step
    assert f"step {STEPS}/{STEPS}" in done["log"]
    # the live view (plain lines): every cell's activity, counters, rounded scores; no Ray notice
    log = done["log"]
    assert "0:" in log and "rerouted " in log and "faults " in log and "missing " in log, log
    closing = next(ln for ln in log.splitlines() if "reward first/last quarter" in ln)
    assert not re.search(r"\d\.\d{6}", closing), closing  # 4 significant digits, not 17
    for notice in ("Started a local Ray instance", "Token authentication", "Usage stats"):
        assert notice not in log, notice


def test_nothing_of_gyre_listens_outside_loopback(done):
    """A local run binds every server of Gyre's (engines, gloo, the proxy) to 127.0.0.1. Sampled
    from /proc every second while the run ran (what `ss -ltnp` shows for its process tree).
    Left outside loopback: Ray 2.60's own gRPC servers, which bind every interface whatever the
    node IP (one per Ray worker, the driver and every cell included; GCS, raylet, agents) and
    its metrics ports; none is bound to a specific routable address any more (docs/runtime.md)."""
    w = done["watch"]
    seen, driver = w.log, w.driver
    table = seen.table()
    rows = list(seen.seen.values())
    assert any(r.pid == driver and r.loopback for r in rows), table  # the proxy was seen
    outside = [r for r in rows if not r.loopback]
    assert all(r.wildcard for r in outside), table  # nothing on the machine's own address
    cells = {c["pid"] for c in done["summary"]["cells"]}
    assert cells and cells <= {r.pid for r in rows}, table
    for pid in cells | {driver}:  # Ray's core-worker server is the one wildcard socket of each
        assert len([r for r in outside if r.pid == pid]) <= 1, table
    s = done["summary"]
    urls = [u for per_cell in s["engine_urls"] for u in per_cell]
    hosts = {re.match(r"http://([^:/]+):", u).group(1) for u in urls}  # type: ignore[union-attr]
    assert hosts == {"127.0.0.1"}, urls
    # the gloo world met in a file of the driver's private folder: no rendezvous port at all
    assert {c["gloo"] for c in s["cells"]} == {"127.0.0.1:0"}, s["cells"]
    assert "proxy at http://127.0.0.1:" in done["log"]


def test_the_runs_engines_answer_only_to_its_key(done):
    """Without the run's engine key an engine of the run answers 401 (generation and control
    alike); /health alone is open. No harness process had the key in its environment."""
    w = done["watch"]
    assert w.probe == {"/get_model_info": 401, "/health": 200}
    assert w.harness_envs and not any(w.harness_envs)


def test_metrics_one_line_per_step(done):
    m = done["metrics"]
    assert [r["step"] for r in m] == list(range(STEPS))
    assert [r["version"] for r in m] == list(range(1, STEPS + 1))
    times = [r["time"] for r in m]
    assert times == sorted(times)
    for r in m:
        assert r["batch/groups"] == B == len(r["groups"])
        assert r["batch/executions_scored"] == B * N and r["batch/executions_missing"] == 0
        assert r["train/participants"] >= 1
        assert r["actor/grad_norm"] >= 0
        if r["batch/executions_trained"]:
            assert (
                r["train/tokens"] > 0 and r["actor/target_tokens"] > 0 and r["actor/grad_norm"] > 0
            )
        # staleness per step: dispatch version <= the step's version, within the policy's bound
        assert isinstance(r["batch/staleness_mean"], (int, float))
        assert 0 <= r["batch/staleness_mean"] <= r["batch/staleness_max"] <= 3 + 1
        assert r["sched/capacity"] is not None
        # tool-call health from the traces: --max-turns 1 is one answered call per execution
        assert r["tools/turns_per_execution"] == 1.0
        assert r["tools/by_profile/reference/turns_per_execution"] == 1.0
        assert 0 <= r["tools/no_call_executions"] <= B * N
    # the first step trains groups dispatched at version 0, at version 0
    assert m[0]["batch/staleness_max"] == 0
    # with mu = 3, later steps train groups dispatched before the previous publication
    assert max(r["batch/staleness_max"] for r in m) >= 1


def test_every_group_trained_once_with_its_own_executions(done):
    m, ex = done["metrics"], done["executions"]
    trained = [g for r in m for g in r["groups"]]
    assert len(trained) == len(set(trained)) == STEPS * B
    ids = [e["execution"] for e in ex]
    assert len(ids) == len(set(ids))
    by_group: dict[int, list[dict]] = {}
    for e in ex:
        assert re.fullmatch(r"r0-g\d{5}-a\d{2}", e["execution"]), e
        assert e["segment"] == 0 and e["failed"] is False and e["harness_stop"] == "exited"
        assert isinstance(e["reward"], (int, float)) and 0.0 <= e["reward"] <= 1.0
        by_group.setdefault(e["group"], []).append(e)
    for r in m:
        rewards = []
        for g in r["groups"]:
            rows = by_group[int(g[1:])]
            assert sorted(e["attempt"] for e in rows) == list(range(N))
            assert len({e["task"] for e in rows}) == 1  # one query per group
            rewards += [e["reward"] for e in rows]
        # the step's reward is the mean over exactly its groups' executions
        assert r["reward/mean"] == pytest.approx(sum(rewards) / len(rewards), rel=1e-9, abs=1e-12)
    # one batch never repeats a query (B <= the split)
    from gyre.runtime.tasks import TaskStream

    stream = TaskStream("quickstart", [], [], seed=0)
    for r in m:
        tasks = [by_group[int(g[1:])][0]["task"] for g in r["groups"]]
        assert tasks == [stream.task(int(g[1:])).name for g in r["groups"]]
    # each finished execution left a trace file
    from gyre.trace.store import trace_path

    for e in ex:
        assert trace_path(done["dir"] / "traces", e["execution"]).is_file(), e["execution"]


def test_outputs_timeline_tensorboard_config(done):
    rd = done["dir"]
    png = (rd / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    events = list((rd / "tb").glob("events.out.tfevents.*"))
    assert events and sum(p.stat().st_size for p in events) > 0
    assert b"reward/mean" in b"".join(p.read_bytes() for p in events)
    # the written config loads back to the config of the run
    from gyre.config import load_config

    cfg = load_config(rd / "config.toml")
    assert (
        cfg.policy.total_steps == STEPS
        and cfg.policy.group_size == N
        and cfg.policy.batch_groups == B
    )
    assert cfg == load_config(done["config"], done["sets"])


def test_switches_and_publications(done):
    s = done["summary"]
    assert s["switches"]["training"]["count"] >= 1, s["switches"]
    assert s["switches"]["rollout"]["count"] >= 1, s["switches"]
    assert s["publications"]["count"] >= 1
    shares = s["role_shares"]
    assert any(sh.get("training", 0) > 0 for sh in shares[1:])  # a satellite trained
    assert all(sh.get("rollout", 0) > 0 for sh in shares)  # every cell served rollouts
    # published weights are pruned during the run (the newest run.keep_published = 2), and at
    # its end only the final one stays, with no satellite snapshot beside it
    published = [p for p in (done["dir"] / "weights").glob("v*") if not p.name.endswith(".tmp")]
    assert [p.name for p in published] == [f"v{s['steps']}"], published
    assert not list((done["dir"] / "weights" / "snapshots").iterdir())
    assert s["disk_dropped_at_end"] > 0  # at least the satellites' snapshots
    # every engine reload was checked against the core's fingerprint (embedded engines)
    assert s["publications"]["engines_checked"] >= 1
    disk = s["disk_bytes"]
    assert disk["checkpoints"] > 0 and disk["published_weights"] > 0 and disk["traces"] > 0
    # each rollout phase's engine reported its prefix cache when it left (issue 35's hit rate)
    pc = s["prefix_cache"]
    assert pc["engine_phases"] >= s["switches"]["training"]["count"], pc  # + the run's end
    assert pc["prefill_tokens"] > 0 and pc["hits"] + pc["misses"] > 0, pc
    assert 0 <= pc["hit_rate"] <= 1 and 0 <= pc["token_share"] < 1, pc


def test_cells_log_switches_and_steps_as_json_lines(done):
    """Each cell writes its own events to logs/cell-<i>.jsonl (gyre.log), JSON lines whatever
    the terminal shows, and none of them reaches the driver's output (Ray's log_to_driver is
    off). They agree with what the driver recorded: the switches, every step's target tokens,
    and the core's optimizer steps with their versions and signal."""
    logs = done["dir"] / "logs"
    rows = {i: _jsonl(logs / f"cell-{i}.jsonl") for i in range(3)}
    assert (logs / "driver.jsonl").is_file()
    for i, rs in rows.items():
        assert rs, i
        for r in rs:
            assert {"ts", "level", "logger", "msg"} <= set(r), r
        switches = [r for r in rs if r.get("event") == "switch"]
        assert switches and switches[0]["from"] is None, switches  # its first role, at start
        for a, b in zip(switches, switches[1:]):
            assert b["from"] == a["to"] != b["to"], switches
        for r in switches:
            assert r["cell"] == i and r["seconds"] >= 0 and isinstance(r["version"], int), r
    every = [r for rs in rows.values() for r in rs]
    moved = [r for r in every if r.get("event") == "switch" and r["from"] is not None]
    s = done["summary"]["switches"]
    for role in ("training", "rollout"):  # a switch in flight at the end is the cell's alone
        assert len([r for r in moved if r["to"] == role]) >= s[role]["count"] >= 1, moved
    claimed = [r for r in every if r.get("event") == "microstep.claimed"]
    finished = [r for r in every if r.get("event") == "microstep.done"]
    assert len(claimed) == len(finished) > 0
    for m in done["metrics"]:
        got = sum(r["target_tokens"] for r in finished if r["step"] == m["step"])
        assert got == m["actor/target_tokens"], m["step"]
    steps = [r for r in rows[0] if r.get("event") == "optimizer_step"]
    assert [r["version"] for r in steps] == [m["version"] for m in done["metrics"]]
    assert [r["signal"] for r in steps] == [m["actor/target_tokens"] > 0 for m in done["metrics"]]
    assert not any(r.get("event") == "optimizer_step" for i in (1, 2) for r in rows[i])
    assert "micro-steps of g" not in done["log"] and "-> training in" not in done["log"]


def test_mismatch_metrics_per_step(done):
    """Engine and trainer agree (float32 both sides, tiny model); versions split the targets."""
    for r in done["metrics"]:
        n = r["mismatch/tokens_same_version"] + r["mismatch/tokens_other_version"]
        assert n == r["actor/target_tokens"], r
    same = [r for r in done["metrics"] if r["mismatch/tokens_same_version"]]
    assert same, "no step trained on tokens of its own version"
    for r in same:
        assert r["mismatch/max_abs_same_version"] < 1e-3, r
        assert 1.0 <= r["mismatch/token_mult_prob_error_same_version"] < 1.001, r
        # the same targets again, by the model call of their execution that sampled them
        turns = {k: v for k, v in r.items() if k.startswith("mismatch/tokens_same_version_turn")}
        assert "mismatch/tokens_same_version_turn1" in turns, r
        assert sum(turns.values()) == r["mismatch/tokens_same_version"], r
        for k in turns:
            assert 0 <= r[k.replace("tokens_", "kl_")] < 1e-6, r


def test_evaluations(done):
    ev = _jsonl(done["dir"] / "evals.jsonl")
    assert ev and all("error" not in e for e in ev), ev
    assert any(e["reward_mean"] is not None for e in ev)
    versions = [e["version"] for e in ev]
    assert len(versions) == len(set(versions)) >= 2
    assert 0 in versions and STEPS in versions  # the starting and the final weights are evaluated
    for e in ev:
        assert e["executions"] == 4 and e["held_out"] is False  # 4 tasks x 1 attempt
        assert sorted(e["per_task"]) == ["digits", "letter-a", "upper", "vowels"]
        scored = [x for v in e["per_task"].values() for x in v if x is not None]
        assert e["reward_mean"] == pytest.approx(sum(scored) / len(scored))
    assert done["summary"]["evals"] == ev
    # evaluations never enter training: their ids are apart from the groups'
    assert not any("eval" in e["execution"] for e in done["executions"])


def test_checkpoints_hold_the_data_cursor(done):
    from gyre.train.checkpoint import latest_checkpoint, load_state

    ck = done["dir"] / "checkpoints"
    assert latest_checkpoint(ck) == ck / f"step-{STEPS}"
    groups = [g for r in done["metrics"] for g in r["groups"]]
    for s in range(1, STEPS + 1):
        st = load_state(ck / f"step-{s}")
        assert st.step == st.policy_version == s
        assert st.consumed_groups == groups[: s * B]


# ------------------------------------------------------------------------------ weight equality
def _step_groups(rd: Path, cfg, metrics: dict, executions: list[dict], step: int):
    from gyre.harness.roles import role_profile
    from gyre.trace.assessment import Missing, MissingReason
    from gyre.trace.store import trace_path
    from gyre.train.groups import group_from_traces

    tc = cfg.trainer
    out = []
    for g in metrics["groups"]:
        rows = [e for e in executions if e["group"] == int(g[1:])]
        assert len(rows) == N
        traces = {e["execution"]: trace_path(rd / "traces", e["execution"]) for e in rows}
        rewards = {
            e["execution"]: Missing(reason=MissingReason(e["missing"]))
            if e["reward"] is None
            else e["reward"]
            for e in rows
        }
        grp, rep = group_from_traces(
            g,
            traces,
            rewards,
            role_profile=role_profile("reference"),
            j_max=tc.j_max,
            seed=tc.seed,
            step=step,
        )
        assert not rep.unreadable
        out.append(grp)
    return out


ADAM_WELL_CONDITIONED = 1e-7  # sqrt(v_hat) at 10x Adam's eps


def _adam_scale(core) -> dict:
    """Per parameter element: sqrt of Adam's bias-corrected second moment after the step."""
    import torch

    beta2 = core.cfg.optim.betas[1]
    out = {}
    for name, p in core.model.named_parameters():
        st = core.optimizer.state.get(p)
        if st and "exp_avg_sq" in st:
            t = float(st["step"])
            out[name] = torch.sqrt(st["exp_avg_sq"] / (1 - beta2**t))
    return out


def test_runtime_steps_match_a_local_core(done, tmp_path):
    """The first two steps that carried signal, each retrained by one local core from the checkpoint before it
    (optimizer state included) with the run's own traces and rewards, lands on the runtime's
    next checkpoint: the split over cells, the reduce, 1/E, the clip and the step agree."""
    import torch
    from safetensors.torch import load_file

    from gyre.config import load_config
    from gyre.train.demo.coordinator import LocalCoordinator
    from gyre.train.demo.core import Core

    torch.set_num_threads(1)
    rd = done["dir"]
    cfg = load_config(rd / "config.toml")
    ck = rd / "checkpoints"
    compared = []
    for s, m in enumerate(done["metrics"]):
        if len(compared) == 2:  # ~5-10 s a step on 2 busy cores
            break
        after = load_file(str(ck / f"step-{s + 1}" / "model.safetensors"))
        before = load_file(str((ck / f"step-{s}" if s else done["model"]) / "model.safetensors"))
        if not m["batch/executions_trained"]:
            # no signal: the runtime took no optimizer step, the weights are bit for bit the same
            assert all(torch.equal(after[k], before[k]) for k in after), s
            continue
        root = tmp_path / f"ck{s}"
        if s:
            shutil.copytree(ck / f"step-{s}", root / f"step-{s}")
            (root / "latest").write_text(f"step-{s}")
        tc = cfg.trainer.model_copy(
            update={
                "checkpoint": cfg.trainer.checkpoint.model_copy(
                    update={"dir": str(root) if s else None, "every_steps": 10**6}
                )
            }
        )
        core = Core(tc, LocalCoordinator())
        core.start(resume=bool(s))
        assert core.state.step == s
        assert core.add_groups(_step_groups(rd, cfg, m, done["executions"], s)) == B
        res = core.run_step()
        mine = {k: v.detach().clone() for k, v in core.model.state_dict().items()}
        scale = _adam_scale(core)
        core.stop()
        assert res.metrics["batch/executions_scored"] == m["batch/executions_scored"]
        assert res.metrics["train/tokens"] == m["train/tokens"]
        # Adam is blind to a gradient's scale: the norm (after 1/E, before the clip) checks the 1/E;
        # the loss is a float32 sum that nearly cancels (advantages sum to 0 in a group)
        assert res.metrics["actor/grad_norm"] == pytest.approx(m["actor/grad_norm"], rel=1e-5)
        assert res.metrics["actor/loss"] == pytest.approx(m["actor/loss"], rel=1e-4, abs=1e-6)
        moved = max(float((after[k] - before[k]).abs().max()) for k in after)
        assert moved > 1e-4, (s, moved)  # the step did change the weights
        # Adam divides by sqrt(v_hat) + eps: where every gradient so far is ~1e-10 (float32 round-off
        # of sums of O(1) terms, taken in another order on the cells), the update is round-off / eps
        # and differs by up to ~1e-4. Everywhere else the weights must agree to float32 precision.
        diff = noisy = total = 0
        worst_noisy = 0.0
        for k in after:
            d = (after[k] - mine[k]).abs()
            ok = (
                scale[k] >= ADAM_WELL_CONDITIONED
                if k in scale
                else torch.ones_like(d, dtype=torch.bool)
            )
            diff = max(diff, float(d[ok].max()) if ok.any() else 0.0)
            noisy += int((~ok).sum())
            total += d.numel()
            worst_noisy = max(worst_noisy, float(d[~ok].max()) if (~ok).any() else 0.0)
        assert diff <= 1e-5, (s, diff, moved)
        assert noisy <= 1e-2 * total, (s, noisy, total)  # the exception stays an exception
        assert worst_noisy <= 1.01 * cfg.trainer.optim.lr, (s, worst_noisy)
        compared.append(s)
    assert compared, "no step of the run carried gradient signal"


# ------------------------------------------------------------------------------ faults
def _part_done(rd: Path) -> dict[int, int]:
    """Groups not (yet) trained with some but not all of their executions finished: id -> done."""
    trained = {int(g[1:]) for x in _jsonl_torn(rd / "metrics.jsonl") for g in x["groups"]}
    done: dict[int, int] = {}
    for e in _jsonl_torn(rd / "executions.jsonl"):
        if e["group"] not in trained:
            done[e["group"]] = done.get(e["group"], 0) + 1
    return {g: n for g, n in done.items() if n < N}


def _jsonl_torn(p: Path) -> list[dict]:
    """Rows of a JSONL file being written: a torn last line is left out."""
    out = []
    for x in p.read_text().splitlines() if p.exists() else []:
        try:
            out.append(json.loads(x))
        except ValueError:
            pass
    return out


def kill_mid_group(argv: list[str], rd: Path, log: Path, steps: int) -> subprocess.Popen:
    """Start ``gyre run`` and SIGKILL its driver once a step is done and a group in flight has
    some, not all, of its executions finished (mid-burst: the next step's group half scored)."""
    for attempt in range(2):
        with open(log, "w") as f:
            p = subprocess.Popen(
                argv,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=_env(),
                cwd=log.parent,
                start_new_session=True,
            )
        t0 = time.monotonic()
        hit = False
        while p.poll() is None and time.monotonic() - t0 < 600:
            m = _jsonl_torn(rd / "metrics.jsonl")
            if 1 <= len(m) < steps and _part_done(rd):
                hit = True
                break
            time.sleep(0.02)
        if p.poll() is None:
            break
        text = log.read_text()
        assert attempt == 0 and RAY_START_FAILED in text, text[-4000:]
    assert hit, "no step done with a group half finished in time"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    _reap_group(p.pid)
    return p


@pytest.mark.slow
def test_driver_killed_then_resumed(tiny_model_dir, tmp_path):
    """SIGKILL the driver once a step is done and a group in flight is partly finished; `gyre
    run --resume` finishes the run: every step once, every group trained once with N
    executions, the finished executions of the groups in flight kept (not relaunched, not
    logged twice), only their unfinished attempts relaunched, the rest on fresh group ids."""
    steps = 6  # more steps, more moments to catch a group part finished
    rd = tmp_path / "killed"
    # two executions per cell: a group's attempts start as others end, so groups are caught
    # part finished
    extra = ("run.eval_interval=0", "policy.cell_capacity=2")
    argv = _args(tiny_model_dir, tmp_path, "killed", steps, *extra)
    kill_mid_group(argv, rd, tmp_path / "first.log", steps)
    killed_at = len(_jsonl(rd / "metrics.jsonl"))
    assert killed_at < steps, "the run finished before it was killed"
    assert not (rd / "summary.json").exists()
    first = _jsonl_torn(rd / "executions.jsonl")
    ckpt = json.loads(
        (rd / "checkpoints" / (rd / "checkpoints" / "latest").read_text().strip())
        .joinpath("trainer_state.json")
        .read_text()
    )
    trained_before = {int(g[1:]) for g in ckpt["consumed_groups"]}
    in_flight = {e["group"] for e in first} - trained_before
    assert in_flight, "nothing in flight"
    kept = {(e["group"], e["attempt"]) for e in first if e["group"] in in_flight}
    partial = [g for g in in_flight if 0 < sum(1 for k in kept if k[0] == g) < N]
    assert partial, "no group in flight was partly finished"
    assert all(e["dispatch_version"] is not None and "served_versions" in e for e in first)

    r = _gyre(
        [sys.executable, "-m", "gyre.cli", "run", "--resume", str(rd), "--log-format", "plain"],
        tmp_path / "resume.log",
    )
    assert r.returncode == 0, r.stdout[-6000:]
    assert re.search(r"resuming .* at step [1-9]", r.stdout)
    line = re.search(
        r"in flight: (\d+) groups, (\d+) finished executions kept, (\d+) attempts", r.stdout
    )
    assert line, r.stdout[-3000:]
    assert (int(line[1]), int(line[2]), int(line[3])) == (
        len(in_flight),
        len(kept),
        len(in_flight) * N - len(kept),
    )
    assert f"step {steps}/{steps}" in r.stdout
    m = _jsonl(rd / "metrics.jsonl")
    assert [x["step"] for x in m] == list(range(steps))
    assert [x["version"] for x in m] == list(range(1, steps + 1))
    trained = [g for x in m for g in x["groups"]]
    assert len(trained) == len(set(trained)) == steps * B  # every group trained once
    s = json.loads((rd / "summary.json").read_text())
    assert s["steps"] == steps and s["segment"] == 1 and s["interrupted_executions"] == 0
    assert s["executions"]["this_segment"]["restored"] >= 1
    resumed_at = steps - s["steps_this_segment"]
    assert 1 <= resumed_at <= killed_at + 1
    ex = _jsonl(rd / "executions.jsonl")
    ids = [e["execution"] for e in ex]
    assert len(ids) == len(set(ids))
    # each attempt finished once over both segments: nothing finished was run again
    attempts = [(e["group"], e["attempt"]) for e in ex]
    assert len(attempts) == len(set(attempts))
    later = ex[len(first) :]
    assert not kept & {(e["group"], e["attempt"]) for e in later}
    # the summary counts the executions of both segments, not only the resumed one's
    assert s["executions"]["finished"] == len(ex) > len(later)
    assert s["executions"]["this_segment"]["finished"] == len(later)
    assert later and all(e["segment"] == 1 and e["execution"].startswith("r1-") for e in later)
    # the resumed segment ran the in-flight groups' unfinished attempts, then fresh groups
    fresh = {e["group"] for e in later} - in_flight
    assert not fresh or min(fresh) > max(e["group"] for e in first)
    by_group: dict[int, list[dict]] = {}
    for e in ex:
        by_group.setdefault(e["group"], []).append(e)
    for x in m:  # every trained group has its N executions, each counted once
        for g in x["groups"]:
            assert len(by_group[int(g[1:])]) == N, g
    # a trained partial group mixes the two segments; its staleness is its executions' mean
    mixed = [g for g in partial if f"g{g}" in trained]
    for g in mixed:
        assert {e["segment"] for e in by_group[g]} == {0, 1}
        row = next(x for x in m if f"g{g}" in x["groups"])
        vs = [e["dispatch_version"] for e in by_group[g]]
        # relaunched at the resume's first dispatch: the checkpoint's version
        assert all(e["dispatch_version"] == resumed_at for e in by_group[g] if e["segment"] == 1)
        assert row["batch/staleness_max"] >= row["version"] - 1 - sum(vs) / N - 1e-9


@pytest.mark.slow
def test_killed_after_its_last_step_the_resume_finishes_the_run(done, tmp_path):
    """A run killed after its last step, before its summary (in its final evaluation):
    `gyre run --resume` serves the last checkpoint, evaluates it, and writes summary.json and
    timeline.png, counting the killed segment's executions. The killed run is the shared run's
    directory as a SIGKILL there leaves it (checkpoint and metrics of every step, no summary,
    timeline, workload or final evaluation): a resume alone, not a second training run."""
    rd = tmp_path / "last"
    shutil.copytree(done["dir"], rd, symlinks=True)
    for name in ("summary.json", "timeline.png", "workload.json"):
        (rd / name).unlink()
    evals = [e for e in _jsonl(rd / "evals.jsonl") if e["version"] != STEPS]
    (rd / "evals.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    assert (rd / "checkpoints" / f"step-{STEPS}").is_dir()
    first = _jsonl(rd / "executions.jsonl")
    r = _gyre(
        [sys.executable, "-m", "gyre.cli", "run", "--resume", str(rd), "--log-format", "plain"],
        tmp_path / "resume.log",
    )
    assert r.returncode == 0, r.stdout[-6000:]
    assert "finishing the run" in r.stdout, r.stdout[-3000:]
    s = json.loads((rd / "summary.json").read_text())
    assert (rd / "timeline.png").stat().st_size > 0
    assert s["steps"] == STEPS and s["steps_this_segment"] == 0 and s["segment"] == 1
    finals = [e for e in _jsonl(rd / "evals.jsonl") if e["version"] == STEPS]
    assert len(finals) == 1 and finals[0]["executions"] >= 1, finals  # the final evaluation
    assert finals[0]["scored"] >= 1 and s["evals"][-1]["version"] == STEPS
    assert s["executions"]["finished"] == len(first) == len(_jsonl(rd / "executions.jsonl"))
    assert s["executions"]["this_segment"]["finished"] == 0
    assert [x["step"] for x in _jsonl(rd / "metrics.jsonl")] == list(range(STEPS))
    # a second resume has nothing left to do
    again = subprocess.run(
        [sys.executable, "-m", "gyre.cli", "run", "--resume", str(rd)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert again.returncode == 0 and "already finished" in again.stderr, again.stderr


@pytest.mark.slow
def test_harness_killed_is_recorded_and_run_completes(tiny_model_dir, tmp_path):
    """SIGKILL one reference-agent process: the run still finishes, the execution is recorded
    as failed, and the summary counts it as interrupted.

    The same run (one run where there were three, for the suite's time) bounds its disk (a
    checkpoint every 3 steps, so only the final one, one kept, one published
    weights directory kept) and publishes in memory (``run.publication = "distributed"``):
    the engines get every publication from the core over a gloo weight group instead of
    reloading the HF directory, each reply matching the core's fingerprint (the publication
    check stops the run otherwise); the directory is still written (late joiners, the
    fallback). Async placement: cell 0 trains and the others serve throughout, so every
    publication has rollout engines to reach."""
    steps = 3  # async publishes after steps 1 and 2 (the last step's weights: the final ones)
    rd = tmp_path / "hk"
    argv = _args(
        tiny_model_dir,
        tmp_path,
        "hk",
        steps,
        "run.eval_interval=0",
        "trainer.checkpoint.every_steps=3",
        "trainer.checkpoint.keep=1",
        "run.keep_published=1",
        "run.publication=distributed",
        "policy.placement=async",
        "policy.mu=1",
    )
    log = tmp_path / "hk.log"
    victim = None
    for attempt in range(2):
        with open(log, "w") as f:
            p = subprocess.Popen(
                argv,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=_env(),
                cwd=tmp_path,
                start_new_session=True,
            )
        t0 = time.monotonic()
        while victim is None and p.poll() is None and time.monotonic() - t0 < 600:
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    cmd = (proc / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if any(b"gyre.harness.reference_agent" in c for c in cmd) and any(
                    str(rd).encode() in c for c in cmd
                ):
                    ws = Path(cmd[cmd.index(b"--workspace") + 1].decode())
                    try:
                        os.kill(int(proc.name), signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    victim = ws.parent.name  # workspaces/<execution id>/workspace
                    break
            time.sleep(0.02)
        if victim is not None or p.poll() is None:
            break
        text = log.read_text()
        assert attempt == 0 and RAY_START_FAILED in text, text[-4000:]
    assert victim is not None, "no harness process seen"
    try:
        rc = p.wait(timeout=600)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = log.read_text()
    assert rc == 0, text[-6000:]
    ex = {e["execution"]: e for e in _jsonl(rd / "executions.jsonl")}
    row = ex[victim]
    assert row["failed"] is True and row["harness_stop"] == "exited" and row["exit_code"] != 0, row
    s = json.loads((rd / "summary.json").read_text())
    assert s["steps"] == steps
    assert s["executions"]["failed"] == sum(1 for e in ex.values() if e["failed"]) >= 1
    assert s["interrupted_executions"] >= 1
    m = _jsonl(rd / "metrics.jsonl")
    assert [x["step"] for x in m] == list(range(steps))
    trained = [g for x in m for g in x["groups"]]
    assert len(trained) == len(set(trained))
    assert sorted(p.name for p in (rd / "checkpoints").glob("step-*")) == [f"step-{steps}"]
    assert len([p for p in (rd / "weights").glob("v*") if not p.name.endswith(".tmp")]) <= 1
    assert s["disk_bytes"]["checkpoints"] > 0 and s["disk_bytes"]["total"] >= sum(
        v for k, v in s["disk_bytes"].items() if k != "total"
    )
    # in memory: no engine reloaded from disk, every publication reached its engines
    assert "reloading from disk" not in text, text[-4000:]
    pubs = s["publications"]
    assert pubs["count"] >= 2
    assert pubs["engines_in_memory"] >= pubs["count"]
    assert pubs["engines_checked"] >= pubs["engines_in_memory"]
    assert s["disk_bytes"]["published_weights"] > 0
    mem = pubs["in_memory"]
    assert mem["count"] == pubs["count"]
    # after the first (full) publication the engines hold the base: deltas, and fewer bytes
    assert mem["deltas"] >= 1 and mem["bytes"] < mem["raw_bytes"], mem
