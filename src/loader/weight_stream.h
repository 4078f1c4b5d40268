// Checkpoint tensors -> backend tensors through one reused, bounded host staging buffer
// (LoadOptions): every tensor, however large, is read with pread in pieces of at most the buffer's
// size, converted there if needed, and uploaded piece by piece into its place in the backend tensor.
// Host memory above the final weights is the staging buffer plus small per-module scale vectors.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "core/status.h"
#include "loader/load_options.h"
#include "loader/safetensors.h"

namespace sparkserve {

class WeightStream {
 public:
  WeightStream(const Checkpoint& ckpt, Backend& backend, const LoadOptions& options);
  ~WeightStream();
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  // Sees each piece before it is uploaded: bytes as stored, their count, and the byte offset of the
  // piece inside the tensor. A failed Status stops the copy.
  using BytesCheck = std::function<Status(const uint8_t* bytes, uint64_t n, uint64_t tensor_offset)>;
  // Sees each converted piece: values, count, element index of the first one inside the tensor.
  using F32Check = std::function<Status(const float* values, uint64_t n, uint64_t tensor_index)>;

  // The tensor's bytes as stored -> dst's bytes [dst_offset, dst_offset + info.nbytes).
  Status copy(const TensorInfo& info, const Tensor& dst, uint64_t dst_offset, const BytesCheck& check = {});
  // A float tensor (F32/F16/BF16/F8/F64) converted to f32 -> dst (F32) elements
  // [dst_index, dst_index + numel).
  Status convert_f32(const TensorInfo& info, const Tensor& dst, uint64_t dst_index, const F32Check& check = {});
  // dst (F32) elements [begin, begin + n) = value.
  void fill_f32(const Tensor& dst, uint64_t begin, uint64_t n, float value);
  // A tensor of at most a few values (global / input scales), as f32.
  Expected<std::vector<float>> read_small_f32(const TensorInfo& info);

  uint64_t bytes_read() const { return bytes_read_; }
  // Float tensors (F32 / F16 / BF16) that held NaN or Inf values, with their counts, in the order
  // they were streamed: a broken checkpoint is named at load instead of serving garbage.
  const std::vector<std::pair<std::string, uint64_t>>& nonfinite_tensors() const { return nonfinite_; }
  // The most staging memory held at once (<= min(buffer budget, kMaxStagingBytes)).
  uint64_t peak_staging_bytes() const { return capacity_; }
  uint64_t staging_limit() const { return limit_; }

 private:
  // A staging area of at least min(need, limit_) bytes; grows (freeing the old one first) but never
  // past limit_. Taken from Backend::alloc_host_staging where the backend has such memory.
  uint8_t* staging(uint64_t need);
  Status read_piece(const TensorInfo& info, uint64_t begin, uint64_t n, void* dst);

  const Checkpoint& ckpt_;
  Backend& backend_;
  LoadOptions options_;
  uint64_t limit_ = 0;
  uint64_t capacity_ = 0;
  void release();
  uint8_t* buffer_ = nullptr;
  bool buffer_from_backend_ = false;  // Backend::alloc_host_staging (pinned on CUDA) or new[]
  uint64_t bytes_read_ = 0;
  std::vector<std::pair<std::string, uint64_t>> nonfinite_;
  void count_nonfinite(const TensorInfo& info, uint64_t n);
};

}  // namespace sparkserve
