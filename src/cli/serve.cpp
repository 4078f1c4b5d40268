// `sparkserve serve MODEL` (or --model DIR): the OpenAI-compatible HTTP server. Loads the model, tokenizer,
// chat template and generation defaults from DIR, sizes the KV blocks and GDN state slots once,
// starts the engine thread and serves until SIGTERM / SIGINT (then: stop accepting, cancel
// what is running, exit 0).
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <csignal>
#include <malloc.h>
#include <pthread.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/resource.h>
#include <thread>

#include "backend/backend_factory.h"
#include "cli/command.h"
#include "cli/kv_sizing.h"
#include "cli/model_args.h"
#include "cli/serve.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "http/server.h"
#include "loader/model_path.h"
#include "model/load.h"
#include "runtime/engine.h"
#include "runtime/token_constraint.h"
#include "runtime/warm_up.h"
#include "server/handlers.h"
#include "server/request_log.h"

namespace sparkserve::cli {
namespace {

// A chat template exists in the folder (whether or not it parses): chat_template.jinja, or a
// "chat_template" key in tokenizer_config.json.
bool chat_template_present(const std::string& model) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(model) / "chat_template.jinja")) return true;
  std::ifstream in(fs::path(model) / "tokenizer_config.json");
  if (!in) return false;
  try {
    return nlohmann::json::parse(in).contains("chat_template");
  } catch (const std::exception&) {
    return false;
  }
}

// The KV cache budget on the CPU backend when neither --kv-blocks nor --kv-cache-mb is given.
constexpr int64_t kCpuKvCacheMb = 256;

int fail(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  return 1;
}

// The checkpoint's model on --device, over state storage of `limits` (on a GPU the KV blocks are
// sized, or checked, against the memory left after the weights: cli/kv_sizing.h).
class CheckpointRunner final : public ModelRunner {
 public:
  static Expected<std::unique_ptr<ModelRunner>> load(const ServeOptions& o, const ModelConfig& c,
                                                     const StateLimits& requested) {
    auto load_opts = make_load_options(o.load);
    if (!load_opts) return make_error(load_opts.message());
    load_opts->load_mtp = requested.mtp;
    auto backend = make_backend(o.device, o.threads > 0 ? o.threads : default_thread_count());
    if (!backend) return make_error(backend.message());
    std::vector<std::string> notes;
    auto model = load_qwen35(o.model, **backend, &notes, *load_opts);
    if (!model) return make_error(model.message());
    for (const auto& n : notes) std::fprintf(stderr, "%s\n", n.c_str());
    StateLimits limits = requested;
    SS_ASSIGN_OR_RETURN(limits.num_kv_blocks,
                        serve_kv_blocks(**backend, c, requested, o.gpu_memory_utilization, step_token_budget(o)));
    return std::unique_ptr<ModelRunner>(new CheckpointRunner(std::move(*backend), std::move(*model), limits));
  }
  CacheGeometry geometry() const override { return runner_.geometry(); }
  Expected<StepOutput> execute(const StepPlan& plan) override { return runner_.execute(plan); }
  bool can_speculate() const override { return runner_.can_speculate(); }
  Expected<std::vector<std::vector<int32_t>>> speculate(const StepPlan& plan, const SpecFollowUp& follow) override {
    return runner_.speculate(plan, follow);
  }

 private:
  CheckpointRunner(std::unique_ptr<Backend> backend, std::unique_ptr<Qwen35Model> model, const StateLimits& limits)
      : backend_(std::move(backend)), model_(std::move(model)), state_(*backend_, model_->config(), limits),
        runner_(*model_, state_) {}
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Qwen35Model> model_;
  ModelState state_;
  Qwen35Runner runner_;
};

// The notes for vLLM flags that mean nothing here; an error for values that cannot be honoured.
std::optional<std::string> vllm_flag_notes(const ServeOptions& o) {
  auto note = [](const std::string& m) { log_line(LogLevel::kInfo, "note: " + m); };
  if (!o.tool_call_parser.empty()) {
    if (o.tool_call_parser != "qwen3_coder" && o.tool_call_parser != "qwen3_xml")
      log_line(LogLevel::kWarning, "--tool-call-parser " + o.tool_call_parser +
                                       ": this server parses the qwen3_coder format Qwen3.5 writes, whatever the flag says");
    else
      note("--tool-call-parser " + o.tool_call_parser + ": tool calls are always parsed in the qwen3_coder format");
  }
  if (!o.reasoning_parser.empty())
    note("--reasoning-parser " + o.reasoning_parser + ": reasoning is always split at </think> (vLLM's qwen3 parser)");
  if (o.enable_auto_tool_choice) note("--enable-auto-tool-choice: tool_choice \"auto\" is always available");
  if (!o.dtype.empty() && o.dtype != "auto")
    log_line(LogLevel::kWarning, "--dtype " + o.dtype + ": ignored; weights are used in the formats the checkpoint stores");
  else if (!o.dtype.empty())
    note("--dtype auto: weights are used in the formats the checkpoint stores");
  if (o.trust_remote_code) note("--trust-remote-code: no code from the model folder is ever run");
  if (o.enable_prefix_caching && o.no_prefix_caching)
    return std::string("--enable-prefix-caching and --no-prefix-caching contradict each other; give one");
  if (o.enable_prefix_caching) note("--enable-prefix-caching: prefix caching is on by default");
  if (o.tensor_parallel_size > 1 || o.tensor_parallel_size < 0)
    return "--tensor-parallel-size " + std::to_string(o.tensor_parallel_size) + ": sparkserve runs on one GPU only";
  if (o.tensor_parallel_size == 1) note("--tensor-parallel-size 1: one device");
  return std::nullopt;
}

// Prompt / generation throughput, running / waiting requests and KV usage every `interval`
// seconds while the server has work (vLLM's periodic stats line).
class StatsLogger {
 public:
  StatsLogger(const ServerMetrics& m, double interval) : m_(m), interval_(interval) {
    if (interval_ > 0) thread_ = std::thread([this] { loop(); });
  }
  ~StatsLogger() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    MetricsSnapshot last = m_.snapshot();
    auto t_last = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::duration<double>(interval_), [this] { return stop_; })) {
      const MetricsSnapshot now = m_.snapshot();
      const auto t = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(t - t_last).count();
      const bool busy = now.running > 0 || now.waiting > 0 || now.prompt_tokens != last.prompt_tokens ||
                        now.generation_tokens != last.generation_tokens;
      if (busy && dt > 0) {
        char line[256];
        std::snprintf(line, sizeof line,
                      "throughput: prompt %.1f tokens/s, generation %.1f tokens/s, running %lld, waiting %lld, "
                      "KV cache usage %.1f%%, finished %llu",
                      static_cast<double>(now.prompt_tokens - last.prompt_tokens) / dt,
                      static_cast<double>(now.generation_tokens - last.generation_tokens) / dt,
                      static_cast<long long>(now.running), static_cast<long long>(now.waiting), now.kv_usage * 100,
                      static_cast<unsigned long long>(now.finished));
        log_line(LogLevel::kInfo, line);
      }
      last = now;
      t_last = t;
    }
  }
  const ServerMetrics& m_;
  double interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

// The most drafts per step: acceptance falls with every further draft (public Qwen3.5 MTP accept
// lengths: ~1.9 / 2.4 / 2.8 tokens per step with 1 / 2 / 3 drafts), while each costs a verify row.
constexpr int64_t kMaxSpeculativeTokens = 8;

Expected<int64_t> speculative_tokens_from(const ServeOptions& o) {
  int64_t k = o.speculative_tokens;
  if (!o.speculative_config.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(o.speculative_config);
    } catch (const std::exception& e) {
      return make_error(std::string("--speculative-config is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) return make_error("--speculative-config must be a JSON object");
    for (const auto& [key, value] : j.items()) {
      if (key == "method") {
        // vLLM's names for a checkpoint's own MTP layer.
        if (!value.is_string() || (value != "mtp" && value != "qwen3_next_mtp" && value != "qwen3_5_mtp"))
          return make_error("--speculative-config: method " + value.dump() +
                            " is not supported (only \"mtp\": the checkpoint's own multi-token-prediction layer)");
      } else if (key == "num_speculative_tokens") {
        if (!value.is_number_integer()) return make_error("--speculative-config: num_speculative_tokens must be an integer");
        if (o.speculative_tokens > 0 && value.get<int64_t>() != o.speculative_tokens)
          return make_error("--speculative-config num_speculative_tokens and --speculative-tokens disagree");
        k = value.get<int64_t>();
      } else {
        return make_error("--speculative-config: unknown key '" + key + "' (known: method, num_speculative_tokens)");
      }
    }
    if (!j.contains("num_speculative_tokens"))
      return make_error("--speculative-config needs num_speculative_tokens");
  }
  if (k < 0 || k > kMaxSpeculativeTokens)
    return make_error("--speculative-tokens must be in [0, " + std::to_string(kMaxSpeculativeTokens) + "] (0: off)");
  return k;
}

int run_serve(ServeOptions& o, const RunnerFactory& make_runner) {
  namespace fs = std::filesystem;
  auto level = parse_log_level(o.log_level);
  if (!level) return fail("--log-level must be debug, info, warning or error, got '" + o.log_level + "'");
  set_log_level(*level);
  int64_t max_model_len_arg = 0;
  if (!o.max_model_len.empty()) {
    auto n = parse_token_count(o.max_model_len, "--max-model-len");
    if (!n.ok()) return fail(n.message());
    max_model_len_arg = *n < 0 ? 0 : *n;
  }
  if (auto e = vllm_flag_notes(o)) return fail(*e);
  auto cors = parse_allowed_origins(o.allowed_origins, o.allow_credentials);
  if (!cors.ok()) return fail(cors.message());
  if (o.log_stats_interval < 0) return fail("--log-stats-interval must be >= 0 (0: off)");
  set_request_logging(!o.disable_log_requests);
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
    return fail("--device must be auto, cpu or cuda, got '" + o.device + "'");
  if (o.port < 0 || o.port > 65535) return fail("--port must be in [0, 65535]");
  if (o.max_num_seqs < 1) return fail("--max-num-seqs must be >= 1");
  if (o.max_num_batched_tokens < 0) return fail("--max-num-batched-tokens must be >= 1 (0: 8192 on cuda, 2048 on cpu)");
  if (o.block_size < 1 || o.block_size > 1024) return fail("--block-size must be in [1, 1024]");
  if (o.kv_blocks < 0 || o.kv_blocks > (1 << 30)) return fail("--kv-blocks must be in [1, 2^30] (0: from --kv-cache-mb)");
  if (o.kv_cache_mb < 0) return fail("--kv-cache-mb must be >= 1 (0: from --gpu-memory-utilization)");
  if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1))
    return fail("--gpu-memory-utilization must be in (0, 1]");
  if (o.max_body_bytes < 1024) return fail("--max-body-bytes must be >= 1024");
  if (o.threads < 0 || o.threads > kMaxThreads) return fail("--threads must be in [1, 1024] (0: all cores)");
  if (o.http_workers < 1 || o.http_workers > 256) return fail("--http-workers must be in [1, 256]");
  if (o.max_connections < 1 || o.max_connections > 1000000) return fail("--max-connections must be in [1, 1000000]");
  if (o.max_waiting_requests < 0) return fail("--max-waiting-requests must be >= 0 (0: no limit)");
  if (o.shutdown_timeout < 0) return fail("--shutdown-timeout must be >= 0");
  if (o.keep_alive_timeout <= 0) return fail("--keep-alive-timeout must be > 0");
  if (o.prefix_cache_state_mb < 0) return fail("--prefix-cache-state-mb must be >= 0");
  if (o.prefix_cache_snapshot_interval < 0) return fail("--prefix-cache-snapshot-interval must be >= 0 (0: none)");
  if (auto load_opts = make_load_options(o.load); !load_opts) return fail(load_opts.message());
  // The model last among the checks of the arguments: a flag's error names the flag even when
  // the folder is wrong too.
  if (!o.model_pos.empty() && !o.model.empty() && o.model_pos != o.model)
    return fail("the model is given twice ('" + o.model_pos + "' and --model '" + o.model + "'); give one");
  if (o.model.empty()) o.model = o.model_pos;
  if (o.model.empty()) return fail("no model: sparkserve serve MODEL_DIR (or --model MODEL_DIR)");
  const std::string model_arg = o.model;
  auto located = resolve_model_dir(o.model);
  if (!located.ok()) return fail(located.message());
  o.model = located->dir;
  if (!located->note.empty()) log_line(LogLevel::kInfo, located->note);

  // --device auto: the GPU when this build has the CUDA backend and a device answers.
  if (o.device == "auto") {
    o.device = "cpu";
    if (build_has_cuda()) {
      if (auto probe = make_backend("cuda", 1); probe.ok()) o.device = "cuda";
      else log_line(LogLevel::kInfo, "--device auto: " + probe.message() + "; using the CPU");
    }
    log_line(LogLevel::kInfo, "--device auto: using " + o.device);
  }
  auto kv_dtype = parse_kv_cache_dtype(o.kv_cache_dtype, o.device == "cuda" ? Device::kCuda : Device::kCpu);
  if (!kv_dtype) return fail(kv_dtype.message());
  auto gdn_dtype = parse_gdn_state_dtype(o.gdn_state_dtype);
  if (!gdn_dtype) return fail(gdn_dtype.message());
  auto spec_tokens = speculative_tokens_from(o);
  if (!spec_tokens) return fail(spec_tokens.message());

  // glibc's default malloc made RSS creep under load (measured: +30 MiB over 512 requests of 64
  // concurrent streams): logits buffers of varying size (rows x vocab floats) fall under the
  // dynamically raised mmap threshold and fragment the heap, and each HTTP thread may get its own
  // arena. A fixed 1 MiB threshold (big buffers always mmapped, returned on free) and 2 arenas
  // kept RSS flat in the same run (bench/soak.py; docs/serving-engine.md).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_ARENA_MAX, 2);
  // Each connection is a descriptor: allow as many as the hard limit permits.
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }

  // Block the stop signals in every thread; one thread waits for them (sigwait).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (!fs::exists(fs::path(o.model) / "tokenizer.json"))
    return fail("'" + o.model + "' has no tokenizer.json: sparkserve needs the Hugging Face tokenizer next to the "
                "weights. A checkpoint written by `sparkserve synth` holds weights only: copy a tokenizer.json and "
                "tokenizer_config.json in whose vocabulary fits the model's vocab_size (tests/fixtures/serve-tiny/make_model.py "
                "does this with the Qwen3.5 tokenizer and --vocab 248077)");
  auto tokenizer = Tokenizer::load(o.model);
  if (!tokenizer.ok()) return fail("tokenizer: " + tokenizer.message());
  std::optional<ChatTemplate> tmpl;
  std::string template_error;  // a template that exists but cannot be used
  if (!o.chat_template.empty()) {
    // vLLM's --chat-template: a file, or the template text itself.
    std::string source = o.chat_template, origin = "--chat-template";
    if (fs::is_regular_file(o.chat_template)) {
      std::ifstream in(o.chat_template, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      source = ss.str();
      origin = o.chat_template;
    } else if (o.chat_template.find("{%") == std::string::npos && o.chat_template.find("{{") == std::string::npos) {
      return fail("--chat-template: '" + o.chat_template + "' is neither a file nor a Jinja template");
    }
    auto t = chat_template_from_source(source, origin, (fs::path(o.model) / "tokenizer_config.json").string());
    if (!t.ok()) return fail("--chat-template: " + t.message());
    tmpl = std::move(*t);
  } else if (auto t = load_chat_template(o.model); t.ok()) {
    tmpl = std::move(*t);
  } else if (chat_template_present(o.model)) {
    template_error = t.message();
    std::fprintf(stderr, "warning: the chat template cannot be used: %s\n"
                 "warning: every request that needs it (chat, /tokenize with messages) will get this error\n",
                 t.message().c_str());
  } else {
    std::fprintf(stderr, "note: no chat template (%s); /v1/chat/completions will refuse requests\n", t.message().c_str());
  }

  auto config = load_model_config(o.model);
  if (!config) return fail(config.message());
  const ModelConfig& c = *config;
  if (static_cast<int64_t>(tokenizer->vocab_size()) > c.vocab_size)
    return fail("the tokenizer has " + std::to_string(tokenizer->vocab_size()) + " ids but the model's vocab_size is " +
                std::to_string(c.vocab_size) + ": the model has no embedding or logit for the tokenizer's highest ids. "
                "Use the tokenizer the checkpoint was trained with (for a `sparkserve synth` checkpoint: make it with "
                "--vocab " + std::to_string(tokenizer->vocab_size()) + " or more)");

  GenerationDefaults defaults;
  const fs::path gen_path = fs::path(o.model) / "generation_config.json";
  if (fs::exists(gen_path)) {
    std::ifstream in(gen_path);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      return fail(gen_path.string() + " is not valid JSON: " + e.what());
    }
    auto d = parse_generation_defaults(j);
    if (!d.ok()) return fail(gen_path.string() + ": " + d.message());
    defaults = std::move(*d);
  }
  // EOS: generation_config's, the config's and the tokenizer's (vLLM stops at all of them).
  for (int id : c.eos_token_ids) defaults.eos_token_ids.push_back(id);
  if (auto eos = tokenizer->eos_token_id()) defaults.eos_token_ids.push_back(*eos);

  // State sizing: KV blocks from --kv-blocks, --kv-cache-mb, or on a GPU what
  // --gpu-memory-utilization leaves after the weights, the GDN state and activations (decided by
  // the runner once the weights are loaded: cli/kv_sizing.h); one GDN slot per sequence.
  const int attn_layers = count_layers(c, LayerType::kFullAttention);
  const int64_t bytes_per_block = std::max(attn_layers + (*spec_tokens > 0 ? 1 : 0), 1) * int64_t{o.block_size} *
                                  kv_bytes_per_token(*kv_dtype, c.num_key_value_heads, c.head_dim);
  int64_t blocks = o.kv_blocks > 0     ? o.kv_blocks
                   : o.kv_cache_mb > 0 ? (o.kv_cache_mb << 20) / bytes_per_block
                   : o.device == "cuda" ? 0
                                        : (kCpuKvCacheMb << 20) / bytes_per_block;
  blocks = std::min<int64_t>(blocks, 1 << 30);
  if (blocks < 1 && o.device != "cuda") return fail("the KV budget holds no block; raise --kv-cache-mb or --kv-blocks");
  const int64_t max_pos = c.max_position_embeddings > 0 ? c.max_position_embeddings : kDefaultMaxPositions;
  int64_t max_model_len = max_model_len_arg > 0 ? max_model_len_arg : max_pos;
  if (max_model_len > max_pos)
    return fail("--max-model-len " + std::to_string(max_model_len) + " exceeds max_position_embeddings " + std::to_string(max_pos));
  StateLimits limits;
  limits.max_sequences = o.max_num_seqs;
  limits.num_kv_blocks = static_cast<int32_t>(blocks);
  limits.block_size = o.block_size;
  limits.kv_dtype = *kv_dtype;
  limits.gdn_state_dtype = *gdn_dtype;
  limits.mtp = *spec_tokens > 0;
  // Prefix-cache snapshots: whole GDN states of one sequence each, from the --prefix-cache-state-mb
  // budget, at most 4 per sequence slot (enough for every running conversation's last turns; a
  // tiny model would otherwise get millions). On a GPU the KV sizing counts them as GDN state.
  if (!o.no_prefix_caching) {
    const int64_t per_snapshot = std::max<int64_t>(gdn_state_bytes(c, *gdn_dtype), 1);
    limits.num_snapshots = static_cast<int32_t>(
        std::min<int64_t>((o.prefix_cache_state_mb << 20) / per_snapshot, 4LL * o.max_num_seqs));
  }
  auto runner = make_runner(o, c, limits);
  if (!runner) return fail(runner.message());
  if (*spec_tokens > 0 && !(*runner)->can_speculate())
    return fail("--speculative-tokens: the model runner cannot speculate (no multi-token-prediction layer)");
  blocks = (*runner)->geometry().num_blocks;
  const int64_t pool_tokens = blocks * o.block_size;
  if (max_model_len > pool_tokens) {
    if (max_model_len_arg > 0)
      return fail("--max-model-len " + std::to_string(max_model_len) + " does not fit in the KV cache (" +
                  std::to_string(pool_tokens) + " tokens); raise --kv-cache-mb or --kv-blocks");
    max_model_len = pool_tokens;  // one sequence must always fit, so preemption can always make progress
  }

  ServeContext ctx;
  // As vLLM: the names clients send; the first is reported. Default: the model as given.
  std::vector<std::string> names = o.served_model_names;
  if (names.empty()) names.push_back(model_arg);
  const std::string name = names.front();
  ServerMetrics metrics(name, max_model_len);
  EngineConfig ec;
  ec.max_num_seqs = o.max_num_seqs;
  ec.max_num_batched_tokens = step_token_budget(o);
  ec.max_model_len = max_model_len;
  ec.vocab_size = static_cast<int64_t>(tokenizer->vocab_size());
  ec.sampling_threads = std::min(8, default_thread_count());
  ec.enable_prefix_caching = !o.no_prefix_caching;
  ec.snapshot_interval = o.prefix_cache_snapshot_interval;
  ec.num_speculative_tokens = *spec_tokens;
  if (o.device == "cuda" && !o.no_warm_up) {
    const WarmUpResult w = warm_up(**runner, ec);
    log_line(LogLevel::kInfo, "warm-up: " + std::to_string(w.prompts) + " prompts of 1.." +
                                  std::to_string(ec.max_num_batched_tokens) + " tokens in " +
                                  std::to_string(static_cast<int>(w.seconds * 1000)) + " ms");
  }
  Engine engine(**runner, ec, &metrics);

  ctx.engine = &engine;
  ctx.tokenizer = &*tokenizer;
  ctx.vocab_texts = VocabTexts::build(*tokenizer);  // for tool_choice required / named
  ctx.chat_template = tmpl ? &*tmpl : nullptr;
  ctx.chat_template_error = template_error;
  ctx.metrics = &metrics;
  ctx.info.names = names;
  ctx.cors = *cors;
  ctx.info.max_model_len = max_model_len;
  ctx.info.vocab_size = ec.vocab_size;
  ctx.model_root = o.model;
  if (o.seed) defaults.server_seed = static_cast<uint64_t>(*o.seed);
  ctx.defaults = defaults;
  ctx.api_key = o.api_key;
  if (ctx.api_key.empty())
    if (const char* k = std::getenv("SPARKSERVE_API_KEY")) ctx.api_key = k;
  ctx.max_body_bytes = static_cast<size_t>(o.max_body_bytes);
  for (int64_t id = 0; id < static_cast<int64_t>(tokenizer->vocab_size()); ++id)
    ctx.max_token_bytes = std::max(ctx.max_token_bytes, tokenizer->token_bytes(static_cast<int32_t>(id)).size());
  ctx.request_timeout_s = o.request_timeout;
  ctx.max_waiting_requests = o.max_waiting_requests;
  auto image_input = serve_image_options(o.model, c, o.images);
  if (!image_input.ok()) return fail(image_input.message());
  ctx.image_input = std::move(*image_input);

  http::ServerOptions hopt;
  hopt.host = o.host;
  hopt.port = o.port;
  hopt.worker_threads = o.http_workers;
  hopt.max_connections = o.max_connections;
  hopt.body_limit = static_cast<size_t>(o.max_body_bytes);
  hopt.keepalive_timeout_s = o.keep_alive_timeout;
  hopt.error_body = transport_error_body;
  // Jobs post to the server's workers; the server is created first and destroyed last.
  http::Server* server_ptr = nullptr;
  GenerationJobs jobs([&server_ptr](std::function<void()> task) { server_ptr->post(std::move(task)); });
  ctx.jobs = &jobs;
  http::Server server(hopt, make_router(ctx));
  server_ptr = &server;

  engine.start();
  auto bound = server.start();
  if (!bound.ok()) {
    engine.shutdown();
    return fail(bound.message());
  }
  std::fprintf(stderr,
               "sparkserve: serving %s on http://%s:%d (max_model_len %lld, %lld KV blocks of %d = %lld tokens, %s "
               "%.2f GB, %d sequences, GDN state %s, prefix cache %s with %d state snapshots, %lld MTP draft tokens per "
               "step)\n",
               name.c_str(), o.host.c_str(), *bound, static_cast<long long>(max_model_len), static_cast<long long>(blocks),
               o.block_size, static_cast<long long>(pool_tokens), kv_cache_dtype_name(*kv_dtype),
               static_cast<double>(blocks) * bytes_per_block / 1e9, o.max_num_seqs, gdn_state_dtype_name(*gdn_dtype),
               o.no_prefix_caching ? "off" : "on",
               limits.num_snapshots, static_cast<long long>(*spec_tokens));
  std::fprintf(stderr, "sparkserve: on %s; chat page at http://%s:%d/ ; OpenAI API at http://%s:%d/v1 ; Anthropic API at http://%s:%d\n",
               o.device.c_str(), o.host.c_str(), *bound, o.host.c_str(), *bound, o.host.c_str(), *bound);
  std::fflush(stderr);
  StatsLogger stats(metrics, o.disable_log_stats ? 0 : o.log_stats_interval);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "received %s: draining (up to %g s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", o.shutdown_timeout);
  std::fflush(stderr);
  // Drain: no new connections, 503 for new requests, running ones may finish...
  ctx.shutting_down.store(true);
  server.stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_timeout * 1000));
  while (jobs.active() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // ...and whatever is left ends with an explicit error, which is given a moment to be written.
  const size_t left = jobs.active();
  ctx.drain_expired.store(true);
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (jobs.active() > 0 && std::chrono::steady_clock::now() < flush_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  server.stop();
  engine.shutdown();
  std::fprintf(stderr, "sparkserve: stopped (%zu requests were cut short by the drain timeout)\n", left);
  return 0;
}

void add_serve_options(CLI::App* cmd, ServeOptions& opts) {
  ServeOptions* o = &opts;
  cmd->add_option("model", o->model_pos, "Model folder, or a Hugging Face id already in the HF cache (vLLM's positional form)");
  cmd->add_option("--model", o->model, "Model folder (config.json, *.safetensors, tokenizer.json, chat template)");
  cmd->add_option("--host", o->host, "Address to listen on")->default_val("127.0.0.1");
  cmd->add_option("--port", o->port, "Port (0: any free port)")->default_val(8000);
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route but /, /health and /metrics (or env SPARKSERVE_API_KEY)");
  cmd->add_option("--served-model-name", o->served_model_names, "Model names clients may send, the first reported (default: the model as given)")
      ->expected(1, 16);
  cmd->add_option("--max-model-len", o->max_model_len, "Context length: 32768, 32k (=32000), 32K (=32768) (default: max_position_embeddings, capped by the KV cache)");
  cmd->add_option("--chat-template", o->chat_template, "Chat template file (or the template text) instead of the model's");
  cmd->add_option("--seed", o->seed, "Seed of the seeds of requests that send none (same requests in the same order sample the same)");
  cmd->add_option("--log-level", o->log_level, "debug, info, warning or error")->default_val("info");
  cmd->add_option("--log-stats-interval", o->log_stats_interval, "Seconds between throughput / KV lines while busy (0: off)")->default_val(10);
  cmd->add_flag("--disable-log-stats", o->disable_log_stats, "No periodic throughput / KV lines");
  cmd->add_flag("--disable-log-requests", o->disable_log_requests, "No line per finished request");
  cmd->add_option("--allowed-origins", o->allowed_origins, "CORS origins browsers may call from: * (default), a comma-separated or JSON list, or '' for none")
      ->default_val("*");
  cmd->add_flag("--allow-credentials", o->allow_credentials, "CORS: allow credentials (the origin is echoed instead of *)");
  // vLLM flags accepted with a note (no effect here).
  cmd->add_option("--tool-call-parser", o->tool_call_parser, "vLLM compatibility: tool calls are always parsed as qwen3_coder");
  cmd->add_option("--reasoning-parser", o->reasoning_parser, "vLLM compatibility: reasoning is always split at </think>");
  cmd->add_flag("--enable-auto-tool-choice", o->enable_auto_tool_choice, "vLLM compatibility: tool_choice auto is always on");
  cmd->add_option("--dtype", o->dtype, "vLLM compatibility: weights stay in the checkpoint's formats");
  cmd->add_flag("--trust-remote-code", o->trust_remote_code, "vLLM compatibility: no model code is run");
  cmd->add_option("--tensor-parallel-size", o->tensor_parallel_size, "vLLM compatibility: 1 (one device)");
  cmd->add_flag("--enable-prefix-caching", o->enable_prefix_caching, "vLLM compatibility: the prefix cache is on by default");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Sequences running at once (GDN state slots)")->default_val(64);
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Tokens per engine step (0: 8192 on cuda, where a larger prefill chunk reads each expert for more tokens; 2048 on cpu)")->default_val(0);
  cmd->add_option("--kv-blocks", o->kv_blocks, "KV cache blocks (default: from --kv-cache-mb)");
  cmd->add_option("--kv-cache-mb", o->kv_cache_mb,
                  "KV cache budget in MiB (default: what --gpu-memory-utilization leaves on cuda, 256 on cpu)");
  add_kv_cache_dtype_option(cmd, o->kv_cache_dtype);
  add_gdn_state_dtype_option(cmd, o->gdn_state_dtype);
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "Fraction of the device's total memory this process may use; the KV cache gets what the weights, "
                  "the GDN state and activations leave of it (cuda)")
      ->default_val(0.9);
  cmd->add_option("--block-size", o->block_size, "Tokens per KV block")->default_val(16);
  cmd->add_option("--threads", o->threads, "Model worker threads (default: all cores)");
  cmd->add_option("--device", o->device, "Backend: auto (cuda when a GPU answers, else cpu), cpu or cuda")->default_val("auto");
  add_load_options(cmd, o->load);
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body (413 above)")->default_val(8 << 20);
  cmd->add_option("--request-timeout", o->request_timeout, "Seconds before a request is cancelled (0: never)")->default_val(600);
  cmd->add_option("--http-workers", o->http_workers, "Threads that parse requests, render templates, tokenize and stream")->default_val(4);
  cmd->add_option("--max-connections", o->max_connections, "Open connections at most (503 beyond)")->default_val(1024);
  cmd->add_option("--max-waiting-requests", o->max_waiting_requests, "Requests waiting for the engine at most (503 + Retry-After beyond; 0: no limit)")->default_val(256);
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout, "Seconds running requests may take to finish after SIGTERM/SIGINT")->default_val(10);
  cmd->add_option("--keep-alive-timeout", o->keep_alive_timeout, "Seconds an idle keep-alive connection stays open")->default_val(60);
  cmd->add_flag("--no-warm-up", o->no_warm_up,
                "CUDA: skip the start-up warm-up (throwaway prompts of 1, 2, 4, ... tokens that load every kernel "
                "before the first request)");
  cmd->add_flag("--no-prefix-caching,--no-enable-prefix-caching", o->no_prefix_caching,
                "Turn the prefix cache off (shared KV blocks + GDN state snapshots; on by default)");
  cmd->add_option("--prefix-cache-state-mb", o->prefix_cache_state_mb,
                  "Memory for the prefix cache's GDN state snapshots, MiB (at most 4 per --max-num-seqs)")
      ->default_val(4096);
  cmd->add_option("--prefix-cache-snapshot-interval", o->prefix_cache_snapshot_interval,
                  "Tokens between state snapshots of a long prompt (0: only at its end and at shared prefixes)")
      ->default_val(2048);
  add_serve_image_flags(cmd, o->images);
  cmd->add_option("--speculative-tokens", o->speculative_tokens,
                  "Speculative decoding with the checkpoint's multi-token-prediction layer (mtp.*): draft tokens per "
                  "step, 0 = off (a request may opt out with \"num_speculative_tokens\": 0)")
      ->default_val(0);
  cmd->add_option("--speculative-config", o->speculative_config,
                  "vLLM's form of --speculative-tokens: '{\"method\":\"mtp\",\"num_speculative_tokens\":K}'");
}

namespace {

void register_serve(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = root.add_subcommand("serve", "OpenAI-compatible HTTP server (continuous batching)");
  add_serve_options(cmd, *o);
  cmd->callback([o, &exit_code] { exit_code = run_serve(*o, CheckpointRunner::load); });
}
SPARKSERVE_COMMAND(register_serve);

}  // namespace
}  // namespace sparkserve::cli
