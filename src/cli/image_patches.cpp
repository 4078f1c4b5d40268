// `sparkserve image-patches --image FILE [--preprocessor preprocessor_config.json] [--out F.npy]`
//   Decodes and preprocesses one image as the vision tower receives it; prints
//   {"grid_thw": [t, h, w], "resized": [height, width], "tokens": N, "hash": "..."} and writes the
//   pixel values [t*h*w, 3*temporal*patch^2] as float32 .npy (the layout of transformers'
//   pixel_values). Used by the preprocessing tests against transformers' image processor.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/npy.h"
#include "media/preprocess.h"

namespace {

using namespace sparkserve;

int run_image_patches(const std::string& image, const std::string& preprocessor, const std::string& out) {
  media::PreprocessorConfig config;
  if (!preprocessor.empty()) {
    std::ifstream pf(preprocessor);
    if (!pf) {
      std::fprintf(stderr, "error: cannot open %s\n", preprocessor.c_str());
      return 1;
    }
    std::stringstream ps;
    ps << pf.rdbuf();
    auto c = media::parse_preprocessor_config(ps.str(), preprocessor);
    if (!c.ok()) {
      std::fprintf(stderr, "error: %s\n", c.message().c_str());
      return 1;
    }
    config = *c;
  }
  std::ifstream f(image, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "error: cannot open %s\n", image.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string bytes = ss.str();
  auto rgb = media::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (!rgb.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", image.c_str(), rgb.message().c_str());
    return 1;
  }
  auto p = media::preprocess_image(*rgb, config);
  if (!p.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", image.c_str(), p.message().c_str());
    return 1;
  }
  if (!out.empty()) {
    Status s = write_npy_f32(out, {p->num_patches(), p->patch_dim}, p->pixels.data());
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.message().c_str());
      return 1;
    }
  }
  char hash[32];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(p->content_hash));
  nlohmann::json j{{"grid_thw", {p->grid_t, p->grid_h, p->grid_w}},
                   {"resized", {p->grid_h * config.patch_size, p->grid_w * config.patch_size}},
                   {"source", {rgb->height, rgb->width}},
                   {"tokens", p->num_tokens(config.merge_size)},
                   {"hash", hash}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

void register_image_patches(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("image-patches", "Decode and preprocess an image for the vision tower");
  static std::string image, preprocessor, out;
  cmd->add_option("--image", image, "JPEG, PNG, WebP or GIF file")->required();
  cmd->add_option("--preprocessor", preprocessor, "preprocessor_config.json (default: Qwen3.5's values)");
  cmd->add_option("--out", out, "Write the pixel values here (.npy, float32)");
  cmd->callback([&exit_code] { exit_code = run_image_patches(image, preprocessor, out); });
}
SPARKSERVE_COMMAND(register_image_patches);

}  // namespace
