// `sparkserve generate`: greedy decoding: one prefill of the prompt, then one forward per generated
// token through the sequence's state (KV cache + GDN state). With --spec-k K the request runs
// through the serving engine with speculative decoding (the checkpoint's MTP layer drafts K tokens,
// one forward verifies them); the output is the same token for token.
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
#include "runtime/engine.h"

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
  int64_t spec_k = 0;
  LoadCliOptions load;
  KvCliOptions kv;
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Generated {
  std::vector<int32_t> out;
  double prefill_ms = 0, decode_ms = 0;
  EngineStats stats;
};

// One greedy request through the engine (speculative decoding on): prefill_ms until the first
// token, decode_ms for the rest.
Expected<Generated> generate_speculative(const GenerateOptions& o, Backend& backend, Qwen35Model& model,
                                         StateLimits limits, std::unique_ptr<MultimodalPrompt> mm,
                                         const std::vector<int32_t>& ids) {
  const ModelConfig& c = model.config();
  limits.mtp = true;
  // Room for the last verify chunk's drafts past the end.
  limits.num_kv_blocks += static_cast<int32_t>((o.spec_k + limits.block_size - 1) / limits.block_size);
  ModelState state(backend, c, limits);
  Qwen35Runner runner(model, state);
  EngineConfig ec;
  ec.max_num_seqs = 1;
  ec.max_num_batched_tokens = std::max<int64_t>(static_cast<int64_t>(ids.size()), 1 + o.spec_k);
  ec.max_model_len = static_cast<int64_t>(ids.size()) + o.max_tokens;
  ec.vocab_size = c.vocab_size;
  ec.enable_prefix_caching = false;
  ec.num_speculative_tokens = o.spec_k;
  Engine engine(runner, ec);
  auto r = std::make_shared<EngineRequest>();
  r->prompt = ids;
  r->mm = std::move(mm);
  r->params.temperature = 0.0f;
  r->params.max_tokens = o.max_tokens;
  r->params.ignore_eos = o.ignore_eos;
  r->params.eos_token_ids = c.eos_token_ids;
  engine.submit(r);
  Generated g;
  auto t0 = Clock::now();
  std::optional<Clock::time_point> first;
  std::string error;
  while (engine.step()) {
    for (auto& e : r->out.pop_all(std::chrono::milliseconds(0))) {
      if (e.finish_reason == "error") error = e.error;
      if (e.finished) continue;
      if (!first) first = Clock::now();
      g.out.push_back(e.token);
    }
  }
  if (!error.empty()) return make_error(error);
  g.prefill_ms = first ? std::chrono::duration<double, std::milli>(*first - t0).count() : 0;
  g.decode_ms = first ? ms_since(*first) : 0;
  g.stats = engine.stats();
  return g;
}

int run_generate(const GenerateOptions& o) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    return 1;
  };
  auto ids = parse_token_ids(o.prompt_ids);
  if (!ids) return fail(ids.message());
  if (o.max_tokens < 0) return fail("--max-tokens must be >= 0");
  if (o.spec_k < 0 || o.spec_k > 8) return fail("--spec-k must be in [0, 8] (0: no speculative decoding)");
  if (o.threads < 0 || o.threads > kMaxThreads)
    return fail("--threads must be between 1 and " + std::to_string(kMaxThreads) + " (0 or absent: all cores)");
  auto kv_dtype = parse_kv_cache_dtype(o.kv.dtype, o.device == "cuda" ? Device::kCuda : Device::kCpu);
  if (!kv_dtype) return fail(kv_dtype.message());
  auto gdn_dtype = parse_gdn_state_dtype(o.kv.gdn_state_dtype);
  if (!gdn_dtype) return fail(gdn_dtype.message());
  if (!(o.kv.gpu_memory_utilization > 0 && o.kv.gpu_memory_utilization <= 1))
    return fail("--gpu-memory-utilization must be in (0, 1]");
  auto made = make_backend(o.device, o.threads > 0 ? o.threads : default_thread_count());
  if (!made) return fail(made.message());
  auto backend = std::move(*made);
  std::vector<std::string> notes;
  auto load_opts = make_load_options(o.load);
  if (!load_opts) return fail(load_opts.message());
  load_opts->load_mtp = o.spec_k > 0;
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
  auto limits = one_sequence_state(*backend, c, total, *kv_dtype, *gdn_dtype, o.kv.gpu_memory_utilization);
  if (!limits) return fail(limits.message());
  std::optional<EngineStats> spec_stats;
  std::vector<int32_t> out;
  double prefill_ms = 0, decode_ms = 0;
  if (o.spec_k > 0 && o.max_tokens > 0) {
    auto g = generate_speculative(o, *backend, **model, *limits, std::move(*mm), *ids);
    if (!g) return fail(g.message());
    out = std::move(g->out);
    prefill_ms = g->prefill_ms;
    decode_ms = g->decode_ms;
    spec_stats = g->stats;
  }
  DirectState state(*backend, c, *limits);
  auto seq = state.open_sequence();
  if (!seq) return fail(seq.message());

  if (o.max_tokens > 0 && !spec_stats) {
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
    if (spec_stats) {
      const auto& st = *spec_stats;
      j["speculative"] = {{"k", o.spec_k},
                          {"verify_steps", st.verify_chunks},
                          {"draft_tokens", st.drafts_proposed},
                          {"accepted_tokens", st.drafts_accepted},
                          {"mean_accept_length", st.verify_chunks ? 1.0 + static_cast<double>(st.drafts_accepted) /
                                                                             static_cast<double>(st.verify_chunks)
                                                                  : 0.0}};
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string s;
    for (size_t i = 0; i < out.size(); ++i) s += (i ? "," : "") + std::to_string(out[i]);
    std::printf("output_ids: %s\n", s.c_str());
    std::printf("prefill: %zu tokens in %.1f ms (%.1f tokens/s); decode: %lld tokens in %.1f ms (%.1f tokens/s)\n",
                ids->size(), prefill_ms, prefill_tps, static_cast<long long>(decoded), decode_ms, decode_tps);
    if (spec_stats)
      std::printf("speculative: %llu verify steps, %llu/%llu drafts accepted\n",
                  static_cast<unsigned long long>(spec_stats->verify_chunks),
                  static_cast<unsigned long long>(spec_stats->drafts_accepted),
                  static_cast<unsigned long long>(spec_stats->drafts_proposed));
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
  cmd->add_option("--spec-k,--speculative-tokens", opts->spec_k,
                  "Speculative decoding with the checkpoint's multi-token-prediction layer: K draft tokens per step "
                  "(0: off; the output is the same with the float32 GDN state: a bfloat16 one is rounded once per "
                  "verify step's accepted tokens instead of once per token)")
      ->default_val(0);
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
