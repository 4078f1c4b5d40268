"""Images in chat requests (OpenAI image_url parts) on the tiny model's random vision tower.

The reference for what the server computes is `sparkserve generate --image` (the CLI path that
test_vision_reference.py checks against transformers: pixels bit-exact, logits within 1e-3):
for one and for several JPEG / PNG / WebP images, streamed and not, the server's expanded prompt
ids equal the CLI's and its greedy tokens equal the CLI's. The server runs with 32-token prefill
chunks, so every image is split across chunks and the decode steps rely on the rope delta the
engine keeps per sequence. Every malformed image is a 400 with OpenAI's error object naming the
content part, and the server stays up. Anthropic image blocks and Responses input_image parts take
the same path."""
import base64
import json
import os
import struct
import subprocess
import zlib

import httpx
import pytest

from conftest import BIN, MODEL_NAME, ROOT, Server, check_sanitizer_report

IMAGES = os.path.join(ROOT, "tests", "fixtures", "vision-images")
JPEG, PNG, WEBP = "c_300x200.jpg", "b_150x90.png", "d_97x257.webp"
IMAGE_PAD = 248056  # <|image_pad|> in the Qwen3.5 tokenizer (config.json image_token_id)
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def vserver(tiny_model):
    s = Server(tiny_model, "--max-model-len", "1024", "--max-body-bytes", str(1 << 20),
               "--max-num-batched-tokens", "32", "--limit-mm-per-prompt", '{"image": 3}',
               "--allowed-local-media-path", IMAGES, "--max-image-pixels", "1000000")
    yield s
    s.stop()


@pytest.fixture
def vclient(vserver):
    import openai
    return openai.OpenAI(base_url=vserver.url + "/v1", api_key="unused", timeout=300, max_retries=0)


def read(name):
    with open(os.path.join(IMAGES, name), "rb") as f:
        return f.read()


def data_url(data, mime="image/png"):
    return f"data:{mime};base64," + base64.b64encode(data).decode()


MIME = {".jpg": "image/jpeg", ".png": "image/png", ".webp": "image/webp"}


def image_part(name):
    return {"type": "image_url", "image_url": {"url": data_url(read(name), MIME[os.path.splitext(name)[1]])}}


def user(*parts):
    return [{"role": "user", "content": [{"type": "text", "text": "Describe these."}, *parts]}]


def cli_generate(tiny_model, prompt_ids, names):
    """The CLI's greedy tokens and expanded prompt for the server's prompt with each image's run of
    <|image_pad|> collapsed back to one placeholder."""
    collapsed = [t for i, t in enumerate(prompt_ids) if t != IMAGE_PAD or i == 0 or prompt_ids[i - 1] != IMAGE_PAD]
    cmd = [BIN, "generate", "--model", tiny_model, "--prompt-ids", ",".join(map(str, collapsed)),
           "--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--json", "--threads", "2", "--no-progress"]
    for n in names:
        cmd += ["--image", os.path.join(IMAGES, n)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    check_sanitizer_report(out.stderr, "sparkserve generate")
    j = json.loads(out.stdout)
    return j["prompt_ids"], j["output_ids"]


@pytest.mark.parametrize("names", [[JPEG], [PNG], [WEBP], [PNG, JPEG, WEBP]], ids=["jpeg", "png", "webp", "three"])
def test_chat_with_images_matches_cli(vclient, tiny_model, names):
    r = vclient.chat.completions.create(model=MODEL_NAME, messages=user(*map(image_part, names)),
                                        max_tokens=MAX_TOKENS, temperature=0,
                                        extra_body={"ignore_eos": True, "return_token_ids": True})
    choice = r.choices[0]
    prompt = r.prompt_token_ids
    assert sum(1 for i, t in enumerate(prompt) if t == IMAGE_PAD and prompt[i - 1] != IMAGE_PAD) == len(names)
    assert r.usage.prompt_tokens == len(prompt)
    cli_prompt, cli_out = cli_generate(tiny_model, prompt, names)
    assert prompt == cli_prompt
    assert choice.token_ids == cli_out


def test_streamed_chat_with_several_images(vclient):
    names = [WEBP, JPEG]
    args = dict(model=MODEL_NAME, messages=user(*map(image_part, names)), max_tokens=MAX_TOKENS, temperature=0,
                extra_body={"ignore_eos": True, "return_token_ids": True})
    whole = vclient.chat.completions.create(**args).choices[0]
    ids, text = [], ""
    for chunk in vclient.chat.completions.create(stream=True, **args):
        for ch in chunk.choices:
            ids += getattr(ch, "token_ids", None) or []
            text += (getattr(ch.delta, "reasoning_content", None) or "") + (ch.delta.content or "")
    assert ids == whole.token_ids and len(ids) == MAX_TOKENS
    assert text == (getattr(whole.message, "reasoning_content", None) or "") + (whole.message.content or "")


def test_file_url_inside_the_allowed_folder(vclient):
    file_part = {"type": "image_url", "image_url": {"url": "file://" + os.path.join(IMAGES, PNG)}}
    args = dict(model=MODEL_NAME, max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    a = vclient.chat.completions.create(messages=user(file_part), **args)
    b = vclient.chat.completions.create(messages=user(image_part(PNG)), **args)
    assert a.choices[0].token_ids == b.choices[0].token_ids and a.prompt_token_ids == b.prompt_token_ids


def test_tokenize_expands_images(vserver, vclient):
    r = vclient.chat.completions.create(model=MODEL_NAME, messages=user(image_part(JPEG)), max_tokens=1,
                                        extra_body={"return_token_ids": True})
    t = httpx.post(vserver.url + "/tokenize", json={"model": MODEL_NAME, "messages": user(image_part(JPEG))}, timeout=60)
    assert t.status_code == 200, t.text
    assert t.json()["tokens"] == r.prompt_token_ids


def test_anthropic_and_responses_images(vserver):
    """Anthropic image blocks and Responses input_image parts run the chat path's images: the same
    prompt (token count) and greedy output as the chat request with an image_url part."""
    import anthropic
    import openai
    png = base64.b64encode(read(PNG)).decode()
    chat = httpx.post(vserver.url + "/v1/chat/completions", timeout=300, json={
        "model": MODEL_NAME, "messages": user(image_part(PNG)), "max_tokens": MAX_TOKENS, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}}).json()
    text = chat["choices"][0]["message"]["content"] or ""
    ac = anthropic.Anthropic(base_url=vserver.url, api_key="x", timeout=300, max_retries=0)
    blocks = [{"type": "text", "text": "Describe these."},
              {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]
    a = ac.messages.create(model=MODEL_NAME, max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
                           messages=[{"role": "user", "content": blocks}])
    assert a.usage.input_tokens + a.usage.cache_read_input_tokens == chat["usage"]["prompt_tokens"]
    assert a.usage.output_tokens == chat["usage"]["completion_tokens"]
    # (a whitespace-only reply opens no text block)
    assert "".join(b.text for b in a.content if b.type == "text") == (text if text.strip() else "")
    assert ac.messages.count_tokens(model=MODEL_NAME, messages=[{"role": "user", "content": blocks}]).input_tokens == \
        chat["usage"]["prompt_tokens"]
    oc = openai.OpenAI(base_url=vserver.url + "/v1", api_key="x", timeout=300, max_retries=0)
    r = oc.responses.create(model=MODEL_NAME, max_output_tokens=MAX_TOKENS, temperature=0, reasoning={"effort": "none"},
                            input=[{"role": "user", "content": [
                                {"type": "input_text", "text": "Describe these."},
                                {"type": "input_image", "image_url": data_url(read(PNG))}]}])
    assert r.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert r.output_text == text
    # An image in a tool result (a screenshot tool) adds the tokens it adds to a user turn.
    def count(content):
        return ac.messages.count_tokens(model=MODEL_NAME, messages=[
            {"role": "user", "content": "Look"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content}]}]).input_tokens

    def tokens(content):
        return len(httpx.post(vserver.url + "/tokenize", timeout=60, json={
            "model": MODEL_NAME, "messages": [{"role": "user", "content": content}]}).json()["tokens"])

    added = tokens([{"type": "text", "text": "x"}, image_part(PNG)]) - tokens("x")
    assert added > 0
    assert count(blocks) - count(blocks[:1]) == added


# ---- malformed images -----------------------------------------------------------------------------

def png_chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_bomb(width, height):
    """A small PNG declaring width x height RGB pixels (a decompression bomb's header): the
    decoder must refuse it from the header, before allocating or inflating anything."""
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            png_chunk(b"IDAT", zlib.compress(bytes(1000))) + png_chunk(b"IEND", b""))


def bad(url, words, n=1):
    parts = [{"type": "image_url", "image_url": {"url": url}}] * n
    return user(*parts), words


BAD = {
    "undecodable": bad(data_url(b"\x89PNG\r\n\x1a\n" + os.urandom(200)), ("PNG",)),
    "truncated png": bad(data_url(read(PNG)[: len(read(PNG)) // 2]), ("truncated",)),
    "truncated jpeg": bad(data_url(read(JPEG)[: len(read(JPEG)) // 2], "image/jpeg"), ("JPEG",)),
    "too large": bad(data_url(png_bomb(30000, 30000)), ("30000x30000", "1000000")),
    "unsupported format": bad(data_url(b"BM" + bytes(60), "image/bmp"), ("unsupported image format",)),
    "not base64": bad("data:image/png;base64,@@not base64@@", ("base64",)),
    "empty data": bad("data:image/png;base64,", ("no data",)),
    "not a base64 data URL": bad("data:image/png," + "x" * 10, ("base64",)),
    "text media type": bad("data:text/plain;base64,aGVsbG8=", ("text/plain",)),
    "network URL": bad("https://example.com/cat.png", ("network",)),
    "file outside the folder": bad("file:///etc/passwd", ("outside",)),
    "file escaping with ..": bad("file://" + IMAGES + "/../../../../../../../../../etc/passwd", ("outside",)),
    "missing file": bad("file://" + IMAGES + "/nope.png", ("cannot open",)),
    "over the image limit": bad(data_url(read(PNG)), ("At most 3 image",), n=4),
}


@pytest.mark.parametrize("name", list(BAD))
def test_malformed_image_is_a_400(vserver, name):
    messages, words = BAD[name]
    r = httpx.post(vserver.url + "/v1/chat/completions", json={"model": MODEL_NAME, "messages": messages}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError"
    assert err["param"].startswith("messages[0].content["), err
    for w in words:
        assert w in err["message"], err["message"]
    assert httpx.get(vserver.url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("messages,words", [
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "data:image/png;base64,AAAA"}]}], ("image_url",)),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}], ("url",)),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}], ("input_audio",)),
    ([{"role": "system", "content": [image_part(PNG)]}, {"role": "user", "content": "hi"}], ("System message cannot contain images",)),
    ([{"role": "user", "content": [{"type": "text", "text": "<|vision_start|><|image_pad|><|vision_end|>"}, image_part(PNG)]}],
     ("image",)),
], ids=["image_url not an object", "url not a string", "audio part", "image in system message", "placeholder text"])
def test_bad_image_parts_are_400s(vserver, messages, words):
    r = httpx.post(vserver.url + "/v1/chat/completions", json={"model": MODEL_NAME, "messages": messages}, timeout=60)
    assert r.status_code == 400, r.text
    for w in words:
        assert w in r.json()["error"]["message"], r.text
