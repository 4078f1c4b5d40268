"""bench/prefix_cache_bench.py's streaming client against a fake HTTP server: TTFT is when the first
generated token's bytes arrived, never later. The fake server sends the role event (with ~80 KB of
prompt ids, as a 12K-token agent turn has) and, 10 ms later, the first token's event (servers that send
the role event ahead of the token do); the parse of the role event is made slow (200 ms): a client that
read on only after parsing the events before would stamp the token ~190 ms late."""
import json
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import prefix_cache_bench as bench  # noqa: E402


def serve_once(listener, delay_s):
    conn, _ = listener.accept()
    with conn:
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += conn.recv(65536)
        head, body = buf.split(b"\r\n\r\n", 1)
        length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
        while len(body) < length:
            body += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        time.sleep(delay_s)  # the "prefill"

        def chunk(obj):
            data = b"data: " + json.dumps(obj).encode() + b"\n\n"
            return b"%x\r\n" % len(data) + data + b"\r\n"

        role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                "prompt_token_ids": list(range(12000))}
        token = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "token_ids": [7]}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 12000, "completion_tokens": 1}}
        conn.sendall(chunk(role))
        time.sleep(0.01)
        conn.sendall(chunk(token))
        conn.sendall(chunk(usage) + b"%x\r\ndata: [DONE]\n\n\r\n0\r\n\r\n" % len(b"data: [DONE]\n\n"))
        time.sleep(0.2)


def test_first_token_is_stamped_on_arrival(monkeypatch):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    server = threading.Thread(target=serve_once, args=(listener, 0.02), daemon=True)
    server.start()
    real_loads = json.loads

    def slow_loads(s, *a, **k):
        v = real_loads(s, *a, **k)
        if isinstance(v, dict) and "prompt_token_ids" in v:
            time.sleep(0.2)
        return v

    monkeypatch.setattr(bench.json, "loads", slow_loads)
    ttft, usage, text = bench.stream(f"http://127.0.0.1:{port}", "/v1/chat/completions", {"model": "m"})
    server.join(5)
    listener.close()
    assert text == "Hi" and usage["completion_tokens"] == 1
    assert 0.03 <= ttft < 0.15, ttft  # prefill + the token's 10 ms, not the role event's 200 ms parse
