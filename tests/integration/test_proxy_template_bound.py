"""Issue 37 finding 8 (template item): a chat template that loops without end (nested
``range(100000)``, each within Jinja's sandbox limit) is cut off by the render's time limit, at
start (``gyre proxy`` exits with one line) and per request (a 400; the proxy goes on)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gyre.proxy.render import Renderer, RenderError, TemplateRejected
from gyre.proxy.timebound import RenderTimedOut, within

BOMB = "{%- for i in range(100000) %}{%- for j in range(100000) %}{%- endfor %}{%- endfor %}"
PLAIN = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + "
    "'<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# fine for the start-up renders (one or two messages), a bomb from the fourth message on
LATE_BOMB = "{%- if messages | length > 3 %}" + BOMB + "{%- endif %}" + PLAIN


def _tokenizer(model_dir: Path, template: str):
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = template
    return tok


def test_a_looping_template_is_refused_when_the_renderer_starts(tiny_model_dir):
    tok = _tokenizer(tiny_model_dir, BOMB + PLAIN)
    with pytest.raises(TemplateRejected, match="longer than 0.5 s"):
        Renderer(tok, time_limit_s=0.5)


def test_a_template_looping_on_some_requests_fails_those_only(tiny_model_dir):
    r = Renderer(_tokenizer(tiny_model_dir, LATE_BOMB), time_limit_s=0.5)
    long = [{"role": "user", "content": f"m{i}"} for i in range(4)]
    with pytest.raises(RenderError, match="longer than 0.5 s"):
        r.full(long)
    assert r.full(long[:2])  # this thread goes on rendering: nothing of the bound left over
    time.sleep(0.7)  # a deadline that passed after its render ended raises nowhere
    with pytest.raises(RenderError):  # and in a worker thread, as the proxy renders
        asyncio.run(asyncio.to_thread(r.full, long))
    assert asyncio.run(asyncio.to_thread(r.full, long[:2]))


def test_within_returns_what_finishes_in_time():
    assert within(5.0, lambda: 42) == 42
    assert within(None, lambda: 7) == 7
    with pytest.raises(RenderTimedOut):
        within(0.2, lambda: [None for _ in iter(int, 1)])  # endless


def test_gyre_proxy_exits_with_one_line_on_a_looping_template(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(BOMB + PLAIN)
    gyre = str(Path(sys.executable).parent / "gyre")
    cmd = [gyre, "proxy", "--model", str(model), "--engine", "http://127.0.0.1:9"]
    cmd += ["--port", "0", "--trace-dir", str(tmp_path / "t")]
    cmd += ["--set", "proxy.template_time_limit_s=1"]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert lines[0].startswith("gyre proxy: --model ") and "chat template" in lines[0]
    assert "longer than 1 s" in lines[0]


def test_the_proxy_answers_a_400_for_a_render_past_the_limit_and_goes_on(tiny_model_dir, tmp_path):
    import httpx

    from gyre.engine.app import create_app
    from gyre.engine.null import NullEngine
    from gyre.engine.runner import ServerRunner
    from gyre.proxy.config import ProxyConfig
    from gyre.proxy.runner import ProxyServer

    tok = _tokenizer(tiny_model_dir, LATE_BOMB)
    with ServerRunner(create_app(NullEngine()), name="null") as eng:
        cfg = ProxyConfig(
            model_dir=str(tiny_model_dir),
            engines=[eng.url],
            trace_dir=str(tmp_path / "t"),
            fsync=False,
            template_time_limit_s=0.5,
        )
        with ProxyServer(cfg, tok) as px:
            url, h = px.url + "/v1/chat/completions", {"authorization": "Bearer k"}
            msgs = [{"role": "user", "content": f"m{i}"} for i in range(4)]
            r = httpx.post(url, json={"model": "m", "messages": msgs}, headers=h, timeout=60)
            assert r.status_code == 400 and "longer than 0.5 s" in r.json()["error"]["message"]
            r = httpx.post(url, json={"model": "m", "messages": msgs[:1]}, headers=h, timeout=60)
            assert r.status_code == 200, r.text
