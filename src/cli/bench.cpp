// `sparkserve bench`: throughput of the forward pass on a backend, no HTTP, for a model folder
// (--model DIR) or for random weights with the real shapes of a known model in a checkpoint layout,
// generated directly in backend memory (--synth LIKE --layout L; loader/synth_weights.h), so the
// 122B shapes are measured on a GPU machine whose disk could not hold the checkpoint. With --url it
// measures an OpenAI-compatible server instead (cli/bench_url.h).
//
// Reported: prefill tokens/s and time to first token per prompt length; decode tokens/s per
// (batch, context) where a context of C is one prefill of C tokens per sequence before the timed
// steps; peak device memory; the device's streaming bandwidth (elementwise add over 1 GiB buffers:
// 2 reads + 1 write per element) and beside each decode number its roofline:
//   weight floor  = weight bytes one step reads ÷ bandwidth. At batch 1 that is the weight bytes per
//                   token (routed experts k/E, embeddings one row, lm_head whole, no vision/MTP);
//                   at batch B the routed-expert part is the expected share of distinct experts B
//                   tokens touch under uniform routing, 1 − (1 − k/E)^B.
//   state floor   = the same plus the per-sequence state a step must touch: the KV cache read over
//                   the context (K and V of every attention layer, in --kv-cache-dtype) and the GDN recurrent and conv
//                   state read and written once.
// With --spec-k K1,K2..: speculative decoding cases per (batch, context, K) (cli/bench_spec.h): ms per
// verify step and per MTP proposal, tokens per step, tokens/s and both against the plain decode step of
// the same case; --spec-accept A forces the acceptance rate (a simulation: random weights accept
// nothing), otherwise the model's own greedy acceptance is measured.
// A decode step returns the greedy ids (the device argmax, as a served greedy step does); with
// --full-logits it downloads every [batch, vocab] row instead.
// Token ids are random (fixed seed): speed does not depend on them. A case predicted to take longer
// than --max-case-s (from the prefill rate already measured) or to need more device memory than is
// free is skipped and reported as such, never run into an out-of-memory abort.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include "backend/backend_factory.h"
#include "backend/synth_fill.h"
#include "cli/bench_spec.h"
#include "cli/bench_url.h"
#include "cli/command.h"
#include "cli/kv_sizing.h"
#include "cli/model_args.h"
#include "core/thread_pool.h"
#include "loader/safetensors.h"
#include "loader/synth_weights.h"
#include "model/load.h"
#include "runtime/direct_state.h"

namespace sparkserve::cli {
namespace {

struct BenchOptions {
  std::string model;
  std::string synth;
  std::string layout;
  std::optional<int> layers, vocab;
  uint64_t seed = 0;
  std::string url;
  std::string served_model;
  std::string api_key;
  int runs = 3;
  std::string device = build_has_cuda() ? "cuda" : "cpu";
  LoadCliOptions load;
  std::string prompt_lens = "128,512,2048";
  std::string batches = "1,4,16";
  std::string contexts = "0";
  std::string prefill_after = "0";  // cached tokens before each timed prefill
  int prefill_saves = 0;            // GDN state saves inside each timed prefill
  int decode_steps = 32;
  int prefill_chunk = 16384;
  double max_case_s = 120;
  double time_budget_s = 0;
  int threads = 0;
  bool json = false;
  std::string json_out;
  std::string concurrency;  // --url load mode levels, e.g. "1,8,32,64"
  bool weights_digest = false;
  // A/B measurements: each turns one decode mechanism off (all are on in serving).
  bool no_graphs = false, no_fused = false, sequential_branches = false, full_logits = false;
  std::string kv_cache_dtype = "auto";
  std::string gdn_state_dtype = "auto";
  double gpu_memory_utilization = 0.9;
  std::string context_fill = "prefill";
  std::string spec_k;       // speculative decoding cases: draft counts, e.g. "1,2,3"
  std::string spec_accept;  // "A" or "forced:A" (A in [0, 1]); empty: the model's own drafts
};

// --spec-accept: "0.8" or "forced:0.8" -> 0.8; empty -> -1 (the model's own acceptance).
Expected<double> parse_spec_accept(std::string text) {
  if (text.empty()) return -1.0;
  if (text.rfind("forced:", 0) == 0) text = text.substr(7);
  try {
    size_t used = 0;
    const double a = std::stod(text, &used);
    if (used == text.size() && a >= 0 && a <= 1) return a;
  } catch (const std::exception&) {
  }
  return make_error("--spec-accept: '" + text + "' is not a rate in [0, 1] (e.g. 0.8 or forced:0.8)");
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Expected<std::vector<int>> parse_list(const std::string& what, const std::string& text, bool allow_zero = false) {
  std::vector<int> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      int x = std::stoi(item, &used);
      if (used != item.size() || x < 0 || (x == 0 && !allow_zero)) throw std::invalid_argument(item);
      v.push_back(x);
    } catch (const std::exception&) {
      return make_error(what + ": '" + item + "' is not a " + (allow_zero ? "non-negative" : "positive") + " integer");
    }
  }
  if (v.empty()) return make_error(what + ": empty list");
  return v;
}

// What a decode step must read, from the checkpoint's tensor list (the same rule for --model and
// --synth): weights by name, state from the config.
struct ByteModel {
  double token_bytes = 0;        // weights one token reads at batch 1
  double routed_bytes_all = 0;   // every routed expert of every layer
  double kv_bytes_per_token = 0; // K + V of every attention layer in the cache's dtype
  double gdn_bytes_per_seq = 0;  // recurrent (--gdn-state-dtype) + f32 conv state of every GDN layer
  int experts = 0, top_k = 0;

  double weight_bytes(int batch) const {
    if (experts == 0) return token_bytes;
    const double p = static_cast<double>(top_k) / experts;
    const double distinct = 1.0 - std::pow(1.0 - p, batch);
    return token_bytes - routed_bytes_all * p + routed_bytes_all * distinct;
  }
  double state_bytes(int batch, int context) const {
    return batch * (static_cast<double>(context) * kv_bytes_per_token + 2.0 * gdn_bytes_per_seq);
  }
};

ByteModel byte_model(const std::map<std::string, TensorInfo>& tensors, const ModelConfig& c, DType kv_dtype,
                     DType gdn_dtype) {
  ByteModel m;
  for (const auto& [name, info] : tensors) {
    if (name.find("visual") != std::string::npos || name.rfind("mtp.", 0) == 0) continue;
    double b = static_cast<double>(info.nbytes);
    if (name.find("embed_tokens") != std::string::npos) {
      b /= static_cast<double>(c.vocab_size);
      if (c.tie_word_embeddings) m.token_bytes += static_cast<double>(info.nbytes);  // read again as lm_head
    } else if (name.find("mlp.experts.") != std::string::npos && c.num_experts > 0) {
      m.routed_bytes_all += b;
      b *= static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.num_experts);
    }
    m.token_bytes += b;
  }
  m.experts = c.num_experts;
  m.top_k = c.num_experts_per_tok;
  m.kv_bytes_per_token = static_cast<double>(count_layers(c, LayerType::kFullAttention)) *
                         kv_bytes_per_token(kv_dtype, c.num_key_value_heads, c.head_dim);
  m.gdn_bytes_per_seq = static_cast<double>(gdn_state_bytes(c, gdn_dtype));
  return m;
}

// Rows that came back whole, and rows whose argmax alone came back (it reports a non-finite logit).
bool all_finite(const Logits& l) {
  for (float v : l.data)
    if (!std::isfinite(v)) return false;
  for (const RowArgmax& a : l.argmax)
    if (a.nonfinite >= 0) return false;
  return true;
}

int run_bench(const BenchOptions& o) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    return 1;
  };
  const int sources = !o.model.empty() + !o.synth.empty() + !o.url.empty();
  if (sources != 1) return fail("give exactly one of --model DIR, --synth LIKE (with --layout) or --url URL");
  auto lens = parse_list("--prompt-lens", o.prompt_lens);
  if (!lens) return fail(lens.message());
  if (o.decode_steps < 0) return fail("--decode-steps must be >= 0");
  if (!o.url.empty()) {
    if (o.decode_steps == 0) return fail("--decode-steps must be > 0 with --url");
    BenchUrlOptions u;
    u.url = o.url;
    u.model = o.served_model;
    u.api_key = o.api_key;
    u.prompt_lens = *lens;
    u.gen_tokens = o.decode_steps;
    u.runs = o.runs;
    u.json = o.json;
    u.json_out = o.json_out;
    if (!o.concurrency.empty()) {
      auto conc = parse_list("--concurrency", o.concurrency);
      if (!conc) return fail(conc.message());
      u.concurrency = *conc;
    }
    return run_bench_url(u);
  }
  auto batches = parse_list("--batches", o.batches);
  if (!batches) return fail(batches.message());
  auto contexts = parse_list("--contexts", o.contexts, /*allow_zero=*/true);
  if (!contexts) return fail(contexts.message());
  auto afters = parse_list("--prefill-after", o.prefill_after, /*allow_zero=*/true);
  if (!afters) return fail(afters.message());
  std::sort(afters->begin(), afters->end());
  if (o.prefill_chunk <= 0) return fail("--prefill-chunk must be > 0");
  if (!(o.max_case_s > 0)) return fail("--max-case-s must be > 0");
  if (o.time_budget_s < 0) return fail("--time-budget-s must be >= 0");
  if (!o.synth.empty() && o.layout.empty()) return fail("--synth needs --layout (" + [] {
    std::string s;
    for (const auto& n : synth_layout_names()) s += (s.empty() ? "" : " | ") + n;
    return s;
  }() + ")");
  if (o.synth.empty() && (!o.layout.empty() || o.layers || o.vocab))
    return fail("--layout, --layers and --vocab go with --synth");
  std::vector<int> spec_ks;
  if (!o.spec_k.empty()) {
    auto ks = parse_list("--spec-k", o.spec_k);
    if (!ks) return fail(ks.message());
    spec_ks = *ks;
    if (*std::max_element(spec_ks.begin(), spec_ks.end()) > 8) return fail("--spec-k: at most 8 drafts");
  }
  auto spec_accept = parse_spec_accept(o.spec_accept);
  if (!spec_accept) return fail(spec_accept.message());
  if (*spec_accept >= 0 && spec_ks.empty()) return fail("--spec-accept goes with --spec-k");
  std::sort(lens->begin(), lens->end());
  std::sort(contexts->begin(), contexts->end());
  auto kv_dtype = parse_kv_cache_dtype(o.kv_cache_dtype, o.device == "cuda" ? Device::kCuda : Device::kCpu);
  if (!kv_dtype) return fail(kv_dtype.message());
  auto gdn_dtype = parse_gdn_state_dtype(o.gdn_state_dtype);
  if (!gdn_dtype) return fail(gdn_dtype.message());
  if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1))
    return fail("--gpu-memory-utilization must be in (0, 1]");

  // Everything that can be rejected without a backend is checked before one is created.
  std::optional<SynthPlan> plan;
  if (!o.synth.empty()) {
    auto like = model_like(o.synth);
    if (!like) return fail(like.message());
    if (Status st = resize_model(*like, o.vocab, o.layers); !st.ok()) return fail(st.message());
    auto layout = parse_synth_layout(o.layout);
    if (!layout) return fail(layout.message());
    plan = synth_plan(*like, *layout);
  }
  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  auto made = make_backend(o.device, threads);
  if (!made) return fail(made.message());
  Backend& be = **made;
  const auto t_start = Clock::now();
  auto t_load = Clock::now();
  std::unique_ptr<Qwen35Model> model;
  ByteModel bytes;
  uint64_t loaded_bytes = 0;
  double budget_token_bytes = -1;  // loader/weight_budget.h's count (what `inspect --like` prints), --synth only
  if (plan) {
    auto sm = build_synth_model(*plan, be, o.seed, /*with_mtp=*/!spec_ks.empty());
    if (!sm) return fail(sm.message());
    if (o.weights_digest) {
      std::printf("weights digest: %s\n", weights_digest(sm->weights, be).c_str());
      return 0;
    }
    bytes = byte_model(synth_tensor_infos(*plan), sm->config, *kv_dtype, *gdn_dtype);
    budget_token_bytes = sm->token_bytes;
    loaded_bytes = sm->loaded_bytes;
    model = std::make_unique<Qwen35Model>(be, std::move(sm->config), std::move(sm->weights));
  } else {
    auto ckpt = Checkpoint::open(o.model);
    if (!ckpt) return fail(ckpt.message());
    if (o.weights_digest) {
      auto config = load_model_config(o.model);
      if (!config) return fail(config.message());
      auto w = load_weights(*ckpt, *config, be);
      if (!w) return fail(w.message());
      std::printf("weights digest: %s\n", weights_digest(*w, be).c_str());
      return 0;
    }
    auto load_opts = make_load_options(o.load);
    if (!load_opts) return fail(load_opts.message());
    load_opts->load_mtp = !spec_ks.empty();
    auto m = load_qwen35(o.model, be, nullptr, *load_opts);
    if (!m) return fail(m.message());
    model = std::move(*m);
    bytes = byte_model(ckpt->tensors(), model->config(), *kv_dtype, *gdn_dtype);
    for (const auto& [name, info] : ckpt->tensors()) loaded_bytes += info.nbytes;
  }
  be.synchronize();
  const double load_s = seconds_since(t_load);
  Qwen35Model& m = *model;
  const ModelConfig& c = m.config();
  if (o.no_graphs) m.set_graphs_enabled(false);
  if (o.no_fused) m.set_fused_enabled(false);
  if (o.sequential_branches) be.set_concurrent_branches(false);
  std::mt19937 rng(1234);
  auto random_ids = [&](int64_t n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& x : ids) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size));
    return ids;
  };
  const int max_len = lens->back();
  const int max_ctx = contexts->back();
  if (c.max_position_embeddings > 0 &&
      std::max({max_len + afters->back(), max_ctx + o.decode_steps + 3}) > c.max_position_embeddings)
    return fail("a prompt length or context + decode steps exceeds max_position_embeddings " +
                std::to_string(c.max_position_embeddings));

  // Streaming bandwidth: out = a + b over 2^28 floats (1 GiB each), median of 10 after a warm-up.
  double copy_gbs = 0;
  {
    const int64_t n = be.device() == Device::kCuda ? (int64_t{1} << 28) : (int64_t{1} << 24);
    Buffer a(&be, DType::kF32, {n}), b(&be, DType::kF32, {n}), out(&be, DType::kF32, {n});
    be.fill_zero(a);
    be.fill_zero(b);
    std::vector<double> ts;
    for (int i = 0; i < 11; ++i) {
      be.synchronize();
      auto t0 = Clock::now();
      be.add(out, a, b);
      be.synchronize();
      if (i > 0) ts.push_back(seconds_since(t0));
    }
    std::sort(ts.begin(), ts.end());
    copy_gbs = 3.0 * static_cast<double>(n) * 4 / ts[ts.size() / 2] / 1e9;
  }
  const bool table = !o.json;
  auto say = [&](const char* fmt, auto... args) {
    if (table) {
      std::printf(fmt, args...);
      std::fflush(stdout);
    }
  };

  nlohmann::json j;
  j["source"] = plan ? "synth" : "model";
  if (plan) {
    j["synth"] = o.synth;
    j["layout"] = o.layout;
    j["layers"] = c.num_hidden_layers;
    j["vocab"] = c.vocab_size;
  } else {
    j["model"] = o.model;
  }
  j["device"] = o.device;
  j["graphs"] = !o.no_graphs;
  j["fused_decode"] = !o.no_fused;
  j["concurrent_branches"] = !o.sequential_branches;
  j["decode_output"] = o.full_logits ? "logits" : "argmax";
  j["load_s"] = load_s;
  j["weights_bytes"] = loaded_bytes;
  j["weight_bytes_per_token"] = bytes.token_bytes;
  if (budget_token_bytes >= 0) j["weight_bytes_per_token_inspect"] = budget_token_bytes;
  j["kv_bytes_per_token"] = bytes.kv_bytes_per_token;
  j["gdn_state_bytes_per_sequence"] = bytes.gdn_bytes_per_seq;
  j["stream_bandwidth_gb_s"] = copy_gbs;
  j["weight_floor_ms_batch1"] = bytes.token_bytes / (copy_gbs * 1e9) * 1e3;
  j["prefill"] = nlohmann::json::array();
  j["decode"] = nlohmann::json::array();
  bool finite = true;
  auto check = [&](const Logits& l, const std::string& where) {
    if (all_finite(l)) return;
    if (finite) std::fprintf(stderr, "warning: non-finite logits (%s): the synthetic scales overflow\n", where.c_str());
    finite = false;
  };
  say("%s on %s: load %.2f s, %.2f GB of weights, weights read per decoded token %.3f GB, stream bandwidth %.1f GB/s, "
      "weight floor at batch 1 %.3f ms/token\n",
      plan ? (o.synth + " " + o.layout + " (synthetic, " + std::to_string(c.num_hidden_layers) + " layers)").c_str()
           : o.model.c_str(),
      o.device.c_str(), load_s, loaded_bytes / 1e9, bytes.token_bytes / 1e9, copy_gbs,
      bytes.token_bytes / (copy_gbs * 1e9) * 1e3);
  if (o.no_graphs || o.no_fused || o.sequential_branches || o.full_logits)
    say("A/B: %s%s%s%s\n", o.no_graphs ? "CUDA graphs off " : "", o.no_fused ? "fused decode off " : "",
        o.sequential_branches ? "branches in order " : "", o.full_logits ? "full logits rows downloaded" : "");

  // Memory a case needs beyond the weights must fit in what --gpu-memory-utilization leaves (serve's
  // rule, cli/kv_sizing.h); -1 = not tracked (CPU).
  const DeviceMemory mem_at_start = device_memory(be);
  const double room = mem_at_start.total_bytes < 0 ? -1.0
                                                   : o.gpu_memory_utilization * static_cast<double>(mem_at_start.total_bytes) -
                                                         static_cast<double>(mem_at_start.total_bytes - mem_at_start.free_bytes);
  auto fits = [&](double need) { return room < 0 || need < room; };
  j["kv_cache_dtype"] = kv_cache_dtype_name(*kv_dtype);
  j["gdn_state_dtype"] = gdn_state_dtype_name(*gdn_dtype);
  if (*gdn_dtype != DType::kF32) say("GDN recurrent state in %s (--gdn-state-dtype)\n", gdn_state_dtype_name(*gdn_dtype));
  j["context_fill"] = o.context_fill;
  j["prefill_saves"] = o.prefill_saves;
  if (o.prefill_saves > 0) say("each timed prefill saves its GDN state %d times (--prefill-saves)\n", o.prefill_saves);
  if (room >= 0) {
    // What `serve` would size with these settings: 64 sequences, steps of 2048 tokens.
    auto kb = kv_budget_from_memory(be, c, o.gpu_memory_utilization, 64, 2048, *gdn_dtype);
    if (!kb) return fail(kb.message());
    const double tokens = std::max(0.0, kb->kv) / bytes.kv_bytes_per_token;
    j["kv_capacity_tokens_serve_64"] = tokens;
    say("KV cache (%s, %.0f B/token): serve --gpu-memory-utilization %.2f --max-num-seqs 64 leaves %.1f GB = %.0f tokens "
        "(%.1f sequences of 32768)\n",
        kv_cache_dtype_name(*kv_dtype), bytes.kv_bytes_per_token, o.gpu_memory_utilization, kb->kv / 1e9, tokens,
        tokens / 32768);
  }
  // Prefill rate measured so far, for predicting how long a longer prefill takes (a lower bound:
  // attention grows faster than linearly).
  double rate_tokens = 0, rate_s = 0;
  auto predict_prefill_s = [&](int64_t tokens) { return rate_s > 0 ? rate_s * tokens / rate_tokens : 0.0; };
  auto over_budget = [&](double predicted_s) {
    return o.time_budget_s > 0 && seconds_since(t_start) + predicted_s > o.time_budget_s;
  };
  StateLimits lim;
  lim.block_size = 16;
  lim.kv_dtype = *kv_dtype;
  lim.gdn_state_dtype = *gdn_dtype;
  auto blocks_for = [&](int64_t tokens) { return static_cast<int32_t>(tokens / lim.block_size + 2); };

  // Runs a prompt of `len` tokens through one sequence in chunks of --prefill-chunk.
  // saves: the last chunk saves the GDN state after its tokens len - 1, len - 3, .. (--prefill-saves).
  auto prefill = [&](DirectState& st, SequenceState& seq, int64_t len, int saves = 0) -> Expected<Logits> {
    Logits last;
    for (int64_t done = 0; done < len;) {
      const int64_t n = std::min<int64_t>(o.prefill_chunk, len - done);
      std::vector<SequenceInput> b(1);
      b[0].state = &seq;
      b[0].tokens = random_ids(n);
      for (int i = saves - 1; i >= 0 && done + n == len; --i)
        if (n - 1 - 2 * i > 0) b[0].saves.push_back({n - 1 - 2 * i, lim.max_sequences + i});
      SS_ASSIGN_OR_RETURN(last, st.forward(m, b));
      done += n;
    }
    return last;
  };

  // Prefill: one sequence, one forward over the prompt (in chunks of --prefill-chunk), after A
  // cached tokens (--prefill-after; A > 0: a later turn of a conversation whose earlier turns are in
  // the KV cache and GDN state — a prefill of A random tokens, untimed, then the timed one).
  say("\n%-14s %12s %14s\n", "prefill tokens", "TTFT ms", "tokens/s");
  // --prefill-after is sorted: the cases after cached tokens come last, under a header with that column.
  bool after_header_said = false;
  for (const int A : *afters) {
    if (A > 0 && !after_header_said) {
      say("\n%-14s %8s %12s %14s\n", "prefill tokens", "after", "TTFT ms", "tokens/s");
      after_header_said = true;
    }
    for (const int L : *lens) {
      const double pred = predict_prefill_s(L) + predict_prefill_s(A);
      const double need = static_cast<double>(blocks_for(A + L)) * lim.block_size * bytes.kv_bytes_per_token +
                          bytes.gdn_bytes_per_seq + activation_bytes(c, std::min(std::max(A, L), o.prefill_chunk));
      std::string skip;
      if (pred > o.max_case_s) skip = "predicted " + std::to_string(static_cast<int>(pred)) + " s > --max-case-s";
      else if (over_budget(pred)) skip = "--time-budget-s spent";
      else if (!fits(need)) skip = "needs ~" + std::to_string(static_cast<int>(need / 1e9)) + " GB of free device memory";
      if (!skip.empty()) {
        j["prefill"].push_back({{"prompt_tokens", L}, {"after", A}, {"skipped", skip}});
        say("%-14d %s\n", L, ("skipped: " + skip).c_str());
        continue;
      }
      lim.max_sequences = 1;
      lim.num_kv_blocks = blocks_for(A + L);
      lim.num_snapshots = o.prefill_saves;
      DirectState st(be, c, lim);
      lim.num_snapshots = 0;
      // Each length is timed on its second run: the first loads the kernels its shapes pick (CUDA
      // loads a kernel on its first launch; cuBLASLt chooses per token-count bucket), as a served
      // model has done at start-up (serve's warm-up).
      for (int rep = 0; rep < 2; ++rep) {
        auto seq = st.open_sequence();
        if (!seq) return fail(seq.message());
        if (A > 0) {
          auto cached = prefill(st, *seq, A);
          if (!cached) return fail(cached.message());
        }
        be.synchronize();
        auto t0 = Clock::now();
        auto l = prefill(st, *seq, L, o.prefill_saves);
        if (!l) return fail(l.message());
        const double s = seconds_since(t0);
        check(*l, "prefill");
        st.close_sequence(*seq);
        if (rep == 1) {
          j["prefill"].push_back({{"prompt_tokens", L}, {"after", A}, {"ttft_ms", s * 1e3}, {"tokens_per_s", L / s}});
          if (A > 0) {
            say("%-14d %8d %12.2f %14.1f\n", L, A, s * 1e3, L / s);
          } else {
            say("%-14d %12.2f %14.1f\n", L, s * 1e3, L / s);
            rate_tokens = L;
            rate_s = s;
          }
        }
      }
    }
  }

  // Decode: B sequences, each first prefilled with C tokens, then two warm-up steps and
  // decode_steps timed batched steps.
  if (o.decode_steps > 0)
    say("\n%-6s %8s %11s %11s | %10s %10s %8s | %10s %10s %8s\n", "batch", "context", "ms/step", "tokens/s",
        "weight MB", "floor ms", "of floor", "+state MB", "floor ms", "of floor");
  double step_s_hint = 0;
  std::map<std::pair<int, int>, double> plain_step_s;  // (batch, context) -> s per decode step
  for (int C : *contexts) {
    for (int B : *batches) {
      if (o.decode_steps == 0) break;  // prefill cases only
      const int64_t tokens = static_cast<int64_t>(C) + o.decode_steps + 3;
      const bool fill_zeros = o.context_fill == "zeros";
      const double pred = (fill_zeros ? 0.0 : B * predict_prefill_s(C)) + (o.decode_steps + 3) * step_s_hint;
      const double need = static_cast<double>(B) * blocks_for(tokens) * lim.block_size * bytes.kv_bytes_per_token +
                          B * bytes.gdn_bytes_per_seq + activation_bytes(c, std::max<int64_t>(B, std::min(C, o.prefill_chunk)));
      std::string skip;
      if (C > 0 && rate_s == 0 && !fill_zeros) skip = "no prefill rate measured to predict the context prefill";
      else if (pred > o.max_case_s) skip = "predicted " + std::to_string(static_cast<int>(pred)) + " s > --max-case-s";
      else if (over_budget(pred)) skip = "--time-budget-s spent";
      else if (!fits(need)) skip = "needs ~" + std::to_string(static_cast<int>(need / 1e9)) + " GB of free device memory";
      if (!skip.empty()) {
        j["decode"].push_back({{"batch", B}, {"context", C}, {"skipped", skip}});
        say("%-6d %8d skipped: %s\n", B, C, skip.c_str());
        continue;
      }
      lim.max_sequences = B;
      lim.num_kv_blocks = B * blocks_for(tokens);
      DirectState st(be, c, lim);
      std::vector<SequenceState> seqs;
      for (int i = 0; i < B; ++i) {
        auto s = st.open_sequence();
        if (!s) return fail(s.message());
        seqs.push_back(*s);
      }
      auto t_ctx = Clock::now();
      if (fill_zeros) {
        // The context as zeros in the KV cache (and the GDN state left as a fresh sequence's):
        // a decode step reads every cached position whatever its value, so it times the same.
        for (const KvPool& p : st.state().pools().kv)
          for (const Tensor* t : {&p.k, &p.v, &p.k_scale, &p.v_scale})
            if (t->data) be.fill_zero(*t);
        for (auto& seq : seqs)
          if (Status ok = st.skip_ahead(seq, C); !ok.ok()) return fail(ok.message());
      }
      for (int i = 0; i < B && C > 0 && !fill_zeros; ++i) {
        auto l = prefill(st, seqs[static_cast<size_t>(i)], C);
        if (!l) return fail(l.message());
      }
      be.synchronize();
      const double ctx_s = seconds_since(t_ctx);
      std::vector<SequenceInput> b(static_cast<size_t>(B));
      for (int i = 0; i < B; ++i) {
        b[static_cast<size_t>(i)].state = &seqs[static_cast<size_t>(i)];
        b[static_cast<size_t>(i)].tokens = random_ids(1);
        // As a served greedy step: the ids come back, not [B, vocab] rows of logits (64 MB at batch
        // 64, downloaded into fresh pageable host memory every step).
        b[static_cast<size_t>(i)].argmax_vocab = o.full_logits ? 0 : c.vocab_size;
      }
      // Two warm-up steps: with CUDA graphs the first step of a batch size runs op by op and the
      // second records the graph that the timed steps replay.
      Expected<Logits> l = make_error("no step");
      for (int w = 0; w < 2; ++w) {
        l = st.forward(m, b);
        if (!l) return fail(l.message());
        for (auto& in : b) in.tokens = random_ids(1);
      }
      check(*l, "decode warm-up");
      be.synchronize();
      auto t0 = Clock::now();
      for (int s = 0; s < o.decode_steps; ++s) {
        for (auto& in : b) in.tokens = random_ids(1);
        l = st.forward(m, b);
        if (!l) return fail(l.message());
      }
      const double per_step = seconds_since(t0) / o.decode_steps;
      check(*l, "decode");
      step_s_hint = std::max(step_s_hint, per_step);
      plain_step_s[{B, C}] = per_step;
      const double wb = bytes.weight_bytes(B), sb = wb + bytes.state_bytes(B, C);
      const double wfloor = wb / (copy_gbs * 1e9), sfloor = sb / (copy_gbs * 1e9);
      j["decode"].push_back({{"batch", B},
                             {"context", C},
                             {"context_prefill_s", ctx_s},
                             {"ms_per_step", per_step * 1e3},
                             {"tokens_per_s", B / per_step},
                             {"weight_bytes_per_step", wb},
                             {"weight_floor_ms", wfloor * 1e3},
                             {"fraction_of_weight_roofline", wfloor / per_step},
                             {"state_bytes_per_step", sb - wb},
                             {"state_floor_ms", sfloor * 1e3},
                             {"fraction_of_state_roofline", sfloor / per_step}});
      say("%-6d %8d %11.3f %11.1f | %10.1f %10.3f %7.1f%% | %10.1f %10.3f %7.1f%%\n", B, C, per_step * 1e3, B / per_step,
          wb / 1e6, wfloor * 1e3, 100 * wfloor / per_step, sb / 1e6, sfloor * 1e3, 100 * sfloor / per_step);
    }
  }
  // Speculative decoding: the same (batch, context) cases with k drafts per step.
  j["speculative"] = nlohmann::json::array();
  if (!spec_ks.empty() && o.decode_steps > 0) {
    const bool forced = *spec_accept >= 0;
    say("\nspeculative decoding (MTP), acceptance: %s\n", forced ? ("FORCED " + std::to_string(*spec_accept) +
                                                                      " per draft (simulation: random weights accept nothing; tok/step is its expectation 1 + A + .. + A^k)").c_str()
                                                                 : "the model's own (greedy)");
    say("%-6s %8s %3s %10s %9s %10s %10s %8s %11s | %9s %9s\n", "batch", "context", "k", "verify ms", "commit ms",
        "draft ms", "step ms", "tok/step", "tokens/s", "verify/dec", "speedup");
    for (int C : *contexts) {
      for (int B : *batches) {
        for (int k : spec_ks) {
          const int64_t tokens = static_cast<int64_t>(C) + static_cast<int64_t>(o.decode_steps + 3) * (k + 1) + k + 1;
          const double need = static_cast<double>(B) * blocks_for(tokens) * lim.block_size * bytes.kv_bytes_per_token *
                                  (1.0 + 1.0 / std::max(1, count_layers(c, LayerType::kFullAttention))) +
                              B * bytes.gdn_bytes_per_seq + activation_bytes(c, std::max<int64_t>(B * (k + 1), std::min(C, o.prefill_chunk)));
          const double pred = (o.context_fill == "zeros" ? 0.0 : B * predict_prefill_s(C)) +
                              (o.decode_steps + 3) * step_s_hint * 2;
          std::string skip;
          if (pred > o.max_case_s) skip = "predicted " + std::to_string(static_cast<int>(pred)) + " s > --max-case-s";
          else if (over_budget(pred)) skip = "--time-budget-s spent";
          else if (!fits(need)) skip = "needs ~" + std::to_string(static_cast<int>(need / 1e9)) + " GB of free device memory";
          if (!skip.empty()) {
            j["speculative"].push_back({{"batch", B}, {"context", C}, {"k", k}, {"skipped", skip}});
            say("%-6d %8d %3d skipped: %s\n", B, C, k, skip.c_str());
            continue;
          }
          SpecCase sc;
          sc.batch = B;
          sc.context = C;
          sc.k = k;
          sc.forced_accept = *spec_accept;
          sc.steps = o.decode_steps;
          sc.fill_zeros = o.context_fill == "zeros";
          auto r = run_spec_case(be, m, lim, sc, prefill, rng);
          if (!r) return fail(r.message());
          const double tps = B * r->tokens_per_step / (r->step_ms() / 1e3);
          auto plain = plain_step_s.find({B, C});
          const double plain_ms = plain == plain_step_s.end() ? 0 : plain->second * 1e3;
          nlohmann::json row = {{"batch", B}, {"context", C}, {"k", k}, {"acceptance", forced ? "forced" : "model"},
                                {"verify_ms", r->verify_ms}, {"commit_ms", r->commit_ms}, {"propose_ms", r->propose_ms},
                                {"step_ms", r->step_ms()},
                                {"tokens_per_step", r->tokens_per_step},
                                {"tokens_per_step_sampled", r->sampled_tokens_per_step}, {"tokens_per_s", tps}};
          if (forced) row["forced_accept"] = *spec_accept;
          row["mtp_pass_ms"] = r->pass_ms;
          if (plain_ms > 0) {
            row["plain_decode_ms"] = plain_ms;
            row["verify_over_decode"] = r->verify_ms / plain_ms;
            row["speedup_over_plain"] = tps / (B / (plain_ms / 1e3));
          }
          j["speculative"].push_back(row);
          if (plain_ms > 0)
            say("%-6d %8d %3d %10.3f %9.3f %10.3f %10.3f %8.2f %11.1f | %8.2fx %8.2fx\n", B, C, k, r->verify_ms,
                r->commit_ms, r->propose_ms, r->step_ms(), r->tokens_per_step, tps, r->verify_ms / plain_ms,
                tps / (B / (plain_ms / 1e3)));
          else
            say("%-6d %8d %3d %10.3f %9.3f %10.3f %10.3f %8.2f %11.1f | (no plain decode case)\n", B, C, k, r->verify_ms,
                r->commit_ms, r->propose_ms, r->step_ms(), r->tokens_per_step, tps);
          std::string passes;
          for (double ms : r->pass_ms) passes += " " + std::to_string(ms).substr(0, 6);
          if (forced)
            say("       MTP passes ms:%s   (tok/step drawn in this run: %.2f)\n", passes.c_str(), r->sampled_tokens_per_step);
          else
            say("       MTP passes ms:%s\n", passes.c_str());
        }
      }
    }
  }
  const int64_t peak = backend_peak_memory_bytes(be);
  j["peak_device_memory_bytes"] = peak;
  j["logits_finite"] = finite;
  if (!o.json_out.empty()) {
    std::FILE* f = std::fopen(o.json_out.c_str(), "w");
    if (!f) return fail("cannot write --json-out " + o.json_out);
    std::fprintf(f, "%s\n", j.dump(1).c_str());
    std::fclose(f);
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  if (o.decode_steps > 0)
    std::printf("(weight MB = weights one step reads: batch-1 bytes per token, routed experts as the expected\n"
                " distinct share 1-(1-k/E)^B at batch B; floor = bytes / stream bandwidth; +state adds the KV\n"
                " cache read over the context and the GDN state read + written once per sequence)\n");
  if (peak >= 0) std::printf("\npeak device memory (pool high-water mark): %.1f MiB\n", peak / 1048576.0);
  if (!finite) std::printf("warning: some logits were not finite\n");
  return 0;
}

void register_bench(CLI::App& root, int& exit_code) {
  auto opts = std::make_shared<BenchOptions>();
  auto* cmd = root.add_subcommand("bench", "Prefill/decode throughput of a model on a backend, or of an OpenAI-compatible server");
  cmd->add_option("--model", opts->model, "Model folder (config.json + *.safetensors)");
  cmd->add_option("--synth", opts->synth, "Random weights in device memory with the shapes of: qwen3.5-122b-a10b | qwen3.5-35b-a3b | tiny");
  cmd->add_option("--layout", opts->layout, "With --synth: bf16 | nvfp4 | nvfp4-fp8dense | fp8 | modelopt-nvfp4");
  cmd->add_option("--layers", opts->layers, "With --synth: number of decoder layers (default: the model's)");
  cmd->add_option("--vocab", opts->vocab, "With --synth: vocabulary size (default: the model's)");
  cmd->add_option("--seed", opts->seed, "With --synth: random seed (as `synth --seed`)")->capture_default_str();
  cmd->add_option("--url", opts->url, "Benchmark an OpenAI-compatible server at this base URL instead (e.g. http://host:8000)");
  cmd->add_option("--served-model", opts->served_model, "With --url: model name for requests (default: the only one /v1/models lists)");
  cmd->add_option("--api-key", opts->api_key, "With --url: bearer token");
  cmd->add_option("--runs", opts->runs, "With --url: runs per prompt length (with --concurrency: requests per client)")
      ->capture_default_str();
  cmd->add_option("--concurrency", opts->concurrency,
                  "With --url: load mode, clients streaming at once per level, e.g. 1,8,32,64");
  cmd->add_option("--device", opts->device, "Backend: cpu or cuda")->capture_default_str();
  add_load_options(cmd, opts->load);
  cmd->add_option("--prompt-lens", opts->prompt_lens, "Prefill prompt lengths")->capture_default_str();
  cmd->add_option("--batches", opts->batches, "Decode batch sizes")->capture_default_str();
  cmd->add_option("--contexts", opts->contexts, "Context lengths before decoding (a prefill of that many tokens per sequence)")
      ->capture_default_str();
  cmd->add_option("--prefill-after", opts->prefill_after,
                  "Cached tokens before each timed prefill, e.g. 0,10240 (a later conversation turn: that many "
                  "tokens prefilled untimed into the KV cache and GDN state first)")
      ->capture_default_str();
  cmd->add_option("--prefill-saves", opts->prefill_saves,
                  "GDN state saves inside each timed prefill, after its tokens L-1, L-3, .. (a later agent turn "
                  "saves 2: its prompt's last position and where the generation prompt begins)")
      ->check(CLI::Range(0, 8))
      ->capture_default_str();
  cmd->add_option("--decode-steps", opts->decode_steps,
                  "Timed decode steps per case (--url: generated tokens per request); 0: prefill cases only")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", opts->prefill_chunk, "Longest forward of one prompt (longer prompts run in chunks)")
      ->capture_default_str();
  cmd->add_option("--max-case-s", opts->max_case_s, "Skip a case predicted to take longer than this")->capture_default_str();
  cmd->add_option("--time-budget-s", opts->time_budget_s,
                  "Skip cases once this many seconds (load included) would be exceeded; 0 = no limit")
      ->capture_default_str();
  cmd->add_option("--threads", opts->threads, "CPU worker threads (default: hardware concurrency)");
  cmd->add_flag("--no-graphs", opts->no_graphs, "A/B: run decode steps op by op instead of replaying CUDA graphs");
  cmd->add_flag("--full-logits", opts->full_logits,
                "A/B: decode steps download every logits row instead of the greedy ids (as before 2026-12-02)");
  cmd->add_flag("--no-fused", opts->no_fused, "A/B: run the fused decode chains as their separate ops");
  cmd->add_flag("--sequential-branches", opts->sequential_branches,
                "A/B: run independent branches (routed vs shared expert, q/k/v) in order on one stream");
  add_kv_cache_dtype_option(cmd, opts->kv_cache_dtype);
  add_gdn_state_dtype_option(cmd, opts->gdn_state_dtype);
  cmd->add_option("--gpu-memory-utilization", opts->gpu_memory_utilization,
                  "Fraction of the device's memory the cases may use (weights included); larger cases are skipped")
      ->capture_default_str();
  cmd->add_option("--context-fill", opts->context_fill,
                  "How decode contexts are made: prefill (a forward of C random tokens) or zeros (the KV cache "
                  "zero-filled: same decode work, no prefill time)")
      ->check(CLI::IsMember({"prefill", "zeros"}))
      ->capture_default_str();
  cmd->add_option("--spec-k", opts->spec_k,
                  "Speculative decoding cases with the MTP layer: draft counts per step, e.g. 1,2,3 (per batch and "
                  "context)");
  cmd->add_option("--spec-accept", opts->spec_accept,
                  "With --spec-k: force this acceptance rate per draft, e.g. 0.8 or forced:0.8 (a simulation for random "
                  "weights); default: the model's own greedy acceptance");
  cmd->add_flag("--json", opts->json, "Print one JSON object");
  cmd->add_option("--json-out", opts->json_out, "Also write the JSON object to this file (with the table on stdout)");
  cmd->add_flag("--weights-digest", opts->weights_digest,
                "Only build the weights and print a digest of their bytes (compares --synth with a written checkpoint)");
  cmd->callback([opts, &exit_code] { exit_code = run_bench(*opts); });
}
SPARKSERVE_COMMAND(register_bench);

}  // namespace
}  // namespace sparkserve::cli
