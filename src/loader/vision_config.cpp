#include "loader/vision_config.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace sparkserve {

using nlohmann::json;

Expected<VisionConfig> parse_vision_config(const std::string& text, const std::string& source, int text_hidden) {
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  VisionConfig c;
  if (root.is_discarded() || !root.is_object() || !root.contains("vision_config")) return c;
  const json& v = root["vision_config"];
  if (!v.is_object()) return make_error(source + ": vision_config must be an object");
  c.present = true;
  auto integer = [&](const json& obj, const std::string& where, const char* key, int& out, bool required,
                     int min_value) -> Status {
    if (!obj.contains(key) || obj[key].is_null()) {
      if (required) return make_error(source + ": " + where + key + " is missing");
      return Status::Ok();
    }
    const json& x = obj[key];
    if (!x.is_number_integer() || x.get<int64_t>() < min_value || x.get<int64_t>() > (1 << 30))
      return make_error(source + ": " + where + key + " must be an integer >= " + std::to_string(min_value));
    out = x.get<int>();
    return Status::Ok();
  };
  const std::string V = "vision_config.";
  // Absent sizes take transformers' Qwen3_5VisionConfig defaults.
  c.depth = 27;
  c.hidden_size = 1152;
  c.num_heads = 16;
  c.intermediate_size = 4304;
  c.out_hidden_size = 3584;
  c.num_position_embeddings = 2304;
  SS_RETURN_IF_ERROR(integer(v, V, "depth", c.depth, false, 1));
  SS_RETURN_IF_ERROR(integer(v, V, "hidden_size", c.hidden_size, false, 1));
  SS_RETURN_IF_ERROR(integer(v, V, "num_heads", c.num_heads, false, 1));
  SS_RETURN_IF_ERROR(integer(v, V, "intermediate_size", c.intermediate_size, false, 1));
  SS_RETURN_IF_ERROR(integer(v, V, "out_hidden_size", c.out_hidden_size, false, 1));
  SS_RETURN_IF_ERROR(integer(v, V, "in_channels", c.in_channels, false, 1));
  SS_RETURN_IF_ERROR(integer(v, V, "patch_size", c.patch_size, false, 1));
  SS_RETURN_IF_ERROR(integer(v, V, "temporal_patch_size", c.temporal_patch_size, false, 1));
  SS_RETURN_IF_ERROR(integer(v, V, "spatial_merge_size", c.spatial_merge_size, false, 1));
  SS_RETURN_IF_ERROR(integer(v, V, "num_position_embeddings", c.num_position_embeddings, false, 1));
  SS_RETURN_IF_ERROR(integer(root, "", "image_token_id", c.image_token_id, false, 0));
  SS_RETURN_IF_ERROR(integer(root, "", "video_token_id", c.video_token_id, false, 0));
  SS_RETURN_IF_ERROR(integer(root, "", "vision_start_token_id", c.vision_start_token_id, false, 0));
  SS_RETURN_IF_ERROR(integer(root, "", "vision_end_token_id", c.vision_end_token_id, false, 0));
  if (c.in_channels != 3) return make_error(source + ": vision_config.in_channels must be 3 (RGB)");
  if (c.hidden_size % c.num_heads != 0 || c.head_dim() % 4 != 0)
    return make_error(source + ": vision_config.hidden_size " + std::to_string(c.hidden_size) +
                      " must be num_heads times a head size divisible by 4 (the 2-D rotary)");
  const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(c.num_position_embeddings))));
  if (side * side != c.num_position_embeddings)
    return make_error(source + ": vision_config.num_position_embeddings must be a square (a grid of positions)");
  if (v.contains("hidden_act")) {
    if (!v["hidden_act"].is_string()) return make_error(source + ": vision_config.hidden_act must be a string");
    const std::string act = v["hidden_act"].get<std::string>();
    if (act == "gelu_pytorch_tanh") {
      c.gelu_tanh = true;
    } else if (act == "gelu") {
      c.gelu_tanh = false;
    } else {
      return make_error(source + ": vision_config.hidden_act \"" + act +
                        "\" is not supported (gelu_pytorch_tanh or gelu)");
    }
  }
  if (v.contains("deepstack_visual_indexes")) {
    const json& d = v["deepstack_visual_indexes"];
    if (!d.is_null() && !(d.is_array() && d.empty()))
      return make_error(source + ": vision_config.deepstack_visual_indexes is not empty (deepstack is not implemented)");
  }
  if (v.contains("rope_parameters") && v["rope_parameters"].is_object() &&
      v["rope_parameters"].contains("rope_theta")) {
    const json& t = v["rope_parameters"]["rope_theta"];
    if (!t.is_number() || !(t.get<double>() > 0))
      return make_error(source + ": vision_config.rope_parameters.rope_theta must be a positive number");
    c.rope_theta = t.get<double>();
  }
  // A tower whose output does not fit the text model is not used (the checkpoint's merger shapes
  // are checked against this config when its tensors load).
  if (c.out_hidden_size != text_hidden) c.present = false;
  return c;
}

}  // namespace sparkserve
