#include "media/preprocess.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "media/resize.h"

namespace sparkserve::media {

using nlohmann::json;

Expected<PreprocessorConfig> parse_preprocessor_config(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(source + ": not a JSON object");
  PreprocessorConfig c;
  auto positive = [&](const json& v, const std::string& key, int64_t& out) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      return make_error(source + ": " + key + " must be a positive integer");
    out = v.get<int64_t>();
    return Status::Ok();
  };
  int64_t v = 0;
  if (j.contains("size") && j["size"].is_object()) {
    const json& s = j["size"];
    if (s.contains("shortest_edge")) SS_RETURN_IF_ERROR(positive(s["shortest_edge"], "size.shortest_edge", c.min_pixels));
    if (s.contains("longest_edge")) SS_RETURN_IF_ERROR(positive(s["longest_edge"], "size.longest_edge", c.max_pixels));
  }
  if (j.contains("min_pixels") && !j["min_pixels"].is_null()) SS_RETURN_IF_ERROR(positive(j["min_pixels"], "min_pixels", c.min_pixels));
  if (j.contains("max_pixels") && !j["max_pixels"].is_null()) SS_RETURN_IF_ERROR(positive(j["max_pixels"], "max_pixels", c.max_pixels));
  for (auto [key, field] : {std::pair<const char*, int*>{"patch_size", &c.patch_size},
                            {"temporal_patch_size", &c.temporal_patch_size},
                            {"merge_size", &c.merge_size}}) {
    if (!j.contains(key)) continue;
    SS_RETURN_IF_ERROR(positive(j[key], key, v));
    if (v > 1024) return make_error(source + ": " + key + " is implausibly large");
    *field = static_cast<int>(v);
  }
  for (auto [key, field] : {std::pair<const char*, std::array<float, 3>*>{"image_mean", &c.image_mean},
                            {"image_std", &c.image_std}}) {
    if (!j.contains(key)) continue;
    const json& a = j[key];
    if (!a.is_array() || a.size() != 3)
      return make_error(source + ": " + key + " must be a list of 3 numbers");
    for (int i = 0; i < 3; ++i) {
      if (!a[i].is_number()) return make_error(source + ": " + key + " must be a list of 3 numbers");
      (*field)[i] = a[i].get<float>();
    }
  }
  for (float s : c.image_std)
    if (!(s > 0)) return make_error(source + ": image_std entries must be positive");
  if (j.contains("rescale_factor")) {
    if (!j["rescale_factor"].is_number() || !(j["rescale_factor"].get<double>() > 0))
      return make_error(source + ": rescale_factor must be a positive number");
    c.rescale_factor = j["rescale_factor"].get<double>();
  }
  if (j.contains("resample") && !(j["resample"].is_number_integer() && j["resample"].get<int>() == 3))
    return make_error(source + ": resample must be 3 (bicubic), the only filter implemented");
  for (const char* key : {"do_resize", "do_rescale", "do_normalize"})
    if (j.contains(key) && !(j[key].is_boolean() && j[key].get<bool>()))
      return make_error(source + ": " + key + " must be true (the only mode implemented)");
  if (c.min_pixels > c.max_pixels) return make_error(source + ": min pixels exceed max pixels");
  return c;
}

Expected<PreprocessorConfig> load_preprocessor_config(const std::filesystem::path& dir,
                                                      const PreprocessorConfig& fallback) {
  const auto path = dir / "preprocessor_config.json";
  std::ifstream f(path);
  if (!f) return fallback;
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_preprocessor_config(ss.str(), path.string());
}

Expected<std::pair<int64_t, int64_t>> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                                   int64_t max_pixels) {
  const double h = static_cast<double>(height), w = static_cast<double>(width), f = static_cast<double>(factor);
  if (std::max(h, w) / std::min(h, w) > 200)
    return make_error("image aspect ratio " + std::to_string(std::max(h, w) / std::min(h, w)) +
                      " is above the limit of 200");
  // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
  double hb = std::nearbyint(h / f) * f, wb = std::nearbyint(w / f) * f;
  if (hb * wb > static_cast<double>(max_pixels)) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    hb = std::max(f, std::floor(h / beta / f) * f);
    wb = std::max(f, std::floor(w / beta / f) * f);
  } else if (hb * wb < static_cast<double>(min_pixels)) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    hb = std::ceil(h * beta / f) * f;
    wb = std::ceil(w * beta / f) * f;
  }
  if (hb < f || wb < f)
    return make_error("image of " + std::to_string(width) + "x" + std::to_string(height) + " resizes to nothing");
  return std::make_pair(static_cast<int64_t>(hb), static_cast<int64_t>(wb));
}

namespace {
// FNV-1a, 64 bit.
uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
}  // namespace

PatchedImage preprocess_image(const RgbImage& image, const PreprocessorConfig& c, int64_t rh, int64_t rw) {
  const RgbImage r = resize_bicubic_aa(image, static_cast<int>(rw), static_cast<int>(rh));
  const int64_t P = c.patch_size, m = c.merge_size, Tp = c.temporal_patch_size;
  PatchedImage out;
  out.grid_h = rh / P;
  out.grid_w = rw / P;
  out.patch_dim = 3 * Tp * P * P;
  // The fused rescale + normalise of the reference: mean and std scaled by 1/rescale_factor in fp32,
  // then (x - mean) / std in fp32.
  float mean[3], stdv[3];
  const float inv_rescale = static_cast<float>(1.0 / c.rescale_factor);
  for (int ch = 0; ch < 3; ++ch) {
    mean[ch] = c.image_mean[ch] * inv_rescale;
    stdv[ch] = c.image_std[ch] * inv_rescale;
  }
  out.pixels.resize(static_cast<size_t>(out.grid_h * out.grid_w * out.patch_dim));
  float* dst = out.pixels.data();
  // Row order (block row, block col, row in block, col in block); inside a row (channel, frame, y, x).
  for (int64_t bh = 0; bh < out.grid_h / m; ++bh)
    for (int64_t bw = 0; bw < out.grid_w / m; ++bw)
      for (int64_t mh = 0; mh < m; ++mh)
        for (int64_t mw = 0; mw < m; ++mw) {
          const int64_t y0 = (bh * m + mh) * P, x0 = (bw * m + mw) * P;
          for (int ch = 0; ch < 3; ++ch)
            for (int64_t t = 0; t < Tp; ++t)
              for (int64_t py = 0; py < P; ++py)
                for (int64_t px = 0; px < P; ++px) {
                  const float v = r.rgb[static_cast<size_t>(((y0 + py) * rw + x0 + px) * 3 + ch)];
                  *dst++ = (v - mean[ch]) / stdv[ch];
                }
        }
  uint64_t h = 0xcbf29ce484222325ull;
  const int64_t meta[5] = {rh, rw, P, m, Tp};
  h = fnv1a(h, meta, sizeof(meta));
  h = fnv1a(h, mean, sizeof(mean));
  h = fnv1a(h, stdv, sizeof(stdv));
  out.content_hash = fnv1a(h, r.rgb.data(), r.rgb.size());
  return out;
}

Expected<PatchedImage> preprocess_image(const RgbImage& image, const PreprocessorConfig& c) {
  SS_ASSIGN_OR_RETURN(auto size, smart_resize(image.height, image.width, c.factor(), c.min_pixels, c.max_pixels));
  return preprocess_image(image, c, size.first, size.second);
}

}  // namespace sparkserve::media
