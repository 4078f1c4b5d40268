// `sparkserve serve`, as functions: its options and the server around a model runner. The serve
// subcommand runs the checkpoint's model; test binaries run the same server on a fake runner.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cli/model_args.h"
#include "cli/serve_images.h"
#include "core/status.h"
#include "loader/hf_config.h"
#include "runtime/model_runner.h"
#include "runtime/model_state.h"

namespace sparkserve::cli {

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;
  int64_t max_model_len = 0;
  int max_num_seqs = 64;
  int64_t max_num_batched_tokens = 0;  // 0: by device (run_serve)
  int64_t kv_blocks = 0;
  int64_t kv_cache_mb = 0;  // 0: from --gpu-memory-utilization (cuda) or 256 MiB (cpu)
  std::string kv_cache_dtype = "auto";
  double gpu_memory_utilization = 0.9;
  int block_size = 16;
  int threads = 0;
  std::string device = "cpu";
  LoadCliOptions load;
  int64_t max_body_bytes = 8 << 20;
  double request_timeout = 600;
  int http_workers = 4;
  int max_connections = 1024;
  int64_t max_waiting_requests = 256;
  double shutdown_timeout = 10;
  double keep_alive_timeout = 60;
  bool no_prefix_caching = false;
  int64_t prefix_cache_state_mb = 4096;     // GDN state snapshots (device memory on CUDA)
  int64_t prefix_cache_snapshot_interval = 2048;
  ServeImageFlags images;
};

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

// Loads the tokenizer, chat template and generation defaults of o.model, sizes the state, builds the
// runner, serves until SIGTERM / SIGINT. Returns the process exit code.
int run_serve(const ServeOptions& o, const RunnerFactory& make_runner);

}  // namespace sparkserve::cli
