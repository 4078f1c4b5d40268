#include "loader/quant_scheme.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/tensor.h"

namespace sparkserve {

namespace {

constexpr const char* kRoles[] = {"weight_packed",      "weight_global_scale", "input_global_scale", "weight_scale_2",
                                  "weight_scale",       "weight_zero_point",   "weight_shape",       "weight_g_idx",
                                  "input_scale",        "k_scale",             "v_scale",            "output_scale",
                                  "weight",             "bias"};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

std::string describe(const TensorInfo& t) {
  return std::string(dtype_name(t.dtype)) + " " + shape_to_string(t.shape);
}

// Accumulates messages of one kind ("template") with a count and the first module as example.
class Aggregator {
 public:
  void add(const std::string& message, const std::string& module) {
    auto [it, inserted] = index_.try_emplace(message, entries_.size());
    if (inserted) entries_.push_back({message, module, 0});
    ++entries_[it->second].count;
  }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    for (const auto& e : entries_)
      out.push_back(e.count == 1 ? e.message + " (module " + e.example + ")"
                                 : e.message + " (" + std::to_string(e.count) + " modules, e.g. " + e.example + ")");
    return out;
  }
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    std::string message, example;
    int count;
  };
  std::unordered_map<std::string, size_t> index_;
  std::vector<Entry> entries_;
};

using Roles = std::map<std::string, const TensorInfo*>;

ModuleClass classify(const std::string& name, const Roles& roles) {
  auto ends = [&](std::string_view s) { return name.size() >= s.size() && name.ends_with(s); };
  const TensorInfo* w = nullptr;
  if (auto it = roles.find("weight"); it != roles.end()) w = it->second;
  if (auto it = roles.find("weight_packed"); it != roles.end()) w = it->second;
  if (auto it = roles.find(""); it != roles.end()) {
    if (it->second->shape.size() == 3 && name.find(".mlp.experts.") != std::string::npos) return ModuleClass::kFusedExperts;
    return ModuleClass::kOther;
  }
  if (!w) return ModuleClass::kOther;
  if (ends("embed_tokens") || ends("pos_embed") || ends("embedding")) return ModuleClass::kEmbedding;
  if (w->shape.size() == 2) return ModuleClass::kLinear;
  return ModuleClass::kOther;
}

// Reads the module's format from its tensors alone; appends an error (naming module and tensor) when
// they do not form a consistent set.
bool read_format(const std::string& name, const Roles& roles, ModuleFormat& m, std::vector<std::string>& errors) {
  auto get = [&](const char* role) -> const TensorInfo* {
    auto it = roles.find(role);
    return it == roles.end() ? nullptr : it->second;
  };
  auto fail = [&](std::string msg) {
    errors.push_back(name + ": " + msg);
    return false;
  };
  auto scalar_float = [&](const TensorInfo* t, const char* role) -> bool {
    if (!is_float_dtype(t->dtype) || numel_of(t->shape) != 1)
      return fail(std::string(role) + " must be one float value (F32 [1] or scalar), got " + describe(*t));
    return true;
  };
  const TensorInfo* weight = get("weight");
  const TensorInfo* packed = get("weight_packed");
  const TensorInfo* scale = get("weight_scale");
  const TensorInfo* gscale = get("weight_global_scale");
  const TensorInfo* scale2 = get("weight_scale_2");
  const TensorInfo* igscale = get("input_global_scale");
  const TensorInfo* iscale = get("input_scale");
  m.tensors.bias = get("bias");
  m.tensors.k_scale = get("k_scale");
  m.tensors.v_scale = get("v_scale");
  m.tensors.output_scale = get("output_scale");
  for (const char* role : {"k_scale", "v_scale", "output_scale"})
    if (const TensorInfo* t = get(role); t && !scalar_float(t, role)) return false;
  if (get("weight_zero_point"))
    return fail("has weight_zero_point: asymmetric quantization is not supported");
  if (get("weight_g_idx")) return fail("has weight_g_idx: activation-ordered (GPTQ) weights are not supported");
  if (const TensorInfo* bare = get("")) {
    if (!is_float_dtype(bare->dtype)) return fail("parameter has unsupported dtype " + describe(*bare));
    m.tensors.weight = bare;
    m.format = bare->dtype == DType::kBF16 ? WeightFormat::kBf16 : bare->dtype == DType::kF16 ? WeightFormat::kF16 : WeightFormat::kF32;
    m.shape = bare->shape;
    return true;
  }
  if (packed) {
    if (weight) return fail("has both weight and weight_packed");
    if (packed->dtype == DType::kI32 || get("weight_shape"))
      return fail("weight_packed " + describe(*packed) +
                  " is integer pack-quantized (int4/int8) weights: not supported (only NVFP4 U8 packing)");
    if (packed->dtype != DType::kU8) return fail("weight_packed must be U8 [N, K/2], got " + describe(*packed));
    if (packed->shape.size() != 2) return fail("weight_packed must be 2-D [N, K/2], got " + describe(*packed));
    const int64_t N = packed->shape[0], K = packed->shape[1] * 2;
    if (!scale) return fail("NVFP4 weight_packed without weight_scale (missing tensor " + name + ".weight_scale)");
    if (!gscale)
      return fail("NVFP4 weight_packed without weight_global_scale (missing tensor " + name + ".weight_global_scale)");
    if (scale2) return fail("has both weight_global_scale (compressed-tensors) and weight_scale_2 (ModelOpt)");
    if (scale->dtype != DType::kF8E4M3 || scale->shape != std::vector<int64_t>{N, K / 16})
      return fail("weight_scale must be F8_E4M3 [" + std::to_string(N) + ", " + std::to_string(K / 16) + "], got " +
                  describe(*scale));
    if (K % 16 != 0) return fail("NVFP4 K = " + std::to_string(K) + " is not a multiple of 16");
    if (!scalar_float(gscale, "weight_global_scale")) return false;
    if (igscale && !scalar_float(igscale, "input_global_scale")) return false;
    if (iscale) return fail("has input_scale next to weight_packed (mixed ModelOpt / compressed-tensors naming)");
    m.format = WeightFormat::kNvfp4;
    m.shape = {N, K};
    m.tensors = {packed, scale, gscale, igscale, m.tensors.bias, m.tensors.k_scale, m.tensors.v_scale, m.tensors.output_scale};
    return true;
  }
  if (!weight) {
    std::string roles_text;
    for (const auto& [role, info] : roles) roles_text += (roles_text.empty() ? "" : ", ") + role;
    return fail("has " + roles_text + " but no weight or weight_packed");
  }
  m.tensors.weight = weight;
  if (weight->dtype == DType::kU8) {
    if (weight->shape.size() != 2) return fail("U8 weight must be 2-D [N, K/2], got " + describe(*weight));
    const int64_t N = weight->shape[0], K = weight->shape[1] * 2;
    if (!scale) return fail("U8 (NVFP4) weight without weight_scale (missing tensor " + name + ".weight_scale)");
    if (gscale) return fail("has weight (ModelOpt naming) with weight_global_scale (compressed-tensors naming)");
    if (!scale2) return fail("ModelOpt NVFP4 weight without weight_scale_2 (missing tensor " + name + ".weight_scale_2)");
    if (scale->dtype != DType::kF8E4M3 || scale->shape != std::vector<int64_t>{N, K / 16})
      return fail("weight_scale must be F8_E4M3 [" + std::to_string(N) + ", " + std::to_string(K / 16) + "], got " +
                  describe(*scale));
    if (K % 16 != 0) return fail("NVFP4 K = " + std::to_string(K) + " is not a multiple of 16");
    if (!scalar_float(scale2, "weight_scale_2")) return false;
    if (iscale && !scalar_float(iscale, "input_scale")) return false;
    if (igscale) return fail("has input_global_scale next to a ModelOpt U8 weight");
    m.format = WeightFormat::kNvfp4ModelOpt;
    m.shape = {N, K};
    m.tensors.weight_scale = scale;
    m.tensors.global_scale = scale2;
    m.tensors.input_scale = iscale;
    return true;
  }
  if (weight->dtype == DType::kF8E4M3) {
    if (weight->shape.size() != 2) return fail("FP8 weight must be 2-D [N, K], got " + describe(*weight));
    const int64_t N = weight->shape[0];
    if (!scale) return fail("FP8 weight without weight_scale (missing tensor " + name + ".weight_scale)");
    if (gscale || scale2 || igscale) return fail("FP8 weight with NVFP4 scale tensors");
    if (!is_float_dtype(scale->dtype)) return fail("weight_scale of an FP8 weight must be F32/BF16/F16, got " + describe(*scale));
    const int64_t sn = numel_of(scale->shape);
    if (sn == 1) {
      m.format = WeightFormat::kFp8Tensor;
    } else if (sn == N && (scale->shape == std::vector<int64_t>{N, 1} || scale->shape == std::vector<int64_t>{N})) {
      m.format = WeightFormat::kFp8Channel;
    } else if (scale->shape.size() == 2) {
      return fail("FP8 weight_scale " + describe(*scale) + " is block-wise (" + shape_to_string(weight->shape) +
                  " weight): block-quantized FP8 is not supported (supported: [N, 1] channel, [1] tensor)");
    } else {
      return fail("FP8 weight_scale must be [" + std::to_string(N) + ", 1] or [1], got " + describe(*scale));
    }
    if (iscale && !scalar_float(iscale, "input_scale")) return false;
    m.shape = weight->shape;
    m.tensors.weight_scale = scale;
    m.tensors.input_scale = iscale;
    return true;
  }
  if (is_float_dtype(weight->dtype)) {
    for (const char* role : {"weight_scale", "weight_global_scale", "weight_scale_2", "input_scale", "input_global_scale"})
      if (get(role))
        return fail(std::string("unquantized ") + std::string(dtype_name(weight->dtype)) + " weight comes with " + role +
                    " (a quantized weight of the wrong dtype?)");
    m.format = weight->dtype == DType::kBF16 ? WeightFormat::kBf16 : weight->dtype == DType::kF16 ? WeightFormat::kF16 : WeightFormat::kF32;
    m.shape = weight->shape;
    return true;
  }
  return fail("weight has unsupported dtype " + describe(*weight));
}

struct Verdict {
  QuantScheme scheme;  // quantized=false: stays unquantized
  std::string by;      // e.g. "ignore entry \"lm_head\"", "group_0 target \"Linear\""
  bool ignored = false;
};

// Names, aliases and parents of every module, for "matches no module" checks.
std::unordered_set<std::string> names_and_parents(const std::vector<std::string>& modules) {
  std::unordered_set<std::string> out;
  for (const auto& name : modules)
    for (const auto& a : module_name_aliases(name)) {
      out.insert(a);
      for (size_t p = a.find('.'); p != std::string::npos; p = a.find('.', p + 1)) out.insert(a.substr(0, p));
    }
  return out;
}

// One warning per entry that matches no module name or parent (at most 10, then a count).
template <class Match>
void report_unmatched(const std::vector<std::string>& entries, const std::vector<std::string>& modules, const char* what,
                      Match matches, std::vector<std::string>& warnings) {
  if (entries.empty()) return;
  const auto names = names_and_parents(modules);
  int reported = 0, more = 0;
  for (const auto& e : entries) {
    bool hit = names.count(e) > 0;
    for (auto it = names.begin(); !hit && it != names.end(); ++it) hit = matches(e, *it);
    if (hit) continue;
    if (reported < 10) {
      warnings.push_back(std::string(what) + " \"" + e + "\" matches no module");
      ++reported;
    } else {
      ++more;
    }
  }
  if (more > 0) warnings.push_back("... and " + std::to_string(more) + " more " + what + "s match no module");
}

// compressed-tensors targets and ignore list, with both tools' priority rules.
class CtResolver {
 public:
  static Expected<CtResolver> create(const QuantConfig& c) {
    CtResolver r;
    r.config_ = &c;
    // vLLM's target_scheme_map: keys in first-appearance order, a repeated target maps to the later group
    // (the same as compressed-tensors' target_to_scheme).
    std::unordered_map<std::string, size_t> pos;
    for (size_t g = 0; g < c.groups.size(); ++g) {
      for (const auto& t : c.groups[g].targets) {
        auto [it, inserted] = pos.try_emplace(t, r.targets_.size());
        if (inserted) {
          SS_ASSIGN_OR_RETURN(TargetMatcher m, TargetMatcher::compile(t));
          r.targets_.push_back({std::move(m), g});
        } else {
          r.targets_[it->second].group = g;
        }
      }
    }
    r.group_used_.assign(c.groups.size(), false);
    for (size_t i = 0; i < c.ignore.size(); ++i) {
      SS_ASSIGN_OR_RETURN(TargetMatcher m, TargetMatcher::compile(c.ignore[i]));
      if (m.is_regex()) r.ignore_regex_.push_back(i);
      else r.ignore_exact_.emplace(c.ignore[i], i);
      r.ignore_.push_back(std::move(m));
    }
    r.ignore_used_.assign(c.ignore.size(), false);
    return r;
  }

  Verdict resolve(const std::string& name, ModuleClass cls, Aggregator& warnings) {
    const std::vector<std::string> aliases = module_name_aliases(name);
    // Ignore first: any alias, any entry (names, regexes, class names).
    std::optional<size_t> ignored_by;
    for (const auto& a : aliases) {
      if (auto it = ignore_exact_.find(a); it != ignore_exact_.end()) {
        ignore_used_[it->second] = true;
        if (!ignored_by || it->second < *ignored_by) ignored_by = it->second;
      }
      for (size_t i : ignore_regex_)
        if (ignore_[i].matches_name(a)) {
          ignore_used_[i] = true;
          if (!ignored_by || i < *ignored_by) ignored_by = i;
        }
    }
    for (size_t i = 0; i < ignore_.size(); ++i)
      if (ignore_[i].matches_class(cls)) {
        ignore_used_[i] = true;
        if (!ignored_by || i < *ignored_by) ignored_by = i;
      }
    if (ignored_by) {
      Verdict v;
      v.ignored = true;
      v.by = "ignore entry \"" + config_->ignore[*ignored_by] + "\"";
      return v;
    }
    // Name matches under the first alias that matches anything.
    std::vector<size_t> name_hits;
    for (const auto& a : aliases) {
      for (size_t t = 0; t < targets_.size(); ++t)
        if (targets_[t].matcher.matches_name(a)) name_hits.push_back(t);
      if (!name_hits.empty()) break;
    }
    std::vector<size_t> class_hits;
    for (size_t t = 0; t < targets_.size(); ++t)
      if (targets_[t].matcher.matches_class(cls)) class_hits.push_back(t);
    if (name_hits.empty() && class_hits.empty()) return Verdict{{}, "no config group targets it", false};
    for (size_t t : name_hits) group_used_[targets_[t].group] = true;
    for (size_t t : class_hits) group_used_[targets_[t].group] = true;
    // compressed-tensors: exact name > regex (alphabetically first pattern) > class name (alphabetically first).
    auto ct_pick = [&]() -> size_t {
      std::optional<size_t> best;
      for (size_t t : name_hits)
        if (!targets_[t].matcher.is_regex()) return t;
      for (size_t t : name_hits)
        if (!best || targets_[t].matcher.entry() < targets_[*best].matcher.entry()) best = t;
      if (best) return *best;
      for (size_t t : class_hits)
        if (!best || targets_[t].matcher.entry() < targets_[*best].matcher.entry()) best = t;
      return *best;
    }();
    // vLLM: first name match in config order, else first class match.
    const size_t vllm_pick = name_hits.empty() ? class_hits.front() : *std::min_element(name_hits.begin(), name_hits.end());
    const Target& chosen = targets_[ct_pick];
    const Target& other = targets_[vllm_pick];
    if (chosen.group != other.group) {
      warnings.add("overlapping targets: compressed-tensors applies " + config_->groups[chosen.group].name +
                       " (target \"" + chosen.matcher.entry() + "\") but vLLM's first-match order would apply " +
                       config_->groups[other.group].name + " (target \"" + other.matcher.entry() + "\")",
                   name);
    }
    const QuantGroup& g = config_->groups[chosen.group];
    return Verdict{g.scheme, g.name + " target \"" + chosen.matcher.entry() + "\" (" + g.scheme.description + ")", false};
  }

  // Warnings for groups and ignore entries that matched nothing. Entries are looked for among every
  // module name (any class: llm-compressor also lists norms and GDN blocks) and its parents (an entry
  // like "...linear_attn" names the parent of in_proj_qkv), under every alias.
  void finish(const std::vector<std::string>& all_modules, std::vector<std::string>& warnings) const {
    for (size_t g = 0; g < group_used_.size(); ++g)
      if (!group_used_[g]) {
        std::string targets;
        for (const auto& t : config_->groups[g].targets) targets += (targets.empty() ? "\"" : ", \"") + t + "\"";
        warnings.push_back("config group " + config_->groups[g].name + " (targets " + targets +
                           ") matches no module that is not ignored");
      }
    std::vector<std::string> unused;
    for (size_t i = 0; i < ignore_.size(); ++i)
      if (!ignore_used_[i]) unused.push_back(config_->ignore[i]);
    report_unmatched(unused, all_modules, "ignore entry", [this](const std::string& entry, const std::string& name) {
      for (const auto& m : ignore_)
        if (m.entry() == entry) return m.matches_name(name);
      return false;
    }, warnings);
  }

 private:
  struct Target {
    TargetMatcher matcher;
    size_t group;
  };
  const QuantConfig* config_ = nullptr;
  std::vector<Target> targets_;
  std::vector<bool> group_used_;
  std::vector<TargetMatcher> ignore_;
  std::unordered_map<std::string, size_t> ignore_exact_;
  std::vector<size_t> ignore_regex_;
  std::vector<bool> ignore_used_;
};

class ModelOptResolver {
 public:
  explicit ModelOptResolver(const QuantConfig& c) : config_(&c), exclude_used_(c.exclude_modules.size(), false) {}

  Verdict resolve(const std::string& name, ModuleClass cls) {
    const std::vector<std::string> aliases = module_name_aliases(name);
    std::optional<size_t> excluded_by;
    for (size_t i = 0; i < config_->exclude_modules.size(); ++i)
      for (const auto& a : aliases)
        if (fnmatch_name(config_->exclude_modules[i], a)) {
          exclude_used_[i] = true;
          if (!excluded_by) excluded_by = i;
          break;
        }
    if (excluded_by) return Verdict{{}, "exclude_modules entry \"" + config_->exclude_modules[*excluded_by] + "\"", true};
    if (config_->quant_algo == "MIXED_PRECISION") {
      // An entry names the module itself or a parent (e.g. "...mlp.experts" for every expert).
      for (const auto& [layer, scheme] : config_->quantized_layers)
        for (const auto& a : aliases)
          if (layer == a || (a.size() > layer.size() && a.starts_with(layer) && a[layer.size()] == '.'))
            return Verdict{scheme, "quantized_layers \"" + layer + "\" (" + scheme.description + ")", false};
      return Verdict{{}, "not in quantized_layers", false};
    }
    if (cls != ModuleClass::kLinear) return Verdict{{}, "not a Linear module", false};
    return Verdict{config_->modelopt_scheme, "quant_algo " + config_->quant_algo, false};
  }

  void finish(const std::vector<std::string>& all_modules, std::vector<std::string>& warnings) const {
    std::vector<std::string> unused;
    for (size_t i = 0; i < exclude_used_.size(); ++i)
      if (!exclude_used_[i]) unused.push_back(config_->exclude_modules[i]);
    report_unmatched(unused, all_modules, "exclude_modules entry",
                     [](const std::string& pattern, const std::string& name) { return fnmatch_name(pattern, name); }, warnings);
  }

 private:
  const QuantConfig* config_;
  std::vector<bool> exclude_used_;
};

std::string format_text(const ModuleFormat& m) {
  return std::string(weight_format_name(m.format)) + " (" + std::string(dtype_name(m.tensors.weight->dtype)) + " " +
         shape_to_string(m.tensors.weight->shape) + ")";
}

}  // namespace

std::pair<std::string, std::string> split_module_role(const std::string& tensor_name) {
  const size_t dot = tensor_name.rfind('.');
  if (dot == std::string::npos) return {tensor_name, ""};
  const std::string last = tensor_name.substr(dot + 1);
  for (const char* r : kRoles)
    if (last == r) return {tensor_name.substr(0, dot), last};
  return {tensor_name, ""};
}

Expected<QuantPlan> plan_module_formats(const std::map<std::string, TensorInfo>& tensors, const QuantConfig& config) {
  // 1. Group by module.
  std::map<std::string, Roles> grouped;
  for (const auto& [name, info] : tensors) {
    auto [module, role] = split_module_role(name);
    grouped[module][role] = &info;
  }
  QuantPlan plan;
  std::vector<std::string> errors;
  Aggregator warnings;
  std::optional<CtResolver> ct;
  std::optional<ModelOptResolver> mo;
  if (config.method == QuantMethod::kCompressedTensors) {
    SS_ASSIGN_OR_RETURN(CtResolver r, CtResolver::create(config));
    ct = std::move(r);
  } else if (config.method == QuantMethod::kModelOpt) {
    mo.emplace(config);
  }
  bool any_kv_scale = false;
  for (const auto& [name, roles] : grouped) {
    // KV-cache-scale-only modules (compressed-tensors: self_attn.k_scale / v_scale).
    bool only_kv = std::all_of(roles.begin(), roles.end(), [](const auto& r) {
      return r.first == "k_scale" || r.first == "v_scale" || r.first == "output_scale";
    });
    if (only_kv) {
      ModuleTensors t;
      for (const auto& [role, info] : roles) {
        if (!is_float_dtype(info->dtype) || numel_of(info->shape) != 1) {
          errors.push_back(name + ": " + role + " must be one float value, got " + describe(*info));
          continue;
        }
        (role == "k_scale" ? t.k_scale : role == "v_scale" ? t.v_scale : t.output_scale) = info;
      }
      plan.kv_scales[name] = t;
      any_kv_scale = true;
      continue;
    }
    ModuleFormat m;
    m.name = name;
    m.cls = classify(name, roles);
    for (const auto& [role, info] : roles) m.nbytes += info->nbytes;
    if (!read_format(name, roles, m, errors)) continue;
    if (m.tensors.k_scale || m.tensors.v_scale) any_kv_scale = true;
    const bool checkable = m.cls != ModuleClass::kOther;
    const bool soft = name.starts_with("mtp.") || name.find("visual.") != std::string::npos;  // off the text path
    Verdict v;
    if (config.method == QuantMethod::kNone) {
      v.by = "no quantization config";
    } else if (!checkable) {
      v.by = "not a Linear/Embedding module";
    } else if (ct) {
      v = ct->resolve(name, m.cls, warnings);
    } else {
      v = mo->resolve(name, m.cls);
    }
    m.decided_by = v.by;
    const bool actual_q = is_quantized(m.format);
    if (actual_q && config.method == QuantMethod::kNone) {
      errors.push_back(name + ": tensors hold " + format_text(m) +
                       " but the checkpoint has no quantization config (config.json quantization_config or "
                       "hf_quant_config.json)");
    } else if (actual_q && !v.scheme.quantized) {
      errors.push_back(name + ": tensors hold " + format_text(m) + " but the config leaves it unquantized (" + v.by + ")");
    } else if (!actual_q && v.scheme.quantized) {
      if (soft || config.method == QuantMethod::kModelOpt) {
        warnings.add((config.method == QuantMethod::kModelOpt ? "quant_algo " + config.quant_algo + " would quantize"
                                                              : v.by.substr(0, v.by.find(" (")) + " targets") +
                         " modules whose tensors are " + std::string(weight_format_name(m.format)) + "; read as stored",
                     name);
      } else {
        errors.push_back(name + ": config says " + v.scheme.description + " (" + v.by.substr(0, v.by.find(" (")) +
                         ") but tensors hold " + format_text(m));
      }
    } else if (actual_q) {
      if (v.scheme.weight != m.format) {
        errors.push_back(name + ": config says " + v.scheme.description + " (" + v.by.substr(0, v.by.find(" (")) +
                         ", weight format " + std::string(weight_format_name(v.scheme.weight)) + ") but tensors hold " +
                         format_text(m));
      } else if ((v.scheme.activation == ActivationQuant::kNvfp4 || v.scheme.activation == ActivationQuant::kFp8TensorStatic) &&
                 !m.tensors.input_scale) {
        const char* missing = m.format == WeightFormat::kNvfp4 ? ".input_global_scale" : ".input_scale";
        errors.push_back(name + ": config says " + v.scheme.description + ", which needs a static activation scale, "
                         "but tensor " + name + missing + " is missing");
      } else {
        m.activation = v.scheme.activation;
      }
    }
    plan.modules.emplace(name, std::move(m));
  }
  std::vector<std::string> all_modules;
  for (const auto& [name, roles] : grouped) all_modules.push_back(name);
  if (ct) ct->finish(all_modules, plan.warnings);
  if (mo) mo->finish(all_modules, plan.warnings);
  const bool kv_configured = (config.method == QuantMethod::kCompressedTensors && config.kv_cache) ||
                             (config.method == QuantMethod::kModelOpt && !config.kv_cache_quant_algo.empty());
  if (kv_configured && !any_kv_scale)
    plan.warnings.push_back("the config asks for an FP8 KV cache but the checkpoint has no k_scale/v_scale tensors; "
                            "scale 1.0 will be used");
  if (!kv_configured && any_kv_scale)
    plan.warnings.push_back("the checkpoint has k_scale/v_scale tensors but no KV-cache quantization in its config; "
                            "they are ignored");
  for (auto& w : warnings.lines()) plan.warnings.push_back(std::move(w));
  if (!errors.empty()) {
    std::string msg = std::to_string(errors.size()) + " module(s) have no consistent reading:";
    for (size_t i = 0; i < errors.size() && i < 20; ++i) msg += "\n  " + errors[i];
    if (errors.size() > 20) msg += "\n  ... and " + std::to_string(errors.size() - 20) + " more";
    return make_error(msg);
  }
  return plan;
}

}  // namespace sparkserve
