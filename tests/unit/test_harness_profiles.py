"""Harness profiles (templating, files), bubblewrap argv, and per-harness role rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.harness import reference_agent as ref
from gyre.harness.profiles import HarnessProfile, ProfileError, builtin_profiles, load_profile
from gyre.harness.roles import claude_code_profile, role_profile
from gyre.harness.sandbox import bwrap_argv
from gyre.trace.roles import Role


def test_render_fills_templates_and_names_unknown_variables():
    p = HarnessProfile(
        name="x",
        command=["run", "--url", "{openai_base_url}", "{instruction}"],
        args=["--m", "{model}"],
        env={"K": "{api_key}"},
        model="m1",
    )
    argv, env = p.render(
        {"openai_base_url": "http://h/v1", "instruction": "fix {this} }", "api_key": "k"}
    )
    assert argv == [
        "run",
        "--url",
        "http://h/v1",
        "fix {this} }",
        "--m",
        "m1",
    ]  # braces in values are safe
    assert env == {"K": "k"}
    with pytest.raises(ProfileError, match=r"unknown template variable \{nope\}"):
        HarnessProfile(name="x", command=["{nope}"]).render({})
    with pytest.raises(ProfileError, match="bad template"):
        HarnessProfile(name="x", command=["{"]).render({})


def test_builtin_profiles_and_files(tmp_path):
    names = set(builtin_profiles())
    assert {"reference", "mini-swe-agent", "claude-code", "synthetic", "oracle"} <= names
    cc = load_profile("claude-code")
    argv, _ = cc.render({"claude": "/bin/claude", "instruction": "do", "model": "policy"})
    assert argv[argv.index("--allowedTools") + 1] == "Bash,Read,Write,Edit,Glob,Grep,Agent,Task"
    f = tmp_path / "mine.toml"
    f.write_text('command = ["echo", "{workspace}"]\nallowed_tools = ["Bash"]\n')
    p = load_profile(f)
    assert p.name == "mine" and p.render({"workspace": "/w"})[0] == ["echo", "/w"]
    f.write_text("command = 3\n")
    with pytest.raises(ProfileError, match="mine.toml"):
        load_profile(f)
    with pytest.raises(ProfileError, match="unknown harness profile"):
        load_profile("no-such-profile")


def test_bwrap_argv_hides_and_binds(tmp_path):
    ws, other, hidden = (
        tmp_path / "runs" / "e1" / "workspace",
        tmp_path / "runs",
        tmp_path / "taskset",
    )
    ws.mkdir(parents=True)
    hidden.mkdir()
    argv = bwrap_argv(["python", "-V"], workspace=ws, hide=[other, hidden, tmp_path / "absent"])
    s = " ".join(argv)
    assert argv[0] == "bwrap" and argv[-3:] == ["--", "python", "-V"]
    # Only the system directories, never the host's whole tree; private /tmp and pid namespace.
    assert (
        "--ro-bind / /" not in s
        and "--ro-bind /usr /usr" in s
        and "--tmpfs /tmp" in s
        and "--unshare-pid" in s
        and "--die-with-parent" in s
    )
    assert "--unshare-net" not in argv  # the harness must reach the proxy on loopback
    assert f"--bind {ws} {ws} --remount-ro /dev --remount-ro / --chdir {ws}" in s
    # Hidden trees are not bound at all (nothing exposes them here), absent ones not named.
    sources = [argv[i + 1] for i, a in enumerate(argv) if a in ("--ro-bind", "--bind")]
    assert not any(x == str(other) or x == str(hidden) for x in sources)
    assert str(tmp_path / "absent") not in s
    assert "--unshare-net" in bwrap_argv(["true"], workspace=ws, hide=[], unshare_net=True)


def test_reference_agent_roles_are_exact():
    prof = role_profile("reference")
    want = {
        ref.MAIN_SYSTEM: Role.MAIN,
        ref.SUB_SYSTEM: Role.SUB_AGENT,
        ref.MAIN_SUMMARY_SYSTEM: Role.MAIN_SUMMARY,
        ref.SUB_SUMMARY_SYSTEM: Role.SUB_AGENT_SUMMARY,
    }
    for system, role in want.items():
        assert prof.role_of({"system_head": system[:2000], "tools": []}) == role


def test_claude_code_roles_on_recorded_requests():
    rec = json.loads(
        (Path(ref.__file__).parent / "recordings" / "claude-code-2.1.332.json").read_text()
    )
    prof = claude_code_profile()
    got = [(prof.role_of(r["meta"]).value, r["observed_as"]) for r in rec["records"]]
    assert [g for g, _ in got] == [o for _, o in got]
    assert {"main", "sub-agent", "main-summary"} <= {o for _, o in got}


def test_claude_code_roles_on_constructed_requests():
    """Sub-agent compaction, old-style summariser and side requests: metadata built from the recorded
    requests and the binary's strings (not all observable live in -p mode)."""
    rec = json.loads(
        (Path(ref.__file__).parent / "recordings" / "claude-code-2.1.332.json").read_text()
    )["records"]
    main = next(r["meta"] for r in rec if r["observed_as"] == "main")
    sub = next(r["meta"] for r in rec if r["observed_as"] == "sub-agent")
    compact = (
        "Your task is to create a detailed summary of the conversation so far, paying close attention to "
        "the user's explicit requests and your previous actions."
    )
    prof = claude_code_profile()
    assert prof.role_of({**main, "last_user_head": compact}) == Role.MAIN_SUMMARY
    assert prof.role_of({**sub, "last_user_head": compact}) == Role.SUB_AGENT_SUMMARY
    assert (
        prof.role_of(
            {
                **main,
                "tools": [],
                "last_user_head": "Summarize",
                "system_head": "You are a helpful AI assistant tasked with summarizing conversations.",
            }
        )
        == Role.MAIN_SUMMARY
    )
    assert (
        prof.role_of({**main, "tools": [], "system_head": "Generate a concise title"})
        == Role.SUB_AGENT
    )
    # A user who merely mentions a sub-agent in the task stays main.
    assert prof.role_of({**main, "last_user_head": "please use a sub-agent"}) == Role.MAIN
    assert role_profile("mini-swe-agent").role_of(main) == Role.MAIN
    assert role_profile("unknown").name == "default"
    assert load_profile("claude-code").role_profile().name == "claude-code"
    assert load_profile("synthetic").role_profile().name == "default"
