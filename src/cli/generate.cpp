// `sparkserve generate`: greedy decoding on the CPU backend: one prefill of the prompt, then one
// forward per generated token through the sequence's state (KV cache + GDN state).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backend/backend_factory.h"
#include "cli/cli_images.h"
#include "cli/command.h"
#include "cli/kv_sizing.h"
#include "cli/model_args.h"
#include "core/thread_pool.h"
#include "model/load.h"
#include "runtime/direct_state.h"

namespace sparkserve::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::string prompt_ids;
  int max_tokens = 16;
  bool json = false;
  bool ignore_eos = false;
  int threads = 0;
  std::string device = "cpu";
  std::vector<std::string> images;
  LoadCliOptions load;
  KvCliOptions kv;
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int run_generate(const GenerateOptions& o) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    return 1;
  };
  auto ids = parse_token_ids(o.prompt_ids);
  if (!ids) return fail(ids.message());
  if (o.max_tokens < 0) return fail("--max-tokens must be >= 0");
  if (o.threads < 0 || o.threads > kMaxThreads)
    return fail("--threads must be between 1 and " + std::to_string(kMaxThreads) + " (0 or absent: all cores)");
  auto kv_dtype = parse_kv_cache_dtype(o.kv.dtype, o.device == "cuda" ? Device::kCuda : Device::kCpu);
  if (!kv_dtype) return fail(kv_dtype.message());
  if (!(o.kv.gpu_memory_utilization > 0 && o.kv.gpu_memory_utilization <= 1))
    return fail("--gpu-memory-utilization must be in (0, 1]");
  auto made = make_backend(o.device, o.threads > 0 ? o.threads : default_thread_count());
  if (!made) return fail(made.message());
  auto backend = std::move(*made);
  std::vector<std::string> notes;
  auto load_opts = make_load_options(o.load);
  if (!load_opts) return fail(load_opts.message());
  auto t_load = Clock::now();
  auto model = load_qwen35(o.model, *backend, &notes, *load_opts);
  if (!model) return fail(model.message());
  const double load_ms = ms_since(t_load);
  for (const auto& n : notes) std::fprintf(stderr, "%s\n", n.c_str());
  auto mm = load_cli_images(o.model, **model, o.images, *ids);
  if (!mm) return fail(mm.message());
  const ModelConfig& c = (*model)->config();

  const int64_t total = static_cast<int64_t>(ids->size()) + o.max_tokens;
  const int64_t max_pos = c.max_position_embeddings > 0 ? c.max_position_embeddings : kDefaultMaxPositions;
  if (total > max_pos)
    return fail("prompt + max tokens = " + std::to_string(total) + " exceeds the model's maximum of " +
                std::to_string(max_pos) + " positions (max_position_embeddings)");
  auto limits = one_sequence_state(*backend, c, total, *kv_dtype, o.kv.gpu_memory_utilization);
  if (!limits) return fail(limits.message());
  DirectState state(*backend, c, *limits);
  auto seq = state.open_sequence();
  if (!seq) return fail(seq.message());

  std::vector<int32_t> out;
  double prefill_ms = 0, decode_ms = 0;
  if (o.max_tokens > 0) {
    std::vector<SequenceInput> batch(1);
    batch[0].state = &*seq;
    batch[0].tokens = *ids;
    batch[0].mm = mm->get();
    auto t0 = Clock::now();
    auto logits = state.forward(**model, batch);
    if (!logits) return fail(logits.message());
    prefill_ms = ms_since(t0);
    auto next = static_cast<int32_t>(std::max_element(logits->row(0), logits->row(0) + logits->vocab) - logits->row(0));
    auto t1 = Clock::now();
    for (;;) {
      out.push_back(next);
      const bool eos = std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end();
      if (static_cast<int>(out.size()) >= o.max_tokens || (eos && !o.ignore_eos)) break;
      batch[0].tokens = {next};
      batch[0].mm = nullptr;  // decode: position = index + the sequence's rope delta
      logits = state.forward(**model, batch);
      if (!logits) return fail(logits.message());
      next = static_cast<int32_t>(std::max_element(logits->row(0), logits->row(0) + logits->vocab) - logits->row(0));
    }
    decode_ms = ms_since(t1);
  }
  const int64_t decoded = std::max<int64_t>(0, static_cast<int64_t>(out.size()) - 1);  // forwards after prefill
  const double prefill_tps = prefill_ms > 0 ? ids->size() * 1000.0 / prefill_ms : 0;
  const double decode_tps = decode_ms > 0 && decoded > 0 ? decoded * 1000.0 / decode_ms : 0;
  if (o.json) {
    nlohmann::json j;
    j["prompt_ids"] = *ids;
    j["output_ids"] = out;
    j["timing"] = {{"load_ms", load_ms},
                   {"prefill_ms", prefill_ms},
                   {"prefill_tokens_per_s", prefill_tps},
                   {"decode_ms", decode_ms},
                   {"decode_tokens", decoded},
                   {"decode_tokens_per_s", decode_tps}};
    j["threads"] = o.threads > 0 ? o.threads : default_thread_count();
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string s;
    for (size_t i = 0; i < out.size(); ++i) s += (i ? "," : "") + std::to_string(out[i]);
    std::printf("output_ids: %s\n", s.c_str());
    std::printf("prefill: %zu tokens in %.1f ms (%.1f tokens/s); decode: %lld tokens in %.1f ms (%.1f tokens/s)\n",
                ids->size(), prefill_ms, prefill_tps, static_cast<long long>(decoded), decode_ms, decode_tps);
  }
  return 0;
}

void register_generate(CLI::App& root, int& exit_code) {
  auto opts = std::make_shared<GenerateOptions>();
  auto* cmd = root.add_subcommand("generate", "Greedy decoding from prompt token ids (CPU backend)");
  cmd->add_option("--model", opts->model, "Model folder (config.json + *.safetensors)")->required();
  cmd->add_option("--prompt-ids", opts->prompt_ids, "Comma-separated prompt token ids, e.g. 1,2,3")->required();
  cmd->add_option("--max-tokens", opts->max_tokens, "Tokens to generate")->default_val(16);
  cmd->add_flag("--json", opts->json, "Print one JSON object (output_ids, prompt_ids, timing)");
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "Do not stop at the config's eos token ids");
  cmd->add_option("--threads", opts->threads, "Worker threads (default: hardware concurrency)");
  cmd->add_option("--device", opts->device, "Backend: cpu or cuda")->default_val("cpu");
  cmd->add_option("--image", opts->images,
                  "Image file (JPEG, PNG, WebP, GIF), repeatable; each image token id in --prompt-ids is expanded "
                  "into that image's tokens (prompt_ids in --json output are the expanded ones)");
  add_load_options(cmd, opts->load);
  add_kv_options(cmd, opts->kv);
  cmd->callback([opts, &exit_code] { exit_code = run_generate(*opts); });
}
SPARKSERVE_COMMAND(register_generate);

}  // namespace
}  // namespace sparkserve::cli
