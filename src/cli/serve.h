// `sparkserve serve`, as functions: its options and the server around a model runner. The serve
// subcommand runs the checkpoint's model; test binaries run the same server on a fake runner.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/model_args.h"
#include "cli/serve_images.h"
#include "core/status.h"
#include "loader/hf_config.h"
#include "runtime/model_runner.h"
#include "runtime/model_state.h"

namespace sparkserve::cli {

struct ServeOptions {
  std::string model;      // --model
  std::string model_pos;  // serve MODEL (vLLM's positional form)
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::vector<std::string> served_model_names;
  std::string max_model_len;  // "32768", "32k", "32K" (parse_token_count); "" or -1: from the model
  std::string chat_template;  // a file, or the template text itself
  std::optional<int64_t> seed;
  std::string log_level = "info";
  double log_stats_interval = 10;
  bool disable_log_stats = false, disable_log_requests = false;
  std::string allowed_origins = "*";
  bool allow_credentials = false;
  // vLLM flags with no effect here (a one-line note each).
  std::string tool_call_parser, reasoning_parser, dtype;
  bool enable_auto_tool_choice = false, trust_remote_code = false, enable_prefix_caching = false;
  int tensor_parallel_size = 0;  // 0: not given
  int max_num_seqs = 64;
  int64_t max_num_batched_tokens = 0;  // 0: by device (run_serve)
  int64_t kv_blocks = 0;
  int64_t kv_cache_mb = 0;  // 0: from --gpu-memory-utilization (cuda) or 256 MiB (cpu)
  std::string kv_cache_dtype = "auto";
  std::string gdn_state_dtype = "auto";
  double gpu_memory_utilization = 0.9;
  int block_size = 16;
  int threads = 0;
  std::string device = "auto";  // auto: cuda when the build has it and a GPU answers, else cpu
  LoadCliOptions load;
  int64_t max_body_bytes = 8 << 20;
  double request_timeout = 600;
  int http_workers = 4;
  int max_connections = 1024;
  int64_t max_waiting_requests = 256;
  double shutdown_timeout = 10;
  double keep_alive_timeout = 60;
  bool no_prefix_caching = false;
  bool no_warm_up = false;
  int64_t prefix_cache_state_mb = 4096;     // GDN state snapshots (device memory on CUDA)
  int64_t prefix_cache_snapshot_interval = 2048;
  ServeImageFlags images;
  // Speculative decoding with the checkpoint's MTP layer: drafts per step (0: off), or vLLM's
  // --speculative-config JSON ({"method": "mtp", "num_speculative_tokens": K}).
  int64_t speculative_tokens = 0;
  std::string speculative_config;
};

// --speculative-tokens / --speculative-config -> drafts per step (0: off). Errors name the flag.
Expected<int64_t> speculative_tokens_from(const ServeOptions& o);

void add_serve_options(CLI::App* cmd, ServeOptions& o);
// --max-num-batched-tokens, or when 0 the device's default: 8192 on cuda (a larger prefill chunk
// reads each expert for more tokens), 2048 on cpu.
inline int64_t step_token_budget(const ServeOptions& o) {
  return o.max_num_batched_tokens > 0 ? o.max_num_batched_tokens : o.device == "cuda" ? 8192 : 2048;
}

// The runner requests execute on, over state storage of `limits` (KV blocks, GDN slots) for a
// model of `config` (config.json of --model). limits.num_kv_blocks 0: as many as fit on the device
// after the weights are loaded (--gpu-memory-utilization); the runner's geometry() says how many.
using RunnerFactory = std::function<Expected<std::unique_ptr<ModelRunner>>(
    const ServeOptions& o, const ModelConfig& config, const StateLimits& limits)>;

// Checks the options, finds the model folder (o.model or the positional MODEL: a folder or a Hugging
// Face id in the HF cache), resolves --device auto, loads the tokenizer, chat template and generation
// defaults, sizes the state, builds the runner (o.model and o.device are resolved in place first)
// and serves until SIGTERM / SIGINT. Returns the process exit code.
int run_serve(ServeOptions& o, const RunnerFactory& make_runner);

}  // namespace sparkserve::cli
