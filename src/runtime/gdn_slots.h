// Gated DeltaNet state storage: for each GDN layer a conv state pool [rows, conv_dim, K-1] f32 (the
// last K-1 conv inputs) and a recurrent state pool [rows, Hv, dk, dv], f32 or bf16 (the ops read
// either: backend/ops.h, "The recurrent state pool"). A row is one
// sequence's whole GDN state. Rows [0, slots) belong to running sequences; rows
// [slots, slots + snapshots) hold copies of such states kept for the prefix cache. Which row
// belongs to whom is decided by the owner (the engine's scheduler, or DirectState).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"

namespace sparkserve {

class GdnSlots {
 public:
  GdnSlots(Backend& backend, int num_layers, int32_t num_slots, int32_t num_snapshots, const GdnDims& dims,
           DType recurrent_dtype = DType::kF32);

  const Tensor& conv_pool(int layer) const { return conv_[static_cast<size_t>(layer)].tensor(); }
  const Tensor& recurrent_pool(int layer) const { return rec_[static_cast<size_t>(layer)].tensor(); }
  int num_layers() const { return static_cast<int>(conv_.size()); }
  int32_t num_slots() const { return num_slots_; }
  int32_t num_snapshots() const { return num_snapshots_; }
  int32_t num_rows() const { return num_slots_ + num_snapshots_; }
  // Bytes of one row over all layers (what one snapshot costs).
  int64_t row_bytes() const;

  // Zeroes row `row` in every layer (the state of an empty sequence).
  void zero_row(int32_t row);
  // Appends the copies that make row dst's conv and recurrent state row src's, in every layer (for
  // Backend::copy_batch).
  void add_row_copies(int32_t src, int32_t dst, std::vector<TensorCopy>& out) const;

 private:
  Backend* backend_;
  int32_t num_slots_, num_snapshots_;
  std::vector<Buffer> conv_, rec_;
};

}  // namespace sparkserve
