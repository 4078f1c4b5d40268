// The state's dtypes and the KV cache's size for the model-running commands (generate, logits, serve,
// bench): --kv-cache-dtype, --gdn-state-dtype, and the device memory a cache may take under
// --gpu-memory-utilization.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "backend/ops.h"
#include "core/status.h"
#include "loader/hf_config.h"
#include "runtime/model_state.h"

namespace sparkserve::cli {

// --kv-cache-dtype: "auto" is bf16 on CUDA (K and V exact for the tensor-core attention kernels,
// half the bytes of f32) and float32 on the CPU (the fp32 reference the transformers comparisons
// use); "bf16"; "fp8" (e4m3 with a scale per position and kv head, KvPool in backend/ops.h);
// "float32". Errors name the bad value.
Expected<DType> parse_kv_cache_dtype(const std::string& name, Device device);
// "float32", "bf16" or "fp8".
const char* kv_cache_dtype_name(DType dtype);
void add_kv_cache_dtype_option(CLI::App* cmd, std::string& value);

// --gdn-state-dtype (alias vLLM's --mamba-ssm-cache-dtype): the GDN recurrent state's storage between
// steps (backend/ops.h, "The recurrent state pool"). "auto" and "float32" (also fp32, f32) are
// float32, the default: the checkpoints' own config names float32 (mamba_ssm_dtype); "bfloat16" (also
// bf16) halves the state's bytes, rounding it once per op that writes it. Errors name the bad value.
Expected<DType> parse_gdn_state_dtype(const std::string& name);
// "float32" or "bfloat16".
const char* gdn_state_dtype_name(DType dtype);
void add_gdn_state_dtype_option(CLI::App* cmd, std::string& value);

// Device bytes a prefill or step of `tokens` rows needs for activations, generously (f32, the
// widest intermediates of a layer held at once, times two for the allocator's slack).
double activation_bytes(const ModelConfig& c, int64_t tokens);

// The device memory for the KV cache under vLLM's meaning of --gpu-memory-utilization: the process
// may use `utilization` of the device's total memory; from that go what the device already holds
// (the loaded weights, and any other process's memory), the GDN state of `max_seqs` sequences (its
// recurrent part in `gdn_dtype`) and the activations of a step of `step_tokens` tokens plus a fixed
// headroom (CUDA graphs' logits, library workspaces).
struct KvBudget {
  double total = 0, in_use = 0, gdn_state = 0, activations = 0;
  double kv = 0;  // what is left for the KV cache (may be <= 0)
};
inline constexpr double kHeadroomBytes = 512.0 * 1024 * 1024;
Expected<KvBudget> kv_budget_from_memory(Backend& backend, const ModelConfig& c, double utilization, int max_seqs,
                                         int64_t step_tokens, DType gdn_dtype);

// The KV blocks of serve's state on `backend`, the weights already loaded: limits.num_kv_blocks, or
// when that is 0 as many as `utilization` leaves for limits.kv_dtype; on a device backend an error
// giving the arithmetic when they do not fit (instead of an out-of-memory abort). CPU: as given.
Expected<int32_t> serve_kv_blocks(Backend& backend, const ModelConfig& c, const StateLimits& limits, double utilization,
                                  int64_t step_tokens);

// State for one sequence of up to `positions` tokens (generate / logits): exactly the KV blocks it
// needs in `kv_dtype`, the GDN state in `gdn_dtype`; on a device backend an error when they do not
// fit in what `utilization` leaves (instead of an out-of-memory abort).
Expected<StateLimits> one_sequence_state(Backend& backend, const ModelConfig& c, int64_t positions, DType kv_dtype,
                                         DType gdn_dtype, double utilization);
// --kv-cache-dtype, --gdn-state-dtype and --gpu-memory-utilization of generate / logits.
struct KvCliOptions {
  std::string dtype = "auto";
  std::string gdn_state_dtype = "auto";
  double gpu_memory_utilization = 0.9;
};
void add_kv_options(CLI::App* cmd, KvCliOptions& o);

}  // namespace sparkserve::cli
