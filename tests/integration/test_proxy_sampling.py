"""A harness's own top_p through the proxy (docs/engine.md, "Sampling semantics"): a run's fixed
sampling overrides it (the engine samples the run's distribution; the trace says what was
replaced), refuse mode answers 400 in the client's dialect, an unset field passes it through.

The engine records ``processed`` log-probs (the distribution actually sampled from), so the
recorded numbers show which top_p the engine really used: under the run's top_p=1 they equal the
model's full softmax; under a passed-through top_p=0.3 they are the renormalised nucleus's."""

import pytest
import torch
from helpers.servers import running_engine, running_proxy

from gyre.proxy.sampling import DEFAULTS
from gyre.trace.store import read_trace

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

MSGS = [{"role": "user", "content": "Count to three."}]


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    dirs = {k: tmp_path_factory.mktemp(k) for k in ("run", "refuse", "open")}
    fixed = dict(DEFAULTS)
    with (
        running_engine("embedded", tiny_model_dir, logprob_mode="processed") as eng,
        running_proxy(
            tiny_model_dir, [eng.url], dirs["run"], tiny_tokenizer, fsync=False, sampling=fixed
        ) as run,
        running_proxy(
            tiny_model_dir,
            [eng.url],
            dirs["refuse"],
            tiny_tokenizer,
            fsync=False,
            sampling={**fixed, "harness_params": "refuse"},
        ) as refuse,
        running_proxy(tiny_model_dir, [eng.url], dirs["open"], tiny_tokenizer, fsync=False) as op,
    ):
        yield {
            "run": (run, dirs["run"]),
            "refuse": (refuse, dirs["refuse"]),
            "open": (op, dirs["open"]),
        }


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def _one_record(traces):
    (path,) = sorted(traces.glob("*.jsonl"))
    res = read_trace(path, vocab_size=2048)
    assert res.errors == [] and len(res.records) == 1
    return res.records[0]


def _logits(model, rec):
    assert rec.base is None  # a first call: its input is the whole prompt
    ids = list(rec.input_suffix) + list(rec.output_ids)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double(), len(rec.input_suffix)


def _ask(px, key, top_p):
    c = openai.OpenAI(base_url=px.url + "/v1", api_key=key, max_retries=0)
    return c.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=10, temperature=1.0, top_p=top_p, seed=4
    )


def test_run_sampling_overrides_a_harness_top_p(stack, hf_model):
    px, traces = stack["run"]
    _ask(px, "override", 0.3)
    rec = _one_record(traces)
    assert rec.meta["sampling"] == DEFAULTS
    assert rec.meta["sampling_overridden"] == {"top_p": 0.3}
    logits, n = _logits(hf_model, rec)
    full = torch.log_softmax(logits, -1)
    ref = [full[n - 1 + i, t].item() for i, t in enumerate(rec.output_ids)]
    assert list(rec.output_logprobs) == pytest.approx(ref, abs=1e-4)  # no cut was applied


def test_unset_field_passes_the_harness_top_p(stack, hf_model):
    px, traces = stack["open"]
    _ask(px, "pass", 0.3)
    rec = _one_record(traces)
    assert rec.meta["sampling"] == {**DEFAULTS, "top_p": 0.3}
    assert "sampling_overridden" not in rec.meta
    logits, n = _logits(hf_model, rec)
    full = torch.log_softmax(logits, -1)
    raw = [full[n - 1 + i, t].item() for i, t in enumerate(rec.output_ids)]
    # the engine cut to the 0.3 nucleus: every recorded log-prob is above the full softmax's
    assert all(a > b + 1e-3 for a, b in zip(rec.output_logprobs, raw, strict=True))


def test_refuse_mode_is_a_400_in_each_dialect(stack):
    px, traces = stack["refuse"]
    with pytest.raises(openai.BadRequestError, match="top_p=0.3 differs"):
        _ask(px, "refused", 0.3)
    ac = anthropic.Anthropic(base_url=px.url, api_key="refused-a", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="top_k=20 differs"):
        ac.messages.create(model="tiny", messages=MSGS, max_tokens=10, extra_body={"top_k": 20})
    assert not list(traces.glob("*.jsonl")) or all(
        read_trace(p, vocab_size=2048).records == [] for p in traces.glob("*.jsonl")
    )
    _ask(px, "agrees", 1.0)  # the run's own value is no conflict
    assert _one_record(traces).meta["sampling"] == DEFAULTS
