// `sparkserve bench --url URL`: prefill / decode / time-to-first-token figures of any
// OpenAI-compatible server, computed as llama-benchy (PyPI llama-benchy 0.4, results.py) computes
// them, so engines can be compared with one tool:
//   latency   mean time of GET /v1/models (llama-benchy's `api` latency mode), 3 probes
//   ttfr      start of the request -> first SSE chunk that carries `choices`
//   e2e_ttft  start -> first chunk carrying content, reasoning or token ids
//   est_ppt   ttfr - latency;            pp t/s = prompt tokens / est_ppt
//   tg t/s    (generated tokens - 1) / (end of stream - first token chunk)
//   (mean ± population sd over --runs; prompt tokens = usage.prompt_tokens when within 20% of the
//   requested count, else the requested count). Also pp t/s (e2e) = prompt tokens / (e2e_ttft -
//   latency), not a llama-benchy column: a server that sends the role chunk before its prefill makes
//   ttfr (and so pp t/s) measure no prefill at all.
// Requests: POST /v1/chat/completions, stream, stream_options.include_usage, return_token_ids,
// max_tokens = min_tokens = N with ignore_eos, temperature 0. Prompt tokens come from the server's
// usage.prompt_tokens; generated tokens from per-chunk token_ids, else usage.completion_tokens, else
// one per content chunk.
// With --concurrency C1,C2,...: for each level and prompt length, C clients stream --runs requests
// each at once; `--json` prints one object per (concurrency, prompt length) under "results", each
// with a `concurrency` field. Prompts are random English words sized to the requested token count with a
// per-server calibration (two probes give tokens per word and the chat template's overhead).
#pragma once

#include <string>
#include <vector>

namespace sparkserve::cli {

struct BenchUrlOptions {
  std::string url;       // http://host:port, optionally ending in /v1
  std::string model;     // empty: the only model /v1/models lists
  std::string api_key;   // bearer token, empty for none
  std::vector<int> prompt_lens;
  int gen_tokens = 32;
  int runs = 3;
  bool json = false;
  int timeout_s = 600;   // per request
  // Load mode (non-empty): for each level, that many clients stream requests at once; reports
  // aggregate output / input tok/s, TTFT and time-per-output-token median / p99 and errors.
  std::vector<int> concurrency;
  std::string json_out;  // also write the JSON result here
};

// Returns the process exit code; errors (bad URL, server down, HTTP errors, a stream without usage)
// are printed as "error: ..." on stderr with exit code 1.
int run_bench_url(const BenchUrlOptions& o);

}  // namespace sparkserve::cli
