"""Output parser: Hermes/Qwen tool calls and <think>, streaming == one-shot, broken JSON -> text."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.proxy.parsing import HermesParser, PlainParser, make_parser
from gyre.proxy.types import ReasoningDelta, TextDelta, ToolCallEvent


def _ids():
    c = itertools.count()
    return lambda: f"call_{next(c)}"


def run(text: str, pieces: list[int] | None = None, reasoning_open: bool = False):
    p = HermesParser(_ids(), reasoning_open)
    evs = []
    if pieces is None:
        evs += p.feed(text)
    else:
        pos = 0
        for n in pieces:
            evs += p.feed(text[pos : pos + n])
            pos += n
        evs += p.feed(text[pos:])
    evs += p.finish()
    content = "".join(e.text for e in evs if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in evs if isinstance(e, ReasoningDelta))
    calls = [(e.call.name, e.call.arguments) for e in evs if isinstance(e, ToolCallEvent)]
    return content, reasoning, calls


def test_tool_calls_and_text():
    text = (
        'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>'
    )
    content, reasoning, calls = run(text)
    assert content == "Let me look."
    assert reasoning == ""
    assert calls == [("bash", '{"command": "ls"}'), ("read", '{"path": "a.py"}')]


def test_reasoning_block_and_open_reasoning():
    content, reasoning, calls = run("<think>\nplan it\n</think>\n\nThe answer.")
    assert (content, reasoning.strip(), calls) == ("The answer.", "plan it", [])
    # a template whose generation prompt already opened <think>
    content, reasoning, _ = run("plan it\n</think>\n\nok", reasoning_open=True)
    assert (content, reasoning.strip()) == ("ok", "plan it")


def test_broken_json_is_text_never_a_crash():
    bad = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>'
    content, _, calls = run("x " + bad)
    assert calls == [] and content == "x " + bad
    for raw in [
        "<tool_call>[1,2]</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "a", "arguments": 5}</tool_call>',
    ]:
        content, _, calls = run(raw)
        assert calls == [] and content == raw
    # cut off inside a call (max_tokens): what was written comes back as text
    content, _, calls = run('ok <tool_call>\n{"name": "ba')
    assert calls == [] and content == 'ok <tool_call>\n{"name": "ba'


def test_unparsed_calls_are_counted():
    """What came back as text although the model wrote a call: the trace's tool-call health."""
    good = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    bad = '<tool_call>{"name": "a", "arguments": 5}</tool_call>'
    for text, parsed, unparsed in [
        (good + bad + bad, 1, 2),
        (good, 1, 0),
        ("plain words", 0, 0),
        (good + '<tool_call>{"name": "b"', 1, 1),  # cut off inside the second call
    ]:
        for pieces in (None, [3] * (len(text) // 3)):
            p = HermesParser(_ids())
            evs = []
            if pieces is None:
                evs += p.feed(text)
            else:
                for i in range(0, len(text), 3):
                    evs += p.feed(text[i : i + 3])
            evs += p.finish()
            assert sum(isinstance(e, ToolCallEvent) for e in evs) == parsed
            assert p.n_unparsed == unparsed, text
    plain = PlainParser(_ids())
    plain.feed(bad)
    assert plain.n_unparsed == 0  # tool_choice none: text is text


def test_arguments_given_as_json_string():
    _, _, calls = run('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert calls == [("f", '{"a": 1}')]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "Hi ",
                "<think>",
                "why",
                "</think>",
                "\n",
                "<tool_call>",
                '{"name": "f", "arguments": {"x": 1}}',
                "</tool_call>",
                "<",
                "tool",
                "{",
                "é",
            ]
        ),
        max_size=14,
    ),
    st.lists(st.integers(0, 7), max_size=20),
)
def test_streaming_in_any_pieces_equals_one_shot(parts, cuts):
    text = "".join(parts)
    assert run(text, cuts) == run(text)


def test_plain_parser_and_registry():
    p = make_parser("plain", _ids())
    assert isinstance(p, PlainParser)
    assert [e.text for e in p.feed("<tool_call>{}</tool_call>")] == ["<tool_call>{}</tool_call>"]
    try:
        make_parser("nope", _ids())
    except ValueError as e:
        assert "unknown output parser" in str(e)
    else:
        raise AssertionError("unknown parser accepted")
