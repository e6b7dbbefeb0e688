"""The run report in a real headless browser (Chromium from the system packages): it
renders its parts, takes a screenshot, and logs no console error (a fetch the page tried,
blocked here, would be one). Skipped where no Chromium is installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from helpers.rundirs import make_run
from typer.testing import CliRunner

from gyre.cli import app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)"),
    pytest.mark.slow,  # ~90 s on a loaded 2-core machine (two Chromium starts)
]


def _chromium(*args: str, tmp) -> subprocess.CompletedProcess:
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0",
            "--host-resolver-rules=MAP * ~NOTFOUND"]  # fmt: skip
    return subprocess.run([*base, *args], capture_output=True, text=True, timeout=240)


def test_report_renders_in_chromium(tmp_path):
    rd = make_run(tmp_path, "a-done", steps=4, total=4, finished=True, ckpt=True)
    r = CliRunner().invoke(app, ["runs", "show", str(rd)])
    assert r.exit_code == 0, r.output
    page = (rd / "report.html").as_uri()
    shot = tmp_path / "shot.png"
    got = _chromium("--window-size=1200,2400", f"--screenshot={shot}", page, tmp=tmp_path)
    assert shot.is_file(), got.stderr[-2000:]
    consoles = [ln for ln in got.stderr.splitlines() if "CONSOLE" in ln or "Failed to load" in ln]
    assert consoles == []
    from matplotlib.image import imread

    px = (imread(shot)[:, :, :3] * 255).round().astype(int).reshape(-1, 3)
    assert imread(shot).shape[:2] == (2400, 1200)
    colours = {tuple(c) for c in px.tolist()}
    # the charts are drawn: reward/mean's blue and the pass rate's orange (legend swatches)
    assert (0x4C, 0x78, 0xA8) in colours and (0xF5, 0x85, 0x18) in colours
    dom = _chromium("--dump-dom", page, tmp=tmp_path).stdout
    for part in ('id="curves"', 'id="executions"', "<svg", "missing: model_unreachable"):
        assert part in dom


def test_hostile_run_text_shows_only_as_text(tmp_path):
    """A received run directory whose folder name, task names and errors carry HTML: in the
    browser each is text on the page, no element of theirs exists and no script of theirs ran."""
    import json

    planted = '<img id="planted" src="x" onerror="document.body.dataset.pwned=1">'
    rd = make_run(tmp_path, '<b id="planted-run">r', steps=3, total=3, finished=True, ckpt=True)
    rows = [json.loads(x) for x in (rd / "executions.jsonl").read_text().splitlines()]
    rows[0]["task"] = f"t\n{planted}"
    rows[1]["error"] = f"</td></tr></table><script>document.body.dataset.pwned=2</script>{planted}"
    rows[1]["missing"] = planted
    (rd / "executions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = CliRunner().invoke(app, ["runs", "show", str(rd)])
    assert r.exit_code == 0, r.output
    dom = _chromium("--dump-dom", (rd / "report.html").as_uri(), tmp=tmp_path).stdout
    assert 'id="executions"' in dom  # the page rendered
    elements = _elements(dom)
    assert "script" not in {tag for tag, _ in elements}
    assert [a for _, a in elements if "planted" in a.get("id", "") or "data-pwned" in a] == []
    assert dom.count('&lt;img id="planted"') >= 3 and '&lt;b id="planted-run"&gt;' in dom


def _elements(dom: str) -> list[tuple[str, dict]]:
    from html.parser import HTMLParser

    found: list[tuple[str, dict]] = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, dict(attrs)))

    P().feed(dom)
    return found
