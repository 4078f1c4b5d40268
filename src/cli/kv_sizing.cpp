#include "cli/kv_sizing.h"

#include <algorithm>
#include <cstdio>

#include "backend/synth_fill.h"
#include "cli/model_args.h"

namespace sparkserve::cli {

Expected<DType> parse_kv_cache_dtype(const std::string& name, Device device) {
  if (name == "auto") return device == Device::kCuda ? DType::kBF16 : DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp8" || name == "fp8_e4m3") return DType::kF8E4M3;
  if (name == "float32" || name == "fp32" || name == "f32") return DType::kF32;
  return make_error("--kv-cache-dtype: '" + name + "' is not one of auto, bf16, fp8, float32");
}

const char* kv_cache_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kF8E4M3: return "fp8";
    default: return "float32";
  }
}

Expected<DType> parse_gdn_state_dtype(const std::string& name) {
  if (name == "auto" || name == "float32" || name == "fp32" || name == "f32") return DType::kF32;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  return make_error("--gdn-state-dtype: '" + name + "' is not one of auto, float32, bfloat16");
}

const char* gdn_state_dtype_name(DType dtype) { return dtype == DType::kBF16 ? "bfloat16" : "float32"; }

void add_gdn_state_dtype_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--gdn-state-dtype,--mamba-ssm-cache-dtype", value,
                  "GDN recurrent state storage between steps: auto (float32) | float32 | bfloat16 (half the "
                  "bytes; rounded once per op that writes it)")
      ->default_val("auto");
}

void add_kv_cache_dtype_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--kv-cache-dtype", value,
                  "KV cache storage: auto (bf16 on cuda, float32 on cpu) | bf16 | fp8 (e4m3, a scale per position "
                  "and kv head) | float32")
      ->default_val("auto");
}

double activation_bytes(const ModelConfig& c, int64_t tokens) {
  const double per_row = 10.0 * c.hidden_size + 3.0 * c.gdn_conv_dim() + 4.0 * c.num_attention_heads * c.head_dim +
                         3.0 * std::max(1, c.num_experts_per_tok) * 2.0 * std::max(c.moe_intermediate_size, c.intermediate_size) +
                         2.0 * c.shared_expert_intermediate_size;
  return 2.0 * 4.0 * per_row * static_cast<double>(tokens) + 4.0 * c.vocab_size * 64;
}

Expected<KvBudget> kv_budget_from_memory(Backend& backend, const ModelConfig& c, double utilization, int max_seqs,
                                         int64_t step_tokens, DType gdn_dtype) {
  if (!(utilization > 0.0 && utilization <= 1.0)) return make_error("--gpu-memory-utilization must be in (0, 1]");
  const DeviceMemory mem = device_memory(backend);
  if (mem.total_bytes <= 0) return make_error("the backend does not report device memory");
  KvBudget b;
  b.total = static_cast<double>(mem.total_bytes);
  b.in_use = static_cast<double>(mem.total_bytes - mem.free_bytes);
  b.gdn_state = static_cast<double>(gdn_state_bytes(c, gdn_dtype)) * max_seqs;
  b.activations = activation_bytes(c, std::max<int64_t>(step_tokens, max_seqs)) + kHeadroomBytes;
  b.kv = utilization * b.total - b.in_use - b.gdn_state - b.activations;
  return b;
}

Expected<int32_t> serve_kv_blocks(Backend& backend, const ModelConfig& c, const StateLimits& limits, double utilization,
                                  int64_t step_tokens) {
  if (backend.device() == Device::kCpu) return limits.num_kv_blocks;
  SS_ASSIGN_OR_RETURN(KvBudget b, kv_budget_from_memory(backend, c, utilization, limits.max_sequences + limits.num_snapshots,
                                                            step_tokens, limits.gdn_state_dtype));
  const double per_block = static_cast<double>(std::max(count_layers(c, LayerType::kFullAttention) + (limits.mtp ? 1 : 0), 1)) *
                           static_cast<double>(limits.block_size) *
                           static_cast<double>(kv_bytes_per_token(limits.kv_dtype, c.num_key_value_heads, c.head_dim));
  const double room = std::max(0.0, b.kv);
  const int64_t blocks =
      limits.num_kv_blocks > 0 ? limits.num_kv_blocks : std::min<int64_t>(static_cast<int64_t>(room / per_block), 1 << 30);
  if (blocks < 1 || static_cast<double>(blocks) * per_block > room) {
    char msg[640];
    std::snprintf(msg, sizeof msg,
                  "the KV cache (%lld blocks, %.2f GB of %s) does not fit: --gpu-memory-utilization %.2f of %.1f GB "
                  "leaves %.2f GB after %.1f GB in use (weights), %.2f GB of GDN state for %d sequences and snapshots and %.2f GB "
                  "for activations; raise --gpu-memory-utilization, lower --max-num-seqs, or use --kv-cache-dtype fp8",
                  static_cast<long long>(std::max<int64_t>(blocks, 1)), static_cast<double>(std::max<int64_t>(blocks, 1)) * per_block / 1e9,
                  kv_cache_dtype_name(limits.kv_dtype), utilization, b.total / 1e9, b.kv / 1e9, b.in_use / 1e9,
                  b.gdn_state / 1e9, limits.max_sequences + limits.num_snapshots, b.activations / 1e9);
    return make_error(msg);
  }
  return static_cast<int32_t>(blocks);
}

Expected<StateLimits> one_sequence_state(Backend& backend, const ModelConfig& c, int64_t positions, DType kv_dtype,
                                         DType gdn_dtype, double utilization) {
  StateLimits limits = one_sequence_limits(positions);
  limits.kv_dtype = kv_dtype;
  limits.gdn_state_dtype = gdn_dtype;
  if (backend.device() == Device::kCpu) return limits;
  SS_ASSIGN_OR_RETURN(KvBudget b, kv_budget_from_memory(backend, c, utilization, 1, positions, gdn_dtype));
  const double need = static_cast<double>(limits.num_kv_blocks) * limits.block_size *
                      count_layers(c, LayerType::kFullAttention) *
                      kv_bytes_per_token(kv_dtype, c.num_key_value_heads, c.head_dim);
  if (need > b.kv)
    return make_error("the KV cache of " + std::to_string(positions) + " positions needs " +
                      std::to_string(static_cast<int64_t>(need / 1e6)) + " MB but --gpu-memory-utilization " +
                      std::to_string(utilization) + " leaves " + std::to_string(static_cast<int64_t>(b.kv / 1e6)) +
                      " MB after the weights, the GDN state and activations");
  return limits;
}

void add_kv_options(CLI::App* cmd, KvCliOptions& o) {
  add_kv_cache_dtype_option(cmd, o.dtype);
  add_gdn_state_dtype_option(cmd, o.gdn_state_dtype);
  cmd->add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                  "Fraction of the device's total memory this process may use (cuda)")
      ->default_val(0.9);
}

}  // namespace sparkserve::cli
