// `sparkserve bench --model DIR`: throughput of the forward pass on a backend, no HTTP. Prefill
// tokens/s and time to first token at several prompt lengths; decode tokens/s at several batch
// sizes; peak device memory; achieved weight bandwidth (weight bytes one decode step reads ÷ time
// per step) beside the device's measured streaming bandwidth (an elementwise add over 1 GiB
// buffers: 2 reads + 1 write per element). Token ids are random (fixed seed): speed does not depend
// on them. Table, or one JSON object with --json.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backend/backend_factory.h"
#include "cli/command.h"
#include "core/thread_pool.h"
#include "loader/safetensors.h"
#include "model/load.h"

namespace sparkserve::cli {
namespace {

struct BenchOptions {
  std::string model;
  std::string device = build_has_cuda() ? "cuda" : "cpu";
  std::string prompt_lens = "128,512,2048";
  std::string batches = "1,4,16";
  int decode_steps = 32;
  int context = 16;
  int threads = 0;
  bool json = false;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Expected<std::vector<int>> parse_list(const std::string& what, const std::string& text) {
  std::vector<int> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      int x = std::stoi(item, &used);
      if (used != item.size() || x <= 0) throw std::invalid_argument(item);
      v.push_back(x);
    } catch (const std::exception&) {
      return make_error(what + ": '" + item + "' is not a positive integer");
    }
  }
  if (v.empty()) return make_error(what + ": empty list");
  return v;
}

// Bytes of weights one decoded token reads at batch 1: every text tensor once, routed experts
// k/E of theirs, the embedding one row of its table; vision and MTP tensors are not on the path.
Expected<double> weight_bytes_per_token(const std::string& dir, const ModelConfig& c) {
  SS_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  double bytes = 0;
  for (const auto& [name, info] : ckpt.tensors()) {
    if (name.find("visual") != std::string::npos || name.rfind("mtp.", 0) == 0) continue;
    double b = static_cast<double>(info.nbytes);
    if (name.find("embed_tokens") != std::string::npos) {
      b /= static_cast<double>(c.vocab_size);
      if (c.tie_word_embeddings) bytes += static_cast<double>(info.nbytes);  // read again as lm_head
    } else if (name.find("mlp.experts.") != std::string::npos && c.num_experts > 0) {
      b *= static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.num_experts);
    }
    bytes += b;
  }
  return bytes;
}

int run_bench(const BenchOptions& o) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    return 1;
  };
  auto lens = parse_list("--prompt-lens", o.prompt_lens);
  if (!lens) return fail(lens.message());
  auto batches = parse_list("--batches", o.batches);
  if (!batches) return fail(batches.message());
  if (o.decode_steps <= 0) return fail("--decode-steps must be > 0");
  if (o.context <= 0) return fail("--context must be > 0");
  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  auto made = make_backend(o.device, threads);
  if (!made) return fail(made.message());
  Backend& be = **made;
  auto t_load = Clock::now();
  auto model_or = load_qwen35(o.model, be);
  if (!model_or) return fail(model_or.message());
  be.synchronize();
  const double load_s = seconds_since(t_load);
  Qwen35Model& m = **model_or;
  const ModelConfig& c = m.config();
  auto wbytes = weight_bytes_per_token(o.model, c);
  if (!wbytes) return fail(wbytes.message());
  std::mt19937 rng(1234);
  auto random_ids = [&](int n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& x : ids) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size));
    return ids;
  };
  const int max_len = *std::max_element(lens->begin(), lens->end());
  if (c.max_position_embeddings > 0 && std::max(max_len, o.context + o.decode_steps + 2) > c.max_position_embeddings)
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

  nlohmann::json j;
  j["model"] = o.model;
  j["device"] = o.device;
  j["load_s"] = load_s;
  j["weight_bytes_per_token"] = *wbytes;
  j["stream_bandwidth_gb_s"] = copy_gbs;
  StateLimits lim;
  lim.block_size = 16;
  // Prefill: one sequence, one forward over the whole prompt (returns the last row's logits).
  {
    lim.max_sequences = 1;
    lim.num_kv_blocks = static_cast<int32_t>(max_len / 16 + 2);
    ModelState st(be, c, lim);
    bool warmed = false;
    for (int L : *lens) {
      for (int rep = warmed ? 1 : 0; rep < 2; ++rep) {  // the first forward warms up
        auto seq = st.open_sequence();
        if (!seq) return fail(seq.message());
        std::vector<SequenceInput> b(1);
        b[0].state = &*seq;
        b[0].tokens = random_ids(L);
        be.synchronize();
        auto t0 = Clock::now();
        auto l = m.forward(b, st);
        if (!l) return fail(l.message());
        const double s = seconds_since(t0);
        st.close_sequence(*seq);
        if (rep == 1)
          j["prefill"].push_back({{"prompt_tokens", L}, {"ttft_ms", s * 1e3}, {"tokens_per_s", L / s}});
      }
      warmed = true;
    }
  }
  // Decode: B sequences with `context` prompt tokens each, then decode_steps batched steps.
  for (int B : *batches) {
    lim.max_sequences = B;
    lim.num_kv_blocks = static_cast<int32_t>(B * ((o.context + o.decode_steps + 2) / 16 + 2));
    ModelState st(be, c, lim);
    std::vector<SequenceState> seqs;
    for (int i = 0; i < B; ++i) {
      auto s = st.open_sequence();
      if (!s) return fail(s.message());
      seqs.push_back(*s);
    }
    std::vector<SequenceInput> b(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) {
      b[static_cast<size_t>(i)].state = &seqs[static_cast<size_t>(i)];
      b[static_cast<size_t>(i)].tokens = random_ids(o.context);
    }
    auto l = m.forward(b, st);
    if (!l) return fail(l.message());
    for (auto& in : b) in.tokens = random_ids(1);
    l = m.forward(b, st);  // warm-up step
    if (!l) return fail(l.message());
    be.synchronize();
    auto t0 = Clock::now();
    for (int s = 0; s < o.decode_steps; ++s) {
      for (auto& in : b) in.tokens = random_ids(1);
      l = m.forward(b, st);
      if (!l) return fail(l.message());
    }
    const double per_step = seconds_since(t0) / o.decode_steps;
    j["decode"].push_back({{"batch", B},
                           {"context", o.context},
                           {"ms_per_step", per_step * 1e3},
                           {"tokens_per_s", B / per_step},
                           {"weight_gb_s", *wbytes / per_step / 1e9},
                           {"fraction_of_stream_bw", *wbytes / per_step / 1e9 / copy_gbs}});
  }
  j["peak_device_memory_bytes"] = backend_peak_memory_bytes(be);

  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model %s on %s: load %.2f s, weights read per decoded token %.3f MB, stream bandwidth %.1f GB/s\n",
              o.model.c_str(), o.device.c_str(), load_s, *wbytes / 1e6, copy_gbs);
  std::printf("\n%-14s %12s %14s\n", "prefill tokens", "TTFT ms", "tokens/s");
  for (auto& p : j["prefill"])
    std::printf("%-14d %12.2f %14.1f\n", p["prompt_tokens"].get<int>(), p["ttft_ms"].get<double>(),
                p["tokens_per_s"].get<double>());
  std::printf("\n%-6s %8s %12s %12s %14s %10s\n", "batch", "context", "ms/step", "tokens/s", "weight GB/s", "of stream");
  for (auto& d : j["decode"])
    std::printf("%-6d %8d %12.3f %12.1f %14.1f %9.1f%%\n", d["batch"].get<int>(), d["context"].get<int>(),
                d["ms_per_step"].get<double>(), d["tokens_per_s"].get<double>(), d["weight_gb_s"].get<double>(),
                100 * d["fraction_of_stream_bw"].get<double>());
  std::printf("(weight GB/s = batch-1 weight bytes per token / time per step: the achieved weight bandwidth at\n"
              " batch 1; larger batches read more distinct experts per step, so there it understates the bytes)\n");
  const int64_t peak = j["peak_device_memory_bytes"].get<int64_t>();
  if (peak >= 0) std::printf("\npeak device memory (pool high-water mark): %.1f MiB\n", peak / 1048576.0);
  return 0;
}

void register_bench(CLI::App& root, int& exit_code) {
  auto opts = std::make_shared<BenchOptions>();
  auto* cmd = root.add_subcommand("bench", "Prefill/decode throughput of a model on a backend (no HTTP)");
  cmd->add_option("--model", opts->model, "Model folder (config.json + *.safetensors)")->required();
  cmd->add_option("--device", opts->device, "Backend: cpu or cuda")->capture_default_str();
  cmd->add_option("--prompt-lens", opts->prompt_lens, "Prefill prompt lengths")->capture_default_str();
  cmd->add_option("--batches", opts->batches, "Decode batch sizes")->capture_default_str();
  cmd->add_option("--decode-steps", opts->decode_steps, "Timed decode steps per batch size")->capture_default_str();
  cmd->add_option("--context", opts->context, "Prompt tokens per sequence before decoding")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "CPU worker threads (default: hardware concurrency)");
  cmd->add_flag("--json", opts->json, "Print one JSON object");
  cmd->callback([opts, &exit_code] { exit_code = run_bench(*opts); });
}
SPARKSERVE_COMMAND(register_bench);

}  // namespace
}  // namespace sparkserve::cli
