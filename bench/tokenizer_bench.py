#!/usr/bin/env python3
"""Tokenizer encode throughput, single-threaded: sparkserve vs Hugging Face `tokenizers`.

  python3 bench/tokenizer_bench.py --bin BUILD/bench/bench_tokenizer_bench --model DIR [--lines 20000]

Builds the deterministic corpus (tools/tokenizer_corpus.py, seed 1234), then times
  - sparkserve: bench_tokenizer_bench (encode each line, one thread),
  - HF: Tokenizer.encode(line) for each line, and encode_batch(lines) with RAYON_NUM_THREADS=1,
    TOKENIZERS_PARALLELISM=false (both single-threaded),
reporting MB/s (UTF-8 input bytes) and tokens/s for the first (cold cache) and best of N passes.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import tokenizer_corpus  # noqa: E402


HF_SNIPPET = r"""
import json, sys, time
from tokenizers import Tokenizer
model, corpus, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = [json.loads(l) for l in open(corpus, encoding="utf-8", newline="\n")]
nbytes = sum(len(l.encode("utf-8")) for l in lines)
tok = Tokenizer.from_file(model + "/tokenizer.json")
for mode in ("encode", "encode_batch"):
    tok = Tokenizer.from_file(model + "/tokenizer.json")  # fresh cache
    times, ntok = [], 0
    for r in range(repeats):
        t0 = time.perf_counter()
        if mode == "encode":
            ntok = sum(len(tok.encode(l).ids) for l in lines)
        else:
            ntok = sum(len(e.ids) for e in tok.encode_batch(lines))
        times.append(time.perf_counter() - t0)
    print(json.dumps({"impl": "hf-tokenizers " + mode, "lines": len(lines), "bytes": nbytes, "tokens": ntok,
                      "first_s": times[0], "best_s": min(times), "first_MBps": nbytes / times[0] / 1e6,
                      "best_MBps": nbytes / min(times) / 1e6, "best_tokens_per_s": ntok / min(times)}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--lines", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    corpus = os.path.join(os.path.dirname(os.path.abspath(a.bin)), "tokenizer_bench_corpus.jsonl")
    lines = tokenizer_corpus.make_corpus(a.lines, 1234)
    with open(corpus, "w", encoding="utf-8", newline="\n") as f:
        for l in lines:
            f.write(json.dumps(l) + "\n")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1", RAYON_RS_NUM_CPUS="1")
    results = [json.loads(subprocess.run([a.bin, a.model, corpus, str(a.repeats)], check=True,
                                         capture_output=True, text=True).stdout)]
    out = subprocess.run([a.python, "-c", HF_SNIPPET, a.model, corpus, str(a.repeats)], check=True,
                         capture_output=True, text=True, env=env).stdout
    results += [json.loads(l) for l in out.splitlines()]
    import tokenizers
    print("machine: %s, %s, %d cores; date %s; tokenizers %s; model %s" % (
        platform.processor() or platform.machine(), platform.platform(), os.cpu_count(),
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), tokenizers.__version__, a.model))
    print("%-28s %10s %10s %14s %10s" % ("impl", "first MB/s", "best MB/s", "best tokens/s", "tokens"))
    for r in results:
        print("%-28s %10.2f %10.2f %14.0f %10d" % (r["impl"], r["first_MBps"], r["best_MBps"],
                                                  r["best_tokens_per_s"], r["tokens"]))


if __name__ == "__main__":
    main()
