#include "model/load.h"

#include "loader/safetensors.h"

namespace sparkserve {

Expected<std::unique_ptr<Qwen35Model>> load_qwen35(const std::filesystem::path& dir, Backend& backend,
                                                   std::vector<std::string>* notes, const LoadOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return make_error(dir.string() + ": not a model directory");
  SS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  SS_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  SS_ASSIGN_OR_RETURN(ModelWeights weights, load_weights(ckpt, config, backend, options));
  if (notes) *notes = weights.report.notes();
  return std::make_unique<Qwen35Model>(backend, std::move(config), std::move(weights));
}

}  // namespace sparkserve
