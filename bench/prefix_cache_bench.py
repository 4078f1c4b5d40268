#!/usr/bin/env python3
"""Prefix-cache benchmarks for `sparkserve serve` (never run as timed assertions in the tests).

  repeat   The same N-token prompt twice (several different prompts): TTFT of the second request
           vs the first. Done-when for the CPU tiny model: second <= 25% of first at 2K tokens.
             bench/prefix_cache_bench.py repeat --bin build/sparkserve --model build/serve-tiny \\
                 --prompt-tokens 2048 --pairs 5
  agent    A coding-agent session: a long system prompt with tools, then T turns that each add
           about K new tokens (a tool result and a user line) and resend the whole conversation.
           Reports every turn's TTFT and cached tokens, and median TTFT of turns 2..T / turn 1.
           Done-when on the H200 (synthetic Qwen3.5-35B-A3B, CUDA): <= 10% with an 8K system
           prompt, 10 turns of ~300 new tokens.
             bench/prefix_cache_bench.py agent --bin build/sparkserve --model /tmp/m35 \\
                 --serve-args "--device cuda" --system-tokens 8192 --turns 10 --turn-tokens 300
  bodies   The agent session's request bodies, one JSON line per turn, without a server (each
           assistant reply is --max-tokens random words): the input of bench_serve_prefill_stages,
           which times the server's work before and after generation stage by stage.
             bench/prefix_cache_bench.py bodies --out /tmp/agent-bodies.jsonl

With --url URL (and no --bin) the benchmark runs against a server already running. Prints a table
and one JSON line (--json-out FILE writes it too). Standard library + httpx only (the timed requests
go through RawClient, a plain socket)."""
import argparse
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx

WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word "
         "business issue side kind head house service friend father power hour game line end member law car "
         "city name team minute idea kid body information back parent face level office door health person "
         "art war history party result change morning reason research girl guy moment air teacher force").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Served:
    """A `serve` process on a free port (or an existing --url)."""

    def __init__(self, a, extra=()):
        self.proc = None
        if a.url:
            self.url = a.url.rstrip("/")
            if self.url.endswith("/v1"):
                self.url = self.url[:-3]
            return
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [a.bin, "serve", "--model", a.model, "--port", str(port), "--served-model-name", "bench",
               *a.serve_args.split(), *extra]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + a.start_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited with {self.proc.returncode}: {' '.join(cmd)}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit("server did not start")

    def model(self):
        return httpx.get(self.url + "/v1/models", timeout=30).json()["data"][0]["id"]

    def metric(self, name):
        total = 0.0
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


class RawClient:
    """The streamed requests' HTTP/1.1 client: one keep-alive socket (as an agent keeps one
    connection), the request built before the clock starts and sent with one sendall, the chunked SSE
    body read as it arrives. Each event is stamped when the recv() that completed it returns;
    stream() reads the whole response before it parses any event. TTFT is the time from the
    request's first byte sent to the arrival of the first generated token's bytes, and the client's
    own JSON parsing and line handling (httpx's iter_lines + json.loads of the ~80 KB first event of
    a 12K-token turn with return_token_ids: ~2.5 ms on a 2-core Xeon) is not in it."""

    def __init__(self, url):
        hostport = url.split("://", 1)[1].split("/", 1)[0]
        host, _, port = hostport.rpartition(":")
        self.addr, self.hostport, self.sock = (host.strip("[]"), int(port)), hostport, None

    def _recv(self, sock):
        d = sock.recv(1 << 20)
        self.at = time.perf_counter()  # when the bytes read so far had all arrived
        if not d:
            raise SystemExit("the server closed the connection in the middle of a response")
        return d

    def post_stream(self, path, data):
        """Yields (seconds since the first byte was sent, event text) for every SSE event."""
        if self.sock is None:
            self.sock = socket.create_connection(self.addr)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self.sock
        request = (f"POST {path} HTTP/1.1\r\nHost: {self.hostport}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(data)}\r\n\r\n").encode() + data
        t0 = time.perf_counter()
        sock.sendall(request)
        buf = b""
        while True:  # the head (skipping interim 1xx responses)
            while b"\r\n\r\n" not in buf:
                buf += self._recv(sock)
            raw, buf = buf.split(b"\r\n\r\n", 1)
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            if status >= 200:
                break
        headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
        if headers.get("connection", "").lower() == "close":
            self.sock = None  # this response is the connection's last: reconnect next time
        if status != 200 or headers.get("transfer-encoding", "").lower() != "chunked":
            raise SystemExit(f"HTTP {status}: {buf[:300]!r}")
        body = b""
        while True:  # chunks: "SIZE\r\nDATA\r\n", ending with "0\r\n\r\n"
            while b"\r\n" not in buf:
                buf += self._recv(sock)
            size_line, rest = buf.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(rest) < size + 2:
                rest += self._recv(sock)
            body += rest[:size]
            buf = rest[size + 2:]
            while b"\n\n" in body:
                event, body = body.split(b"\n\n", 1)
                yield self.at - t0, event.decode()
            if size == 0:
                return


_CLIENTS = {}


def stream(url, path, body, token_ids=True):
    """One streamed request: (ttft seconds to the first generated token, usage dict). With token_ids
    the first generated token shows even when it has no text, but the first chunk then carries the
    whole prompt's ids too (vLLM's return_token_ids): ~80 KB of JSON for a 12K-token agent turn,
    ~0.35 ms to write on the server and more to read here (on the clock: the bytes must arrive)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": token_ids}
    # Encoded before the clock starts: the client's json.dumps of a ~70 KB agent turn is no server time.
    data = json.dumps(body).encode()
    c = _CLIENTS.setdefault(url, RawClient(url))
    ttft, usage, text = None, None, ""
    # Every event is read and stamped before any is parsed: parsing the ~80 KB first event while the
    # first token's event arrives would stamp that one late (a server may send them apart).
    for at, event in list(c.post_stream(path, data)):
        for line in event.split("\n"):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if "error" in j:
                raise SystemExit(f"stream error: {j['error']}")
            for ch in j.get("choices", []):
                if ttft is None and (ch.get("token_ids") or ch.get("text") or (ch.get("delta") or {}).get("content")
                                     or (ch.get("delta") or {}).get("reasoning_content")):
                    ttft = at
                d = ch.get("delta") or {}
                text += d.get("content") or ""
            usage = j.get("usage") or usage
    return ttft, usage, text


def cached(usage):
    return ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")


def bench_repeat(a):
    srv = Served(a)
    try:
        model = srv.model()
        rng = random.Random(a.seed)
        rows = []
        for i in range(a.pairs):
            prompt = [rng.randrange(1000, 100000) for _ in range(a.prompt_tokens)]
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            t1, u1, _ = stream(srv.url, "/v1/completions", body)
            t2, u2, _ = stream(srv.url, "/v1/completions", body)
            rows.append({"pair": i, "ttft_first_s": t1, "ttft_second_s": t2, "ratio": t2 / t1,
                         "prompt_tokens": u1["prompt_tokens"], "cached_second": cached(u2)})
            print(f"pair {i}: first {t1 * 1e3:8.1f} ms  second {t2 * 1e3:8.1f} ms  ratio {t2 / t1:.3f}  "
                  f"cached {cached(u2)}/{u1['prompt_tokens']}", flush=True)
        out = {"bench": "repeat", "prompt_tokens": a.prompt_tokens, "pairs": rows,
               "median_ratio": statistics.median(r["ratio"] for r in rows),
               "median_first_s": statistics.median(r["ttft_first_s"] for r in rows),
               "median_second_s": statistics.median(r["ttft_second_s"] for r in rows)}
        print(f"median TTFT first {out['median_first_s'] * 1e3:.1f} ms, second {out['median_second_s'] * 1e3:.1f} ms, "
              f"ratio {out['median_ratio']:.3f}")
        return out
    finally:
        srv.stop()


TOOLS = [{"type": "function", "function": {
    "name": name, "description": desc,
    "parameters": {"type": "object", "properties": {p: {"type": "string", "description": f"the {p}"} for p in params},
                   "required": list(params[:1])}}}
    for name, desc, params in [
        ("read_file", "Read a file of the repository", ["path", "start_line", "end_line"]),
        ("write_file", "Write a file of the repository", ["path", "content"]),
        ("run_command", "Run a shell command in the sandbox", ["command", "timeout"]),
        ("search_code", "Search the repository for a regular expression", ["pattern", "glob"]),
        ("list_directory", "List a directory", ["path"])]]


def agent_start(a, rng):
    # ~1 token per word (measured by the server: usage.prompt_tokens of turn 1 is printed).
    return [{"role": "system", "content": "You are a coding agent. Rules and repository notes: " +
             words(rng, a.system_tokens)},
            {"role": "user", "content": "Fix the failing test. " + words(rng, a.turn_tokens // 2)}]


def agent_body(a, model, messages):
    return {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": a.max_tokens,
            "temperature": 0, "chat_template_kwargs": {"enable_thinking": a.thinking}}


def agent_next(a, rng, messages, text):
    # The agent's reply goes back as it came (a tool call would be a tool message; random
    # weights write text), then a tool result and a user line of about turn_tokens new tokens.
    return messages + [{"role": "assistant", "content": text or "(no text)"},
                       {"role": "user", "content": "Tool output:\n" + words(rng, a.turn_tokens - 20) + "\nWhat next?"}]


def agent_bodies(a):
    """The bodies bench_agent sends (streamed, as stream() sends them), replies made up."""
    rng, replies = random.Random(a.seed), random.Random(a.seed + 1)
    messages = agent_start(a, rng)
    with open(a.out, "w") as f:
        for _ in range(a.turns):
            body = agent_body(a, "bench", messages)
            body = {**body, "stream": True, "stream_options": {"include_usage": True},
                    "return_token_ids": not a.no_token_ids}
            f.write(json.dumps(body) + "\n")
            messages = agent_next(a, rng, messages, words(replies, a.max_tokens))
    print(f"wrote {a.turns} request bodies to {a.out}")
    return {"bench": "bodies", "out": a.out, "turns": a.turns}


def bench_agent(a):
    srv = Served(a)
    try:
        model = srv.model()
        rng = random.Random(a.seed)
        messages = agent_start(a, rng)
        hits0 = srv.metric("sparkserve:prefix_cache_hits_total")
        rows = []
        for turn in range(1, a.turns + 1):
            body = agent_body(a, model, messages)
            ttft, usage, text = stream(srv.url, "/v1/chat/completions", body, token_ids=not a.no_token_ids)
            rows.append({"turn": turn, "ttft_s": ttft, "prompt_tokens": usage["prompt_tokens"],
                         "cached_tokens": cached(usage), "completion_tokens": usage["completion_tokens"]})
            print(f"turn {turn:2d}: TTFT {ttft * 1e3:9.1f} ms  prompt {usage['prompt_tokens']:6d}  "
                  f"cached {cached(usage)}", flush=True)
            messages = agent_next(a, rng, messages, text)
        later = [r["ttft_s"] for r in rows[1:]]
        out = {"bench": "agent", "turns": rows, "turn1_ttft_s": rows[0]["ttft_s"],
               "median_later_ttft_s": statistics.median(later) if later else None,
               "prefix_cache_hits_tokens": srv.metric("sparkserve:prefix_cache_hits_total") - hits0}
        if later:
            out["ratio"] = out["median_later_ttft_s"] / out["turn1_ttft_s"]
            print(f"turn 1 TTFT {out['turn1_ttft_s'] * 1e3:.1f} ms; median of turns 2..{a.turns} "
                  f"{out['median_later_ttft_s'] * 1e3:.1f} ms = {out['ratio'] * 100:.1f}% of turn 1")
        return out
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", choices=["repeat", "agent", "bodies"])
    ap.add_argument("--bin")
    ap.add_argument("--model")
    ap.add_argument("--url")
    ap.add_argument("--serve-args", default="", help="extra serve options, e.g. \"--device cuda\"")
    ap.add_argument("--start-timeout", type=float, default=1800)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--system-tokens", type=int, default=8192)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--turn-tokens", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--thinking", action="store_true", help="leave the chat template's thinking on")
    ap.add_argument("--no-token-ids", action="store_true",
                    help="agent, bodies: do not ask for return_token_ids, as an agent would not (the first token "
                         "is then the first chunk with text; see stream())")
    ap.add_argument("--json-out")
    ap.add_argument("--out", help="bodies: the JSON-lines file to write")
    a = ap.parse_args()
    if a.which == "bodies":
        if not a.out:
            ap.error("bodies needs --out")
        out = agent_bodies(a)
    else:
        if not a.url and not (a.bin and a.model):
            ap.error("give --url, or --bin and --model")
        out = bench_repeat(a) if a.which == "repeat" else bench_agent(a)
    line = json.dumps(out)
    print(line)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
