"""Chat templates: `sparkserve chat-template` must render byte-for-byte what Python jinja2 renders
when configured as transformers' apply_chat_template (with vLLM's request preprocessing), for the
Qwen3.5 and Qwen3 templates on 200+ conversations, and for small templates exercising each engine
feature. When jinja2 raises, sparkserve must fail too, with the same message."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from chat_template import oracle  # noqa: E402
from chat_template.conversations import all_requests  # noqa: E402
from chat_template.feature_cases import CASES, V  # noqa: E402
from chat_template.random_templates import all_templates  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "templates"


def sparkserve_bin() -> str:
    path = os.environ.get("SPARKSERVE_BIN") or str(ROOT / "build" / "sparkserve")
    assert Path(path).exists(), f"sparkserve binary not found at {path}; build it or set SPARKSERVE_BIN"
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Model folders as HF ships them. qwen3.5: chat_template.jinja next to a tokenizer_config.json
    whose own chat_template must lose; qwen3: the template inside tokenizer_config.json."""
    base = tmp_path_factory.mktemp("models")
    q35 = base / "qwen3.5"
    q35.mkdir()
    shutil.copy(FIXTURES / "qwen3.5.jinja", q35 / "chat_template.jinja")
    (q35 / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": "WRONG TEMPLATE: chat_template.jinja must win",
        "bos_token": None,
        "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False},
        "pad_token": "<|endoftext|>", "unk_token": None}), encoding="utf-8")
    q3 = base / "qwen3"
    q3.mkdir()
    shutil.copy(FIXTURES / "qwen3_tokenizer_config.json", q3 / "tokenizer_config.json")
    named = base / "named_list"
    named.mkdir()
    (named / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": [{"name": "tool_use", "template": "TOOL {{ messages|length }}"},
                          {"name": "default", "template": "DEFAULT {{ bos_token }}{{ messages[0].content }}"}],
        "bos_token": {"content": "<s>"}}), encoding="utf-8")
    dirs = {"qwen3.5": q35, "qwen3": q3, "named_list": named}
    for style in ("mistral_style", "gemma_style", "schema_style"):
        d = base / style
        d.mkdir()
        shutil.copy(FIXTURES / f"{style}.jinja", d / "chat_template.jinja")
        (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}), encoding="utf-8")
        dirs[style] = d
    return dirs


def run_cli(args, request: dict, tmp_path: Path):
    req = tmp_path / "request.json"
    req.write_text(json.dumps(request, ensure_ascii=False), encoding="utf-8")
    return subprocess.run([sparkserve_bin(), "chat-template", *args, "--request", str(req)],
                          capture_output=True, timeout=60)


def check(expected, proc, what):
    status, value = expected
    stderr = proc.stderr.decode("utf-8", "replace")
    if status == "ok":
        assert proc.returncode == 0, f"{what}: sparkserve failed: {stderr}"
        got = proc.stdout.decode("utf-8")
        assert got == value, f"{what}: output differs\n--- jinja2\n{value!r}\n--- sparkserve\n{got!r}"
    elif status == "syntax":
        assert proc.returncode != 0 and proc.stdout == b"", f"{what}: jinja2 refused the template ({value}) but sparkserve rendered it"
        assert "template syntax error" in stderr and "line" in stderr, stderr
    else:
        assert proc.returncode != 0, f"{what}: jinja2 raised {value!r} but sparkserve printed {proc.stdout!r}"
        assert proc.stdout == b"", "nothing may reach stdout on failure"
        # jinja2 message "TemplateError: msg" -> sparkserve prints the bare raise_exception message.
        msg = value.split(": ", 1)[1] if value.startswith("TemplateError: ") else value
        assert msg in stderr, f"{what}: messages differ\n jinja2: {msg!r}\n sparkserve: {stderr!r}"


REQUESTS = all_requests()


@pytest.mark.parametrize("template", ["qwen3.5", "qwen3", "mistral_style", "gemma_style", "schema_style"])
@pytest.mark.parametrize("case", sorted(REQUESTS))
def test_conversation(models, template, case, tmp_path):
    request = REQUESTS[case]
    source, tokens = oracle.load_model_template(models[template])
    expected = oracle.render(source, request, tokens)
    check(expected, run_cli(["--model", str(models[template])], request, tmp_path), f"{template}/{case}")


def test_enough_conversations_render():
    """The suite must compare at least 200 successful renderings per template, not only errors."""
    for name in ("qwen3.5.jinja", "qwen3.jinja"):
        source = (FIXTURES / name).read_text(encoding="utf-8")
        ok = sum(oracle.render(source, r, {})[0] == "ok" for r in REQUESTS.values())
        assert ok >= 200, f"{name}: only {ok} conversations render without error"


def test_golden_strings_from_reference(models, tmp_path):
    """serving-api.md §2.2 goldens, independently of the oracle."""
    hi = run_cli(["--model", str(models["qwen3.5"])], REQUESTS["golden_1_hi"], tmp_path)
    assert hi.stdout == b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    two = run_cli(["--model", str(models["qwen3.5"])], REQUESTS["golden_2_system_no_thinking"], tmp_path)
    assert two.stdout == (b"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                          b"<|im_start|>assistant\n<think>\n\n</think>\n\n")
    three = run_cli(["--model", str(models["qwen3.5"])], REQUESTS["golden_3_multi_turn"], tmp_path)
    assert three.stdout == (b"<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
                            b"<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n")
    four = run_cli(["--model", str(models["qwen3.5"])], REQUESTS["golden_4_tool_round_trip"], tmp_path).stdout.decode()
    assert "<parameter=metric>\nTrue\n</parameter>" in four and "<parameter=opts>\n{\"a\": null}\n</parameter>" in four
    assert '{"type": "function", "function": {"name": "get_weather", "description": "Get weather", "parameters": ' in four
    five = run_cli(["--model", str(models["qwen3.5"])], REQUESTS["golden_5_image_part"], tmp_path)
    assert five.stdout.startswith(b"<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n")


def test_template_list_uses_default_entry(models, tmp_path):
    proc = run_cli(["--model", str(models["named_list"])], {"messages": [{"role": "user", "content": "x"}]}, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"DEFAULT <s>x"


FEATURE_TEMPLATES = dict(CASES)
assert len(FEATURE_TEMPLATES) == len(CASES), "duplicate feature case names"


@pytest.mark.parametrize("case", [name for name, _ in CASES])
def test_engine_feature(models, case, tmp_path):
    source = FEATURE_TEMPLATES[case]
    tpl = tmp_path / "t.jinja"
    tpl.write_bytes(source.encode("utf-8"))
    request = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": V}
    _, tokens = oracle.load_model_template(models["qwen3.5"])
    expected = oracle.render(source, request, tokens)
    proc = run_cli(["--template", str(tpl), "--model", str(models["qwen3.5"])], request, tmp_path)
    check(expected, proc, case)


def test_cli_errors_are_clean(tmp_path, models):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    proc = subprocess.run([sparkserve_bin(), "chat-template", "--model", str(models["qwen3.5"]), "--request", str(bad)],
                          capture_output=True, timeout=60)
    assert proc.returncode != 0 and b"not valid JSON" in proc.stderr and proc.stdout == b""
    proc = run_cli(["--model", str(tmp_path / "no_such_model")], {"messages": []}, tmp_path)
    assert proc.returncode != 0 and b"no chat template" in proc.stderr
    proc = run_cli(["--model", str(models["qwen3.5"])], {"messages": "nope"}, tmp_path)
    assert proc.returncode != 0 and b"messages must be an array" in proc.stderr
    bad_args = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{broken"}}]}]}
    proc = run_cli(["--model", str(models["qwen3.5"])], bad_args, tmp_path)
    assert proc.returncode != 0 and b"arguments is not valid JSON" in proc.stderr


# Random templates (chat_template/random_templates.py, seed 777). Known divergences, each checked
# to still diverge (strict xfail), so a fix or a regression in them is noticed:
#  - jinja2 folds constant subtrees at compile time, and a constant subscript that fails becomes
#    Undefined there, while the same subscript on a runtime value raises TypeError; sparkserve
#    always raises (rand_tpl_012, 139, 220, 252, 274).
#  - jinja2's map/select/batch/... return lazy generators, so an error inside one that is never
#    iterated never happens; sparkserve evaluates eagerly (rand_tpl_015, 073, 193, 239).
RANDOM_KNOWN_DIVERGENCES = {"rand_tpl_012", "rand_tpl_139", "rand_tpl_220", "rand_tpl_252", "rand_tpl_274",
                            "rand_tpl_015", "rand_tpl_073", "rand_tpl_193", "rand_tpl_239"}
RANDOM_TEMPLATES = all_templates()


@pytest.mark.parametrize("case", sorted(RANDOM_TEMPLATES))
def test_random_template(models, case, tmp_path, request):
    if case in RANDOM_KNOWN_DIVERGENCES:
        request.applymarker(pytest.mark.xfail(strict=True, reason="known divergence, see RANDOM_KNOWN_DIVERGENCES"))
    source = RANDOM_TEMPLATES[case]
    req = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": V}
    expected = oracle.render(source, req, {})
    if expected[0] == "ok" and " at 0x" in expected[1]:
        # Python printed an object address (a generator): nothing to compare byte for byte, but
        # sparkserve must still render it.
        expected = ("ok", None)
    tpl = tmp_path / "t.jinja"
    tpl.write_bytes(source.encode("utf-8"))
    proc = run_cli(["--template", str(tpl)], req, tmp_path)
    if expected[1] is None:
        assert proc.returncode == 0, proc.stderr
        return
    check(expected, proc, case)
