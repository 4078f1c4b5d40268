#include "runtime/gdn_slots.h"

#include "core/check.h"

namespace sparkserve {

GdnSlots::GdnSlots(Backend& backend, int num_layers, int32_t num_slots, int32_t num_snapshots, const GdnDims& d,
                   DType recurrent_dtype)
    : backend_(&backend), num_slots_(num_slots), num_snapshots_(num_snapshots) {
  CHECK_MSG(recurrent_dtype == DType::kF32 || recurrent_dtype == DType::kBF16, "the GDN recurrent state is f32 or bf16");
  const int64_t rows = num_slots + num_snapshots;
  for (int l = 0; l < num_layers; ++l) {
    conv_.emplace_back(&backend, DType::kF32, std::vector<int64_t>{rows, d.conv_dim(), d.conv_kernel - 1});
    rec_.emplace_back(&backend, recurrent_dtype, std::vector<int64_t>{rows, d.num_v_heads, d.k_head_dim, d.v_head_dim});
  }
}

int64_t GdnSlots::row_bytes() const {
  int64_t b = 0;
  for (size_t l = 0; l < conv_.size(); ++l)
    b += static_cast<int64_t>(conv_[l].tensor().rows(0, 1).nbytes() + rec_[l].tensor().rows(0, 1).nbytes());
  return b;
}

void GdnSlots::zero_row(int32_t row) {
  CHECK(row >= 0 && row < num_rows());
  for (auto& b : conv_) backend_->fill_zero(b.tensor().rows(row, 1));
  for (auto& b : rec_) backend_->fill_zero(b.tensor().rows(row, 1));
}

void GdnSlots::add_row_copies(int32_t src, int32_t dst, std::vector<TensorCopy>& out) const {
  CHECK(src >= 0 && src < num_rows() && dst >= 0 && dst < num_rows() && src != dst);
  for (size_t l = 0; l < conv_.size(); ++l) {
    out.push_back({conv_[l].tensor().rows(dst, 1), conv_[l].tensor().rows(src, 1)});
    out.push_back({rec_[l].tensor().rows(dst, 1), rec_[l].tensor().rows(src, 1)});
  }
}

}  // namespace sparkserve
