"""Bridge matching: which earlier call a request extends, payload restoring, forks, prefix JSON."""

import json

from gyre.proxy import jsonfast
from gyre.proxy.adapters import anthropic_messages, openai_chat
from gyre.proxy.session import CallNode, ExecutionState


def _node(st, call, assistant, base=None, base_len=0, suffix=(1, 2, 3), output=(4, 5), norm=None):
    b = st.find_bridge(call)
    node = CallNode(
        request_id=f"r{len(st.nodes)}",
        seq=len(st.nodes),
        norm=b.norm,
        raw_to_norm=b.raw_to_norm,
        n_raw=len(call.raw_items),
        raw_items=None,
        tools_raw=call.tools_raw,
        tools=call.tools,
        head=b.head,
        assistant=assistant,
        base=b.base,
        base_len=b.base_len,
        suffix=list(suffix),
        output=list(output),
    )
    st.add_node(node, st.prefix_json(b.base, b.base_len), call.raw_items)
    return node, b


def _oa(messages, tools=None):
    body = {"model": "m", "messages": messages}
    if tools:
        body["tools"] = tools
    return openai_chat.parse_request(
        json.loads(json.dumps(body))
    )  # fresh objects, like a new HTTP body


def test_extension_with_reserialised_arguments_is_bridged():
    st = ExecutionState("e")
    m0 = [{"role": "system", "content": "S"}, {"role": "user", "content": "go"}]
    a0 = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls  -l"}'},
            }
        ],
    }
    n0, b0 = _node(st, _oa(m0), a0)
    assert b0.base is None and not b0.forked
    echo = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{\n  "command": "ls  -l"\n}'},
            }
        ],
    }
    m1 = m0 + [echo, {"role": "tool", "tool_call_id": "call_1", "content": "out"}]
    b1 = st.find_bridge(_oa(m1))
    assert b1.base is n0 and b1.base_len == n0.full_len == 5
    assert b1.new == [{"role": "tool", "tool_call_id": "call_1", "content": "out"}]
    # the conversation carries the ORIGINAL argument text (restored from the payload cache)
    assert b1.norm[2]["tool_calls"][0]["function"]["arguments"] == '{"command": "ls  -l"}'


def test_anthropic_moved_cache_control_still_bridges():
    st = ExecutionState("e")
    sys_blocks = [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]
    u0 = {
        "role": "user",
        "content": [{"type": "text", "text": "go", "cache_control": {"type": "ephemeral"}}],
    }
    body = {"model": "m", "max_tokens": 10, "system": sys_blocks, "messages": [u0]}
    c0 = anthropic_messages.parse_request(json.loads(json.dumps(body)))
    a0 = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "Bash", "arguments": '{"command":"ls"}'},
            }
        ],
    }
    n0, _ = _node(st, c0, a0)
    u0_moved = {
        "role": "user",
        "content": [{"type": "text", "text": "go"}],
    }  # marker moved to the newest message
    echo = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
        ],
    }
    tr = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": "x",
                "cache_control": {"type": "ephemeral"},
            }
        ],
    }
    body1 = {"model": "m", "max_tokens": 10, "system": sys_blocks, "messages": [u0_moved, echo, tr]}
    b1 = st.find_bridge(anthropic_messages.parse_request(json.loads(json.dumps(body1))))
    assert b1.base is n0
    assert b1.new == [{"role": "tool", "tool_call_id": "toolu_1", "content": "x"}]


def test_rewritten_history_forks_and_new_conversation_does_not():
    st = ExecutionState("e")
    m0 = [{"role": "system", "content": "S"}, {"role": "user", "content": "go"}]
    n0, _ = _node(st, _oa(m0), {"role": "assistant", "content": "first answer"})
    m1 = m0 + [
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "more"},
    ]
    n1, b1 = _node(st, _oa(m1), {"role": "assistant", "content": "second"}, output=(6, 7, 8))
    assert b1.base is n0
    # a different follow-up after the first answer is a branch off call 0 (still bridged)
    branch = m0 + [
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "other"},
    ]
    b = st.find_bridge(_oa(branch))
    assert b.base is n0 and not b.forked
    # the harness rewrites the model's own answer: no bridge, a recorded fork
    edited = m0 + [
        {"role": "assistant", "content": "first answer, abridged"},
        {"role": "user", "content": "more"},
    ]
    b = st.find_bridge(_oa(edited))
    assert b.base is None and b.forked and b.fork_at == 2
    # a compacted/new conversation sharing only the system prompt is a new root, not a fork
    b = st.find_bridge(_oa([m0[0], {"role": "user", "content": "summary of the work so far"}]))
    assert b.base is None and not b.forked
    # the same request again (not an SDK retry): same input, new sample
    b = st.find_bridge(_oa(m1))
    assert b.base is n1 and b.base_len == n1.input_len and b.echo is None


def test_prefix_json_hot_and_rebuilt_from_chain():
    st = ExecutionState("e", hot_nodes=1)
    msgs = [{"role": "user", "content": "u0"}]
    nodes = []
    for k in range(4):
        a = {"role": "assistant", "content": f"a{k}"}
        n, b = _node(st, _oa(msgs), a, suffix=[10 * k + 1, 10 * k + 2], output=[10 * k + 3])
        nodes.append(n)
        msgs = msgs + [a, {"role": "user", "content": f"u{k + 1}"}]
    full = nodes[-1].materialise(nodes[-1].full_len)
    assert full == [1, 2, 3, 11, 12, 13, 21, 22, 23, 31, 32, 33]
    assert st.prefix_json(nodes[-1], nodes[-1].full_len) == jsonfast.ids_json(full)  # hot
    assert nodes[1].json_parts is None  # evicted
    assert st.prefix_json(nodes[1], nodes[1].full_len) == jsonfast.ids_json(full[:6])  # rebuilt
    assert st.prefix_json(nodes[-1], nodes[-1].input_len) == jsonfast.ids_json(full[:-1])
