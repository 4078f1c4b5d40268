"""Fixtures for the server tests: the tiny servable model (tests/fixtures/serve-tiny) and
`sparkserve serve` processes on free ports, stopped with SIGTERM (and killed if that hangs)."""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.environ.get("SPARKSERVE_BIN", os.path.join(ROOT, "build", "sparkserve"))
# The same server on a scripted fake model runner (tests/serve_scripted): every request writes a
# given text.
SCRIPTED_BIN = os.environ.get("SPARKSERVE_SCRIPTED_BIN", os.path.join(ROOT, "build", "tests", "sparkserve_scripted"))
BUILD_DIR = os.environ.get("SPARKSERVE_BUILD_DIR", os.path.join(ROOT, "build"))
MODEL_NAME = "tiny"
# Set by the ctest entries of a -DSPARKSERVE_SANITIZE=ON build: the binaries run under ASan + UBSan,
# so bounds on RSS and address space (shadow memory, quarantine) say nothing about the server.
SANITIZED = os.environ.get("SPARKSERVE_SANITIZED") == "1"
# What ASan, LeakSanitizer and UBSan write to stderr when they find something.
SANITIZER_REPORT = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|:\d+:\d+: runtime error: ")


def check_sanitizer_report(output: str, what: str):
    """Fails when a sanitizer reported an error in a process's output (a report does not always
    change what the process answers, e.g. a leak found at exit)."""
    m = SANITIZER_REPORT.search(output)
    if m:
        start = output.rfind("\n", 0, max(0, m.start() - 200)) + 1
        raise AssertionError(f"sanitizer report from {what}:\n{output[start:start + 6000]}")


# The scripted output of the parser tests: reasoning, then one qwen3_coder tool call.
SCRIPTED_TOOL_TEXT = (
    "The user wants the weather, so I call the tool.\n</think>\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_model() -> str:
    out = os.path.join(BUILD_DIR, "serve-tiny")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests/fixtures/serve-tiny/make_model.py"), BIN, out],
                   check=True, timeout=300)
    return out


class Server:
    """`sparkserve serve` (or command, e.g. the scripted server): with --model (or, positional=True,
    as `serve MODEL`), served as MODEL_NAME unless extra has --served-model-name, with small test
    defaults for what extra does not set (defaults=False: none)."""

    def __init__(self, model: str, *extra: str, env=None, command=(BIN, "serve"), positional=False, defaults=True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        small = {"--threads": "2", "--max-model-len": "512", "--max-body-bytes": "65536", "--kv-cache-mb": "32"}
        cmd = [*command] + ([model] if positional else ["--model", model]) + ["--port", str(self.port)]
        if "--served-model-name" not in extra:
            cmd += ["--served-model-name", MODEL_NAME]
        for k, v in small.items():
            if defaults and k not in extra:
                cmd += [k, v]
        cmd += list(extra)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("server did not become healthy in 120 s:\n" + self.output())

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def metric(self, name: str) -> float:
        """Sum of the samples of one metric (e.g. sparkserve:num_requests_running)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        total, found = 0.0, False
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            sample, value = line.rsplit(" ", 1)
            if sample.split("{")[0] == name:
                total += float(value)
                found = True
        assert found, f"metric {name} missing from /metrics:\n{text}"
        return total

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("server ignored SIGTERM for %s s" % timeout)
        check_sanitizer_report(self.output(), "the server")
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(tiny_model):
    s = Server(tiny_model)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def scripted_server(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("scripted") / "output.txt"
    path.write_text(SCRIPTED_TOOL_TEXT)
    s = Server(tiny_model, "--script", str(path), command=(SCRIPTED_BIN, "serve-scripted"))
    yield s
    s.stop()


@pytest.fixture
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def collect_chat_stream(stream):
    """Assembles a streamed chat completion: (reasoning, content, {index: {id, name, arguments}},
    finish_reason)."""
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in stream:
        for ch in chunk.choices:
            d = ch.delta
            reasoning += getattr(d, "reasoning_content", None) or ""
            content += d.content or ""
            for tc in d.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:
                    entry["id"] = tc.id
                if tc.function and tc.function.name:
                    entry["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    entry["arguments"] += tc.function.arguments
            finish = ch.finish_reason or finish
    return reasoning, content, calls, finish
