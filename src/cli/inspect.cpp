// `sparkserve inspect DIR [--json] [--summary]`
// `sparkserve inspect --like MODEL --layout L [--vocab N] [--layers N] [--json] [--summary]`
// Every module -> format, shape, bytes; totals per component; weight bytes read per decoded token at
// batch 1; the warnings of the format decision (src/loader/quant_scheme.h). --like computes the same
// from shapes alone (the tensors `synth` would write), without files.
#include <cstdio>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/tensor.h"
#include "loader/hf_config.h"
#include "loader/synth_checkpoint.h"
#include "loader/weight_budget.h"

namespace {

using namespace sparkserve;
using json = nlohmann::json;

struct InspectArgs {
  std::string dir, like, layout;
  std::optional<int> vocab, layers;
  bool json_out = false;
  bool summary = false;
};

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else if (b >= 1e3) std::snprintf(buf, sizeof buf, "%.2f kB", b / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

std::string method_text(const QuantConfig& c) {
  switch (c.method) {
    case QuantMethod::kNone: return "none";
    case QuantMethod::kCompressedTensors: return "compressed-tensors (" + c.source + ", format " + c.format + ")";
    case QuantMethod::kModelOpt: return "modelopt (" + c.source + ", quant_algo " + c.quant_algo + ")";
  }
  return "?";
}

int report(const std::string& source, const QuantConfig& qc, const QuantPlan& plan, int num_experts, int top_k,
           const InspectArgs& a) {
  const WeightBudget b = compute_weight_budget(plan, num_experts, top_k);
  const std::string rule = (num_experts > 0 ? "routed experts " + std::to_string(top_k) + " of " +
                                                  std::to_string(num_experts) + " per layer; "
                                            : std::string("dense model; ")) +
                           "embeddings one row; lm_head all" + (b.lm_head_tied ? " (tied: the embedding table)" : "") +
                           "; everything else once; vision and mtp excluded";
  if (a.json_out) {
    json j;
    j["source"] = source;
    j["quantization"] = method_text(qc);
    if (!a.summary) {
      json mods = json::array();
      for (const ModuleBudget& m : b.modules) {
        mods.push_back({{"name", m.module->name},
                        {"format", weight_format_name(m.module->format)},
                        {"activation", activation_quant_name(m.module->activation)},
                        {"shape", m.module->shape},
                        {"bytes", m.bytes},
                        {"params", m.params},
                        {"component", component_name(m.component)},
                        {"token_bytes", m.token_bytes},
                        {"decided_by", m.module->decided_by}});
      }
      j["modules"] = mods;
    }
    json comps = json::object();
    for (int c = 0; c < kNumComponents; ++c) {
      const ComponentBudget& cb = b.components[static_cast<size_t>(c)];
      comps[std::string(component_name(static_cast<Component>(c)))] = {
          {"modules", cb.modules}, {"params", cb.params}, {"bytes", cb.bytes}, {"token_bytes", cb.token_bytes}};
    }
    j["components"] = comps;
    j["total"] = {{"bytes", b.total_bytes}, {"params", b.total_params}, {"text_params", b.text_params}, {"token_bytes", b.token_bytes}};
    j["token_bytes_rule"] = rule;
    j["warnings"] = plan.warnings;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("checkpoint: %s\nquantization: %s\n\n", source.c_str(), method_text(qc).c_str());
  if (!a.summary) {
    std::printf("%-64s %-15s %-18s %-20s %12s\n", "module", "format", "activations", "shape", "bytes");
    for (const ModuleBudget& m : b.modules)
      std::printf("%-64s %-15s %-18s %-20s %12s\n", m.module->name.c_str(),
                  std::string(weight_format_name(m.module->format)).c_str(),
                  std::string(activation_quant_name(m.module->activation)).c_str(),
                  shape_to_string(m.module->shape).c_str(), human_bytes(static_cast<double>(m.bytes)).c_str());
    std::printf("\n");
  }
  std::printf("%-16s %8s %18s %12s %14s\n", "component", "modules", "params", "bytes", "bytes/token");
  for (int c = 0; c < kNumComponents; ++c) {
    const ComponentBudget& cb = b.components[static_cast<size_t>(c)];
    if (cb.modules == 0 && cb.token_bytes == 0) continue;
    std::printf("%-16s %8d %18llu %12s %14s\n", std::string(component_name(static_cast<Component>(c))).c_str(), cb.modules,
                static_cast<unsigned long long>(cb.params), human_bytes(static_cast<double>(cb.bytes)).c_str(),
                human_bytes(cb.token_bytes).c_str());
  }
  std::printf("%-16s %8zu %18llu %12s %14s\n", "total", b.modules.size(), static_cast<unsigned long long>(b.total_params),
              human_bytes(static_cast<double>(b.total_bytes)).c_str(), human_bytes(b.token_bytes).c_str());
  std::printf("\ntext-model parameters: %llu\n", static_cast<unsigned long long>(b.text_params));
  std::printf("weight bytes per decoded token (batch 1): %.3f GB (%.3f GiB)\n  (%s)\n", b.token_bytes / 1e9,
              b.token_bytes / (1024.0 * 1024.0 * 1024.0), rule.c_str());
  if (!plan.warnings.empty()) {
    std::printf("\nwarnings:\n");
    for (const auto& w : plan.warnings) std::printf("  %s\n", w.c_str());
  }
  return 0;
}

int run_inspect(const InspectArgs& a) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    return 1;
  };
  if (!a.like.empty() || !a.layout.empty()) {
    if (!a.dir.empty()) return fail("give either DIR or --like/--layout, not both");
    if (a.like.empty() || a.layout.empty()) return fail("--like and --layout go together");
    auto model = model_like(a.like);
    if (!model.ok()) return fail(model.message());
    if (Status st = resize_model(*model, a.vocab, a.layers); !st.ok()) return fail(st.message());
    auto layout = parse_synth_layout(a.layout);
    if (!layout.ok()) return fail(layout.message());
    const SynthPlan sp = synth_plan(*model, *layout);
    auto qc = parse_quant_config(sp.config, sp.hf_quant_config);
    if (!qc.ok()) return fail(qc.message());
    const auto infos = synth_tensor_infos(sp);
    auto plan = plan_module_formats(infos, *qc);
    if (!plan.ok()) return fail(plan.message());
    return report(a.like + " layout " + a.layout + " (shapes only, no files)", *qc, *plan, model->text.num_experts,
                  model->text.num_experts_per_tok, a);
  }
  if (a.dir.empty()) return fail("give a checkpoint folder, or --like MODEL --layout L");
  if (a.vocab || a.layers) return fail("--vocab/--layers only apply with --like");
  auto cfg = load_model_config(a.dir);
  if (!cfg.ok()) return fail(cfg.message());
  auto qc = load_quant_config(a.dir);
  if (!qc.ok()) return fail(qc.message());
  auto ckpt = Checkpoint::open(a.dir);
  if (!ckpt.ok()) return fail(ckpt.message());
  auto plan = plan_module_formats(ckpt->tensors(), *qc);
  if (!plan.ok()) return fail(plan.message());
  return report(a.dir, *qc, *plan, cfg->num_experts, cfg->num_experts_per_tok, a);
}

void register_inspect(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("inspect", "Show every module's format, bytes per component and per decoded token");
  auto args = std::make_shared<InspectArgs>();
  cmd->add_option("dir", args->dir, "checkpoint folder");
  cmd->add_option("--like", args->like, "qwen3.5-122b-a10b | qwen3.5-35b-a3b | tiny (shapes only, no files)");
  cmd->add_option("--layout", args->layout, "bf16 | nvfp4 | nvfp4-fp8dense | fp8 | modelopt-nvfp4 (with --like)");
  cmd->add_option("--vocab", args->vocab, "vocabulary size (with --like)");
  cmd->add_option("--layers", args->layers, "number of decoder layers (with --like)");
  cmd->add_flag("--json", args->json_out, "machine-readable output");
  cmd->add_flag("--summary", args->summary, "totals and warnings only, no per-module table");
  cmd->callback([args, &exit_code] { exit_code = run_inspect(*args); });
}
SPARKSERVE_COMMAND(register_inspect);

}  // namespace
