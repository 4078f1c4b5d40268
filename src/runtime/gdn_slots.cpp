#include "runtime/gdn_slots.h"

#include <string>

namespace sparkserve {

GdnSlots::GdnSlots(Backend& backend, int num_layers, int32_t num_slots, const GdnDims& d)
    : backend_(&backend), in_use_(static_cast<size_t>(num_slots), false) {
  for (int l = 0; l < num_layers; ++l) {
    conv_.emplace_back(&backend, DType::kF32, std::vector<int64_t>{num_slots, d.conv_dim(), d.conv_kernel - 1});
    rec_.emplace_back(&backend, DType::kF32,
                      std::vector<int64_t>{num_slots, d.num_v_heads, d.k_head_dim, d.v_head_dim});
  }
  for (int32_t s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

Expected<int32_t> GdnSlots::acquire() {
  if (free_.empty()) return make_error("no free GDN state slot (all " + std::to_string(in_use_.size()) + " in use)");
  int32_t s = free_.back();
  free_.pop_back();
  in_use_[static_cast<size_t>(s)] = true;
  for (auto& b : conv_) backend_->fill_zero(b.tensor().rows(s, 1));
  for (auto& b : rec_) backend_->fill_zero(b.tensor().rows(s, 1));
  return s;
}

void GdnSlots::release(int32_t slot) {
  CHECK(slot >= 0 && slot < static_cast<int32_t>(in_use_.size()) && in_use_[static_cast<size_t>(slot)]);
  in_use_[static_cast<size_t>(slot)] = false;
  free_.push_back(slot);
}

}  // namespace sparkserve
