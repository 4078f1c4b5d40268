"""llama-benchy (PyPI, a real third-party OpenAI benchmark client) against the server on the tiny
model, with tiny settings: its results must hold prompt-processing and generation throughputs.

llama-benchy lives in its own venv, $SPARKSERVE_BUILD_DIR/.venv-benchy, created on first use
from tests/python/benchy-requirements.txt (pinned, --no-deps): it needs a newer `tokenizers` than
the pinned oracle in .venv, so the two must not share a venv. The book it tokenizes is pre-seeded
in its cache (under a private HOME) with this repository's docs, so no download is needed."""
import csv
import glob
import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from conftest import BUILD_DIR, MODEL_NAME, ROOT, Server

REQUIREMENTS = os.path.join(ROOT, "tests", "python", "benchy-requirements.txt")
VENV = os.path.join(BUILD_DIR, ".venv-benchy")
BOOK_URL = "local://sparkserve-docs"


def benchy_venv() -> str:
    """The venv's llama-benchy, (re)created when the pinned requirements changed."""
    with open(REQUIREMENTS, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    stamp = os.path.join(VENV, ".requirements-sha256")
    exe = os.path.join(VENV, "bin", "llama-benchy")
    if os.path.exists(stamp) and open(stamp).read() == want and os.path.exists(exe):
        return exe
    # venv scripts hold absolute paths, so it is built in place; the stamp, written last, marks
    # it complete (an interrupted build is redone).
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True, timeout=120)
    subprocess.run([os.path.join(VENV, "bin", "python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--disable-pip-version-check", "-r", REQUIREMENTS], check=True, timeout=600)
    with open(stamp, "w") as f:
        f.write(want)
    return exe


@pytest.fixture(scope="module")
def benchy_server(tiny_model):
    s = Server(tiny_model)
    yield s
    s.stop()


def test_llama_benchy_reports_pp_and_tg(tiny_model, benchy_server, tmp_path):
    exe = benchy_venv()
    home = tmp_path / "home"
    cache = home / ".cache" / "llama-benchy"
    cache.mkdir(parents=True)
    text = "".join(open(p, encoding="utf-8").read() for p in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))))
    (cache / (hashlib.md5(BOOK_URL.encode()).hexdigest() + ".txt")).write_text(text, encoding="utf-8")
    out = tmp_path / "result.csv"
    cmd = [exe, "--base-url", benchy_server.url + "/v1", "--model", MODEL_NAME, "--tokenizer", tiny_model,
           "--book-url", BOOK_URL, "--pp", "64", "--tg", "8", "--concurrency", "1", "2", "--runs", "1",
           "--exact-tg", "--skip-coherence", "--format", "csv", "--save-result", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["HOME"] = str(home)
    env["HF_HUB_OFFLINE"] = "1"
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert out.exists(), p.stdout[-4000:]
    rows = list(csv.DictReader(open(out)))
    by_test = {}
    for r in rows:
        by_test.setdefault(r["test_name"].split()[0], []).append(float(r["t_s_mean"]))
    assert set(by_test) >= {"pp64", "tg8"}, rows
    for name in ("pp64", "tg8"):
        assert len(by_test[name]) == 2, rows  # concurrency 1 and 2
        assert all(v > 0 for v in by_test[name]), rows
    print("llama-benchy:", {k: [round(v, 1) for v in vs] for k, vs in by_test.items()})
