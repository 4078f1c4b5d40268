#include "loader/weight_stream.h"

#include <cmath>
#include <cstring>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "loader/load_progress.h"

namespace sparkserve {

namespace {

// Bytes [offset, offset + n) of t, as a byte tensor on t's device (an upload target).
Tensor byte_range(const Tensor& t, uint64_t offset, uint64_t n) {
  CHECK(offset + n <= t.nbytes());
  return Tensor(static_cast<char*>(t.data) + offset, DType::kU8, {static_cast<int64_t>(n)}, t.device);
}

using Converter = float (*)(const unsigned char*);

Converter converter_for(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return [](const unsigned char* p) { float f; std::memcpy(&f, p, 4); return f; };
    case DType::kF64:
      return [](const unsigned char* p) { double d; std::memcpy(&d, p, 8); return static_cast<float>(d); };
    case DType::kF16:
      return [](const unsigned char* p) { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); };
    case DType::kBF16:
      return [](const unsigned char* p) { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); };
    case DType::kF8E4M3:
      return [](const unsigned char* p) { return fp8_e4m3_to_f32(*p); };
    case DType::kF8E5M2:
      return [](const unsigned char* p) { return fp8_e5m2_to_f32(*p); };
    default:
      return nullptr;
  }
}

}  // namespace

WeightStream::WeightStream(const Checkpoint& ckpt, Backend& backend, const LoadOptions& options)
    : ckpt_(ckpt), backend_(backend), options_(options) {
  limit_ = std::max<uint64_t>(std::min(options.buffer_bytes, kMaxStagingBytes), 64);
  limit_ = limit_ / 64 * 64;
}

WeightStream::~WeightStream() { release(); }

void WeightStream::release() {
  if (buffer_from_backend_) backend_.free_host_staging(buffer_);
  else delete[] buffer_;
  buffer_ = nullptr;
  buffer_from_backend_ = false;
}

uint8_t* WeightStream::staging(uint64_t need) {
  need = std::min(need, limit_);
  if (need > capacity_) {
    // Grow by doubling (fewer reallocations while a load finds its largest tensor), capped.
    uint64_t grown = std::max<uint64_t>(need, std::min(limit_, capacity_ * 2));
    release();
    buffer_ = static_cast<uint8_t*>(backend_.alloc_host_staging(grown));
    buffer_from_backend_ = buffer_ != nullptr;
    if (!buffer_) buffer_ = new uint8_t[grown];
    capacity_ = grown;
  }
  return buffer_;
}

Status WeightStream::read_piece(const TensorInfo& info, uint64_t begin, uint64_t n, void* dst) {
  SS_RETURN_IF_ERROR(ckpt_.read_bytes(info, begin, n, dst,
                                      options_.drop_page_cache ? Checkpoint::PageCache::kDrop
                                                               : Checkpoint::PageCache::kKeep));
  bytes_read_ += n;
  if (options_.progress) options_.progress->advance(n);
  return Status::Ok();
}

// Non-finite values in `n` bytes of a float tensor as stored (0 for other dtypes: integer and
// packed FP4 data have no NaN; FP8 scales are checked by the quantized loader).
static uint64_t nonfinite_in(DType dtype, const uint8_t* bytes, uint64_t n) {
  uint64_t bad = 0;
  if (dtype == DType::kBF16 || dtype == DType::kF16) {
    // Exponent all ones: Inf or NaN (bf16: 8 exponent bits, f16: 5).
    const uint16_t mask = dtype == DType::kBF16 ? 0x7F80 : 0x7C00;
    for (uint64_t i = 0; i + 1 < n; i += 2) {
      uint16_t h;
      std::memcpy(&h, bytes + i, 2);
      bad += (h & mask) == mask;
    }
  } else if (dtype == DType::kF32) {
    for (uint64_t i = 0; i + 3 < n; i += 4) {
      float f;
      std::memcpy(&f, bytes + i, 4);
      bad += !std::isfinite(f);
    }
  }
  return bad;
}

void WeightStream::count_nonfinite(const TensorInfo& info, uint64_t n) {
  if (n == 0) return;
  if (!nonfinite_.empty() && nonfinite_.back().first == info.name) nonfinite_.back().second += n;
  else nonfinite_.emplace_back(info.name, n);
}

Status WeightStream::copy(const TensorInfo& info, const Tensor& dst, uint64_t dst_offset, const BytesCheck& check) {
  if (dst_offset > dst.nbytes() || info.nbytes > dst.nbytes() - dst_offset)
    return make_error(info.file.string() + ": tensor '" + info.name + "' (" + std::to_string(info.nbytes) +
                      " bytes) does not fit its weight at byte " + std::to_string(dst_offset));
  uint8_t* buf = staging(info.nbytes);
  for (uint64_t done = 0; done < info.nbytes;) {
    const uint64_t n = std::min(info.nbytes - done, limit_);
    SS_RETURN_IF_ERROR(read_piece(info, done, n, buf));
    if (check) SS_RETURN_IF_ERROR(check(buf, n, done));
    count_nonfinite(info, nonfinite_in(info.dtype, buf, n));
    backend_.upload(byte_range(dst, dst_offset + done, n), buf);
    done += n;
  }
  if (options_.drop_page_cache && info.nbytes > limit_) ckpt_.drop_cached(info);  // folios spanning pieces
  return Status::Ok();
}

Status WeightStream::convert_f32(const TensorInfo& info, const Tensor& dst, uint64_t dst_index,
                                 const F32Check& check) {
  CHECK(dst.dtype == DType::kF32);
  const Converter convert = converter_for(info.dtype);
  if (!convert)
    return make_error(info.file.string() + ": tensor '" + info.name + "' has dtype " +
                      std::string(dtype_name(info.dtype)) + ", not a float type that can be read as f32");
  const uint64_t numel = static_cast<uint64_t>(info.numel());
  if (dst_index > static_cast<uint64_t>(dst.numel()) || numel > static_cast<uint64_t>(dst.numel()) - dst_index)
    return make_error(info.file.string() + ": tensor '" + info.name + "' (" + std::to_string(numel) +
                      " values) does not fit its weight at element " + std::to_string(dst_index));
  const uint64_t esize = dtype_size(info.dtype);
  // Source bytes and converted floats share the staging area: [src | pad | f32].
  const uint64_t per_piece = std::max<uint64_t>(1, (limit_ - 16) / (esize + 4));
  const uint64_t first = std::min(numel, per_piece);
  const uint64_t f32_at = (first * esize + 15) / 16 * 16;
  uint8_t* buf = staging(f32_at + first * 4);
  float* out = reinterpret_cast<float*>(buf + f32_at);
  for (uint64_t i = 0; i < numel;) {
    const uint64_t n = std::min(numel - i, first);
    SS_RETURN_IF_ERROR(read_piece(info, i * esize, n * esize, buf));
    uint64_t bad = 0;
    for (uint64_t j = 0; j < n; ++j) {
      out[j] = convert(buf + j * esize);
      bad += !std::isfinite(out[j]);
    }
    count_nonfinite(info, bad);
    if (check) SS_RETURN_IF_ERROR(check(out, n, i));
    backend_.upload(byte_range(dst, (dst_index + i) * 4, n * 4), out);
    i += n;
  }
  if (options_.drop_page_cache && numel > first) ckpt_.drop_cached(info);  // folios spanning pieces
  return Status::Ok();
}

void WeightStream::fill_f32(const Tensor& dst, uint64_t begin, uint64_t n, float value) {
  CHECK(dst.dtype == DType::kF32);
  const uint64_t per_piece = std::min<uint64_t>(n, limit_ / 4);
  float* out = reinterpret_cast<float*>(staging(per_piece * 4));
  std::fill(out, out + per_piece, value);
  for (uint64_t i = 0; i < n;) {
    const uint64_t m = std::min(n - i, per_piece);
    backend_.upload(byte_range(dst, (begin + i) * 4, m * 4), out);
    i += m;
  }
}

Expected<std::vector<float>> WeightStream::read_small_f32(const TensorInfo& info) {
  const Converter convert = converter_for(info.dtype);
  if (!convert)
    return make_error(info.file.string() + ": tensor '" + info.name + "' has dtype " +
                      std::string(dtype_name(info.dtype)) + ", not a float type that can be read as f32");
  constexpr uint64_t kMaxSmall = 4096;  // scale tensors hold 1 value; anything this big is not one
  if (info.nbytes > kMaxSmall)
    return make_error(info.file.string() + ": tensor '" + info.name + "' has shape " + shape_to_string(info.shape) +
                      ", too large for a scale");
  unsigned char tmp[kMaxSmall];
  SS_RETURN_IF_ERROR(read_piece(info, 0, info.nbytes, tmp));
  const uint64_t esize = dtype_size(info.dtype);
  std::vector<float> out(info.nbytes / esize);
  for (size_t j = 0; j < out.size(); ++j) out[j] = convert(tmp + j * esize);
  return out;
}

}  // namespace sparkserve
