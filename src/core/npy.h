// NumPy .npy files (format version 1.0): little-endian float32 arrays in C order, for logits dumps.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/status.h"

namespace sparkserve {

// The .npy header (magic, version 1.0, length, padded dict) for a float32 C-order array.
std::string npy_header_f32(const std::vector<int64_t>& shape);

// Writes data (numel(shape) floats) as a float32 .npy file; errors name the path.
Status write_npy_f32(const std::filesystem::path& path, const std::vector<int64_t>& shape,
                     const float* data);

struct NpyArrayF32 {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Reads a little-endian float32 C-order .npy (version 1.x or 2.x); other dtypes are errors.
Expected<NpyArrayF32> read_npy_f32(const std::filesystem::path& path);

}  // namespace sparkserve
