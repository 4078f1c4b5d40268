// libFuzzer entry point: any bytes as a safetensors file (or as its header JSON) must give a
// validated tensor table or an error naming the file (never crash, hang or throw), and every
// tensor accepted must lie inside the file with the byte size its dtype and shape imply.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "loader/safetensors.h"

namespace {

using namespace sparkserve;

void check(const Expected<SafetensorsFile>& f, uint64_t file_size) {
  if (!f.ok()) {
    if (f.message().find("fuzz.safetensors") == std::string::npos) __builtin_trap();
    return;
  }
  for (const TensorInfo& t : f->tensors()) {
    if (t.offset > file_size || t.nbytes > file_size - t.offset) __builtin_trap();
    if (static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype) != t.nbytes) __builtin_trap();
  }
  // tensors() is sorted by offset; non-empty ones must not overlap.
  uint64_t end = 0;
  for (const TensorInfo& t : f->tensors()) {
    if (t.nbytes == 0) continue;
    if (t.offset < end) __builtin_trap();
    end = t.offset + t.nbytes;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    // The whole file image: length prefix, header, data.
    check(SafetensorsFile::from_bytes("fuzz.safetensors", rest), rest.size());
  } else {
    // Header JSON only (reaches the entry validation without having to guess the length prefix);
    // the data buffer size comes from the selector byte.
    uint64_t file_size = 8 + rest.size() + (data[0] >> 1) * 16;
    check(SafetensorsFile::parse_header("fuzz.safetensors", rest, file_size), file_size);
  }
  return 0;
}
