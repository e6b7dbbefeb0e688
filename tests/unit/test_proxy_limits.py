"""Early refusal of prompts that cannot fit, engine-fault policy, image validation (issue 13)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.proxy.adapters import anthropic_messages as an
from gyre.proxy.adapters import openai_chat as oa
from gyre.proxy.adapters.dialects import ANTHROPIC, OPENAI
from gyre.proxy.enginefaults import Backoff, CallFaults, EngineBroke, EngineSilent
from gyre.proxy.errors import ApiError
from gyre.proxy.promptsize import PromptBound, _slices, text_pieces
from gyre.proxy.render import Renderer
from gyre.proxy.rendered import RenderedShape, probe

# -- prompt floors ------------------------------------------------------------------------------

texts = st.lists(
    st.sampled_from(list("ab xyz\n\t.,:;()_-=é漢🙂") + ["def ", "    ", "\n\n", "<|im_end|>"]),
    max_size=150,
).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(user=texts, tool=texts, system=texts)
def test_floors_never_exceed_the_rendered_count(tiny_tokenizer, user, tool, system):
    """Both floors are below the real token count, also with tiny slices (many boundaries)."""
    items = [
        {"role": "system", "content": system},
        {"role": "user", "content": [{"type": "text", "text": user}]},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "tool_call_id": "t", "content": tool},
    ]
    norm = [m for it in items for m in oa.normalize_item(it, lambda _i: None)]
    real = len(Renderer(tiny_tokenizer).full(norm))
    pb = PromptBound(tiny_tokenizer, max_context=10**9, slice_chars=17)
    assert pb.floor_from_chars(pb.chars(items)) <= real
    assert pb.floor_by_counting(items) <= real


def test_slices_cover_the_text_and_cut_at_whitespace():
    rng = random.Random(0)
    text = " ".join(rng.choice(["a", "word", "longer_word", "x\ny"]) for _ in range(3000))
    parts = list(_slices(text, 100))
    assert "".join(parts) == text and len(parts) > 50
    assert all(p[:1] in (" ", "\n") for p in parts[1:])  # never inside a word
    assert all(len(p) <= 100 for p in parts)
    assert [len(p) for p in _slices("x" * 250, 100)] == [100, 100, 50]  # no whitespace: cut anyway
    assert list(_slices("", 10)) == []


def test_text_pieces_count_what_every_template_renders():
    items = [
        {"role": "system", "content": [{"type": "text", "text": "S"}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "a",
                    "content": [{"type": "text", "text": "R"}],
                },
                {"type": "tool_result", "tool_use_id": "b", "content": "R2"},
                {"type": "image", "source": {"type": "base64", "data": "QUFB" * 1000}},
                {"type": "text", "text": "U"},
            ],
        },
        {"role": "assistant", "content": "<think>not counted (templates trim it)</think>A"},
        {"role": "tool", "content": "T"},
        "junk",
    ]
    assert list(text_pieces(items)) == ["S", "R", "R2", "U", "A", "T"]


async def test_check_refuses_early_with_the_context_length_error(tiny_tokenizer):
    pb = PromptBound(tiny_tokenizer, max_context=1000)
    ok = [{"role": "user", "content": "hello " * 100}]
    await pb.check(ok, OPENAI)  # fits: nothing raised (the full render decides exactly)
    many_chars = [{"role": "user", "content": "x" * (1000 * pb.max_token_chars)}]
    with pytest.raises(ApiError) as e:
        await pb.check(many_chars, OPENAI)
    assert e.value.status == 400 and e.value.code == "context_length_exceeded"
    words = [{"role": "user", "content": "alpha beta gamma " * 1000}]  # counted in slices
    assert pb.needs_count(pb.chars(words)) and pb.floor_from_chars(pb.chars(words)) < 1000
    with pytest.raises(ApiError) as e:
        await pb.check(words, ANTHROPIC)
    assert "prompt is too long" in e.value.message


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(user=texts, tool=texts, ctx=st.integers(1, 400))
async def test_body_size_gate_never_skips_a_refusal(tiny_tokenizer, user, tool, ctx):
    """The gate skips the walk only for bodies whose text could not reach a floor: whatever
    check() decides with the body's size, it decides without it too."""
    import json

    items = [{"role": "user", "content": user}, {"role": "tool", "content": tool}]
    body = json.dumps({"messages": items}, ensure_ascii=False).encode()
    pb = PromptBound(tiny_tokenizer, max_context=ctx, slice_chars=17)
    if pb.cannot_trigger(len(body)):
        await pb.check(items, OPENAI)  # would raise if a floor reached the context


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(said=texts, arg=texts, user=texts)
def test_floors_with_assistant_text_and_tool_calls_stay_below_the_render(
    tiny_tokenizer, said, arg, user
):
    """Assistant text and tool-call arguments count too (templates render them) and the floors
    still never exceed the real count."""
    import json

    items = [
        {"role": "user", "content": user},
        {
            "role": "assistant",
            "content": said,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "run", "arguments": json.dumps({"cmd": arg, arg: [arg]})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    norm = [m for it in items for m in oa.normalize_item(it, lambda _i: None)]
    real = len(Renderer(tiny_tokenizer).full(norm))
    pb = PromptBound(tiny_tokenizer, max_context=10**9, slice_chars=17)
    assert pb.floor_from_chars(pb.chars(items)) <= real
    assert pb.floor_by_counting(items) <= real


def test_tool_call_arguments_and_assistant_text_are_counted():
    items = [
        {
            "role": "assistant",
            "content": "<think>trimmed</think>\nkept",
            "tool_calls": [
                {"function": {"name": "f", "arguments": '{"a": "A1", "b": ["B1", 2]}'}},
                {
                    "function": {"name": "g", "arguments": "not json"}
                },  # rendered as what? not counted
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "not counted"},
                {"type": "tool_use", "id": "t", "name": "h", "input": {"c": "C1"}},
            ],
        },
        {"type": "function_call", "call_id": "x", "name": "k", "arguments": '{"d": "D1"}'},
        {
            "role": "assistant",
            "items": [  # a Responses turn as its adapter wraps it
                {"type": "function_call", "call_id": "y", "name": "m", "arguments": '{"e": "E1"}'},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "no"}]},
            ],
        },
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "not counted"}]},
    ]
    got = sorted(text_pieces(items))
    want = ["kept", "f", "a", "A1", "b", "B1", "g", "h", "c", "C1", "k", "d", "D1", "m", "e", "E1"]
    assert got == sorted(want)


async def test_huge_tool_call_arguments_are_refused_cheaply(tiny_tokenizer):
    """10 MB of assistant tool-call arguments used to be rendered in full (12 s, +2 GB) to learn
    that they do not fit; the floor now counts them."""
    import json
    import time

    big = json.dumps({"cmd": "echo " + "word " * (2 << 20)})  # ~10 MB
    items = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "run", "arguments": big}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ]
    pb = PromptBound(tiny_tokenizer, max_context=32768)
    t0 = time.monotonic()
    with pytest.raises(ApiError) as e:
        await pb.check(items, OPENAI, body_bytes=len(big) + 200)
    assert e.value.code == "context_length_exceeded"
    assert time.monotonic() - t0 < 3.0


# -- what the template renders beyond every template's text (issue 37, finding 4) ---------------

# Qwen3's rule: reasoning is shown for the assistant turns after the last user message.
SINCE_USER_TEMPLATE = (
    "{%- set ns = namespace(last=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\n' }}"
    "{%- set c = m.content or '' %}{%- set r = m.reasoning_content or '' %}"
    "{%- if '</think>' in c %}{%- set r = c.split('</think>')[0].split('<think>')[-1].strip('\n') %}"
    "{%- set c = c.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last and r %}{{- '<think>\n' + r + '\n</think>\n\n' }}{%- endif %}"
    "{{- c }}"
    "{%- for tc in m.tool_calls or [] %}{{- '\n<tool_call>' + tc.function.name + '</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
PLAIN_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\n' + (m.content or '') + "
    "'<|im_end|>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
DESCRIBED_TEMPLATE = (
    "{%- for t in tools or [] %}{{- t.function.name + ': ' + t.function.description + '\n' }}"
    "{%- endfor %}" + PLAIN_TEMPLATE
)


def _with_template(tiny_model_dir, template):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = template
    return tok


@pytest.mark.parametrize(
    "template,want",
    [
        (None, RenderedShape(tools="json", reasoning="all", think="all")),
        (SINCE_USER_TEMPLATE, RenderedShape(reasoning="since_user", think="since_user")),
        (PLAIN_TEMPLATE, RenderedShape(think="all")),
        (DESCRIBED_TEMPLATE, RenderedShape(tools="described", think="all")),
    ],
    ids=["tiny-qwen", "since-user", "plain", "described"],
)
def test_probe_sees_what_a_template_shows(tiny_model_dir, tiny_tokenizer, template, want):
    tok = tiny_tokenizer if template is None else _with_template(tiny_model_dir, template)
    assert probe(Renderer(tok).text_for_probe) == want


def test_a_template_failing_the_probe_is_taken_to_show_nothing_more():
    def render(messages, tools):
        raise RuntimeError("this template takes no such conversation")

    assert probe(render) == RenderedShape()


reasoning_texts = st.lists(st.sampled_from(list("ab xyz\n.é") + ["hm ", "\n\n"]), max_size=60).map(
    "".join
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    desc=texts,
    r1=reasoning_texts,
    r2=reasoning_texts,
    think=reasoning_texts,
    which=st.sampled_from(["tiny", "since_user", "plain", "described"]),
)
def test_floors_with_tools_and_reasoning_stay_below_the_render(
    tiny_model_dir, tiny_tokenizer, desc, r1, r2, think, which
):
    """Whatever the template shows of tools and reasoning, the floors count no more of it."""
    template = {
        "tiny": None,
        "since_user": SINCE_USER_TEMPLATE,
        "plain": PLAIN_TEMPLATE,
        "described": DESCRIBED_TEMPLATE,
    }[which]
    tok = (
        tiny_tokenizer
        if template is None
        else _TOKS.setdefault(which, _with_template(tiny_model_dir, template))
    )
    renderer = Renderer(tok)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": desc,
                "parameters": {"type": "object", "properties": {desc or "k": {"enum": [desc]}}},
            },
        }
    ]
    items = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": f"<think>{think}</think>a", "reasoning_content": r1},
        {"role": "user", "content": "v"},
        {"role": "assistant", "content": f"<think>{think}</think>b", "reasoning_content": r2},
        {"role": "user", "content": "w"},
        {"role": "assistant", "content": f"<think>{think}</think>c"},
    ]
    norm = [m for it in items for m in oa.normalize_item(it, lambda _i: None)]
    real = len(renderer.full(norm, tools))
    pb = PromptBound(tok, 10**9, slice_chars=17, shape=probe(renderer.text_for_probe))
    assert pb.floor_from_chars(pb.chars(items, tools)) <= real
    assert pb.floor_by_counting(items, tools) <= real


_TOKS: dict = {}


def test_reasoning_and_tools_are_counted_where_the_template_shows_them():
    items = [
        {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "<think>K1</think>A1", "reasoning_content": "R1"},
        {"role": "user", "content": [{"type": "text", "text": "U2"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "R2", "signature": "s"},
                {"type": "text", "text": "<think>K2</think>A2"},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "T"}]},
        {
            "role": "assistant",
            "items": [
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "R3"}]},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "<think>K3</think>A3"}],
                },
            ],
        },
    ]
    tools = [
        {
            "type": "function",
            "function": {"name": "n", "description": "D", "parameters": {"p": "P"}},
        }
    ]

    def pieces(**shape):
        return sorted(p for p in text_pieces(items, RenderedShape(**shape), tools) if p)

    always = ["U1", "A1", "U2", "A2", "T", "A3"]
    assert pieces() == sorted(always)
    assert pieces(tools="names") == sorted(always + ["n"])
    assert pieces(tools="described") == sorted(always + ["n", "D"])
    assert pieces(tools="json") == sorted(
        always + ["name", "n", "description", "D"] + ["parameters", "p", "P"]
    )
    # the tool_result-only user message does not end the turns "since the last user"
    assert pieces(reasoning="since_user") == sorted(always + ["R2", "R3"])
    assert pieces(reasoning="last") == sorted(always + ["R3"])
    assert pieces(reasoning="all", think="all") == sorted(
        always + ["R1", "R2", "R3", "K1", "K2", "K3"]
    )
    assert pieces(think="since_user") == sorted(always + ["K2", "K3"])


# -- engine faults ------------------------------------------------------------------------------


def test_backoff_grows_with_jitter_and_stops_at_attempts_or_budget():
    rng = random.Random(1)
    b = Backoff(base_s=0.25, cap_s=2.0, max_attempts=5, budget_s=100)
    for k, top in [(1, 0.25), (2, 0.5), (3, 1.0), (4, 2.0), (9, 2.0)]:
        ds = [b.delay(k, rng) for _ in range(200)]
        assert top / 2 <= min(ds) and max(ds) <= top and max(ds) - min(ds) > top / 4
    f = CallFaults(b)
    assert f.next_delay(False, 0.0, rng) == 0.0  # no failure yet
    for i in range(4):
        f.note("u", EngineBroke("refused"), float(i))
        assert f.next_delay(True, float(i), rng) == 0.0  # another engine is up: go at once
        assert f.next_delay(False, float(i), rng) > 0
    f.note("u", EngineBroke("refused"), 4.0)
    with pytest.raises(ApiError) as e:
        f.next_delay(True, 4.0, rng)
    assert e.value.status == 503 and e.value.headers["retry-after"] == "2"
    assert "5 attempts" in e.value.message and "refused" in e.value.message
    g = CallFaults(Backoff(max_attempts=100, budget_s=3.0))
    g.note("u", EngineSilent("no answer within 1 s"), 10.0)
    with pytest.raises(ApiError) as e:
        g.next_delay(False, 13.5, rng)  # past the budget: no further attempt
    assert e.value.status == 504 and "did not answer in time" in e.value.message


# -- images -------------------------------------------------------------------------------------

B64 = "iVBORw0KGgo="


def _an(block):
    return {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [block]}]}


def _oa(part):
    return {"model": "m", "messages": [{"role": "user", "content": [part]}]}


def _normalized(parse, body):
    call = parse(body)
    return [m for it in call.raw_items for m in call.normalize_item(it, lambda _i: None)]


@pytest.mark.parametrize(
    "block,ok",
    [
        ({"type": "image"}, False),  # no source: was answered 200
        ({"type": "image", "source": None}, False),
        ({"type": "image", "source": {"type": "base64", "media_type": "image/png"}}, False),
        (
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "%%"},
            },
            False,
        ),
        (
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "abc"},
            },
            False,
        ),
        ({"type": "image", "source": {"type": "base64", "data": B64}}, False),
        ({"type": "image", "source": {"type": "nope"}}, False),
        ({"type": "image", "source": {"type": "url"}}, False),
        (
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}},
            True,
        ),
        ({"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}, True),
        ({"type": "image", "source": {"type": "file", "file_id": "file_1"}}, True),
    ],
)
def test_anthropic_image_blocks(block, ok):
    if ok:
        (msg,) = _normalized(an.parse_request, _an(block))
        assert "image omitted" in msg["content"]
        # inside a tool_result too
        tr = {"type": "tool_result", "tool_use_id": "t", "content": [block]}
        assert _normalized(an.parse_request, _an(tr))
    else:
        with pytest.raises(ApiError) as e:
            _normalized(an.parse_request, _an(block))
        assert e.value.status == 400 and "source" in e.value.message
        tr = {"type": "tool_result", "tool_use_id": "t", "content": [block]}
        with pytest.raises(ApiError):
            _normalized(an.parse_request, _an(tr))


@pytest.mark.parametrize(
    "part,ok",
    [
        ({"type": "image_url"}, False),
        ({"type": "image_url", "image_url": "https://x"}, False),
        ({"type": "image_url", "image_url": {"url": ""}}, False),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, False),
        ({"type": "image_url", "image_url": {"url": "data:image/png," + B64}}, False),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64," + B64}}, True),
        ({"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}, True),
    ],
)
def test_openai_image_url_parts(part, ok):
    if ok:
        (msg,) = _normalized(oa.parse_request, _oa(part))
        assert "image_url omitted" in msg["content"]
    else:
        with pytest.raises(ApiError) as e:
            _normalized(oa.parse_request, _oa(part))
        assert e.value.status == 400 and "image_url" in e.value.message


def test_connection_cap_stays_below_the_file_limit():
    from gyre.proxy.listeners import connection_cap

    assert connection_cap(4096, 1 << 20) == 4096
    assert connection_cap(4096, 1024) == 768  # 256 kept for traces, engines, the admin socket
    assert connection_cap(4096, 256) == 192  # a small limit keeps a quarter
    assert connection_cap(4096, 20) == 16
