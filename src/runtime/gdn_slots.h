// Fixed-size Gated DeltaNet state, one slot per running sequence: for each GDN layer a conv state
// pool [slots, conv_dim, K-1] and a recurrent state pool [slots, Hv, dk, dv], both f32.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "core/status.h"

namespace sparkserve {

class GdnSlots {
 public:
  GdnSlots(Backend& backend, int num_layers, int32_t num_slots, const GdnDims& dims);

  // A free slot with zeroed state (a fresh sequence), or an error when all are taken.
  Expected<int32_t> acquire();
  void release(int32_t slot);
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

  const Tensor& conv_pool(int layer) const { return conv_[static_cast<size_t>(layer)].tensor(); }
  const Tensor& recurrent_pool(int layer) const { return rec_[static_cast<size_t>(layer)].tensor(); }

 private:
  Backend* backend_;
  std::vector<Buffer> conv_, rec_;
  std::vector<int32_t> free_;
  std::vector<bool> in_use_;
};

}  // namespace sparkserve
