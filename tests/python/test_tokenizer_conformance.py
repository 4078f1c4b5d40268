"""Tokenizer conformance: `sparkserve tokenize` must give exactly the ids of Hugging Face
`tokenizers` (the oracle, pinned in tests/requirements.txt) for the Qwen3 and Qwen3.5 tokenizers,
on a >= 20,000-line multilingual corpus plus multi-line chunks, and decode must round-trip."""
import json
import os
import sys
import unicodedata

import pytest
from tokenizers import Tokenizer as HfTokenizer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tokenizer"))
import tokenizer_fixtures as fx  # noqa: E402

CORPUS = fx.corpus_module()
LINES = CORPUS.make_corpus(fx.CORPUS_LINES, fx.CORPUS_SEED)
CHUNKS = CORPUS.make_chunks(LINES, fx.CORPUS_CHUNKS, fx.CORPUS_SEED)


def describe(i, text, ours, ref):
    k = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    return "#%d %r\n  ours[%d:]=%s\n  hf  [%d:]=%s" % (i, text[:120], k, ours[k:k + 8], k, ref[k:k + 8])


def test_corpus_covers_what_it_must():
    assert len(LINES) >= 20000
    assert all("\n" not in l for l in LINES)
    text = "".join(LINES)
    def has_range(lo, hi):
        return any(lo <= ord(c) <= hi for c in text)
    assert has_range(0x4E00, 0x9FFF), "Chinese"
    assert has_range(0x3040, 0x30FF), "Japanese kana"
    assert has_range(0xAC00, 0xD7A3), "Korean"
    assert has_range(0x0E00, 0x0E7F), "Thai"
    assert has_range(0x0900, 0x097F), "Devanagari"
    assert has_range(0x0600, 0x06FF), "Arabic"
    assert has_range(0x0590, 0x05FF), "Hebrew"
    assert "\U0001f3fd" in text and "\u200d" in text, "emoji skin tones and ZWJ"
    assert "e\u0301" in text, "decomposed accents"
    assert any(unicodedata.normalize("NFC", l) != l for l in LINES), "lines that NFC changes"
    assert "\t" in text and "\r" in text and "    " in text
    assert "12345678901234567890" in text
    for s in ["<|im_start|>", "<think>", "<tool_call>", "<|im_start", "<think >", "<|IM_START|>"]:
        assert s in text, s
    assert max(len(l) for l in LINES) >= 2000, "very long words"
    assert any("\r\n" in c for c in CHUNKS) and any("\n\n" in c for c in CHUNKS)


@pytest.mark.parametrize("name", fx.MODELS)
def test_ids_identical_to_hf_on_corpus_lines_and_chunks(name):
    model = fx.model_dir(name)
    hf = HfTokenizer.from_file(os.path.join(model, "tokenizer.json"))
    texts = LINES + CHUNKS
    ours = fx.encode_batch_cli(model, texts, decode=True)
    assert len(ours) == len(texts)
    ref = [e.ids for e in hf.encode_batch(texts)]
    bad = [describe(i, texts[i], o["ids"], r) for i, (o, r) in enumerate(zip(ours, ref)) if o["ids"] != r]
    assert not bad, "%d of %d texts differ from HF tokenizers:\n%s" % (len(bad), len(texts), "\n".join(bad[:5]))
    # decode(encode(x)) gives back x up to NFC (the normalizer), and the same text as HF's decode.
    bad_decode = [i for i, (t, o) in enumerate(zip(texts, ours)) if o["text"] != unicodedata.normalize("NFC", t)]
    assert not bad_decode, "round trip fails for %d texts, first %r" % (len(bad_decode), texts[bad_decode[0]][:120])
    bad_hf_decode = [i for i, (o, r) in enumerate(zip(ours, ref))
                     if o["text"] != hf.decode(r, skip_special_tokens=False)]
    assert not bad_hf_decode, "decode differs from HF for %d texts" % len(bad_hf_decode)


@pytest.mark.parametrize("name", fx.MODELS)
def test_ids_identical_on_an_unseen_corpus(name):
    # Another seed: text this implementation was never tuned on.
    lines = CORPUS.make_corpus(4000, 987654321)[-3000:]
    texts = lines + CORPUS.make_chunks(lines, 200, 987654321)
    model = fx.model_dir(name)
    hf = HfTokenizer.from_file(os.path.join(model, "tokenizer.json"))
    ours = fx.encode_batch_cli(model, texts)
    ref = [e.ids for e in hf.encode_batch(texts)]
    bad = [describe(i, texts[i], o["ids"], r) for i, (o, r) in enumerate(zip(ours, ref)) if o["ids"] != r]
    assert not bad, "\n".join(bad[:5])


@pytest.mark.parametrize("name", fx.MODELS)
def test_ids_identical_on_texts_that_resend_earlier_ones(name):
    # A chat client re-sends its conversation: each text starts with (most of) an earlier one, cut
    # anywhere (inside an added token too), so the tokenizer resumes from its prompt memo.
    import random
    rng = random.Random(17)
    pieces = CHUNKS[:400] + ["<|im_start|>", "<|im_end|>\n", "<think>\n", "</think>\n\n", "<tool_call>", "</tool_call>",
                             "<tool_response>", "<|im_start", "<|im_end", "\n\n", " ", "<|endoftext|>"]
    texts = []
    for i in range(120):
        if not texts or rng.random() < 0.15:
            t = ""
        else:
            base = texts[-1 - rng.randrange(min(len(texts), 4))]
            t = base[:rng.randrange(len(base) + 1)]
        while len(t.encode()) < 1500 or rng.random() < 0.7:
            t += rng.choice(pieces)[:rng.choice([5, 40, 400, 4000])]
        texts.append(t)
    model = fx.model_dir(name)
    hf = HfTokenizer.from_file(os.path.join(model, "tokenizer.json"))
    ours = fx.encode_batch_cli(model, texts)
    ref = [e.ids for e in hf.encode_batch(texts)]
    bad = [describe(i, texts[i], o["ids"], r) for i, (o, r) in enumerate(zip(ours, ref)) if o["ids"] != r]
    assert not bad, "%d of %d texts differ from HF tokenizers:\n%s" % (len(bad), len(texts), "\n".join(bad[:5]))


def test_every_code_point_in_several_contexts():
    # Every code point (minus surrogates and "\n") in contexts that exercise the regex classes
    # (\s, \p{L}, \p{N}, \p{M}: Qwen3.5's pattern has \p{M}) and NFC reordering/composition.
    # No tolerance: HF's NFC uses pre-Unicode-10 data (unicode-normalization-alignments), and our
    # normalizer reproduces that (src/text/hf_nfc_starters.cpp, derived from HF by
    # tools/make_hf_nfc_starters.py), so every code point must give identical ids.
    model = fx.model_dir("qwen3.5")
    hf = HfTokenizer.from_file(os.path.join(model, "tokenizer.json"))
    contexts = [
        lambda c: "a" + c + "b " + c + "1 x" + c + "\u0301",
        lambda c: "a\u0301" + c + "\u0323b",
        lambda c: c + c + ". \u05d1" + c + "\u05b0",
        lambda c: " " + c + "  " + c + "\t" + c + "\r" + c + "'s" + c,
    ]
    cps = [c for c in range(0x0, 0x30000) if not (0xD800 <= c <= 0xDFFF) and c != 0x0A]
    texts = [f(chr(c)) for c in cps for f in contexts]
    ours = fx.encode_batch_cli(model, texts)
    ref = [e.ids for e in hf.encode_batch(texts)]
    differing = sorted({cps[i // len(contexts)] for i, (o, r) in enumerate(zip(ours, ref)) if o["ids"] != r})
    assert not differing, "ids differ for %d code points: %s" % (len(differing), [hex(c) for c in differing[:40]])


# Marks added in Unicode 10+ (ccc 0 for HF's old data, nonzero for current Unicode); the test
# also checks that the generated table holds them.
NEW_MARKS = ["\u1dfa", "\u1ac1", "\u0898", "\U00010efd", "\U0001e4ec", "\u1df9"]
OLD_MARKS = ["\u0301", "\u0316", "\u0345", "\u0334", "\u0323", "\u05b0", "\u093c", "\u0e38", "\u0308"]
BASES = ["a", "e", "o", "u", "\u05d1", "\u0915", "\u1100", "\u1161", "\uac00", "\u00e9", "x", " "]


def test_new_marks_in_mixed_sequences_match_hf():
    from tokenizers import normalizers
    table = open(os.path.join(os.path.dirname(__file__), "..", "..", "src", "text", "hf_nfc_starters.cpp")).read()
    hf_nfc = normalizers.NFC()
    for m in NEW_MARKS:
        # Each one Python's Unicode knows is a mark HF's NFC leaves in place where current Unicode
        # reorders it (Python's unicodedata may predate U+10EFD / U+1E4EC, Unicode 15).
        assert not unicodedata.combining(m) or hf_nfc.normalize_str("a" + m + "\u0345") != unicodedata.normalize("NFC", "a" + m + "\u0345") or \
            hf_nfc.normalize_str("a" + m + "\u0334") != unicodedata.normalize("NFC", "a" + m + "\u0334") or \
            hf_nfc.normalize_str("a" + m + "\u0301") != unicodedata.normalize("NFC", "a" + m + "\u0301"), hex(ord(m))
        assert any(lo <= ord(m) <= hi for lo, hi in
                   ((int(x, 16), int(y, 16)) for x, y in __import__("re").findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", table))), hex(ord(m))
    import random
    rng = random.Random(20261130)
    texts = ["a\u1dfa\u0301", "a\u0301\u1dfa", "e\u0334\u1ac1\u0301", "o\u0898\u0308\u0323",
             "\u1100\u1df9\u1161", "\u0915\U00010efd\u093c", "u\U0001e4ec\u0345\u0316"]
    for _ in range(3000):
        n = rng.randint(1, 8)
        t = "".join(rng.choice(BASES) if rng.random() < 0.25 else rng.choice(NEW_MARKS + OLD_MARKS) for _ in range(n))
        texts.append(rng.choice(BASES) + t)
    assert sum(hf_nfc.normalize_str(t) != unicodedata.normalize("NFC", t) for t in texts) > 300, \
        "the sample must exercise the difference"
    for name in fx.MODELS:
        model = fx.model_dir(name)
        hf = HfTokenizer.from_file(os.path.join(model, "tokenizer.json"))
        ours = fx.encode_batch_cli(model, texts, decode=True)
        ref = [e.ids for e in hf.encode_batch(texts)]
        bad = [describe(i, texts[i], o["ids"], r) for i, (o, r) in enumerate(zip(ours, ref)) if o["ids"] != r]
        assert not bad, "%s: %d of %d differ:\n%s" % (name, len(bad), len(texts), "\n".join(bad[:5]))
        # ids of a byte-level BPE spell the normalized bytes, so the decoded text is HF's NFC.
        bad = [i for i, (t, o) in enumerate(zip(texts, ours)) if o["text"] != hf_nfc.normalize_str(t)]
        assert not bad, "%s: decoded text is not HF's NFC for %r" % (name, texts[bad[0]] if bad else None)


@pytest.mark.parametrize("name", fx.MODELS)
def test_cli_text_and_file_modes(name):
    model = fx.model_dir(name)
    hf = HfTokenizer.from_file(os.path.join(model, "tokenizer.json"))
    samples = [
        "Hello world",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "line one\r\nline two\r\n\r\n\ttabbed   spaced  \n",
        "cafe\u0301 \U0001f469\U0001f3fd\u200d\U0001f4bb \u0e01\u0e34 \u0915\u093f",
        "",
    ]
    for s in samples:
        r = fx.run_cli(["--model", model, "--text", s])
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"ids": hf.encode(s).ids}
        path = os.path.join(fx.work_dir(), "sample.txt")
        with open(path, "wb") as f:
            f.write(s.encode("utf-8"))
        r = fx.run_cli(["--model", model, "--file", path])
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"ids": hf.encode(s).ids}


@pytest.mark.parametrize("data,offset", [
    (b"ok\xff", 2),                        # byte that never occurs in UTF-8
    (b"abc\xe4\xb8", 3),                   # truncated 3-byte sequence at the end
    (b"\xc0\x80", 0),                      # overlong encoding of NUL
    (b"x\xed\xa0\x80y", 1),                # UTF-16 surrogate
    (b"12\xf4\x90\x80\x80", 2),            # above U+10FFFF
    (b"\xe4\xbd\xa0\x80", 3),              # stray continuation byte
])
def test_invalid_utf8_is_a_clear_error(data, offset):
    model = fx.model_dir("qwen3")
    path = os.path.join(fx.work_dir(), "invalid.bin")
    with open(path, "wb") as f:
        f.write(data)
    r = fx.run_cli(["--model", model, "--file", path])
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.decode()
    assert "not valid UTF-8" in err and "byte offset %d" % offset in err, err
    assert r.stdout == b""


def test_loading_errors_name_the_problem(tmp_path):
    r = fx.run_cli(["--model", str(tmp_path), "--text", "x"])
    assert r.returncode == 1 and b"no tokenizer.json" in r.stderr, r.stderr
    (tmp_path / "tokenizer.json").write_text("{\"model\": {\"type\": \"BPE\", ")
    r = fx.run_cli(["--model", str(tmp_path), "--text", "x"])
    assert r.returncode == 1 and b"not valid JSON" in r.stderr, r.stderr
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}))
    r = fx.run_cli(["--model", str(tmp_path), "--text", "x"])
    assert r.returncode == 1 and b"Unigram" in r.stderr, r.stderr


def test_added_token_flags_match_hf():
    # The Qwen tokenizers only use normalized=false, no-strip added tokens; this variant of the
    # Qwen3 tokenizer.json turns on every flag HF supports, and adds normalized and overlapping
    # tokens, so the matching rules are checked against the oracle, not only against our reading.
    base = fx.model_dir("qwen3")
    j = json.load(open(os.path.join(base, "tokenizer.json"), encoding="utf-8"))
    flags = {"<think>": {"lstrip": True}, "</think>": {"rstrip": True}, "<tool_call>": {"single_word": True},
             "</tool_call>": {"lstrip": True, "rstrip": True}, "<|im_end|>": {"rstrip": True}}
    for t in j["added_tokens"]:
        t.update(flags.get(t["content"], {}))
    extra = [("caf\u00e9", True, False), ("\u03a9", True, False), (" hello", False, False),
             ("<|im_start|>user", False, True), ("e\u0301t\u00e9", False, False), ("x_y", True, False)]
    next_id = max(t["id"] for t in j["added_tokens"]) + 1
    for i, (content, normalized, special) in enumerate(extra):
        j["added_tokens"].append({"id": next_id + i, "content": content, "single_word": content == "x_y",
                                  "lstrip": False, "rstrip": False, "normalized": normalized, "special": special})
    model = os.path.join(fx.work_dir(), "qwen3_flags")
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(model, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    hf = HfTokenizer.from_file(os.path.join(model, "tokenizer.json"))
    samples = [
        "a  <think>b", "a\t\n <think>  b", "<think>", " </think>  \n x", "x</think>", "a<tool_call>b",
        "a <tool_call> b", "<tool_call>", "_<tool_call>", "<tool_call>_", "\u4e2d<tool_call>", "x  </tool_call>  y",
        "cafe\u0301 caf\u00e9 CAFE\u0301", "\u2126 \u03a9 \u2126\u2126", "say hello  hello", "<|im_start|>user\nhi",
        "<|im_start|>assistant", "e\u0301t\u00e9 \u00e9t\u00e9", "x_y ax_y x_yb x_y_", "<|im_end|>\n\n<|im_start|>user",
        "<think>  </think>  <tool_call> </tool_call>",
    ]
    texts = samples + [s + " " + l for s in samples for l in LINES[:200:7]] + LINES[:3000]
    ours = fx.encode_batch_cli(model, texts, decode=True)
    ref = [e.ids for e in hf.encode_batch(texts)]
    bad = [describe(i, texts[i], o["ids"], r) for i, (o, r) in enumerate(zip(ours, ref)) if o["ids"] != r]
    assert not bad, "%d texts differ:\n%s" % (len(bad), "\n".join(bad[:5]))
    bad_decode = [i for i, (o, r) in enumerate(zip(ours, ref)) if o["text"] != hf.decode(r, skip_special_tokens=False)]
    assert not bad_decode, "decode differs for %r" % texts[bad_decode[0]][:80]
