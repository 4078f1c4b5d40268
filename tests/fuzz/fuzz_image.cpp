// libFuzzer entry point for the image inputs of requests: any bytes as an image file (JPEG, PNG,
// WebP, GIF: decoding, EXIF orientation, alpha compositing), as base64 text (data: URLs and
// Anthropic sources) and as a raw EXIF block must give an image or an error (never crash, hang,
// overflow or leak); a decoded image must have the pixels its size implies and stay within the
// limit, and its preprocessing (smart_resize, antialiased bicubic resize, patchification) must give
// finite values in the tower's layout.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/base64.h"
#include "media/image.h"
#include "media/preprocess.h"

namespace {

using namespace sparkserve;

void check_image(const uint8_t* data, size_t size) {
  media::DecodeLimits limits;
  limits.max_source_pixels = int64_t{1} << 20;  // keeps each run small (the limit is what is checked)
  auto img = media::decode_image(data, size, limits);
  if (!img.ok()) {
    if (img.message().empty()) __builtin_trap();
    return;
  }
  const int64_t w = img->width, h = img->height;
  if (w <= 0 || h <= 0 || w * h > limits.max_source_pixels) __builtin_trap();
  if (img->rgb.size() != static_cast<size_t>(w * h * 3)) __builtin_trap();
  media::PreprocessorConfig pre;
  pre.min_pixels = 1024;   // 32x32: one merged block
  pre.max_pixels = 16384;  // at most 16 blocks, so the resize stays cheap
  auto patched = media::preprocess_image(*img, pre);
  if (!patched.ok()) return;  // aspect ratio above 200: refused with a message
  const media::PatchedImage& p = *patched;
  if (p.grid_h % pre.merge_size || p.grid_w % pre.merge_size) __builtin_trap();
  // Within max_pixels, except where smart_resize raised the short side to one merge block (as
  // transformers does: 1809x88 -> 32x576 pixels for max 16384); the aspect ratio is at most 200.
  const bool clamped = p.grid_h == pre.merge_size || p.grid_w == pre.merge_size;
  if (p.grid_h * p.grid_w * 256 > pre.max_pixels && !(clamped && p.grid_h * p.grid_w * 256 <= 201 * 1024))
    __builtin_trap();
  if (p.pixels.size() != static_cast<size_t>(p.num_patches() * p.patch_dim)) __builtin_trap();
  for (float v : p.pixels)
    if (!std::isfinite(v) || std::fabs(v) > 1.0001f) __builtin_trap();  // (x/255 - 0.5) / 0.5
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t* rest = data + 1;
  const size_t n = size - 1;
  switch (data[0] % 3) {
    case 0: check_image(rest, n); break;
    case 1: {
      auto bytes = base64_decode(std::string_view(reinterpret_cast<const char*>(rest), n));
      if (!bytes.ok()) break;
      if (bytes->size() > n / 4 * 3 + 3) __builtin_trap();
      check_image(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
      break;
    }
    default: {
      const int o = media::exif_orientation(rest, n);
      if (o < 1 || o > 8) __builtin_trap();
    }
  }
  return 0;
}
