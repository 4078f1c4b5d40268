#include "loader/quant_config.h"

#include <fstream>
#include <sstream>

namespace sparkserve {

using json = nlohmann::ordered_json;

std::string_view quant_strategy_name(QuantStrategy s) {
  switch (s) {
    case QuantStrategy::kTensor: return "tensor";
    case QuantStrategy::kChannel: return "channel";
    case QuantStrategy::kGroup: return "group";
    case QuantStrategy::kBlock: return "block";
    case QuantStrategy::kToken: return "token";
    case QuantStrategy::kTensorGroup: return "tensor_group";
    case QuantStrategy::kAttnHead: return "attn_head";
  }
  return "?";
}

namespace {

std::string dump_short(const json& j) {
  std::string s = j.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

Expected<QuantArgs> parse_args(const json& j, const std::string& where) {
  if (!j.is_object()) return make_error(where + " must be an object, got " + dump_short(j));
  QuantArgs a;
  if (j.contains("num_bits") && !j["num_bits"].is_null()) {
    if (!j["num_bits"].is_number_integer()) return make_error(where + ".num_bits must be an integer");
    a.num_bits = j["num_bits"].get<int>();
  }
  if (j.contains("type") && !j["type"].is_null()) {
    if (!j["type"].is_string()) return make_error(where + ".type must be a string");
    std::string t = j["type"].get<std::string>();
    if (t == "float") a.is_float = true;
    else if (t == "int") a.is_float = false;
    else return make_error(where + ".type must be \"int\" or \"float\", got \"" + t + "\"");
  }
  if (j.contains("symmetric") && !j["symmetric"].is_null()) {
    if (!j["symmetric"].is_boolean()) return make_error(where + ".symmetric must be a boolean");
    a.symmetric = j["symmetric"].get<bool>();
  }
  if (j.contains("group_size") && !j["group_size"].is_null()) {
    if (!j["group_size"].is_number_integer()) return make_error(where + ".group_size must be an integer or null");
    a.group_size = j["group_size"].get<int>();
  }
  bool have_strategy = false;
  if (j.contains("strategy") && !j["strategy"].is_null()) {
    if (!j["strategy"].is_string()) return make_error(where + ".strategy must be a string");
    std::string s = j["strategy"].get<std::string>();
    have_strategy = true;
    if (s == "tensor") a.strategy = QuantStrategy::kTensor;
    else if (s == "channel") a.strategy = QuantStrategy::kChannel;
    else if (s == "group") a.strategy = QuantStrategy::kGroup;
    else if (s == "block") a.strategy = QuantStrategy::kBlock;
    else if (s == "token") a.strategy = QuantStrategy::kToken;
    else if (s == "tensor_group") a.strategy = QuantStrategy::kTensorGroup;
    else if (s == "attn_head") a.strategy = QuantStrategy::kAttnHead;
    else return make_error(where + ".strategy \"" + s + "\" is unknown (tensor, channel, group, block, token, tensor_group, attn_head)");
  }
  if (!have_strategy) {  // compressed-tensors infers it from group_size
    if (!a.group_size) a.strategy = QuantStrategy::kTensor;
    else if (*a.group_size > 0) a.strategy = QuantStrategy::kGroup;
    else if (*a.group_size == -1) a.strategy = QuantStrategy::kChannel;
  }
  if (j.contains("dynamic") && !j["dynamic"].is_null()) {
    const json& d = j["dynamic"];
    if (d.is_boolean()) a.dynamic = d.get<bool>() ? DynamicKind::kDynamic : DynamicKind::kStatic;
    else if (d.is_string() && d.get<std::string>() == "local") a.dynamic = DynamicKind::kLocal;
    else return make_error(where + ".dynamic must be true, false or \"local\", got " + dump_short(d));
    if (a.dynamic == DynamicKind::kLocal && a.strategy != QuantStrategy::kTensorGroup)
      return make_error(where + ".dynamic \"local\" is only legal with strategy tensor_group");
  }
  if (j.contains("block_structure") && !j["block_structure"].is_null()) {
    const json& b = j["block_structure"];
    if (b.is_array()) {
      for (const auto& v : b) {
        if (!v.is_number_integer()) return make_error(where + ".block_structure must hold integers");
        a.block_structure.push_back(v.get<int>());
      }
    } else if (b.is_string()) {  // "128x128"
      std::string s = b.get<std::string>();
      auto x = s.find('x');
      if (x == std::string::npos) return make_error(where + ".block_structure \"" + s + "\" is not RxC");
      a.block_structure = {std::atoi(s.substr(0, x).c_str()), std::atoi(s.substr(x + 1).c_str())};
    } else {
      return make_error(where + ".block_structure must be a list or \"RxC\"");
    }
  }
  return a;
}

std::string args_text(const QuantArgs& a) {
  return std::string(a.is_float ? "float" : "int") + std::to_string(a.num_bits) + " " +
         std::string(quant_strategy_name(a.strategy)) +
         (a.group_size ? " group_size " + std::to_string(*a.group_size) : "");
}

bool is_nvfp4_args(const QuantArgs& a) {
  return a.is_float && a.num_bits == 4 && a.strategy == QuantStrategy::kTensorGroup && a.group_size == 16;
}

// The scheme a compressed-tensors group asks for; refuses what we cannot run.
Expected<QuantScheme> ct_group_scheme(QuantGroup& g, const std::string& where) {
  std::string format = g.format;
  if (!g.weights) {
    if (format == "dense") return QuantScheme{false, WeightFormat::kBf16, ActivationQuant::kNone, "dense"};
    return make_error(where + " has no weights args; activation-only quantization is not supported");
  }
  const QuantArgs& w = *g.weights;
  if (format.empty() || format == "mixed-precision") {  // infer from the args, as compressed-tensors does
    if (is_nvfp4_args(w)) format = "nvfp4-pack-quantized";
    else if (w.is_float && w.num_bits == 8) format = "float-quantized";
    else if (!w.is_float && w.num_bits == 4) format = "pack-quantized";
    else if (!w.is_float && w.num_bits == 8) format = "int-quantized";
    else format = "(none)";
    g.format = format;
  }
  if (format == "dense")
    return QuantScheme{false, WeightFormat::kBf16, ActivationQuant::kNone, "dense (weights stored unquantized)"};
  if (format == "pack-quantized")
    return make_error(where + " uses format pack-quantized (integer " + std::to_string(w.num_bits) +
                      "-bit weights): int4/int8 weights are not supported (supported: nvfp4-pack-quantized, "
                      "float-quantized/naive-quantized FP8, dense)");
  if (format == "int-quantized" || (!w.is_float))
    return make_error(where + " uses integer weights (" + args_text(w) + ", format " + format +
                      "): integer quantization is not supported");
  if (format == "mxfp4-pack-quantized" || format == "mxfp8-quantized")
    return make_error(where + " uses format " + format + ": MX formats are not supported");
  if (!w.symmetric) return make_error(where + ".weights is asymmetric: only symmetric quantization is supported");
  if (format == "nvfp4-pack-quantized") {
    if (!is_nvfp4_args(w))
      return make_error(where + " has format nvfp4-pack-quantized but weights are " + args_text(w) +
                        " (NVFP4 needs float4 tensor_group group_size 16)");
    if (!g.input_activations)
      return QuantScheme{true, WeightFormat::kNvfp4, ActivationQuant::kNone, "nvfp4-pack-quantized W4A16"};
    const QuantArgs& a = *g.input_activations;
    if (!is_nvfp4_args(a))
      return make_error(where + ".input_activations are " + args_text(a) +
                        ": with NVFP4 weights only NVFP4 activations (float4 tensor_group 16) are supported");
    if (a.dynamic == DynamicKind::kDynamic)
      return make_error(where + ".input_activations dynamic=true (dynamic global scale) is not supported; "
                        "NVFP4 activations need dynamic \"local\" with a stored input_global_scale");
    return QuantScheme{true, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, "nvfp4-pack-quantized W4A4"};
  }
  if (format == "float-quantized" || format == "naive-quantized") {
    if (w.num_bits != 8)
      return make_error(where + " has format " + format + " but weights are " + args_text(w) + " (FP8 needs float8)");
    QuantScheme s;
    s.quantized = true;
    if (w.strategy == QuantStrategy::kChannel) s.weight = WeightFormat::kFp8Channel;
    else if (w.strategy == QuantStrategy::kTensor) s.weight = WeightFormat::kFp8Tensor;
    else
      return make_error(where + ".weights strategy " + std::string(quant_strategy_name(w.strategy)) +
                        " is not supported for FP8 (supported: channel, tensor)");
    s.description = format + " FP8 " + std::string(quant_strategy_name(w.strategy));
    if (!g.input_activations) {
      s.activation = ActivationQuant::kNone;
      s.description += ", weight-only";
      return s;
    }
    const QuantArgs& a = *g.input_activations;
    if (!a.is_float || a.num_bits != 8 || !a.symmetric)
      return make_error(where + ".input_activations are " + args_text(a) + ": FP8 weights need symmetric float8 activations");
    if (a.dynamic == DynamicKind::kDynamic && a.strategy == QuantStrategy::kToken) {
      s.activation = ActivationQuant::kFp8TokenDynamic;
      s.description += ", dynamic per-token activations";
    } else if (a.dynamic == DynamicKind::kStatic && a.strategy == QuantStrategy::kTensor) {
      s.activation = ActivationQuant::kFp8TensorStatic;
      s.description += ", static per-tensor activations";
    } else {
      return make_error(where + ".input_activations " + args_text(a) + " dynamic=" +
                        (a.dynamic == DynamicKind::kDynamic ? "true" : "false") +
                        " is not supported (supported: dynamic token, static tensor)");
    }
    return s;
  }
  return make_error(where + " has unknown format \"" + format + "\"");
}

// compressed-tensors preset names usable as a config_groups key with a bare list of targets.
std::optional<QuantGroup> preset_group(const std::string& name) {
  QuantArgs nvfp4{4, true, true, 16, QuantStrategy::kTensorGroup, DynamicKind::kStatic, {}};
  QuantArgs nvfp4_act = nvfp4;
  nvfp4_act.dynamic = DynamicKind::kLocal;
  QuantArgs fp8_channel{8, true, true, std::nullopt, QuantStrategy::kChannel, DynamicKind::kStatic, {}};
  QuantArgs fp8_tensor{8, true, true, std::nullopt, QuantStrategy::kTensor, DynamicKind::kStatic, {}};
  QuantArgs fp8_token{8, true, true, std::nullopt, QuantStrategy::kToken, DynamicKind::kDynamic, {}};
  QuantGroup g;
  g.name = name;
  if (name == "NVFP4") { g.weights = nvfp4; g.input_activations = nvfp4_act; g.format = "nvfp4-pack-quantized"; }
  else if (name == "NVFP4A16") { g.weights = nvfp4; g.format = "nvfp4-pack-quantized"; }
  else if (name == "FP8_DYNAMIC") { g.weights = fp8_channel; g.input_activations = fp8_token; g.format = "float-quantized"; }
  else if (name == "FP8") { g.weights = fp8_tensor; g.input_activations = fp8_tensor; g.format = "float-quantized"; }
  else return std::nullopt;
  return g;
}

Expected<std::vector<std::string>> string_list(const json& j, const std::string& where) {
  std::vector<std::string> out;
  if (j.is_null()) return out;
  if (!j.is_array()) return make_error(where + " must be a list of strings");
  for (const auto& v : j) {
    if (!v.is_string()) return make_error(where + " must hold only strings, got " + dump_short(v));
    out.push_back(v.get<std::string>());
  }
  return out;
}

Expected<QuantConfig> parse_compressed_tensors(const json& q, const std::string& src) {
  QuantConfig c;
  c.method = QuantMethod::kCompressedTensors;
  c.source = src;
  if (q.contains("format") && q["format"].is_string()) c.format = q["format"].get<std::string>();
  if (q.contains("quantization_status") && q["quantization_status"].is_string())
    c.quantization_status = q["quantization_status"].get<std::string>();
  if (!c.quantization_status.empty() && c.quantization_status != "compressed")
    return make_error(src + ".quantization_status \"" + c.quantization_status +
                      "\": only checkpoints saved compressed are supported");
  if (q.contains("transform_config") && !q["transform_config"].is_null() &&
      !(q["transform_config"].is_object() && q["transform_config"].empty()))
    return make_error(src + ".transform_config is not empty: the weights were rotated (Hadamard/SpinQuant-style "
                      "transforms), which sparkserve does not implement");
  if (q.contains("sparsity_config") && !q["sparsity_config"].is_null() &&
      !(q["sparsity_config"].is_object() && q["sparsity_config"].empty()))
    return make_error(src + ".sparsity_config is not empty: sparse (compressed) weights are not supported");
  if (!q.contains("config_groups") || !q["config_groups"].is_object())
    return make_error(src + ".config_groups is missing or not an object");
  for (const auto& [name, g] : q["config_groups"].items()) {
    const std::string where = src + ".config_groups." + name;
    QuantGroup group;
    group.name = name;
    if (g.is_array()) {  // preset name -> bare list of targets
      auto preset = preset_group(name);
      if (!preset) return make_error(where + " is a list of targets, but \"" + name + "\" is not a known preset "
                                     "(NVFP4, NVFP4A16, FP8_DYNAMIC, FP8)");
      group = *preset;
      SS_ASSIGN_OR_RETURN(group.targets, string_list(g, where));
    } else if (g.is_object()) {
      if (!g.contains("targets")) return make_error(where + ".targets is missing");
      SS_ASSIGN_OR_RETURN(group.targets, string_list(g["targets"], where + ".targets"));
      if (g.contains("weights") && !g["weights"].is_null()) {
        SS_ASSIGN_OR_RETURN(group.weights, parse_args(g["weights"], where + ".weights"));
      }
      if (g.contains("input_activations") && !g["input_activations"].is_null()) {
        SS_ASSIGN_OR_RETURN(group.input_activations, parse_args(g["input_activations"], where + ".input_activations"));
      }
      if (g.contains("output_activations") && !g["output_activations"].is_null())
        return make_error(where + ".output_activations is set: output quantization is not supported");
      if (g.contains("format") && g["format"].is_string()) group.format = g["format"].get<std::string>();
    } else {
      return make_error(where + " must be an object");
    }
    if (group.format.empty() && c.format != "mixed-precision") group.format = c.format;
    if (group.targets.empty()) return make_error(where + ".targets is empty");
    SS_ASSIGN_OR_RETURN(group.scheme, ct_group_scheme(group, where));
    c.groups.push_back(std::move(group));
  }
  if (q.contains("ignore")) {
    SS_ASSIGN_OR_RETURN(c.ignore, string_list(q["ignore"], src + ".ignore"));
  }
  if (q.contains("kv_cache_scheme") && !q["kv_cache_scheme"].is_null()) {
    SS_ASSIGN_OR_RETURN(c.kv_cache, parse_args(q["kv_cache_scheme"], src + ".kv_cache_scheme"));
    if (!c.kv_cache->is_float || c.kv_cache->num_bits != 8)
      return make_error(src + ".kv_cache_scheme is " + args_text(*c.kv_cache) + ": only FP8 KV caches are supported");
  }
  return c;
}

Expected<QuantScheme> modelopt_algo_scheme(const std::string& algo, const std::string& where) {
  if (algo == "NVFP4") return QuantScheme{true, WeightFormat::kNvfp4ModelOpt, ActivationQuant::kNvfp4, "modelopt NVFP4 W4A4"};
  if (algo == "W4A16_NVFP4")
    return QuantScheme{true, WeightFormat::kNvfp4ModelOpt, ActivationQuant::kNone, "modelopt NVFP4 W4A16"};
  if (algo == "FP8")
    return QuantScheme{true, WeightFormat::kFp8Tensor, ActivationQuant::kFp8TensorStatic, "modelopt FP8 per-tensor, static input scale"};
  if (algo == "FP8_PER_CHANNEL_PER_TOKEN")
    return QuantScheme{true, WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic,
                       "modelopt FP8 per-channel, dynamic per-token"};
  return make_error(where + " quant_algo \"" + algo +
                    "\" is not supported (supported: NVFP4, W4A16_NVFP4, FP8, FP8_PER_CHANNEL_PER_TOKEN, MIXED_PRECISION)");
}

// `q` holds quant_algo etc. (hf_quant_config.json's "quantization" object, or config.json's
// quantization_config with quant_method "modelopt").
Expected<QuantConfig> parse_modelopt(const json& q, const std::string& src) {
  QuantConfig c;
  c.method = QuantMethod::kModelOpt;
  c.source = src;
  if (!q.contains("quant_algo") || !q["quant_algo"].is_string())
    return make_error(src + ".quant_algo is missing or not a string");
  c.quant_algo = q["quant_algo"].get<std::string>();
  if (q.contains("group_size") && !q["group_size"].is_null()) {
    if (!q["group_size"].is_number_integer()) return make_error(src + ".group_size must be an integer");
    c.group_size = q["group_size"].get<int>();
  }
  for (const char* key : {"exclude_modules", "ignore"}) {
    if (q.contains(key)) {
      SS_ASSIGN_OR_RETURN(auto list, string_list(q[key], src + "." + key));
      c.exclude_modules.insert(c.exclude_modules.end(), list.begin(), list.end());
    }
  }
  // Newer exports describe the KV cache as kv_cache_scheme {num_bits: 8, type: "float", ...}.
  if (q.contains("kv_cache_scheme") && q["kv_cache_scheme"].is_object()) {
    SS_ASSIGN_OR_RETURN(QuantArgs kv, parse_args(q["kv_cache_scheme"], src + ".kv_cache_scheme"));
    if (!kv.is_float || kv.num_bits != 8)
      return make_error(src + ".kv_cache_scheme is " + args_text(kv) + ": only FP8 KV caches are supported");
    c.kv_cache_quant_algo = "FP8";
  }
  if (q.contains("kv_cache_quant_algo") && q["kv_cache_quant_algo"].is_string()) {
    c.kv_cache_quant_algo = q["kv_cache_quant_algo"].get<std::string>();
    if (c.kv_cache_quant_algo != "FP8")
      return make_error(src + ".kv_cache_quant_algo \"" + c.kv_cache_quant_algo + "\" is not supported (FP8 or null)");
  }
  if (c.quant_algo == "MIXED_PRECISION") {
    if (!q.contains("quantized_layers") || !q["quantized_layers"].is_object())
      return make_error(src + ".quantized_layers is missing: MIXED_PRECISION needs a per-layer map");
    for (const auto& [name, layer] : q["quantized_layers"].items()) {
      const std::string where = src + ".quantized_layers." + name;
      if (!layer.is_object() || !layer.contains("quant_algo") || !layer["quant_algo"].is_string())
        return make_error(where + ".quant_algo is missing");
      SS_ASSIGN_OR_RETURN(QuantScheme s, modelopt_algo_scheme(layer["quant_algo"].get<std::string>(), where));
      if (layer.contains("group_size") && layer["group_size"].is_number_integer() && is_nvfp4(s.weight) &&
          layer["group_size"].get<int>() != 16)
        return make_error(where + ".group_size must be 16 for NVFP4");
      c.quantized_layers.emplace_back(name, s);
    }
  } else {
    SS_ASSIGN_OR_RETURN(c.modelopt_scheme, modelopt_algo_scheme(c.quant_algo, src));
    if (is_nvfp4(c.modelopt_scheme.weight) && c.group_size != 16)
      return make_error(src + ".group_size is " + std::to_string(c.group_size) + ": NVFP4 needs 16");
  }
  return c;
}

Expected<json> read_json_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("cannot open " + path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(path.string() + ": not valid JSON");
  return j;
}

}  // namespace

Expected<QuantConfig> parse_quant_config(const json& config, const json& hf_quant_config) {
  const json* qc = nullptr;
  if (config.is_object() && config.contains("quantization_config") && !config["quantization_config"].is_null())
    qc = &config["quantization_config"];
  // A nested text_config may carry it too (some re-exports).
  if (!qc && config.is_object() && config.contains("text_config") && config["text_config"].is_object() &&
      config["text_config"].contains("quantization_config") && !config["text_config"]["quantization_config"].is_null())
    qc = &config["text_config"]["quantization_config"];
  std::string method;
  if (qc) {
    if (!qc->is_object()) return make_error("config.json: quantization_config must be an object");
    if (qc->contains("quant_method") && (*qc)["quant_method"].is_string()) method = (*qc)["quant_method"].get<std::string>();
  }
  const bool have_hf_quant = hf_quant_config.is_object();
  if (have_hf_quant) {
    if (qc && method != "modelopt")
      return make_error("hf_quant_config.json (ModelOpt) and config.json quantization_config (quant_method \"" + method +
                        "\") disagree: remove one");
    const json& prod = hf_quant_config.contains("producer") ? hf_quant_config["producer"] : json();
    if (!hf_quant_config.contains("quantization") || !hf_quant_config["quantization"].is_object())
      return make_error("hf_quant_config.json: \"quantization\" object is missing");
    SS_ASSIGN_OR_RETURN(QuantConfig c, parse_modelopt(hf_quant_config["quantization"], "hf_quant_config.json quantization"));
    if (prod.is_object() && prod.contains("name") && prod["name"].is_string()) {
      c.producer = prod["name"].get<std::string>();
      if (prod.contains("version") && prod["version"].is_string()) c.producer += " " + prod["version"].get<std::string>();
    }
    return c;
  }
  if (!qc) return QuantConfig{};
  if (method == "compressed-tensors") return parse_compressed_tensors(*qc, "config.json quantization_config");
  if (method == "modelopt") return parse_modelopt(*qc, "config.json quantization_config");
  if (method.empty()) return make_error("config.json: quantization_config.quant_method is missing");
  return make_error("config.json: quantization_config.quant_method \"" + method +
                    "\" is not supported (supported: compressed-tensors, modelopt)");
}

Expected<QuantConfig> parse_quant_config(const nlohmann::json& config, const nlohmann::json& hf_quant_config) {
  return parse_quant_config(json::parse(config.dump()), json::parse(hf_quant_config.dump()));
}

Expected<QuantConfig> parse_quant_config_text(const std::string& config_json, const std::string& hf_quant_config_json) {
  json config, hf;
  if (!config_json.empty()) {
    config = json::parse(config_json, nullptr, false);
    if (config.is_discarded()) return make_error("config.json: not valid JSON");
  }
  if (!hf_quant_config_json.empty()) {
    hf = json::parse(hf_quant_config_json, nullptr, false);
    if (hf.is_discarded()) return make_error("hf_quant_config.json: not valid JSON");
  }
  return parse_quant_config(config, hf);
}

Expected<QuantConfig> load_quant_config(const std::filesystem::path& dir) {
  json config, hf;
  std::error_code ec;
  if (std::filesystem::exists(dir / "config.json", ec)) {
    SS_ASSIGN_OR_RETURN(config, read_json_file(dir / "config.json"));
  }
  if (std::filesystem::exists(dir / "hf_quant_config.json", ec)) {
    SS_ASSIGN_OR_RETURN(hf, read_json_file(dir / "hf_quant_config.json"));
  }
  return parse_quant_config(config, hf);
}

}  // namespace sparkserve
