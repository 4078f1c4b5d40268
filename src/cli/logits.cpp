// `sparkserve logits`: teacher-forced logits for every prompt position, written as a float32 .npy
// [T, vocab_size] (one forward over the whole prompt; with --prefill-chunk N, forwards of N tokens
// each continuing from the state the last one left, N = 1 being a cached decode: what a state dtype
// changes between forwards shows in these rows). With --image, T counts the expanded image tokens.
// With --mtp-drafts K: the multi-token-prediction layer's draft logits instead,
// [T - 1 + K - 1, vocab]: row p < T - 1 reads the target's hidden state at p and token p + 1
// (teacher forced), then K - 1 chained rows from the last one (each feeds the MTP's output and the
// argmax draft of the row before, one position further).
#include <algorithm>
#include <cstdio>

#include "backend/backend_factory.h"
#include "cli/cli_images.h"
#include "cli/command.h"
#include "cli/kv_sizing.h"
#include "cli/model_args.h"
#include "core/npy.h"
#include "core/thread_pool.h"
#include "model/load.h"
#include "runtime/direct_state.h"

namespace sparkserve::cli {
namespace {

struct LogitsOptions {
  std::string model;
  std::string prompt_ids;
  std::string out;
  int threads = 0;
  std::string device = "cpu";
  std::vector<std::string> images;
  int mtp_drafts = 0;
  int64_t prefill_chunk = 0;  // 0: one forward
  LoadCliOptions load;
  KvCliOptions kv;
};

int run_logits(const LogitsOptions& o) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    return 1;
  };
  auto ids = parse_token_ids(o.prompt_ids);
  if (!ids) return fail(ids.message());
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
  if (o.mtp_drafts < 0) return fail("--mtp-drafts must be >= 1");
  if (o.mtp_drafts > 0 && ids->size() < 2) return fail("--mtp-drafts needs at least 2 prompt tokens");
  if (o.prefill_chunk < 0) return fail("--prefill-chunk must be >= 0");
  if (o.prefill_chunk > 0 && (o.mtp_drafts > 0 || !o.images.empty()))
    return fail("--prefill-chunk goes without --mtp-drafts and --image");
  load_opts->load_mtp = o.mtp_drafts > 0;
  auto model = load_qwen35(o.model, *backend, &notes, *load_opts);
  if (!model) return fail(model.message());
  for (const auto& n : notes) std::fprintf(stderr, "%s\n", n.c_str());
  auto mm = load_cli_images(o.model, **model, o.images, *ids);
  if (!mm) return fail(mm.message());
  const ModelConfig& c = (*model)->config();
  const int64_t T = static_cast<int64_t>(ids->size());
  const int64_t max_pos = c.max_position_embeddings > 0 ? c.max_position_embeddings : kDefaultMaxPositions;
  if (T > max_pos)
    return fail("prompt of " + std::to_string(T) + " tokens exceeds the model's maximum of " +
                std::to_string(max_pos) + " positions (max_position_embeddings)");
  auto limits = one_sequence_state(*backend, c, T + o.mtp_drafts, *kv_dtype, *gdn_dtype, o.kv.gpu_memory_utilization);
  if (!limits) return fail(limits.message());
  limits->mtp = o.mtp_drafts > 0;
  DirectState state(*backend, c, *limits);
  auto seq = state.open_sequence();
  if (!seq) return fail(seq.message());
  std::vector<SequenceInput> batch(1);
  batch[0].state = &*seq;
  batch[0].all_logits = o.mtp_drafts == 0;
  batch[0].mm = mm->get();
  SpecCapture capture;
  Expected<Logits> logits = Logits{};
  const int64_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : T;
  for (int64_t done = 0; done < T; done += chunk) {
    batch[0].tokens.assign(ids->begin() + done, ids->begin() + std::min(T, done + chunk));
    auto part = state.forward(**model, batch, o.mtp_drafts > 0 ? &capture : nullptr);
    if (!part) return fail(part.message());
    if (done == 0) {
      logits = std::move(part);
    } else {  // every row came back whole (all_logits, no argmax rows)
      logits->data.insert(logits->data.end(), part->data.begin(), part->data.end());
      logits->rows += part->rows;
    }
  }
  if (o.mtp_drafts > 0) {
    if (Status st = state.reserve(*seq, T + o.mtp_drafts); !st.ok()) return fail(st.message());
    Qwen35Model::DraftSeq d;
    d.block_table = seq->block_table;
    d.next_tokens = std::span<const int32_t>(*ids).subspan(1);
    d.num_drafts = o.mtp_drafts;
    d.mm = mm->get();
    d.rope_delta = seq->rope_delta;
    d.all_logits = true;
    auto drafted = (*model)->draft({&d, 1}, capture.hidden, state.state().pools());
    if (!drafted) return fail(drafted.message());
    *logits = std::move(drafted->logits);
  }
  Status st = write_npy_f32(o.out, {logits->rows, logits->vocab}, logits->data.data());
  if (!st.ok()) return fail(st.message());
  return 0;
}

void register_logits(CLI::App& root, int& exit_code) {
  auto opts = std::make_shared<LogitsOptions>();
  auto* cmd = root.add_subcommand("logits", "Teacher-forced logits of a prompt as float32 .npy [T, vocab]");
  cmd->add_option("--model", opts->model, "Model folder (config.json + *.safetensors)")->required();
  cmd->add_option("--prompt-ids", opts->prompt_ids, "Comma-separated prompt token ids, e.g. 1,2,3")->required();
  cmd->add_option("--out", opts->out, "Output .npy file")->required();
  cmd->add_option("--threads", opts->threads, "Worker threads (default: hardware concurrency)");
  cmd->add_option("--device", opts->device, "Backend: cpu or cuda")->default_val("cpu");
  cmd->add_option("--image", opts->images,
                  "Image file (JPEG, PNG, WebP, GIF), repeatable; each image token id in --prompt-ids is expanded "
                  "into that image's tokens, and the logits are those of the expanded sequence");
  cmd->add_option("--mtp-drafts", opts->mtp_drafts,
                  "Write the multi-token-prediction layer's draft logits instead: the T-1 teacher-forced rows, "
                  "then K-1 chained ones");
  cmd->add_option("--prefill-chunk", opts->prefill_chunk,
                  "Run the prompt in forwards of this many tokens, each continuing from the state the last left (1: "
                  "token by token, as a cached decode); 0: one forward")
      ->default_val(0);
  add_load_options(cmd, opts->load);
  add_kv_options(cmd, opts->kv);
  cmd->callback([opts, &exit_code] { exit_code = run_logits(*opts); });
}
SPARKSERVE_COMMAND(register_logits);

}  // namespace
}  // namespace sparkserve::cli
