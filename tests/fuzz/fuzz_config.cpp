// libFuzzer entry point: any text as config.json must give a validated ModelConfig or an error
// naming the source (never crash, hang or throw); an accepted config satisfies the invariants the
// model code relies on.
#include <cstddef>
#include <cstdint>
#include <string>

#include "loader/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sparkserve;
  std::string text(reinterpret_cast<const char*>(data), size);
  auto cfg = parse_model_config(text, "fuzz/config.json");
  if (!cfg.ok()) {
    if (cfg.message().rfind("fuzz/config.json: ", 0) != 0) __builtin_trap();
    return 0;
  }
  const ModelConfig& c = *cfg;
  if (c.model_type != "qwen3_5_moe" && c.model_type != "qwen3_5") __builtin_trap();
  if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.vocab_size <= 0) __builtin_trap();
  if (c.layer_types.size() != static_cast<size_t>(c.num_hidden_layers)) __builtin_trap();
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0) __builtin_trap();
  if (c.linear_num_key_heads <= 0 || c.linear_num_value_heads % c.linear_num_key_heads != 0) __builtin_trap();
  if (c.rotary_dim() <= 0 || c.rotary_dim() % 2 != 0 || c.rotary_dim() > c.head_dim) __builtin_trap();
  if (c.gdn_conv_dim() <= 0) __builtin_trap();
  if (c.is_moe && (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts)) __builtin_trap();
  if (!c.is_moe && c.intermediate_size <= 0) __builtin_trap();
  if (!c.mrope_section.empty()) {
    int sum = 0;
    for (int s : c.mrope_section) sum += s;
    if (sum != c.rotary_dim() / 2) __builtin_trap();
  }
  return 0;
}
