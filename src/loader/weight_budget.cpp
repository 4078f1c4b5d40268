#include "loader/weight_budget.h"

namespace sparkserve {

namespace {
uint64_t numel_u(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}
}  // namespace

WeightBudget compute_weight_budget(const QuantPlan& plan, int num_experts, int experts_per_tok) {
  WeightBudget b;
  const double routed_fraction =
      num_experts > 0 ? static_cast<double>(experts_per_tok) / static_cast<double>(num_experts) : 1.0;
  bool have_lm_head = false;
  uint64_t embed_bytes = 0;
  for (const auto& [name, m] : plan.modules) {
    ModuleBudget mb;
    mb.module = &m;
    mb.component = component_of(name);
    mb.bytes = m.nbytes;
    mb.params = numel_u(m.shape) + (m.tensors.bias ? numel_u(m.tensors.bias->shape) : 0);
    switch (mb.component) {
      case Component::kRoutedExperts: mb.token_bytes = static_cast<double>(mb.bytes) * routed_fraction; break;
      case Component::kEmbeddings:
        mb.token_bytes = m.shape.empty() || m.shape[0] == 0 ? 0.0 : static_cast<double>(mb.bytes) / static_cast<double>(m.shape[0]);
        embed_bytes += mb.bytes;
        break;
      case Component::kVision:
      case Component::kMtp: mb.token_bytes = 0.0; break;
      case Component::kLmHead: have_lm_head = true; [[fallthrough]];
      default: mb.token_bytes = static_cast<double>(mb.bytes); break;
    }
    ComponentBudget& c = b.components[static_cast<size_t>(mb.component)];
    c.bytes += mb.bytes;
    c.params += mb.params;
    c.token_bytes += mb.token_bytes;
    ++c.modules;
    b.total_bytes += mb.bytes;
    b.total_params += mb.params;
    if (mb.component != Component::kVision && mb.component != Component::kMtp) b.text_params += mb.params;
    b.token_bytes += mb.token_bytes;
    b.modules.push_back(mb);
  }
  if (!have_lm_head && embed_bytes > 0) {  // tied: the output projection reads the whole table
    b.lm_head_tied = true;
    b.components[static_cast<size_t>(Component::kLmHead)].token_bytes += static_cast<double>(embed_bytes);
    b.token_bytes += static_cast<double>(embed_bytes);
  }
  return b;
}

}  // namespace sparkserve
