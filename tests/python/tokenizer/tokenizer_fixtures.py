"""Shared helpers for the tokenizer tests: unpack the committed tokenizer fixtures into the build
folder, run `sparkserve tokenize`, and build the deterministic corpus (tools/tokenizer_corpus.py)."""
import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "tokenizers")
MODELS = ["qwen3", "qwen3.5"]
CORPUS_SEED = 1234
CORPUS_LINES = 20000
CORPUS_CHUNKS = 1000


def sparkserve_bin():
    b = os.environ.get("SPARKSERVE_BIN")
    if not b:
        raise RuntimeError("SPARKSERVE_BIN is not set (run through ctest)")
    return b


def work_dir():
    base = os.environ.get("SPARKSERVE_BUILD_DIR") or tempfile.gettempdir()
    d = os.path.join(base, "tokenizer_test_work")
    os.makedirs(d, exist_ok=True)
    return d


def model_dir(name):
    """Folder with tokenizer.json (gunzipped from the fixture) and tokenizer_config.json."""
    src = os.path.join(FIXTURES, name)
    dst = os.path.join(work_dir(), name)
    os.makedirs(dst, exist_ok=True)
    gz = os.path.join(src, "tokenizer.json.gz")
    out = os.path.join(dst, "tokenizer.json")
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(gz):
        with gzip.open(gz, "rb") as f, open(out + ".tmp", "wb") as g:
            shutil.copyfileobj(f, g)
        os.replace(out + ".tmp", out)
    shutil.copyfile(os.path.join(src, "tokenizer_config.json"), os.path.join(dst, "tokenizer_config.json"))
    return dst


def corpus_module():
    spec = importlib.util.spec_from_file_location("tokenizer_corpus", os.path.join(REPO, "tools", "tokenizer_corpus.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_cli(args, input_bytes=None):
    return subprocess.run([sparkserve_bin(), "tokenize", *args], input=input_bytes, capture_output=True, timeout=600)


def encode_batch_cli(model, texts, decode=False):
    """Encodes many texts with one `sparkserve tokenize --jsonl` call; returns the parsed objects."""
    path = os.path.join(work_dir(), "batch_%s.jsonl" % os.path.basename(model))
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    args = ["--model", model, "--file", path, "--jsonl"] + (["--decode"] if decode else [])
    r = run_cli(args)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    # Split on "\n" only: decoded texts may contain U+2028 etc., which str.splitlines would split.
    lines = r.stdout.decode("utf-8").split("\n")
    assert lines[-1] == ""
    return [json.loads(l) for l in lines[:-1]]
