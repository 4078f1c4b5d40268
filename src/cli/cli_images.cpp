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

}  // namespace sparkserve::cli
