#include "loader/hf_config.h"

#include <climits>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

namespace sparkserve {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSupportedModelTypes = "qwen3_5_moe, qwen3_5 (text-only spellings: qwen3_5_moe_text, qwen3_5_text)";
// HF's own defaults where the config may omit a key (Qwen3_5*TextConfig.__init__).
constexpr int kDefaultFullAttentionInterval = 4;
constexpr double kDefaultPartialRotaryFactor = 0.25;
constexpr int kDefaultMaxPositionEmbeddings = 32768;
// Sizes beyond this cannot be real and would overflow the int products the model computes.
constexpr int64_t kMaxDerivedSize = INT32_MAX;

// A value for messages, never longer than a short line whatever the file holds.
std::string describe(const json& v) {
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s.size() > 40) {
      size_t cut = 40;
      while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // keep UTF-8 whole
      s = s.substr(0, cut) + "...";
    }
    return "\"" + s + "\"";
  }
  if (v.is_number() || v.is_boolean() || v.is_null()) return v.dump();
  return std::string("a JSON ") + v.type_name();
}

// One JSON object of the config ("" for the top level, "text_config." for the nested text part),
// with typed getters whose errors name the key as it is spelled in the file.
class Section {
 public:
  Section(const json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  std::string key_name(const std::string& key) const { return prefix_ + key; }
  Error error(const std::string& key, const std::string& what) const {
    return make_error(source_ + ": " + key_name(key) + " " + what);
  }
  Error error(const std::string& what) const { return make_error(source_ + ": " + what); }

  // nullptr when absent or null (HF writes unset optional keys as null).
  const json* get(const std::string& key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const std::string& key) const { return get(key) != nullptr; }

  Expected<int> integer(const std::string& key, int min_value) const {
    const json* v = get(key);
    if (!v) return error(key, "is missing (must be an integer >= " + std::to_string(min_value) + ")");
    return to_int(key, *v, min_value);
  }
  Expected<int> integer_or(const std::string& key, int min_value, int fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    return to_int(key, *v, min_value);
  }
  Expected<int> to_int(const std::string& key, const json& v, int min_value) const {
    std::string want = min_value == 1 ? "a positive integer" : "an integer >= " + std::to_string(min_value);
    if (!v.is_number_integer()) return error(key, "must be " + want + ", got " + describe(v));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(INT_MAX)
                               : (v.get<int64_t>() < min_value || v.get<int64_t>() > INT_MAX)) {
      return error(key, "must be " + want + " (at most " + std::to_string(INT_MAX) + "), got " + describe(v));
    }
    int value = static_cast<int>(v.get<int64_t>());
    if (value < min_value) return error(key, "must be " + want + ", got " + describe(v));
    return value;
  }
  Expected<bool> boolean_or(const std::string& key, bool fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) return error(key, "must be true or false, got " + describe(*v));
    return v->get<bool>();
  }
  Expected<std::optional<double>> number(const std::string& key) const {
    const json* v = get(key);
    if (!v) return std::optional<double>();
    if (!v->is_number()) return error(key, "must be a number, got " + describe(*v));
    double d = v->get<double>();
    if (!std::isfinite(d)) return error(key, "must be finite");
    return std::optional<double>(d);
  }
  Expected<std::optional<std::string>> string(const std::string& key) const {
    const json* v = get(key);
    if (!v) return std::optional<std::string>();
    if (!v->is_string()) return error(key, "must be a string, got " + describe(*v));
    return std::optional<std::string>(v->get<std::string>());
  }
  // A nested object, or nullptr when absent/null; any other type is an error.
  Expected<const json*> object(const std::string& key) const {
    const json* v = get(key);
    if (v && !v->is_object()) return error(key, "must be an object, got " + describe(*v));
    return v;
  }
  const json& raw() const { return obj_; }
  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

// Token ids: an int or a list of ints (HF accepts both for eos_token_id).
Expected<std::vector<int>> token_ids(const Section& s, const std::string& key) {
  std::vector<int> ids;
  const json* v = s.get(key);
  if (!v) return ids;
  if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) {
      SS_ASSIGN_OR_RETURN(int id, s.to_int(key + "[" + std::to_string(i) + "]", (*v)[i], 0));
      ids.push_back(id);
    }
    return ids;
  }
  if (!v->is_number_integer()) return s.error(key, "must be a token id or a list of token ids, got " + describe(*v));
  SS_ASSIGN_OR_RETURN(int id, s.to_int(key, *v, 0));
  ids.push_back(id);
  return ids;
}

// A rope field may sit in rope_parameters (current HF), in the legacy rope_scaling dict, or (for
// rope_theta / partial_rotary_factor) at the top level of the text config. The first place that
// has it wins; two places that disagree are an error, since either could be the intended one.
struct RopeSource {
  const json* obj;
  std::string name;  // "text_config.rope_parameters", "text_config", ...
};

Expected<const json*> rope_field(const Section& s, const std::vector<RopeSource>& sources,
                                 const std::vector<std::string>& spellings, std::string* where) {
  const json* found = nullptr;
  for (const RopeSource& src : sources) {
    if (!src.obj) continue;
    for (const std::string& key : spellings) {
      auto it = src.obj->find(key);
      if (it == src.obj->end() || it->is_null()) continue;
      std::string here = src.name.empty() ? key : src.name + "." + key;
      if (!found) {
        found = &*it;
        *where = here;
      } else if (*found != *it) {
        return s.error(*where + " (" + describe(*found) + ") and " + here + " (" + describe(*it) + ") disagree");
      }
    }
  }
  return found;
}

Status parse_rope(const Section& text, ModelConfig& cfg) {
  SS_ASSIGN_OR_RETURN(const json* params, text.object("rope_parameters"));
  SS_ASSIGN_OR_RETURN(const json* scaling, text.object("rope_scaling"));
  std::string p = text.prefix();
  const std::string text_name = p.empty() ? "" : p.substr(0, p.size() - 1);
  const std::vector<RopeSource> dicts = {{params, p + "rope_parameters"}, {scaling, p + "rope_scaling"}};
  std::vector<RopeSource> dicts_and_top = dicts;
  dicts_and_top.push_back({&text.raw(), text_name});
  std::string where;

  // Only plain RoPE frequencies are implemented; "mrope" is the old name of the same thing with
  // M-RoPE sections (transformers maps it to "default").
  SS_ASSIGN_OR_RETURN(const json* type, rope_field(text, dicts, {"rope_type", "type"}, &where));
  if (type) {
    if (!type->is_string()) return text.error(where + " must be a string, got " + describe(*type));
    const std::string t = type->get<std::string>();
    if (t != "default" && t != "mrope")
      return text.error(where + " " + describe(*type) + " is not supported (supported: default, mrope)");
  }

  SS_ASSIGN_OR_RETURN(const json* theta, rope_field(text, dicts_and_top, {"rope_theta"}, &where));
  if (!theta) return text.error(p + "rope_parameters.rope_theta is missing");
  if (!theta->is_number() || !(theta->get<double>() > 0) || !std::isfinite(theta->get<double>()))
    return text.error(where + " must be a positive number, got " + describe(*theta));
  cfg.rope_theta = theta->get<double>();

  double factor = kDefaultPartialRotaryFactor;
  SS_ASSIGN_OR_RETURN(const json* prf, rope_field(text, dicts_and_top, {"partial_rotary_factor"}, &where));
  if (prf) {
    if (!prf->is_number() || !(prf->get<double>() > 0.0 && prf->get<double>() <= 1.0))
      return text.error(where + " must be a number in (0, 1], got " + describe(*prf));
    factor = prf->get<double>();
  } else {
    where = p + "rope_parameters.partial_rotary_factor";
  }
  cfg.partial_rotary_factor = static_cast<float>(factor);
  // HF computes int(head_dim * factor) in double; rotary_dim() does it in float. Refuse factors
  // where the two could differ rather than silently rotate a different number of dims.
  const int rotary_dim = static_cast<int>(cfg.head_dim * factor);
  if (cfg.rotary_dim() != rotary_dim)
    return text.error(where + " (" + std::to_string(factor) + ") gives a rotary dim that is not exact in float");
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > cfg.head_dim) {
    return text.error(where + " gives rotary dim " + std::to_string(rotary_dim) + " = int(head_dim " +
                      std::to_string(cfg.head_dim) + " * " + std::to_string(factor) +
                      "), which must be even, positive and at most head_dim");
  }

  SS_ASSIGN_OR_RETURN(const json* section, rope_field(text, dicts, {"mrope_section"}, &where));
  cfg.mrope_section.clear();
  if (section) {
    if (!section->is_array() || section->empty())
      return text.error(where + " must be a non-empty list of integers, got " + describe(*section));
    int64_t sum = 0;
    for (size_t i = 0; i < section->size(); ++i) {
      const json& v = (*section)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT_MAX)
        return text.error(where + "[" + std::to_string(i) + "] must be a non-negative integer, got " + describe(v));
      cfg.mrope_section.push_back(static_cast<int>(v.get<int64_t>()));
      sum += v.get<int64_t>();
    }
    if (sum != rotary_dim / 2) {
      return text.error(where + " sums to " + std::to_string(sum) + " but must sum to rotary_dim/2 = " +
                        std::to_string(rotary_dim / 2));
    }
  }
  SS_ASSIGN_OR_RETURN(const json* interleaved, rope_field(text, dicts, {"mrope_interleaved"}, &where));
  cfg.mrope_interleaved = false;
  if (interleaved) {
    if (!interleaved->is_boolean()) return text.error(where + " must be true or false, got " + describe(*interleaved));
    cfg.mrope_interleaved = interleaved->get<bool>();
  }
  return Status::Ok();
}

Status parse_layer_types(const Section& text, ModelConfig& cfg) {
  const int n = cfg.num_hidden_layers;
  const json* types = text.get("layer_types");
  const bool has_interval = text.has("full_attention_interval");
  SS_ASSIGN_OR_RETURN(int interval, text.integer_or("full_attention_interval", 1, kDefaultFullAttentionInterval));
  auto from_interval = [&](int i) {
    return (i + 1) % interval == 0 ? LayerType::kFullAttention : LayerType::kLinearAttention;
  };
  cfg.layer_types.clear();
  if (!types) {
    for (int i = 0; i < n; ++i) cfg.layer_types.push_back(from_interval(i));
    return Status::Ok();
  }
  if (!types->is_array()) return text.error("layer_types", "must be a list, got " + describe(*types));
  if (types->size() != static_cast<size_t>(n)) {
    return text.error("layer_types", "has " + std::to_string(types->size()) + " entries but " +
                                         text.key_name("num_hidden_layers") + " is " + std::to_string(n));
  }
  for (int i = 0; i < n; ++i) {
    const json& t = (*types)[static_cast<size_t>(i)];
    const std::string key = "layer_types[" + std::to_string(i) + "]";
    if (t == "linear_attention") {
      cfg.layer_types.push_back(LayerType::kLinearAttention);
    } else if (t == "full_attention") {
      cfg.layer_types.push_back(LayerType::kFullAttention);
    } else {
      return text.error(key, "must be \"linear_attention\" or \"full_attention\", got " + describe(t));
    }
    if (has_interval && cfg.layer_types.back() != from_interval(i)) {
      return text.error(text.key_name(key) + " (" + describe(t) + ") disagrees with " + text.key_name("full_attention_interval") +
                        " (" + std::to_string(interval) + ")");
    }
  }
  return Status::Ok();
}

Status check_product(const Section& text, const std::string& what, int64_t a, int64_t b) {
  if (a * b > kMaxDerivedSize) return text.error(what + " = " + std::to_string(a * b) + " is implausibly large");
  return Status::Ok();
}

Expected<ModelConfig> parse_text(const Section& root, const Section& text, ModelConfig cfg) {
  // Keys whose values this engine hard-wires: refuse configs that ask for something else.
  SS_ASSIGN_OR_RETURN(auto act, text.string("hidden_act"));
  if (act && *act != "silu") return text.error("hidden_act", "\"" + *act + "\" is not supported (only silu)");
  SS_ASSIGN_OR_RETURN(bool attention_bias, text.boolean_or("attention_bias", false));
  if (attention_bias) return text.error("attention_bias", "true is not supported (Qwen3.5 has no attention bias)");
  if (const json* mlp_only = text.get("mlp_only_layers"); mlp_only && !(mlp_only->is_array() && mlp_only->empty()))
    return text.error("mlp_only_layers", "must be empty (every Qwen3.5 MoE layer is sparse), got " + describe(*mlp_only));

  SS_ASSIGN_OR_RETURN(cfg.hidden_size, text.integer("hidden_size", 1));
  SS_ASSIGN_OR_RETURN(cfg.num_hidden_layers, text.integer("num_hidden_layers", 1));
  SS_ASSIGN_OR_RETURN(cfg.vocab_size, text.integer("vocab_size", 1));
  SS_ASSIGN_OR_RETURN(auto eps, text.number("rms_norm_eps"));
  if (eps && !(*eps > 0 && *eps < 1)) return text.error("rms_norm_eps", "must be in (0, 1), got " + std::to_string(*eps));
  cfg.rms_norm_eps = eps ? static_cast<float>(*eps) : 1e-6f;
  SS_ASSIGN_OR_RETURN(cfg.max_position_embeddings,
                      text.integer_or("max_position_embeddings", 1, kDefaultMaxPositionEmbeddings));

  // tie_word_embeddings lives at the top level of nested configs, and sometimes in text_config too.
  SS_ASSIGN_OR_RETURN(bool tie_text, text.boolean_or("tie_word_embeddings", false));
  SS_ASSIGN_OR_RETURN(bool tie_root, root.boolean_or("tie_word_embeddings", false));
  if (&root.raw() != &text.raw() && root.has("tie_word_embeddings") && text.has("tie_word_embeddings") &&
      tie_text != tie_root) {
    return root.error("tie_word_embeddings and " + text.key_name("tie_word_embeddings") + " disagree");
  }
  cfg.tie_word_embeddings = text.has("tie_word_embeddings") ? tie_text : tie_root;

  // Full attention.
  SS_ASSIGN_OR_RETURN(cfg.num_attention_heads, text.integer("num_attention_heads", 1));
  SS_ASSIGN_OR_RETURN(cfg.num_key_value_heads, text.integer("num_key_value_heads", 1));
  if (cfg.num_attention_heads % cfg.num_key_value_heads != 0) {
    return text.error(text.key_name("num_attention_heads") + " (" + std::to_string(cfg.num_attention_heads) +
                      ") must be a multiple of num_key_value_heads (" + std::to_string(cfg.num_key_value_heads) + ")");
  }
  if (text.has("head_dim")) {
    SS_ASSIGN_OR_RETURN(cfg.head_dim, text.integer("head_dim", 1));
  } else {
    if (cfg.hidden_size % cfg.num_attention_heads != 0) {
      return text.error("head_dim", "is missing and hidden_size (" + std::to_string(cfg.hidden_size) +
                                        ") is not a multiple of num_attention_heads (" +
                                        std::to_string(cfg.num_attention_heads) + ")");
    }
    cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
  }
  SS_RETURN_IF_ERROR(check_product(text, text.key_name("num_attention_heads * head_dim * 2"),
                                   int64_t{2} * cfg.num_attention_heads, cfg.head_dim));
  SS_ASSIGN_OR_RETURN(cfg.attn_output_gate, text.boolean_or("attn_output_gate", true));
  SS_RETURN_IF_ERROR(parse_rope(text, cfg));

  // Gated DeltaNet.
  SS_ASSIGN_OR_RETURN(cfg.linear_num_key_heads, text.integer("linear_num_key_heads", 1));
  SS_ASSIGN_OR_RETURN(cfg.linear_num_value_heads, text.integer("linear_num_value_heads", 1));
  SS_ASSIGN_OR_RETURN(cfg.linear_key_head_dim, text.integer("linear_key_head_dim", 1));
  SS_ASSIGN_OR_RETURN(cfg.linear_value_head_dim, text.integer("linear_value_head_dim", 1));
  SS_ASSIGN_OR_RETURN(cfg.linear_conv_kernel_dim, text.integer("linear_conv_kernel_dim", 1));
  if (cfg.linear_num_value_heads % cfg.linear_num_key_heads != 0) {
    return text.error(text.key_name("linear_num_value_heads") + " (" + std::to_string(cfg.linear_num_value_heads) +
                      ") must be a multiple of linear_num_key_heads (" + std::to_string(cfg.linear_num_key_heads) +
                      ")");
  }
  const int64_t key_dim = int64_t{cfg.linear_num_key_heads} * cfg.linear_key_head_dim;
  const int64_t value_dim = int64_t{cfg.linear_num_value_heads} * cfg.linear_value_head_dim;
  SS_RETURN_IF_ERROR(check_product(text, text.key_name("linear conv dim (2*key_dim + value_dim)"), 1,
                                   2 * key_dim + value_dim));

  // MLP.
  if (cfg.is_moe) {
    SS_ASSIGN_OR_RETURN(cfg.num_experts, text.integer("num_experts", 1));
    SS_ASSIGN_OR_RETURN(cfg.num_experts_per_tok, text.integer("num_experts_per_tok", 1));
    SS_ASSIGN_OR_RETURN(cfg.moe_intermediate_size, text.integer("moe_intermediate_size", 1));
    SS_ASSIGN_OR_RETURN(cfg.shared_expert_intermediate_size, text.integer("shared_expert_intermediate_size", 1));
    if (cfg.num_experts_per_tok > cfg.num_experts) {
      return text.error(text.key_name("num_experts_per_tok") + " (" + std::to_string(cfg.num_experts_per_tok) +
                        ") must be at most num_experts (" + std::to_string(cfg.num_experts) + ")");
    }
    SS_RETURN_IF_ERROR(check_product(text, text.key_name("num_experts * moe_intermediate_size * 2"),
                                     int64_t{2} * cfg.num_experts, cfg.moe_intermediate_size));
  } else {
    SS_ASSIGN_OR_RETURN(cfg.intermediate_size, text.integer("intermediate_size", 1));
  }

  SS_ASSIGN_OR_RETURN(cfg.mtp_num_hidden_layers, text.integer_or("mtp_num_hidden_layers", 0, 0));
  SS_RETURN_IF_ERROR(parse_layer_types(text, cfg));

  // Special tokens: text_config first, then the top level.
  const Section& ids_from = text.has("eos_token_id") ? text : root;
  SS_ASSIGN_OR_RETURN(cfg.eos_token_ids, token_ids(ids_from, "eos_token_id"));
  const Section& bos_from = text.has("bos_token_id") ? text : root;
  if (bos_from.has("bos_token_id")) {
    SS_ASSIGN_OR_RETURN(int bos, bos_from.integer("bos_token_id", 0));
    cfg.bos_token_id = bos;
  }
  return cfg;
}

// "qwen3_5_moe_text" -> "qwen3_5_moe"; empty when not a supported type.
std::string family_of(const std::string& model_type) {
  for (const char* family : {"qwen3_5_moe", "qwen3_5"}) {
    if (model_type == family || model_type == std::string(family) + "_text") return family;
  }
  return "";
}

}  // namespace

Expected<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json root_json = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root_json.is_discarded()) return make_error(source + ": not well-formed JSON");
  if (!root_json.is_object()) return make_error(source + ": expected a JSON object, got " + describe(root_json));
  try {
    Section root(root_json, source, "");
    ModelConfig cfg;
    SS_ASSIGN_OR_RETURN(auto model_type, root.string("model_type"));
    if (!model_type) return root.error("model_type", std::string("is missing (supported: ") + kSupportedModelTypes + ")");
    cfg.model_type = family_of(*model_type);
    if (cfg.model_type.empty()) {
      return root.error("model_type", "\"" + *model_type + "\" is not supported (supported: " +
                                          kSupportedModelTypes + ")");
    }
    cfg.is_moe = cfg.model_type == "qwen3_5_moe";

    if (const json* archs = root.get("architectures")) {
      if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
        return root.error("architectures", "must be a non-empty list of class names, got " + describe(*archs));
      cfg.architecture = (*archs)[0].get<std::string>();
    }

    SS_ASSIGN_OR_RETURN(const json* text_json, root.object("text_config"));
    if (!text_json) return parse_text(root, root, cfg);

    cfg.nested_text_config = true;
    Section text(*text_json, source, "text_config.");
    SS_ASSIGN_OR_RETURN(auto text_type, text.string("model_type"));
    if (text_type && family_of(*text_type) != cfg.model_type) {
      return text.error("model_type", "\"" + *text_type + "\" does not match the top-level model_type \"" +
                                          *model_type + "\" (expected " + cfg.model_type + "_text)");
    }
    SS_ASSIGN_OR_RETURN(cfg, parse_text(root, text, cfg));
    SS_ASSIGN_OR_RETURN(cfg.vision, parse_vision_config(json_text, source, cfg.hidden_size));
    return cfg;
  } catch (const json::exception& e) {
    // Every access above is type-checked first; this is the last line of defence for bad input.
    return make_error(source + ": invalid config: " + e.what());
  }
}

Expected<ModelConfig> load_model_config(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return make_error(path.string() + ": file not found");
  auto size = fs::file_size(path, ec);
  if (ec) return make_error(path.string() + ": cannot read: " + ec.message());
  if (size > 64 * 1024 * 1024) return make_error(path.string() + ": implausibly large for a config");
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) return make_error(path.string() + ": read error");
  return parse_model_config(text, path.string());
}

}  // namespace sparkserve
