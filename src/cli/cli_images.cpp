#include "cli/cli_images.h"

#include <fstream>
#include <sstream>

namespace sparkserve::cli {

Expected<std::unique_ptr<MultimodalPrompt>> load_cli_images(const std::string& model_dir, const Qwen35Model& model,
                                                            const std::vector<std::string>& images,
                                                            std::vector<int32_t>& ids) {
  if (images.empty()) return std::unique_ptr<MultimodalPrompt>();
  if (!model.has_vision())
    return make_error("--image: the model in " + model_dir + " has no vision tower (config.json vision_config and "
                      "model.visual.* tensors)");
  const VisionConfig& vc = model.config().vision;
  SS_ASSIGN_OR_RETURN(media::PreprocessorConfig pre, load_model_preprocessor(model_dir, vc));
  std::vector<media::PatchedImage> patched;
  for (const std::string& path : images) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return make_error("--image: cannot open " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string bytes = ss.str();
    auto rgb = media::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (!rgb.ok()) return make_error("--image " + path + ": " + rgb.message());
    auto p = media::preprocess_image(*rgb, pre);
    if (!p.ok()) return make_error("--image " + path + ": " + p.message());
    patched.push_back(std::move(*p));
  }
  SS_ASSIGN_OR_RETURN(MultimodalPrompt mm, build_multimodal_prompt(ids, std::move(patched), vc));
  return std::make_unique<MultimodalPrompt>(std::move(mm));
}

void add_serve_image_flags(CLI::App* cmd, ServeImageFlags& f) {
  cmd->add_option("--allowed-local-media-path", f.allowed_local_media_path,
                  "Folder whose files requests may name as file:// image URLs (default: none; a security risk on shared hosts)");
  cmd->add_option("--limit-mm-per-prompt", f.limit_mm_per_prompt, "Images per prompt at most, as JSON: '{\"image\": 4}' (default 999)");
  cmd->add_option("--mm-processor-kwargs", f.mm_processor_kwargs,
                  "Image resize bounds overriding preprocessor_config.json, as JSON: '{\"max_pixels\": 1003520}'");
  cmd->add_option("--max-image-pixels", f.max_image_pixels, "Decoded image size (width x height) above which an image is refused")
      ->default_val(f.max_image_pixels);
}

Expected<ImageInputOptions> serve_image_options(const std::string& model_dir, const ModelConfig& config,
                                                const ServeImageFlags& f) {
  ImageInputOptions o;
  o.model_has_vision = config.vision.present;
  if (o.model_has_vision) {
    o.vision = config.vision;
    SS_ASSIGN_OR_RETURN(o.preprocessor, load_model_preprocessor(model_dir, o.vision));
  }
  if (!f.mm_processor_kwargs.empty()) SS_RETURN_IF_ERROR(apply_mm_processor_kwargs(f.mm_processor_kwargs, o.preprocessor));
  if (!f.limit_mm_per_prompt.empty()) {
    SS_ASSIGN_OR_RETURN(o.max_images_per_prompt, parse_limit_mm_per_prompt(f.limit_mm_per_prompt));
  }
  if (f.max_image_pixels < 1) return make_error("--max-image-pixels must be >= 1");
  o.max_image_pixels = f.max_image_pixels;
  if (!f.allowed_local_media_path.empty()) {
    std::error_code ec;
    const auto dir = std::filesystem::canonical(f.allowed_local_media_path, ec);
    if (ec || !std::filesystem::is_directory(dir))
      return make_error("--allowed-local-media-path " + f.allowed_local_media_path + " is not a folder");
    o.allowed_local_media_path = dir;
  }
  return o;
}

}  // namespace sparkserve::cli
