// `sparkserve synth --like MODEL --layout L [--vocab N] [--layers N] [--seed S] [--shard-gb G]
//                   [--threads T] --out DIR`
// Writes a checkpoint with random weights and exactly the real tensor names, shapes and dtypes of
// that model in that layout (see src/loader/synth_checkpoint.h), streaming at disk speed.
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "cli/command.h"
#include "loader/synth_checkpoint.h"

namespace {

struct SynthArgs {
  std::string like, layout, out;
  std::optional<int> vocab, layers;
  uint64_t seed = 0;
  double shard_gb = 5.0;
  int threads = 0;
  bool text_only = false;
};

int run_synth(const SynthArgs& a) {
  using namespace sparkserve;
  auto model = model_like(a.like);
  if (!model.ok()) {
    std::fprintf(stderr, "error: %s\n", model.message().c_str());
    return 1;
  }
  if (Status st = resize_model(*model, a.vocab, a.layers); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return 1;
  }
  auto layout = parse_synth_layout(a.layout);
  if (!layout.ok()) {
    std::fprintf(stderr, "error: %s\n", layout.message().c_str());
    return 1;
  }
  if (!(a.shard_gb > 0)) {
    std::fprintf(stderr, "error: --shard-gb must be positive\n");
    return 1;
  }
  SynthPlan plan = synth_plan(*model, *layout);
  if (a.text_only) {
    // Loading tests want the text model's real shapes without the ~2.6 GB (35B) of vision and MTP
    // weights the loader never reads; config.json still describes them (the loader notes nothing).
    std::erase_if(plan.tensors, [](const SynthTensor& t) {
      return t.spec.name.starts_with("model.visual.") || t.spec.name.starts_with("mtp.");
    });
  }
  SynthOptions opt;
  opt.out = a.out;
  opt.seed = a.seed;
  opt.threads = a.threads;
  opt.shard_bytes = static_cast<uint64_t>(a.shard_gb * 1e9);
  auto last = std::chrono::steady_clock::now();
  const auto start = last;
  opt.progress = [&](uint64_t done, uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (done < total && now - last < std::chrono::seconds(2)) return;
    last = now;
    const double s = std::chrono::duration<double>(now - start).count();
    const double rate = s > 0 ? static_cast<double>(done) / s : 0.0;
    std::fprintf(stderr, "\rsynth: %.2f / %.2f GB, %.0f MB/s, ETA %.0f s   ", done / 1e9, total / 1e9, rate / 1e6,
                 rate > 0 ? static_cast<double>(total - done) / rate : 0.0);
    if (done == total) std::fprintf(stderr, "\n");
  };
  auto stats = write_synth_checkpoint(plan, opt);
  if (!stats.ok()) {
    std::fprintf(stderr, "\nerror: %s\n", stats.message().c_str());
    return 1;
  }
  std::printf("wrote %s (%s, layout %s): %zu tensors in %zu files, %.3f GB in %.1f s (%.0f MB/s)\n", a.out.c_str(),
              model->name.c_str(), a.layout.c_str(), plan.tensors.size(), stats->files.size(), stats->bytes / 1e9,
              stats->seconds, stats->seconds > 0 ? stats->bytes / stats->seconds / 1e6 : 0.0);
  return 0;
}

void register_synth(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("synth", "Write a checkpoint with random weights and the real tensor layout of a model");
  auto args = std::make_shared<SynthArgs>();
  cmd->add_option("--like", args->like, "qwen3.5-122b-a10b | qwen3.5-35b-a3b | tiny")->required();
  cmd->add_option("--layout", args->layout, "bf16 | nvfp4 | nvfp4-fp8dense | fp8 | modelopt-nvfp4")->required();
  cmd->add_option("--out", args->out, "output folder (must not hold *.safetensors)")->required();
  cmd->add_option("--vocab", args->vocab, "vocabulary size (default: the model's)");
  cmd->add_option("--layers", args->layers, "number of decoder layers (default: the model's)");
  cmd->add_option("--seed", args->seed, "random seed (default 0)");
  cmd->add_option("--shard-gb", args->shard_gb, "shard size in GB (default 5)");
  cmd->add_option("--threads", args->threads, "generator threads (default: all cores)");
  cmd->add_flag("--text-only", args->text_only,
                "omit the vision tower and MTP tensors (smaller checkpoints for load tests; config.json unchanged)");
  cmd->callback([args, &exit_code] { exit_code = run_synth(*args); });
}
SPARKSERVE_COMMAND(register_synth);

}  // namespace
