"""A user mistake at the ``gyre`` CLI is one line on stderr and a non-zero exit, never a traceback.

Each case drives the real command tree (``gyre.cli.app``) through typer's CliRunner, which is
faithful here: the commands print to stderr and exit by ``typer.Exit`` exactly as they do from a
shell, and any exception that escaped a command would show up as ``result.exception``. A few cases
go through ``python -m gyre.cli`` to cover the entry point itself. No server serves (one slow case
lets an engine fail at startup): every check runs before a model loads, and a busy port is a
socket this test binds itself.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gyre.cli import app

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "gyre" / "harness" / "tasksets" / "pyfix" / "roman"
DEAD = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A loopback port held (listening) by this test for the whole module."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Paths a user might pass by mistake, and a few valid ones to pair them with."""
    d = tmp_path_factory.mktemp("mistakes")
    plain = d / "plain.txt"
    plain.write_text("hello\n")
    empty = d / "empty.jsonl"
    empty.write_text("")
    notjson = d / "notjson.jsonl"
    notjson.write_text("not json at all\n")
    loop = d / "loop"  # a task folder that is a symlink loop
    loop.symlink_to(d / "loop2")
    (d / "loop2").symlink_to(loop)
    nomodel = d / "nomodel"  # a directory, but no config.json
    nomodel.mkdir()
    notok = d / "notok"  # config.json but no tokenizer
    notok.mkdir()
    (notok / "config.json").write_text("{}")
    badcfg = d / "badcfg"  # both files present, config.json is not JSON
    badcfg.mkdir()
    (badcfg / "config.json").write_text("garbage")
    (badcfg / "tokenizer.json").write_text("garbage")
    badtok = d / "badtok"  # a config.json; tokenizer.json is not JSON
    badtok.mkdir()
    (badtok / "config.json").write_text('{"model_type": "qwen3"}')
    (badtok / "tokenizer.json").write_text("garbage")
    badprofile = d / "profile.json"
    badprofile.write_text(json.dumps({"rules": [{"role": "boss"}]}))
    badprofile_toml = d / "harness.toml"
    badprofile_toml.write_text('name = "x"\ncommand = 5\n')
    badtoml = d / "bad.toml"
    badtoml.write_text("[policy\n")
    trace_dir = d / "tr"
    r = CliRunner().invoke(app, ["tree", "synth", str(trace_dir), "--requests", "40"])
    assert r.exit_code == 0, r.output
    return {
        "dir": d,
        "plain": plain,
        "under_file": plain / "sub",  # mkdir/write here fails: a parent is a file
        "empty": empty,
        "notjson": notjson,
        "nomodel": nomodel,
        "loop": loop,
        "notok": notok,
        "badcfg": badcfg,
        "badtok": badtok,
        "badprofile": badprofile,
        "badtoml": badtoml,
        "badprofile_toml": badprofile_toml,
        "trace": trace_dir / "case-study.jsonl",
    }


Args = Callable[[dict[str, Path], int], list[str]]

# (id, argv builder, words the one line must contain)
CASES: list[tuple[str, Args, tuple[str, ...]]] = [
    # servers: model directory, engine URL, port
    (
        "proxy-no-model",
        lambda f, p: ["proxy", "--model", "/nonexistent", "--engine", DEAD],
        ("--model /nonexistent", "no such directory", "gyre model tiny"),
    ),
    (
        "proxy-model-without-config",
        lambda f, p: ["proxy", "--model", str(f["nomodel"]), "--engine", DEAD],
        ("no config.json",),
    ),
    (
        "proxy-model-without-tokenizer",
        lambda f, p: ["proxy", "--model", str(f["notok"]), "--engine", DEAD],
        ("no tokenizer",),
    ),
    (
        "proxy-engine-not-a-url",
        lambda f, p: ["proxy", "--model", str(f["badtok"]), "--engine", "notaurl"],
        ("--engine 'notaurl'", "http://HOST:PORT"),
    ),
    (
        "proxy-port-busy",
        lambda f, p: ["proxy", "--model", str(f["badtok"]), "--engine", DEAD, "--port", str(p)],
        ("--port", "already in use", "--port 0"),
    ),
    (
        "proxy-trace-dir-unwritable",
        lambda f, p: [
            "proxy",
            "--model",
            str(f["badtok"]),
            "--engine",
            DEAD,
            "--trace-dir",
            str(f["under_file"]),
        ],
        ("--trace-dir", "cannot create"),
    ),
    (
        "proxy-unknown-parser",
        lambda f, p: ["proxy", "--model", str(f["badtok"]), "--engine", DEAD, "--parser", "x"],
        ("--parser 'x'", "hermes"),
    ),
    (
        "proxy-tokenizer-unloadable",
        lambda f, p: ["proxy", "--model", str(f["badtok"]), "--engine", DEAD, "--port", "0"],
        ("cannot load its tokenizer",),
    ),
    (
        "engine-port-busy",
        lambda f, p: ["engine", "--kind", "null", "--port", str(p)],
        ("already in use",),
    ),
    (
        "engine-host-not-local",
        lambda f, p: ["engine", "--kind", "null", "--host", "203.0.113.7", "--port", "0"],
        ("--host 203.0.113.7", "not an address of this machine"),
    ),
    (
        "engine-no-model",
        lambda f, p: ["engine", "--model", "/nonexistent", "--port", "0"],
        ("--model /nonexistent", "no such directory"),
    ),
    (
        "engine-config-not-json",
        lambda f, p: ["engine", "--model", str(f["badcfg"]), "--port", "0"],
        ("unreadable config.json",),
    ),
    (
        "engine-unknown-kind",
        lambda f, p: ["engine", "--kind", "sglang"],
        ("--kind 'sglang'", "embedded, scripted, null or vllm"),
    ),
    (
        "engine-script-not-json",
        lambda f, p: [
            "engine",
            "--kind",
            "scripted",
            "--model",
            str(f["badtok"]),
            "--script",
            str(f["notjson"]),
            "--port",
            "0",
        ],
        ("--script", "not a ScriptBook JSON"),
    ),
    (
        "engine-bad-dtype",
        lambda f, p: ["engine", "--model", str(f["badtok"]), "--dtype", "int3", "--port", "0"],
        ("dtype", "'int3'"),
    ),
    (
        "engine-unknown-log-level",
        lambda f, p: ["engine", "--kind", "null", "--log-level", "loud"],
        ("--log-level 'loud'", "warning"),
    ),
    # output paths that cannot be created
    (
        "model-tiny-unwritable",
        lambda f, p: ["model", "tiny", str(f["under_file"])],
        ("cannot create", "sub"),
    ),
    (
        "model-tiny-bad-hidden",
        lambda f, p: ["model", "tiny", str(f["dir"] / "m"), "--hidden", "6"],
        ("--hidden 6", "multiple of 4"),
    ),
    (
        "tree-synth-unwritable",
        lambda f, p: ["tree", "synth", str(f["under_file"])],
        ("cannot create", "sub"),
    ),
    (
        "tree-synth-too-few-requests",
        lambda f, p: ["tree", "synth", str(f["dir"] / "few"), "--requests", "3"],
        ("--requests",),
    ),
    (
        "tree-show-html-unwritable",
        lambda f, p: ["tree", "show", str(f["trace"]), "--html", str(f["under_file"])],
        ("cannot write",),
    ),
    (
        "train-demo-no-model",
        lambda f, p: ["train", "demo", "--model-dir", "/nonexistent"],
        ("--model-dir /nonexistent", "no such directory"),
    ),
    (
        "train-demo-out-unwritable",
        lambda f, p: ["train", "demo", "--out", str(f["under_file"])],
        ("--out", "cannot create"),
    ),
    (
        "train-checkpoint-not-a-dir",
        lambda f, p: ["train", "checkpoint", str(f["plain"])],
        ("not a directory",),
    ),
    # trace files that are not traces
    (
        "tree-show-not-a-trace",
        lambda f, p: ["tree", "show", str(f["notjson"])],
        ("not a Gyre trace", "malformed JSON"),
    ),
    (
        "tree-stats-not-a-trace",
        lambda f, p: ["tree", "stats", str(f["notjson"])],
        ("not a Gyre trace",),
    ),
    (
        "tree-stats-empty-file",
        lambda f, p: ["tree", "stats", str(f["empty"])],
        ("no trace records",),
    ),
    (
        "tree-stats-directory",
        lambda f, p: ["tree", "stats", str(f["dir"])],
        ("Is a directory",),
    ),
    (
        "tree-stats-bad-profile",
        lambda f, p: ["tree", "stats", str(f["trace"]), "--profile", str(f["badprofile"])],
        ("--profile", "rules.0.role"),
    ),
    (
        "tree-show-bad-tokenizer",
        lambda f, p: ["tree", "show", str(f["trace"]), "--tokenizer", "/nonexistent"],
        ("--tokenizer /nonexistent",),
    ),
    # configs: pydantic errors name the field, never link to errors.pydantic.dev
    (
        "config-show-bad-value",
        lambda f, p: ["config", "show", "--model-dir", "m", "--set", "policy.cells=abc"],
        ("policy.cells", "valid integer", "'abc'"),
    ),
    (
        "config-show-no-file",
        lambda f, p: ["config", "show", "/nonexistent.toml"],
        ("/nonexistent.toml",),
    ),
    (
        "config-show-directory",
        lambda f, p: ["config", "show", str(f["dir"])],
        ("is a directory",),
    ),
    (
        "run-config-directory",
        lambda f, p: ["run", str(f["dir"])],
        ("is a directory",),
    ),
    (
        "config-show-toml-syntax",
        lambda f, p: ["config", "show", str(f["badtoml"])],
        ("invalid config",),
    ),
    (
        "run-bad-value",
        lambda f, p: [
            "run",
            str(ROOT / "examples" / "run.toml"),
            "--set",
            "policy.cells=abc",
        ],
        ("policy.cells", "'abc'"),
    ),
    (
        "run-out-dir-unwritable",
        lambda f, p: [
            "run",
            str(ROOT / "examples" / "run.toml"),
            "--set",
            f"model_dir={f['badtok']}",
            "--set",
            f"run.out_dir={f['under_file']}",
        ],
        ("run.out_dir", "cannot create"),
    ),
    (
        "run-cpu-quota-above-the-machine",
        lambda f, p: [
            "run",
            str(ROOT / "examples" / "run.toml"),
            "--set",
            f"model_dir={f['badtok']}",
            "--set",
            "run.cell.cpu_quota=4096",
        ],
        ("run.cell.cpu_quota", "4096", "more than this machine's"),
    ),
    (
        "run-checkpoint-dir-it-cannot-honour",  # checkpoints live in the run directory
        lambda f, p: [
            "run",
            str(ROOT / "examples" / "run.toml"),
            "--set",
            f"trainer.checkpoint.dir={f['dir']}",
        ],
        ("trainer.checkpoint.dir", "run directory's checkpoints/", "leave it unset"),
    ),
    (
        "run-sandbox-without-bwrap",  # the sandbox is on by default: no bwrap, no run
        lambda f, p: [
            "run",
            str(ROOT / "examples" / "run.toml"),
            "--set",
            f"model_dir={f['badtok']}",
            "--set",
            "executor.sandbox.bwrap=/nonexistent/bwrap",
        ],
        ("executor.sandbox", "not installed", "executor.sandbox = false"),
    ),
    (
        "run-sandboxed-harness-unsandboxed-verifier",
        lambda f, p: [
            "run",
            str(ROOT / "examples" / "run.toml"),
            "--set",
            "executor.scorer.sandbox=false",
        ],
        ("executor.scorer.sandbox = false", "unconfined"),
    ),
    (
        "run-truncated-sampling-without-a-named-logprob",  # docs/engine.md, Sampling semantics
        lambda f, p: [
            "run",
            str(ROOT / "examples" / "run.toml"),
            "--set",
            "proxy.sampling.top_p=0.9",
        ],
        ("proxy.sampling top_p=0.9", "engine.logprob_mode = 'processed'"),
    ),
    (
        "run-vllm-tempered-logprobs",
        lambda f, p: [
            "run",
            str(ROOT / "examples" / "run.toml"),
            "--set",
            "engine.kind=vllm",
            "--set",
            "engine.logprob_mode=tempered",
        ],
        ("'tempered' has no vLLM equivalent",),
    ),
    (
        "sim-sweep-unknown-placement",
        lambda f, p: ["sim", "sweep", "--placement", "best", "--seeds", "1"],
        ("--placement", "'best'"),
    ),
    (
        "sim-bad-value",
        lambda f, p: ["sim", "--set", "tail=abc"],
        ("workload.tail", "'abc'"),
    ),
    (
        "sim-faults-bad-cell",
        lambda f, p: ["sim", "--placement", "elastic", "--faults", "cell=99@1h"],
        ("--faults", "cells are 0.."),
    ),
    (
        "sim-plot-unwritable",
        lambda f, p: ["sim", "--placement", "elastic", "--plot", str(f["under_file"]) + ".png"],
        ("--plot", "cannot write", "no directory"),
    ),
    # harness
    (
        "harness-run-base-url-not-a-url",
        lambda f, p: ["harness", "run", str(TASK), "--profile", "oracle", "--base-url", "x"],
        ("--base-url 'x'",),
    ),
    (
        "harness-run-workspace-unwritable",
        lambda f, p: [
            "harness",
            "run",
            str(TASK),
            "--profile",
            "oracle",
            "--base-url",
            DEAD,
            "--workspace-root",
            str(f["under_file"]),
        ],
        ("--workspace-root", "cannot create"),
    ),
    (
        "harness-run-bad-profile-file",
        lambda f, p: (
            ["harness", "run", str(TASK), "--profile", str(f["badprofile_toml"])]
            + ["--base-url", DEAD]
        ),
        ("command: Input should be a valid list (got 5)",),
    ),
    (  # issue 19: an infinite timeout is a mistake, not "no timeout"
        "harness-run-inf-timeout",
        lambda f, p: ["harness", "run", str(TASK), "--base-url", DEAD, "--harness-timeout", "inf"],
        ("--harness-timeout must be a finite number", "inf"),
    ),
    (
        "harness-run-task-symlink-loop",
        lambda f, p: ["harness", "run", str(f["loop"]), "--base-url", DEAD],
        ("cannot be resolved", "loop"),
    ),
    (
        "config-show-inf-executor-seconds",
        lambda f, p: [
            "config",
            "show",
            "--model-dir",
            "m",
            "--set",
            "executor.kill_grace_s=Infinity",
        ],
        ("executor.kill_grace_s", "finite number"),
    ),
    (
        "config-show-inf-run-timeout",
        lambda f, p: [
            "config",
            "show",
            "--model-dir",
            "m",
            "--set",
            "run.harness_timeout_s=Infinity",
        ],
        ("run.harness_timeout_s", "finite number"),
    ),
    (
        "harness-tasks-no-such-set",
        lambda f, p: ["harness", "tasks", "/nonexistent"],
        ("/nonexistent",),
    ),
]


def assert_one_line(r, words: tuple[str, ...]) -> str:
    """Non-zero exit, no traceback, exactly one short ``gyre ...`` line on stderr."""
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code not in (0, None), r.output
    assert "Traceback" not in r.output
    assert "errors.pydantic.dev" not in r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("gyre ") and len(line) <= 300, line
    for w in words:
        assert w in line, (w, line)
    return line


# These load transformers (config or tokenizer) in the test process: ~15 s on two busy cores.
SLOW = {"proxy-tokenizer-unloadable", "engine-config-not-json", "engine-bad-dtype"}


@pytest.mark.parametrize(
    ("make", "words"),
    [pytest.param(m, w, id=i, marks=[pytest.mark.slow] if i in SLOW else []) for i, m, w in CASES],
)
def test_mistake_is_one_line(make: Args, words, files, busy_port) -> None:
    assert_one_line(CliRunner().invoke(app, make(files, busy_port)), words)


def test_click_usage_errors_stay_one_error_line(busy_port) -> None:
    """Out-of-range ports are rejected by click's own range check: one 'Error:' line, exit 2."""
    r = CliRunner().invoke(app, ["engine", "--kind", "null", "--port", "99999"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "65535" in errors[0], r.stderr


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["proxy", "--model", "/nonexistent", "--engine", DEAD], ("--model /nonexistent",)),
        (["engine", "--kind", "null", "--port", "{busy}"], ("already in use",)),
    ],
    ids=["proxy-no-model", "engine-port-busy"],
)
def test_entry_point_reports_one_line(argv, words, busy_port) -> None:
    """The same through ``python -m gyre.cli``: what a user's shell runs."""
    argv = [a.replace("{busy}", str(busy_port)) for a in argv]
    p = subprocess.run(
        [sys.executable, "-m", "gyre.cli", *argv], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and all(w in lines[0] for w in words), p.stderr


def test_main_turns_a_stray_oserror_on_a_path_into_one_line(monkeypatch, capsys) -> None:
    """The last resort in ``gyre.cli.main``: an OSError no command foresaw still names its path."""
    import gyre.cli as cli

    def boom() -> None:
        raise PermissionError(13, "Permission denied", "/some/user/path")

    monkeypatch.setattr(cli, "app", boom)
    with pytest.raises(SystemExit) as ex:
        cli.main()
    assert ex.value.code == 1
    assert capsys.readouterr().err.strip() == "gyre: /some/user/path: Permission denied"


def test_validation_line_names_fields_without_links() -> None:
    from pydantic import BaseModel, ValidationError

    from gyre.validation import validation_line

    class Inner(BaseModel):
        cells: int

    class Outer(BaseModel):
        policy: Inner
        name: str

    with pytest.raises(ValidationError) as e:
        Outer.model_validate({"policy": {"cells": "many"}})
    line = validation_line(e.value)
    assert line == (
        "policy.cells: Input should be a valid integer, unable to parse string as an integer "
        "(got 'many'); name: Field required"
    )


@pytest.mark.slow  # the engine process imports torch and transformers
def test_engine_startup_failure_is_one_line(files) -> None:
    """A model that passes the up-front checks but will not load fails at server startup:
    one line after the announcement, not uvicorn's traceback."""
    p = subprocess.run(
        [sys.executable, "-m", "gyre.cli", "engine", "--model", str(files["badtok"])]
        + ["--port", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0
    assert "Traceback" not in p.stderr + p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("gyre engine: startup failed: "), p.stderr
    assert len(lines) <= 2, p.stderr  # the "serving on" announcement, then the failure
