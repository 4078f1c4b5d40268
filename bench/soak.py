#!/usr/bin/env python3
"""Soak test for `sparkserve serve` (not CI): C concurrent streaming clients for D seconds, a
fraction of them disconnecting at a random point. Every completed response must equal (greedy)
the reference the same prompt gave when run alone; the server's RSS is sampled to show growth.

  bench/soak.py --bin build/sparkserve --model build/serve-tiny --clients 64 --duration 600
  bench/soak.py --url http://127.0.0.1:8000 --pid PID ...      (a server already running)

--sessions: each client runs multi-turn conversations instead (one of three shared system
prompts, 2-6 turns, the reply and a new user line appended each turn), so requests share
prefixes and resume from the prefix cache; a disconnected turn is retried. Every completed turn
is compared with the same messages sent to a second server started with --no-prefix-caching
(--ref-url for one already running), and at the end the server must be idle again: 0 running and
waiting, KV-cache and GDN-slot usage 0 (cached blocks and snapshots are not usage).

Prints one JSON object: requests completed / disconnected / failed / mismatched, tokens, rates,
RSS at start (after warm-up), max and end, and the server's /metrics counters at the end."""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

PROMPTS = ["Count with me: one, two,", "Write a haiku about rust.", "What is 2+2?",
           "List three fruits.", "Explain TCP in one line.", "Say hello in French."]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def stream_once(url, model, prompt, max_tokens, disconnect_after=None):
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "return_token_ids": True}
    ids, chunks, done, finish = [], 0, False, None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            j = json.loads(data)
            if "error" in j:
                raise RuntimeError(f"stream error: {j['error']}")
            for ch in j.get("choices", []):
                ids += ch.get("token_ids") or []
                finish = ch.get("finish_reason") or finish
            chunks += 1
            if disconnect_after is not None and chunks >= disconnect_after:
                return None  # leaving the with-block closes the connection mid-stream
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return ids, finish


def start_server(bin_path, model, name, extra=()):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([bin_path, "serve", "--model", model, "--port", str(port),
                             "--served-model-name", name, *extra], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    return proc, url


SYSTEMS = ["You are a careful coding assistant. Repository notes: " + " ".join(f"module{i} handles part {i}."
                                                                                  for i in range(60)),
           "You answer questions about cooking. Pantry: " + ", ".join(f"item {i}" for i in range(80)) + ".",
           "You are terse."]
USER_LINES = ["What next?", "Explain the last step.", "Now write a test for it.", "Why?", "Shorter please.",
              "List the files involved.", "Continue.", "What about errors?"]


def text_of(ids_and_finish, tokenizer_url, model):
    ids, _ = ids_and_finish
    r = httpx.post(tokenizer_url + "/detokenize", json={"model": model, "tokens": ids}, timeout=60)
    return r.json()["prompt"]


def session_client(i, a, url, ref_url, model, stop_at, stats, errors, lock):
    rng = random.Random(a.seed * 1000 + i)
    while time.time() < stop_at:
        messages = [{"role": "system", "content": rng.choice(SYSTEMS)},
                    {"role": "user", "content": rng.choice(USER_LINES) + f" (session {i}-{rng.random():.6f})"}]
        for _turn in range(rng.randint(2, 6)):
            if time.time() >= stop_at:
                return
            cut = rng.randint(1, a.max_tokens) if rng.random() < a.disconnect_prob else None
            try:
                got = stream_once(url, model, messages, a.max_tokens, cut)
                if got is None:
                    with lock:
                        stats["disconnected"] += 1
                    got = stream_once(url, model, messages, a.max_tokens)  # the client retries
                ref = stream_once(ref_url, model, messages, a.max_tokens)
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    stats["failed"] += 1
                    errors.append(str(e)[:200])
                break
            with lock:
                if got != ref:
                    stats["mismatched"] += 1
                    errors.append(f"mismatch in session {i}: {got} vs {ref}")
                else:
                    stats["completed"] += 1
                    stats["tokens"] += len(got[0])
            messages = messages + [{"role": "assistant", "content": text_of(got, url, model)},
                                   {"role": "user", "content": rng.choice(USER_LINES)}]


def metrics_of(url):
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("sparkserve:") and "_bucket" not in line:
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin")
    ap.add_argument("--model")
    ap.add_argument("--url")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--served-model-name", default="soak")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--disconnect-prob", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sessions", action="store_true", help="multi-turn sessions checked against a no-cache server")
    ap.add_argument("--ref-url", help="--sessions: a --no-prefix-caching server already running")
    ap.add_argument("--serve-args", default="", help="extra options for the server under test, e.g. a small cache")
    a = ap.parse_args()

    proc = None
    if a.url:
        url, pid, model = a.url, a.pid, a.served_model_name
    else:
        proc, url = start_server(a.bin, a.model, a.served_model_name, a.serve_args.split())
        pid, model = proc.pid, a.served_model_name
    ref_proc, ref_url = None, a.ref_url
    if a.sessions and not ref_url:
        ref_proc, ref_url = start_server(a.bin, a.model, a.served_model_name, ["--no-prefix-caching"])

    refs = {} if a.sessions else {p: stream_once(url, model, p, a.max_tokens) for p in PROMPTS}
    rss_start = rss_kib(pid) if pid else 0
    stats = {"completed": 0, "disconnected": 0, "failed": 0, "mismatched": 0, "tokens": 0}
    errors = []
    lock = threading.Lock()
    stop_at = time.time() + a.duration

    def client(i):
        rng = random.Random(a.seed * 1000 + i)
        while time.time() < stop_at:
            p = rng.choice(PROMPTS)
            cut = rng.randint(1, a.max_tokens) if rng.random() < a.disconnect_prob else None
            try:
                got = stream_once(url, model, p, a.max_tokens, cut)
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    stats["failed"] += 1
                    errors.append(str(e)[:200])
                continue
            with lock:
                if got is None:
                    stats["disconnected"] += 1
                elif got != refs[p]:
                    stats["mismatched"] += 1
                else:
                    stats["completed"] += 1
                    stats["tokens"] += len(got[0])

    rss_max = rss_start
    if a.sessions:
        threads = [threading.Thread(target=session_client,
                                    args=(i, a, url, ref_url, model, stop_at, stats, errors, lock))
                   for i in range(a.clients)]
    else:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        if pid:
            rss_max = max(rss_max, rss_kib(pid))
    elapsed = time.time() - t0
    time.sleep(1)
    metrics = metrics_of(url)
    # Idle again: nothing running or waiting, no KV block or GDN slot held by a request (blocks and
    # state snapshots kept by the prefix cache are not usage).
    idle = all(v == 0 for k, v in metrics.items()
               if k.split("{")[0] in ("sparkserve:num_requests_running", "sparkserve:num_requests_waiting",
                                      "sparkserve:kv_cache_usage_perc", "sparkserve:gdn_state_slots_usage_perc"))
    out = {**stats, "clients": a.clients, "seconds": round(elapsed, 1),
           "requests_per_s": round((stats["completed"] + stats["disconnected"]) / elapsed, 2),
           "completion_tokens_per_s": round(stats["tokens"] / elapsed, 1),
           "rss_kib_start": rss_start, "rss_kib_max": rss_max, "rss_kib_end": rss_kib(pid) if pid else 0,
           "idle_at_end": idle, "errors": errors[:5], "metrics": metrics}
    print(json.dumps(out, indent=1))
    for p in (proc, ref_proc):
        if p:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    ok = stats["failed"] == 0 and stats["mismatched"] == 0 and idle
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
