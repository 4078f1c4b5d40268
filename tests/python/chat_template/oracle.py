"""The reference renderer: Python jinja2 configured exactly as transformers' apply_chat_template
does it, plus the request preprocessing vLLM applies before rendering. Written here from those
projects' documented behaviour; sparkserve's C++ code is never consulted."""

import datetime
import json
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_env():
    # transformers.utils.chat_template_utils._compile_jinja_template
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def special_tokens(tokenizer_config: dict) -> dict:
    """transformers' special_tokens_map: the tokens that are set, as strings."""
    out = {}
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = tokenizer_config.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[name] = v
    extra = tokenizer_config.get("additional_special_tokens")
    if isinstance(extra, list):
        out["additional_special_tokens"] = [t.get("content") if isinstance(t, dict) else t for t in extra]
    return out


def load_model_template(model_dir: Path):
    """chat_template.jinja wins over tokenizer_config.json's chat_template."""
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    jinja_path = model_dir / "chat_template.jinja"
    if jinja_path.exists():
        source = jinja_path.read_text(encoding="utf-8")
    else:
        source = cfg["chat_template"]
        if isinstance(source, list):
            source = next(t["template"] for t in source if t.get("name") == "default")
    return source, special_tokens(cfg)


def preprocess_messages(messages):
    """vLLM: assistant tool-call arguments sent as a JSON string are parsed (falsy -> {});
    `reasoning` is accepted for `reasoning_content`; null/empty tool_calls are dropped."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))  # deep copy
        if "reasoning" in m and "reasoning_content" not in m:
            m["reasoning_content"] = m["reasoning"]
        if "tool_calls" in m and not m["tool_calls"]:
            del m["tool_calls"]
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            for call in m["tool_calls"]:
                args = call["function"].get("arguments")
                if not args:
                    call["function"]["arguments"] = {}
                elif not isinstance(args, (dict, list)):
                    call["function"]["arguments"] = json.loads(args)
        out.append(m)
    return out


def context_for_request(request: dict, tokens: dict) -> dict:
    ctx = dict(tokens)
    ctx.update(request.get("chat_template_kwargs") or {})
    ctx["messages"] = preprocess_messages(request["messages"])
    ctx["tools"] = request.get("tools")
    ctx["documents"] = None
    ctx["add_generation_prompt"] = request.get("add_generation_prompt", True)
    return ctx


def render(source: str, request: dict, tokens: dict):
    """Returns ("ok", text) or ("error", message)."""
    try:
        template = ENV.from_string(source)
    except (jinja2.TemplateSyntaxError, SyntaxError) as e:  # SyntaxError: 'break' outside loop
        return "syntax", str(e)
    try:
        return "ok", template.render(**context_for_request(request, tokens))
    except Exception as e:  # noqa: BLE001 - any failure is compared with the C++ one
        return "error", f"{type(e).__name__}: {e}"
