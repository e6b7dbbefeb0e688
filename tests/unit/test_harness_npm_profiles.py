"""The qwen-code and codex profiles: command lines, the config files they put in $HOME,
the home_files rules, and the in-sandbox seeding helper (gyre.harness.homeseed)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from gyre.harness import homeseed
from gyre.harness.profiles import NPM_HARNESSES, HarnessProfile, ProfileError, load_profile

VALUES = {
    "qwen": "/opt/qwen",
    "codex": "/opt/codex",
    "instruction": "fix {it}",
    "model": "policy",
    "home": "/tmp/gyre-home",
    "openai_base_url": "http://127.0.0.1:9/v1",
}


def test_qwen_code_profile_command_env_and_settings():
    p = load_profile("qwen-code")
    argv, env = p.render(VALUES)
    assert argv == [
        "/opt/qwen",
        "--auth-type",
        "openai",
        "--approval-mode",
        "yolo",
        "-p",
        "fix {it}",
    ]
    assert env["OPENAI_MODEL"] == "policy"
    files = p.render_home_files(VALUES)
    assert set(files) == {".qwen/settings.json"}
    s = json.loads(files[".qwen/settings.json"])
    # What makes one turn one call and keeps all traffic on the proxy.
    assert s["privacy"]["usageStatisticsEnabled"] is False
    assert s["telemetry"]["enabled"] is False
    assert s["general"]["enableAutoUpdate"] is False
    assert s["memory"]["enableManagedAutoMemory"] is False
    assert s["memory"]["enableManagedAutoDream"] is False
    assert s["ui"]["enableFollowupSuggestions"] is False
    assert p.roles == "qwen-code"


def test_codex_profile_command_and_config():
    p = load_profile("codex")
    argv, env = p.render(VALUES)
    assert argv == ["/opt/codex", "exec", "--skip-git-repo-check", "fix {it}"]
    assert env["CODEX_HOME"] == "/tmp/gyre-home/.codex"
    files = p.render_home_files(VALUES)
    assert set(files) == {".codex/config.toml"}
    c = tomllib.loads(files[".codex/config.toml"])
    assert c["model"] == "policy" and c["model_provider"] == "gyre"
    prov = c["model_providers"]["gyre"]
    assert prov["base_url"] == "http://127.0.0.1:9/v1"
    assert prov["wire_api"] == "responses" and prov["env_key"] == "OPENAI_API_KEY"
    assert c["approval_policy"] == "never" and c["sandbox_mode"] == "danger-full-access"
    assert c["analytics"]["enabled"] is False and c["web_search"] == "disabled"
    assert c["check_for_update_on_startup"] is False
    assert p.roles == "codex"


def test_home_files_fill_known_variables_only_and_stay_inside_home():
    p = HarnessProfile(
        name="x",
        command=["true"],
        home_files={"a/b.json": '{"m": "{model}", "keep": "{unknown}", "o": {"x": 1}}'},
    )
    p.render({"model": "m1"})  # paths are fine
    assert p.render_home_files({"model": "m1"})["a/b.json"] == (
        '{"m": "m1", "keep": "{unknown}", "o": {"x": 1}}'
    )
    for bad in ("/etc/passwd", "../x", "a/../../x"):
        with pytest.raises(ProfileError, match="inside"):
            HarnessProfile(name="x", command=["true"], home_files={bad: ""}).render({})


def test_toml_profile_file_can_carry_home_files(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text(
        'command = ["echo"]\n[home_files]\n".tool/cfg" = "url = \\"{openai_base_url}\\""\n'
    )
    p = load_profile(f)
    assert p.render_home_files(VALUES) == {".tool/cfg": 'url = "http://127.0.0.1:9/v1"'}


def test_homeseed_copies_into_home_then_execs(tmp_path):
    seed = tmp_path / "seed"
    (seed / ".qwen").mkdir(parents=True)
    (seed / ".qwen" / "settings.json").write_text("{}")
    home = tmp_path / "home"
    (home / ".qwen").mkdir(parents=True)
    (home / ".qwen" / "other").write_text("kept")
    r = subprocess.run(
        [sys.executable, "-S", "-I", homeseed.__file__, "--from", str(seed), "--", "ls", "-A"],
        cwd=home / ".qwen",
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["other", "settings.json"]  # merged, and the command ran after
    assert homeseed.main(["--from", str(seed)]) == 2  # usage: one line, no traceback


def test_homeseed_missing_seed_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert homeseed.main(["--from", str(tmp_path / "absent"), "--", "true"]) == 126
    assert capsys.readouterr().err.count("\n") == 1


def test_npm_harness_lookup_prefers_env_override(monkeypatch, tmp_path):
    from gyre.harness.profiles import find_npm_harness

    assert set(NPM_HARNESSES) == {"claude", "qwen", "codex"}
    monkeypatch.setenv("GYRE_CODEX_BIN", str(tmp_path / "codex"))
    assert find_npm_harness("codex") == str(tmp_path / "codex")
