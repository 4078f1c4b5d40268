"""OpenAI chat requests for the template conformance test: generated deterministically from a
seed, plus hand-written edge cases (templates that raise, odd message orders)."""

import json
import random

TEXTS = [
    "Hi", "What's the weather like in Paris?", "  padded with spaces  ", "\n\nleading newlines",
    "trailing newlines\n\n", "Ünïcödé — “quotes” and ‘single’ ones", "中文问题：今天天气怎么样？",
    "日本語のテキスト", "emoji 👩🏽‍💻 and flags 🇫🇷", "tabs\tand\nnewlines\r\nCRLF", "back\\slash and \"quotes\"",
    "<tool_response>fake</tool_response>", "text with </think> inside", "a{{ not a tag }}b {% neither %}",
    "\u00a0nbsp-wrapped\u00a0", "\u2003em space\u3000ideographic", "\x1cfile-separator-wrapped\x1f", "",
    "   ", "Line1\nLine2\nLine3", "ends with backslash\\", "multi\n\n\nblank lines", "ß straße", "x" * 300,
]

REASONING = ["Need the tool.", "  Let me think.\nStep 1.\nStep 2.  ", "", "推理过程", "\nleading newline",
             "contains </think> oddly"]

SCHEMA_TYPES = ["string", "integer", "number", "boolean", "array", "object", "null"]


def rand_scalar(rng):
    k = rng.randrange(9)
    if k == 0:
        return rng.choice(TEXTS)
    if k == 1:
        return rng.choice([0, 1, -1, 42, 2**31, -(2**40), 9007199254740993])
    if k == 2:
        return rng.choice([0.5, 2.0, 1e-05, 1e16, 1.5e300, -0.0, 3.141592653589793, 0.1, 123456.789, 1e-7])
    if k == 3:
        return rng.choice([True, False])
    if k == 4:
        return None
    if k == 5:
        return rng.choice(["", "a\"b'c", "line1\nline2", "tab\there", "uni é 中 😀", "</parameter>", "\\n literal"])
    if k == 6:
        return rng.random() * 1000
    if k == 7:
        return rng.randrange(-10**6, 10**6)
    return rng.choice(["yes", "no", "null", "true", "1.0"])


def rand_json(rng, depth=0):
    if depth >= 3 or rng.random() < 0.5:
        return rand_scalar(rng)
    if rng.random() < 0.5:
        return [rand_json(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {f"k{i}_{rng.choice(['a', 'é', 'Z', 'long_key'])}": rand_json(rng, depth + 1)
            for i in range(rng.randrange(0, 4))}


def rand_schema(rng, depth=0):
    t = rng.choice(SCHEMA_TYPES[:6] if depth < 2 else SCHEMA_TYPES[:4])
    s = {"type": t}
    if rng.random() < 0.5:
        s["description"] = rng.choice(["A value", "Ünïcode “desc”", "has \"quotes\" and \\ backslash", "多语言"])
    if t == "object":
        s["properties"] = {f"p{i}": rand_schema(rng, depth + 1) for i in range(rng.randrange(1, 4))}
        s["required"] = sorted(s["properties"])[:1]
    elif t == "array":
        s["items"] = rand_schema(rng, depth + 1)
    elif t == "string" and rng.random() < 0.3:
        s["enum"] = ["celsius", "fahrenheit"]
    elif t == "number" and rng.random() < 0.3:
        s["minimum"] = 0.5
        s["maximum"] = 1e3
    return s


def rand_tool(rng, i):
    fn = {"name": f"tool_{i}_{rng.choice(['search', 'get_weather', 'run_code', 'lookup'])}"}
    if rng.random() < 0.8:
        fn["description"] = rng.choice(["Searches the web.", "Gets the weather — fast.", "Runs \"code\".", "查询"])
    fn["parameters"] = {"type": "object", "properties": {f"arg{j}": rand_schema(rng) for j in range(rng.randrange(0, 4))},
                        "required": []}
    return {"type": "function", "function": fn}


def rand_content(rng, allow_parts=True, plain=False):
    if plain:
        return rng.choice(TEXTS)
    if allow_parts and rng.random() < 0.15:
        parts = []
        for _ in range(rng.randrange(1, 4)):
            k = rng.randrange(5)
            if k == 0:
                parts.append({"type": "image"})
            elif k == 1:
                parts.append({"type": "image_url", "image_url": {"url": "http://x/y.png"}})
            elif k == 2:
                parts.append({"type": "video"})
            else:
                parts.append({"type": "text", "text": rng.choice(TEXTS)})
        return parts
    if rng.random() < 0.05:
        return None
    return rng.choice(TEXTS)


def rand_tool_call(rng, tools):
    name = rng.choice(tools)["function"]["name"] if tools else "unlisted_tool"
    args = {f"a{j}": rand_json(rng) for j in range(rng.randrange(0, 5))}
    k = rng.randrange(5)
    if k == 0:
        arguments = args  # already an object
    elif k == 1:
        arguments = json.dumps(args)
    elif k == 2:
        arguments = json.dumps(args, ensure_ascii=False, indent=rng.choice([None, 2]))
    elif k == 3:
        arguments = rng.choice(["", "{}", None])
    else:
        arguments = json.dumps(args, separators=(",", ":"))
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if rng.random() < 0.7:
        call["id"] = f"call_{rng.randrange(10**6)}"
    return call


def rand_assistant(rng, tools, plain=False):
    m = {"role": "assistant"}
    k = rng.randrange(6)
    if k == 0:
        m["content"] = f"<think>\n{rng.choice(REASONING)}\n</think>\n\n{rng.choice(TEXTS)}"
    elif k == 1:
        m["content"] = rng.choice(TEXTS)
        m["reasoning_content"] = rng.choice(REASONING)
    elif k == 2:
        m["content"] = rng.choice(TEXTS)
        m["reasoning"] = rng.choice(REASONING)
    elif k == 3:
        m["content"] = rng.choice(["", "Calling the tool."] if plain else ["", None, "Calling the tool."])
    else:
        m["content"] = rng.choice(TEXTS)
    if rng.random() < 0.4:
        m["tool_calls"] = [rand_tool_call(rng, tools) for _ in range(rng.randrange(1, 4))]
    return m


def rand_conversation(seed, plain=False):
    """plain: string contents only, so that templates without content-part support render it."""
    rng = random.Random(seed)
    req = {"messages": []}
    tools = [rand_tool(rng, i) for i in range(rng.randrange(0, 4))] if rng.random() < 0.5 else []
    if tools:
        req["tools"] = tools
    if rng.random() < 0.5:
        req["messages"].append({"role": "system", "content": rand_content(rng, rng.random() < 0.2, plain)})
    for _ in range(rng.randrange(1, 5)):
        req["messages"].append({"role": "user", "content": rand_content(rng, True, plain)})
        for _ in range(rng.randrange(0, 3)):
            a = rand_assistant(rng, tools, plain)
            req["messages"].append(a)
            if "tool_calls" in a:
                for _ in range(rng.randrange(1, 4)):
                    req["messages"].append({"role": "tool", "tool_call_id": "call_x", "content": rng.choice(TEXTS)})
    if rng.random() < 0.3:
        req["messages"].append(rand_assistant(rng, tools, plain))  # history ending with an assistant turn
    k = rng.randrange(4)
    if k == 1:
        req["chat_template_kwargs"] = {"enable_thinking": True}
    elif k == 2:
        req["chat_template_kwargs"] = {"enable_thinking": False}
    elif k == 3:
        req["chat_template_kwargs"] = {"enable_thinking": rng.choice(["false", 0, None]), "add_vision_id": rng.random() < 0.5}
    if rng.random() < 0.2:
        req["add_generation_prompt"] = False
    return req


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                    "metric": {"type": "boolean"}}, "required": ["city"]}}}

EDGE_CASES = {
    "golden_1_hi": {"messages": [{"role": "user", "content": "Hi"}]},
    "golden_2_system_no_thinking": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                    "chat_template_kwargs": {"enable_thinking": False}},
    "golden_3_multi_turn": {"messages": [{"role": "user", "content": "Q1"},
                                         {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
                                         {"role": "user", "content": "Q2"}]},
    "golden_4_tool_round_trip": {
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
                      "tool_calls": [{"type": "function", "function": {
                          "name": "get_weather",
                          "arguments": "{\"city\":\"Paris\",\"days\":2,\"metric\":true,\"opts\":{\"a\":null}}"}}]},
                     {"role": "tool", "content": "{\"temp\": 21}"}],
        "tools": [WEATHER_TOOL]},
    "golden_5_image_part": {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]},
    "no_messages": {"messages": []},
    "tool_message_first": {"messages": [{"role": "tool", "content": "result"}, {"role": "user", "content": "ok?"}]},
    "only_tool_response_user": {"messages": [{"role": "user", "content": "<tool_response>x</tool_response>"}]},
    "system_not_first": {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]},
    "developer_role": {"messages": [{"role": "developer", "content": "dev"}, {"role": "user", "content": "a"}]},
    "system_with_image": {"messages": [{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "a"}]},
    "unknown_part_type": {"messages": [{"role": "user", "content": [{"type": "audio", "audio": "x"}]}]},
    "content_is_number": {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                          "chat_template_kwargs": {"enable_thinking": False}},
    "consecutive_tool_results": {
        "messages": [{"role": "user", "content": "do both"},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"type": "function", "function": {"name": "a", "arguments": "{\"x\": 1}"}},
                         {"type": "function", "function": {"name": "b", "arguments": {"y": [1, 2.5, "z"]}}}]},
                     {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}, {"role": "tool", "content": "r3"},
                     {"role": "assistant", "content": "done", "reasoning": "all results in"}],
        "add_generation_prompt": False},
    "every_json_type_args": {
        "messages": [{"role": "user", "content": "types"},
                     {"role": "assistant", "content": "Sure.", "tool_calls": [{"type": "function", "function": {
                         "name": "f", "arguments": json.dumps({
                             "s": "str \"q\" \\ \n end", "i": -7, "big": 9007199254740993, "f": 1e-05, "g": 2.0,
                             "h": 1e16, "t": True, "fa": False, "n": None, "o": {"nested": {"deep": [1, {"x": None}]}},
                             "arr": [1, "two", 3.0, None, True], "empty_o": {}, "empty_a": [], "uni": "é中😀"},
                             ensure_ascii=True)}}]},
                     {"role": "tool", "content": "ok"}]},
    "think_in_content_no_reasoning": {
        "messages": [{"role": "user", "content": "q"},
                     {"role": "assistant", "content": "<think>\nhidden\n</think>\n\nvisible"},
                     {"role": "user", "content": "q2"},
                     {"role": "assistant", "content": "<think>r2</think>a2"}]},
    "reasoning_and_reasoning_content": {
        "messages": [{"role": "user", "content": "q"},
                     {"role": "assistant", "content": "a", "reasoning": "from reasoning", "reasoning_content": "wins"}]},
    "empty_tool_calls_list": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": []}]},
    "null_tool_calls": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": None}]},
    "system_only_whitespace_with_tools": {"messages": [{"role": "system", "content": "  \n "}, {"role": "user", "content": "q"}],
                                          "tools": [WEATHER_TOOL]},
    "enable_thinking_string_false": {"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": {"enable_thinking": "false"}},
    "add_vision_id": {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "video"}, {"type": "image_url", "image_url": {"url": "u"}}]},
                                   {"role": "user", "content": [{"type": "image"}]}],
                      "chat_template_kwargs": {"add_vision_id": True}},
    "tool_call_without_function_wrapper": {
        "messages": [{"role": "user", "content": "q"},
                     {"role": "assistant", "content": "x", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": "b"}}}]},
                     {"role": "tool", "content": "r"}, {"role": "user", "content": "<tool_response>\nr\n</tool_response>"}]},
    "content_list_with_only_text_parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": " a "}, {"type": "text", "text": "b "}]}]},
    "extra_kwargs_are_variables": {"messages": [{"role": "user", "content": "q"}],
                                   "chat_template_kwargs": {"enable_thinking": True, "custom_flag": [1, 2], "bos_token": "<override>"}},
}


def all_requests(n_random=220, n_plain=120, seed=20261130):
    cases = dict(EDGE_CASES)
    for i in range(n_random):
        cases[f"random_{i:03d}"] = rand_conversation(seed + i)
    for i in range(n_plain):
        cases[f"plain_{i:03d}"] = rand_conversation(seed + 100000 + i, plain=True)
    return cases
