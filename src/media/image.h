// Image decoding for the vision tower's input: JPEG (libjpeg-turbo), PNG (libpng), WebP (libwebp,
// first frame of an animation) and GIF (giflib, first frame) into 8-bit RGB, with the EXIF
// orientation applied and any alpha composited over white.
//
// The media module is leaf-ish like text/ and loader/: it depends on core only, and the model and
// server include it (server -> runtime -> model -> media -> core).
//
// Conventions that decide pixel values (what the references do; tests/python/test_vision_preprocess.py):
// - Decoders are run as Pillow runs them: libjpeg's default islow IDCT with fancy upsampling, 16-bit
//   PNG samples reduced to their high byte, PNG gAMA/iCCP ignored, palettes expanded.
// - EXIF orientation (JPEG APP1, PNG eXIf, WebP EXIF chunk) is applied as PIL.ImageOps.exif_transpose,
//   which transformers' load_image runs.
// - Alpha, wherever the file has it (RGBA, gray+alpha, palette transparency), is composited over
//   white as Image.paste(image, mask=alpha) onto a white canvas computes it (vLLM's rgba_to_rgb):
//   out = round((c*a + 255*(255-a)) / 255). transformers 5.17's Qwen2-VL processor instead drops
//   alpha (Image.convert("RGB")); a transparent pixel's colour is then whatever the file stored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace sparkserve::media {

enum class ImageFormat { kUnknown, kJpeg, kPng, kWebp, kGif };
const char* format_name(ImageFormat f);
// From the first bytes (magic numbers), never from a file name or MIME type.
ImageFormat sniff_format(const uint8_t* data, size_t size);

// Interleaved 8-bit pixels, row-major, no padding.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3]
};
struct RgbaImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgba;  // [height, width, 4]
};

struct DecodeLimits {
  // Pixels of the decoded (source) image; larger files are refused before their pixels are decoded.
  int64_t max_source_pixels = int64_t{1} << 27;  // 134 M (e.g. 16384 x 8192)
};

// Decodes a JPEG, PNG, WebP or GIF file held in memory. Errors name the format and what is wrong
// ("truncated or corrupt PNG: ...", "unsupported image format (...)", "image of 70000x70000 pixels
// exceeds ..."); bad input never crashes or hangs.
Expected<RgbImage> decode_image(const uint8_t* data, size_t size, const DecodeLimits& limits = {});

// ---- pieces, exposed for tests and the fuzzer ---------------------------------------------------
// Each decoder returns RGBA before orientation and compositing; `orientation` receives the EXIF
// orientation (1..8; 1 when absent or invalid).
Expected<RgbaImage> decode_jpeg(const uint8_t* data, size_t size, const DecodeLimits& limits, int& orientation);
Expected<RgbaImage> decode_png(const uint8_t* data, size_t size, const DecodeLimits& limits, int& orientation);
Expected<RgbaImage> decode_webp(const uint8_t* data, size_t size, const DecodeLimits& limits, int& orientation);
Expected<RgbaImage> decode_gif(const uint8_t* data, size_t size, const DecodeLimits& limits);
// The Orientation tag (0x0112) of IFD0 in a TIFF-structured EXIF block (starting at the byte-order
// mark, without JPEG's "Exif\0\0" prefix); 1 when absent or malformed.
int exif_orientation(const uint8_t* tiff, size_t size);
// PIL.ImageOps.exif_transpose for orientation 2..8 (1: unchanged).
RgbaImage apply_orientation(const RgbaImage& in, int orientation);
// Alpha over white (see above).
RgbImage composite_over_white(const RgbaImage& in);
// Limit check shared by the decoders.
Status check_dimensions(const char* format, int64_t width, int64_t height, const DecodeLimits& limits);

}  // namespace sparkserve::media
