// Format dispatch, EXIF orientation and alpha compositing (the decoders are in decode_*.cpp).
#include "media/image.h"

#include <cstring>

namespace sparkserve::media {

const char* format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kWebp: return "WebP";
    case ImageFormat::kGif: return "GIF";
    default: return "unknown";
  }
}

ImageFormat sniff_format(const uint8_t* d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return ImageFormat::kJpeg;
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && std::memcmp(d, kPng, 8) == 0) return ImageFormat::kPng;
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) return ImageFormat::kWebp;
  if (n >= 6 && (std::memcmp(d, "GIF87a", 6) == 0 || std::memcmp(d, "GIF89a", 6) == 0)) return ImageFormat::kGif;
  return ImageFormat::kUnknown;
}

Status check_dimensions(const char* format, int64_t width, int64_t height, const DecodeLimits& limits) {
  if (width <= 0 || height <= 0)
    return make_error(std::string(format) + " image has no pixels (" + std::to_string(width) + "x" +
                      std::to_string(height) + ")");
  if (width * height > limits.max_source_pixels)
    return make_error(std::string(format) + " image of " + std::to_string(width) + "x" + std::to_string(height) +
                      " pixels exceeds the limit of " + std::to_string(limits.max_source_pixels) + " pixels");
  return Status::Ok();
}

Expected<RgbImage> decode_image(const uint8_t* data, size_t size, const DecodeLimits& limits) {
  if (size == 0) return make_error("empty image data");
  const ImageFormat format = sniff_format(data, size);
  int orientation = 1;
  Expected<RgbaImage> rgba = make_error("unsupported image format (expected JPEG, PNG, WebP or GIF)");
  switch (format) {
    case ImageFormat::kJpeg: rgba = decode_jpeg(data, size, limits, orientation); break;
    case ImageFormat::kPng: rgba = decode_png(data, size, limits, orientation); break;
    case ImageFormat::kWebp: rgba = decode_webp(data, size, limits, orientation); break;
    case ImageFormat::kGif: rgba = decode_gif(data, size, limits); break;
    default: break;
  }
  if (!rgba.ok()) return rgba.error();
  if (orientation != 1) return composite_over_white(apply_orientation(*rgba, orientation));
  return composite_over_white(*rgba);
}

// ---- EXIF ----------------------------------------------------------------------------------------

int exif_orientation(const uint8_t* p, size_t n) {
  if (n < 8) return 1;
  bool little;
  if (p[0] == 'I' && p[1] == 'I') {
    little = true;
  } else if (p[0] == 'M' && p[1] == 'M') {
    little = false;
  } else {
    return 1;
  }
  auto u16 = [&](size_t at) -> uint32_t {
    return little ? (p[at] | (p[at + 1] << 8)) : ((p[at] << 8) | p[at + 1]);
  };
  auto u32 = [&](size_t at) -> uint64_t {
    return little ? (uint64_t{p[at]} | (uint64_t{p[at + 1]} << 8) | (uint64_t{p[at + 2]} << 16) |
                     (uint64_t{p[at + 3]} << 24))
                  : ((uint64_t{p[at]} << 24) | (uint64_t{p[at + 1]} << 16) | (uint64_t{p[at + 2]} << 8) |
                     uint64_t{p[at + 3]});
  };
  if (u16(2) != 42) return 1;
  const uint64_t ifd = u32(4);
  if (ifd > n || n - ifd < 2) return 1;
  const uint32_t entries = u16(ifd);
  for (uint32_t e = 0; e < entries; ++e) {
    const uint64_t at = ifd + 2 + uint64_t{e} * 12;
    if (at + 12 > n) return 1;
    if (u16(at) != 0x0112) continue;
    // SHORT (3), count 1: the value sits in the first two bytes of the value field.
    if (u16(at + 2) != 3 || u32(at + 4) != 1) return 1;
    const uint32_t v = u16(at + 8);
    return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
  }
  return 1;
}

RgbaImage apply_orientation(const RgbaImage& in, int orientation) {
  if (orientation < 2 || orientation > 8) return in;
  const int W = in.width, H = in.height;
  const bool swap = orientation >= 5;  // transpose, rotations by 90 degrees, transverse
  RgbaImage out;
  out.width = swap ? H : W;
  out.height = swap ? W : H;
  out.rgba.resize(in.rgba.size());
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      int sx = x, sy = y;  // source pixel of output (x, y)
      switch (orientation) {
        case 2: sx = W - 1 - x; break;                  // mirror left-right
        case 3: sx = W - 1 - x; sy = H - 1 - y; break;  // rotate 180
        case 4: sy = H - 1 - y; break;                  // mirror top-bottom
        case 5: sx = y; sy = x; break;                  // transpose
        case 6: sx = y; sy = H - 1 - x; break;          // rotate 90 clockwise
        case 7: sx = W - 1 - y; sy = H - 1 - x; break;  // transverse
        case 8: sx = W - 1 - y; sy = x; break;          // rotate 90 counter-clockwise
      }
      std::memcpy(&out.rgba[(static_cast<size_t>(y) * out.width + x) * 4],
                  &in.rgba[(static_cast<size_t>(sy) * W + sx) * 4], 4);
    }
  }
  return out;
}

RgbImage composite_over_white(const RgbaImage& in) {
  RgbImage out;
  out.width = in.width;
  out.height = in.height;
  const size_t n = static_cast<size_t>(in.width) * in.height;
  out.rgb.resize(n * 3);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t a = in.rgba[i * 4 + 3];
    for (int c = 0; c < 3; ++c) {
      const uint32_t v = in.rgba[i * 4 + c] * a + 255 * (255 - a);
      // round(v / 255) for v <= 255*255, in integers as PIL's blend does it.
      const uint32_t t = v + 128;
      out.rgb[i * 3 + c] = static_cast<uint8_t>(((t >> 8) + t) >> 8);
    }
  }
  return out;
}

}  // namespace sparkserve::media
