"""The HTTP layer under abuse, on loopback only, every loop bounded in count and time: slow and
idle connections, huge heads and bodies, bad framing, pipelining, half-closed clients, the
connection limit, memory per request, and work per request (tokenize, templates, min_tokens)."""
import json
import os
import select
import socket
import threading
import time

import httpx
import pytest

from conftest import MODEL_NAME, SANITIZED, Server, check_sanitizer_report

MSGS = [{"role": "user", "content": "hi"}]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class RssSampler:
    """Peak RSS of a process while a block runs (sampled every 10 ms). Its bounds are not judged
    under ASan (SANITIZED): shadow memory and the quarantine of freed blocks (256 MiB) dwarf them;
    the status codes and times still are."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()

    def __enter__(self):
        self.start = rss_mib(self.pid)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            time.sleep(0.01)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, rss_mib(self.pid))


def read_responses(sock, count, timeout=30.0):
    """Reads `count` final HTTP/1.1 responses (1xx interim ones skipped) with Content-Length or
    chunked bodies; returns [(status, headers, body)]."""
    sock.settimeout(timeout)
    buf = b""
    out = []
    deadline = time.time() + timeout

    def need(n):
        nonlocal buf
        while len(buf) < n:
            assert time.time() < deadline, "timed out reading responses"
            chunk = sock.recv(65536)
            if not chunk:
                raise EOFError(f"connection closed after {len(out)} responses")
            buf += chunk

    def line():
        nonlocal buf
        while b"\r\n" not in buf:
            need(len(buf) + 1)
        i = buf.index(b"\r\n")
        text, buf = buf[:i], buf[i + 2:]
        return text.decode("latin-1")

    while len(out) < count:
        status = int(line().split(" ")[1])
        headers = {}
        while True:
            h = line()
            if not h:
                break
            k, v = h.split(":", 1)
            headers[k.strip().lower()] = v.strip()
        if status < 200:
            continue
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(line().split(";")[0], 16)
                if size == 0:
                    line()
                    break
                need(size + 2)
                body, buf = body + buf[:size], buf[size + 2:]
        else:
            n = int(headers.get("content-length", "0"))
            need(n)
            body, buf = buf[:n], buf[n:]
        out.append((status, headers, body))
    return out


def send_until_answered(sock, chunks, timeout=30.0):
    """Sends `chunks` (an iterator of bytes) until the server answers or stops reading; returns
    the bytes sent. The client then reads the answer, as curl does for an early response."""
    sent = 0
    sock.setblocking(False)
    deadline = time.time() + timeout
    try:
        for data in chunks:
            view = memoryview(data)
            while view:
                assert time.time() < deadline, "the server neither read nor answered"
                r, w, _ = select.select([sock], [sock], [], 1.0)
                if r:
                    return sent
                if w:
                    try:
                        n = sock.send(view)
                    except (BrokenPipeError, ConnectionResetError):
                        return sent
                    view = view[n:]
                    sent += n
    finally:
        sock.setblocking(True)
    return sent


def connect(server):
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def request_bytes(method, path, body=b"", headers=()):
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\n"
    for h in headers:
        head += h + "\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def error_of(body):
    err = json.loads(body)["error"]
    assert isinstance(err["message"], str) and err["message"]
    return err


@pytest.fixture(scope="module")
def big_server(tiny_model):
    # Room for 500 slow clients plus the test's own, and 8 MiB bodies.
    s = Server(tiny_model, "--max-body-bytes", str(9 << 20), "--max-connections", "1024")
    yield s
    assert s.stop() == 0


def test_slowloris_does_not_starve_others(big_server):
    s = big_server
    socks = []
    try:
        for i in range(500):
            c = connect(s)
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n")
            socks.append(c)
        for _ in range(2):  # they keep trickling header lines
            for c in socks:
                c.sendall(b"X-Slow: 1\r\n")
            time.sleep(0.5)
        # Five probes, each on a new raw connection (no client library set-up inside the clock);
        # the median is judged, so one scheduling hiccup of a shared machine does not decide it.
        probes = []
        for _ in range(5):
            t = time.time()
            c = connect(s)
            c.sendall(request_bytes("GET", "/health"))
            (status, _, _), = read_responses(c, 1)
            probes.append(time.time() - t)
            c.close()
            assert status == 200
        health_s = sorted(probes)[2]
        chat = json.dumps({"model": MODEL_NAME, "messages": MSGS, "max_tokens": 4, "temperature": 0}).encode()
        t = time.time()
        c = connect(s)
        c.sendall(request_bytes("POST", "/v1/chat/completions", chat))
        (status, _, body), = read_responses(c, 1)
        chat_s = time.time() - t
        c.close()
        assert status == 200, body
        assert health_s < 0.1, probes
        assert chat_s < 1.0, chat_s
    finally:
        for c in socks:
            c.close()


def test_200k_headers_get_431(big_server):
    c = connect(big_server)
    with RssSampler(big_server.proc.pid) as rss:
        send_until_answered(c, iter([b"GET /health HTTP/1.1\r\nHost: t\r\n" + b"X-H: v\r\n" * 200000 + b"\r\n"]))
        (status, _, body), = read_responses(c, 1)
    assert status == 431
    assert "head" in error_of(body)["message"]
    assert SANITIZED or rss.peak - rss.start < 20, (rss.start, rss.peak)
    c.close()


def test_huge_header_line_gets_431(big_server):
    c = connect(big_server)
    send_until_answered(c, (b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * (1 << 20) for _ in range(8)))
    (status, _, _), = read_responses(c, 1)
    assert status == 431
    c.close()


def test_200mb_chunked_body_gets_413_without_being_read(big_server):
    s = big_server
    c = connect(s)
    chunk = b"%x\r\n" % (1 << 20) + b"a" * (1 << 20) + b"\r\n"
    head = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    with RssSampler(s.proc.pid) as rss:
        sent = send_until_answered(c, iter([head] + [chunk] * 200))
        (status, _, body), = read_responses(c, 1)
    assert status == 413, body
    assert str(9 << 20) in error_of(body)["message"]
    assert sent < 100 << 20, sent  # answered long before the 200 MB were sent
    assert SANITIZED or rss.peak - rss.start < 20, (rss.start, rss.peak)
    c.close()


@pytest.mark.parametrize("value,status", [
    ("abc", 400), ("-1", 400), ("1.5", 400), ("", 400), ("18446744073709551616", 400),
    ("9223372036854775808", 413), (str(1 << 40), 413), ("5, 6", 400),
])
def test_bad_content_length(big_server, value, status):
    c = connect(big_server)
    c.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: {value}\r\n\r\n{{}}".encode())
    (got, headers, body), = read_responses(c, 1)
    assert got == status, (value, body)
    assert headers.get("connection") == "close"
    error_of(body)
    c.close()


def test_content_length_with_chunked_is_400(big_server):
    c = connect(big_server)
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"2\r\n{}\r\n0\r\n\r\n")
    (status, _, _), = read_responses(c, 1)
    assert status == 400
    c.close()


def test_pipelined_requests_are_answered_in_order(big_server):
    c = connect(big_server)
    reqs = [request_bytes("GET", "/health")]
    words = ["one", "two two", "three three three", "four four four four", "five " * 5]
    for w in words:
        reqs.append(request_bytes("POST", "/tokenize", json.dumps({"model": MODEL_NAME, "prompt": w}).encode()))
    reqs.append(request_bytes("POST", "/v1/completions", json.dumps(
        {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 3, "temperature": 0}).encode()))
    c.sendall(b"".join(reqs))
    got = read_responses(c, 7)
    assert [g[0] for g in got] == [200] * 7
    counts = [json.loads(g[2])["count"] for g in got[1:6]]
    expected = [len(httpx.post(big_server.url + "/tokenize", json={"model": MODEL_NAME, "prompt": w}).json()["tokens"])
                for w in words]
    assert counts == expected and counts == sorted(counts) and len(set(counts)) == 5
    assert json.loads(got[6][2])["object"] == "text_completion"
    c.close()


def test_half_closed_client_gets_its_response(big_server):
    c = connect(big_server)
    c.sendall(request_bytes("POST", "/v1/completions", json.dumps(
        {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 8, "temperature": 0, "ignore_eos": True}).encode()))
    c.shutdown(socket.SHUT_WR)
    (status, _, body), = read_responses(c, 1)
    assert status == 200
    assert json.loads(body)["usage"]["completion_tokens"] == 8
    c.close()


def test_half_closed_streaming_client_gets_its_stream(big_server):
    c = connect(big_server)
    c.sendall(request_bytes("POST", "/v1/completions", json.dumps(
        {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
         "stream": True}).encode()))
    c.shutdown(socket.SHUT_WR)
    (status, _, body), = read_responses(c, 1)
    assert status == 200
    assert body.endswith(b"data: [DONE]\n\n")
    c.close()


def test_http10_stream_is_not_chunked(big_server):
    c = connect(big_server)
    body = json.dumps({"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4, "stream": True}).encode()
    c.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    data = b""
    c.settimeout(30)
    while True:
        chunk = c.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0]
    assert b"transfer-encoding" not in head.lower()
    assert payload.startswith(b"data: ") and payload.endswith(b"data: [DONE]\n\n")
    c.close()


def test_keep_alive_has_no_small_cap(big_server):
    with httpx.Client(base_url=big_server.url, timeout=10) as client:
        for _ in range(50):
            assert client.get("/health").status_code == 200
    c = connect(big_server)
    for _ in range(50):
        c.sendall(request_bytes("GET", "/health"))
        (status, headers, _), = read_responses(c, 1)
        assert status == 200 and headers.get("connection") != "close"
    c.close()


def test_max_connections_answers_503(tiny_model):
    s = Server(tiny_model, "--max-connections", "64")
    socks = []
    try:
        for _ in range(64):
            c = connect(s)
            c.sendall(request_bytes("GET", "/health"))
            (status, _, _), = read_responses(c, 1)
            assert status == 200
            socks.append(c)
        extra = connect(s)
        extra.sendall(request_bytes("GET", "/health"))
        (status, headers, body), = read_responses(extra, 1)
        assert status == 503
        assert headers.get("retry-after") == "1"
        assert "max-connections" in error_of(body)["message"]
        extra.close()
        socks.pop().close()
        deadline = time.time() + 5
        while True:  # the freed slot is usable again
            c = connect(s)
            c.sendall(request_bytes("GET", "/health"))
            (status, _, _), = read_responses(c, 1)
            c.close()
            if status == 200:
                break
            assert time.time() < deadline
            time.sleep(0.05)
    finally:
        for c in socks:
            c.close()
        assert s.stop() == 0


def test_16_concurrent_8mib_prompts_stay_under_1gib(big_server):
    s = big_server
    prompt = ("lorem ipsum dolor sit amet " * ((8 << 20) // 27 + 1))[: 8 << 20]
    body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}).encode()
    statuses = []

    def one():
        r = httpx.post(s.url + "/v1/completions", content=body, headers={"Content-Type": "application/json"}, timeout=120)
        statuses.append((r.status_code, r.json()["error"]["message"] if r.status_code != 200 else ""))

    with RssSampler(s.proc.pid) as rss:
        threads = [threading.Thread(target=one) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(statuses) == 16
    assert all(st == 400 and "512" in msg for st, msg in statuses), statuses[:3]
    assert SANITIZED or rss.peak < 1024, (rss.start, rss.peak)


# ---- work per request -------------------------------------------------------------------------

def timed_post(server, path, body, timeout=30):
    """The server's time for one request: the body is encoded before the clock starts."""
    data = json.dumps(body).encode()
    with httpx.Client(timeout=timeout) as c:
        c.get(server.url + "/health")  # connected before the clock starts, too
        t = time.time()
        r = c.post(server.url + path, content=data, headers={"Content-Type": "application/json"})
        return r, time.time() - t


def test_over_limit_tokenize_is_refused_fast(big_server):
    s = big_server
    r, dt = timed_post(s, "/tokenize", {"model": MODEL_NAME, "prompt": "word " * (1 << 20)})
    assert r.status_code == 400 and dt < 1.0, (r.status_code, dt)
    assert "before tokenizing" in error_of(r.content)["message"]
    # 200,000 messages (7 MB of JSON): refused once parsed, before they are copied or rendered. The
    # time is the JSON parse (~0.5 s here); the limit leaves room for a loaded machine.
    msgs = [{"role": "user", "content": "x"}] * 200000
    r, dt = timed_post(s, "/tokenize", {"model": MODEL_NAME, "messages": msgs})
    assert r.status_code == 400 and dt < 2.0, (r.status_code, dt)
    assert "max_model_len" in error_of(r.content)["message"]
    r, dt = timed_post(s, "/detokenize", {"model": MODEL_NAME, "tokens": [1] * 100000})
    assert r.status_code == 400 and dt < 1.0, (r.status_code, dt)
    ok = httpx.post(s.url + "/tokenize", json={"model": MODEL_NAME, "prompt": "word " * 100}, timeout=10)
    assert ok.status_code == 200 and 100 <= ok.json()["count"] <= 101


def test_min_tokens_beyond_the_context_is_400(big_server):
    r, dt = timed_post(big_server, "/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "min_tokens": 100000})
    assert r.status_code == 400 and dt < 1.0
    assert error_of(r.content)["param"] == "min_tokens"
    r, _ = timed_post(big_server, "/v1/chat/completions",
                      {"model": MODEL_NAME, "messages": MSGS, "min_tokens": 600})
    assert r.status_code == 400 and "min_tokens" in error_of(r.content)["message"]


def test_stop_lists_are_capped(big_server):
    r, _ = timed_post(big_server, "/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "stop": ["x%d" % i for i in range(65)]})
    assert r.status_code == 400 and error_of(r.content)["param"] == "stop"
    r, _ = timed_post(big_server, "/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "stop_token_ids": [1] * 1025})
    assert r.status_code == 400 and error_of(r.content)["param"] == "stop_token_ids"


def model_copy(tiny_model, tmp_path, template=None):
    """A model folder of links to the tiny model's files, with its own chat template."""
    d = tmp_path / "model"
    d.mkdir()
    for name in os.listdir(tiny_model):
        if name != "chat_template.jinja":
            os.symlink(os.path.abspath(os.path.join(tiny_model, name)), d / name)
    if template is not None:
        (d / "chat_template.jinja").write_text(template)
    return str(d)


RUNAWAY = [
    "{{ '' * 10**15 }}",
    "{{ ([] * 10**15) | length }}",
    "{{ 'ab' * 10**15 }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = ns.l + ['x' * 30000000] %}{% endfor %}",
]


def test_runaway_templates_fail_fast_and_name_the_template(tiny_model, tmp_path):
    # One server per template would be slow: the template reads a kwarg to pick its runaway.
    branches = "".join("{%% %s k == %d %%}%s" % ("if" if i == 0 else "elif", i, t) for i, t in enumerate(RUNAWAY))
    d = model_copy(tiny_model, tmp_path, branches + "{% else %}{{ messages[0].content }}{% endif %}")
    s = Server(d)
    # Under ASan + UBSan the evaluation-step budget itself takes ~1.7 s (2-core machine, 2026-12-01):
    # still a bounded, named refusal, which is what this judges there.
    limit_s = 4.0 if SANITIZED else 1.0
    try:
        for i in range(len(RUNAWAY)):
            body = {"model": MODEL_NAME, "messages": MSGS, "max_tokens": 2, "chat_template_kwargs": {"k": i}}
            with RssSampler(s.proc.pid) as rss:
                r, dt = timed_post(s, "/v1/chat/completions", body)
            if i < 2:  # empty results: nothing runs away, the prompt is just empty
                assert r.status_code in (200, 400), r.text
                continue
            assert r.status_code == 400 and dt < limit_s, (i, r.status_code, dt, r.text)
            msg = error_of(r.content)["message"]
            assert "chat_template.jinja" in msg and ("LimitError" in msg or "built more than" in msg), msg
            assert SANITIZED or rss.peak - rss.start < 400, (i, rss.start, rss.peak)
        assert httpx.get(s.url + "/health").status_code == 200
    finally:
        assert s.stop() == 0


def test_template_parse_error_is_reported_on_every_request(tiny_model, tmp_path):
    d = model_copy(tiny_model, tmp_path, "{% for m in messages %}{{ m.content }")
    s = Server(d)
    try:
        assert "chat template cannot be used" in s.output()
        for path, body in [("/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS}),
                           ("/tokenize", {"model": MODEL_NAME, "messages": MSGS}),
                           ("/v1/chat/completions", {"model": MODEL_NAME, "messages": MSGS})]:
            r = httpx.post(s.url + path, json=body, timeout=10)
            assert r.status_code == 500
            msg = error_of(r.content)["message"]
            assert "chat_template.jinja" in msg and "syntax error" in msg, msg
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}, timeout=10)
        assert r.status_code == 200
    finally:
        assert s.stop() == 0


# ---- overload -----------------------------------------------------------------------------------

def test_waiting_queue_limit_gives_503_and_health_stays_fast(tiny_model):
    s = Server(tiny_model, "--max-num-seqs", "1", "--max-waiting-requests", "2")
    try:
        results = []

        def one():
            r = httpx.post(s.url + "/v1/completions", timeout=60, json={
                "model": MODEL_NAME, "prompt": "hi", "max_tokens": 64, "ignore_eos": True, "temperature": 0})
            results.append((r.status_code, r.headers.get("retry-after")))

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        # /health from one kept-alive connection, while the queue is full and the engine busy.
        times = []
        with httpx.Client(timeout=5) as probe:
            for _ in range(20):
                t0 = time.time()
                assert probe.get(s.url + "/health").status_code == 200
                times.append(time.time() - t0)
                time.sleep(0.05)
        worst = sorted(times)[-2]  # the second worst: one scheduling hiccup of this test process aside
        for t in threads:
            t.join()
        codes = sorted(c for c, _ in results)
        assert codes.count(200) >= 2 and codes.count(503) >= 1, codes  # 1 running + 2 waiting at most
        assert all(ra == "1" for c, ra in results if c == 503)
        assert worst < 0.1, times
    finally:
        assert s.stop() == 0


# ---- model and checkpoint faults ----------------------------------------------------------------

def test_nested_safetensors_header_is_refused_fast(tmp_path, tiny_model):
    import resource
    import subprocess
    from conftest import BIN
    d = tmp_path / "nested"
    d.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        os.symlink(os.path.abspath(os.path.join(tiny_model, name)), d / name)
    n = 99_000_000
    with open(d / "model.safetensors", "wb") as f:
        f.write(n.to_bytes(8, "little"))
        block = b"[" * (1 << 20)
        for _ in range(n // len(block)):
            f.write(block)
        f.write(b"[" * (n % len(block)))
    # 100 MB of address space in all: holding the 99 MB header (or a JSON tree of it) would fail
    # with an allocation error instead of the clean message (inspecting the tiny model fits in 64 MB).
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (100 << 20, 100 << 20))

    # ASan reserves terabytes of address space for its shadow memory: no RLIMIT_AS under it.
    t = time.time()
    p = subprocess.run([BIN, "inspect", str(d)], capture_output=True, preexec_fn=None if SANITIZED else limit,
                       timeout=30)
    dt = time.time() - t
    err = p.stderr.decode()
    check_sanitizer_report(err, "sparkserve inspect")
    assert p.returncode == 1 and "nested deeper" in err, err
    assert "model.safetensors" in err
    assert dt < 1.0, dt


def nan_copy(tiny_model, tmp_path):
    """The tiny model with one BF16/F32 weight filled with NaN (a copy of its safetensors file)."""
    d = tmp_path / "nan"
    d.mkdir()
    st = [n for n in os.listdir(tiny_model) if n.endswith(".safetensors") and "mtp" not in n]
    for name in os.listdir(tiny_model):
        if name not in st:
            os.symlink(os.path.abspath(os.path.join(tiny_model, name)), d / name)
    src = os.path.join(tiny_model, st[0])
    data = bytearray(open(src, "rb").read())
    hlen = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + hlen])
    name = next(k for k, v in header.items()
                if k != "__metadata__" and "norm" in k and "visual" not in k and v["dtype"] in ("BF16", "F32"))
    info = header[name]
    b, e = info["data_offsets"]
    pattern = b"\xc0\x7f" if info["dtype"] == "BF16" else b"\x00\x00\xc0\x7f"
    data[8 + hlen + b: 8 + hlen + e] = pattern * ((e - b) // len(pattern))
    (d / st[0]).write_bytes(bytes(data))
    return str(d), name


def test_nan_weights_warn_at_load_and_fail_requests(tiny_model, tmp_path):
    d, tensor = nan_copy(tiny_model, tmp_path)
    s = Server(d)
    try:
        out = s.output()
        assert f"checkpoint tensor '{tensor}' holds" in out and "non-finite" in out, out
        r = httpx.post(s.url + "/v1/completions", timeout=30,
                       json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4})
        assert r.status_code == 500, r.text
        assert "non-finite logit" in error_of(r.content)["message"]
        with httpx.stream("POST", s.url + "/v1/completions", timeout=30,
                          json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4, "stream": True}) as st:
            text = st.read().decode()
        assert '"error"' in text and "non-finite logit" in text and text.endswith("data: [DONE]\n\n")
        assert s.metric("sparkserve:nonfinite_logits_total") == 2
    finally:
        assert s.stop() == 0


# ---- shutdown -----------------------------------------------------------------------------------

def test_sigterm_drain_errors_what_cannot_finish(tiny_model):
    s = Server(tiny_model, "--shutdown-timeout", "0.5")
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", httpx.post(s.url + "/v1/completions", timeout=60, json={
        "model": MODEL_NAME, "prompt": "hi", "max_tokens": 500, "ignore_eos": True, "temperature": 0})))
    t.start()
    deadline = time.time() + 30
    while s.metric("sparkserve:num_requests_running") == 0:
        assert time.time() < deadline
        time.sleep(0.02)
    assert s.stop(timeout=20) == 0
    t.join()
    r = result["r"]
    assert r.status_code == 503, r.text  # never a 200 with partial text
    assert "shut down" in error_of(r.content)["message"]
