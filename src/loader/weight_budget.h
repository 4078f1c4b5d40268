// Bytes and parameters per module and per component, and the weight bytes one decoded token reads at
// batch 1 (model-qwen35.md §6.3): routed experts top-k of E per layer; embeddings one row; lm_head all
// of it (the embedding table when tied); everything else on the token path once; vision and MTP
// excluded (not on the text decode path; an MTP draft step is a separate budget).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "loader/model_shapes.h"
#include "loader/quant_scheme.h"

namespace sparkserve {

struct ModuleBudget {
  const ModuleFormat* module = nullptr;
  Component component = Component::kNormsOther;
  uint64_t bytes = 0;         // all tensors of the module as stored
  uint64_t params = 0;        // logical weight elements (+ bias)
  double token_bytes = 0.0;   // bytes read per decoded token (batch 1)
};

struct ComponentBudget {
  uint64_t bytes = 0;
  uint64_t params = 0;
  double token_bytes = 0.0;
  int modules = 0;
};

struct WeightBudget {
  std::vector<ModuleBudget> modules;  // in plan (name) order
  std::array<ComponentBudget, kNumComponents> components{};
  uint64_t total_bytes = 0;
  uint64_t total_params = 0;
  uint64_t text_params = 0;   // everything but vision and MTP
  double token_bytes = 0.0;
  bool lm_head_tied = false;  // no lm_head module: the embedding table is read instead
};

// experts_per_tok / num_experts: the routed fraction (0 / 0 for a dense model).
WeightBudget compute_weight_budget(const QuantPlan& plan, int num_experts, int experts_per_tok);

}  // namespace sparkserve
