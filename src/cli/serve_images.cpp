#include "cli/serve_images.h"

#include <filesystem>

#include "model/multimodal.h"

namespace sparkserve::cli {

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
