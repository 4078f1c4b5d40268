// `sparkserve serve --model DIR`: the OpenAI-compatible HTTP server. Loads the model, tokenizer,
// chat template and generation defaults from DIR, sizes the KV blocks and GDN state slots once,
// starts the engine thread and serves until SIGTERM / SIGINT (then: stop accepting, cancel
// what is running, exit 0).
#include <atomic>
#include <csignal>
#include <malloc.h>
#include <pthread.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "backend/backend_factory.h"
#include "cli/command.h"
#include "cli/model_args.h"
#include "cli/serve.h"
#include "core/thread_pool.h"
#include "model/load.h"
#include "runtime/engine.h"
#include "runtime/token_constraint.h"
#include "server/handlers.h"

namespace sparkserve::cli {
namespace {


int fail(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  return 1;
}

// The checkpoint's model on --device, over state storage of `limits`.
class CheckpointRunner final : public ModelRunner {
 public:
  static Expected<std::unique_ptr<ModelRunner>> load(const ServeOptions& o, const ModelConfig&, const StateLimits& limits) {
    auto load_opts = make_load_options(o.load);
    if (!load_opts) return make_error(load_opts.message());
    auto backend = make_backend(o.device, o.threads > 0 ? o.threads : default_thread_count());
    if (!backend) return make_error(backend.message());
    std::vector<std::string> notes;
    auto model = load_qwen35(o.model, **backend, &notes, *load_opts);
    if (!model) return make_error(model.message());
    for (const auto& n : notes) std::fprintf(stderr, "%s\n", n.c_str());
    return std::unique_ptr<ModelRunner>(new CheckpointRunner(std::move(*backend), std::move(*model), limits));
  }
  CacheGeometry geometry() const override { return runner_.geometry(); }
  Expected<StepOutput> execute(const StepPlan& plan) override { return runner_.execute(plan); }

 private:
  CheckpointRunner(std::unique_ptr<Backend> backend, std::unique_ptr<Qwen35Model> model, const StateLimits& limits)
      : backend_(std::move(backend)), model_(std::move(model)), state_(*backend_, model_->config(), limits),
        runner_(*model_, state_) {}
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Qwen35Model> model_;
  ModelState state_;
  Qwen35Runner runner_;
};

}  // namespace

int run_serve(const ServeOptions& o, const RunnerFactory& make_runner) {
  namespace fs = std::filesystem;
  if (o.port < 0 || o.port > 65535) return fail("--port must be in [0, 65535]");
  if (o.max_num_seqs < 1) return fail("--max-num-seqs must be >= 1");
  if (o.max_num_batched_tokens < 1) return fail("--max-num-batched-tokens must be >= 1");
  if (o.block_size < 1 || o.block_size > 1024) return fail("--block-size must be in [1, 1024]");
  if (o.kv_blocks < 0 || o.kv_blocks > (1 << 30)) return fail("--kv-blocks must be in [1, 2^30] (0: from --kv-cache-mb)");
  if (o.kv_cache_mb < 1) return fail("--kv-cache-mb must be >= 1");
  if (o.max_body_bytes < 1024) return fail("--max-body-bytes must be >= 1024");
  if (o.threads < 0 || o.threads > kMaxThreads) return fail("--threads must be in [1, 1024] (0: all cores)");
  if (o.http_threads < 1 || o.http_threads > 4096) return fail("--http-threads must be in [1, 4096]");
  if (o.prefix_cache_state_mb < 0) return fail("--prefix-cache-state-mb must be >= 0");
  if (o.prefix_cache_snapshot_interval < 0) return fail("--prefix-cache-snapshot-interval must be >= 0 (0: none)");
  if (auto load_opts = make_load_options(o.load); !load_opts) return fail(load_opts.message());

  // glibc's default malloc made RSS creep under load (measured: +30 MiB over 512 requests of 64
  // concurrent streams): logits buffers of varying size (rows x vocab floats) fall under the
  // dynamically raised mmap threshold and fragment the heap, and each HTTP thread may get its own
  // arena. A fixed 1 MiB threshold (big buffers always mmapped, returned on free) and 2 arenas
  // kept RSS flat in the same run (bench/soak.py; docs/serving-engine.md).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_ARENA_MAX, 2);

  // Block the stop signals in every thread; one thread waits for them (sigwait).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto tokenizer = Tokenizer::load(o.model);
  if (!tokenizer.ok()) return fail("tokenizer: " + tokenizer.message());
  std::optional<ChatTemplate> tmpl;
  if (auto t = load_chat_template(o.model); t.ok()) tmpl = std::move(*t);
  else std::fprintf(stderr, "note: no chat template (%s); /v1/chat/completions will refuse requests\n", t.message().c_str());

  auto config = load_model_config(o.model);
  if (!config) return fail(config.message());
  const ModelConfig& c = *config;
  if (static_cast<int64_t>(tokenizer->vocab_size()) > c.vocab_size)
    return fail("the tokenizer has " + std::to_string(tokenizer->vocab_size()) + " ids but the model's vocab_size is " +
                std::to_string(c.vocab_size));

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

  // State sizing: KV blocks from --kv-blocks or the --kv-cache-mb budget (f32 K and V per
  // full-attention layer), one GDN slot per sequence.
  const int attn_layers = count_layers(c, LayerType::kFullAttention);
  const int64_t bytes_per_block = 2LL * std::max(attn_layers, 1) * o.block_size * c.num_key_value_heads * c.head_dim * 4;
  int64_t blocks = o.kv_blocks > 0 ? o.kv_blocks : (o.kv_cache_mb << 20) / bytes_per_block;
  blocks = std::min<int64_t>(blocks, 1 << 30);
  if (blocks < 1) return fail("the KV budget holds no block; raise --kv-cache-mb or --kv-blocks");
  const int64_t max_pos = c.max_position_embeddings > 0 ? c.max_position_embeddings : kDefaultMaxPositions;
  int64_t max_model_len = o.max_model_len > 0 ? o.max_model_len : max_pos;
  if (max_model_len > max_pos)
    return fail("--max-model-len " + std::to_string(max_model_len) + " exceeds max_position_embeddings " + std::to_string(max_pos));
  const int64_t pool_tokens = blocks * o.block_size;
  if (max_model_len > pool_tokens) {
    if (o.max_model_len > 0)
      return fail("--max-model-len " + std::to_string(max_model_len) + " does not fit in the KV cache (" +
                  std::to_string(pool_tokens) + " tokens); raise --kv-cache-mb or --kv-blocks");
    max_model_len = pool_tokens;  // one sequence must always fit, so preemption can always make progress
  }
  StateLimits limits;
  limits.max_sequences = o.max_num_seqs;
  limits.num_kv_blocks = static_cast<int32_t>(blocks);
  limits.block_size = o.block_size;
  // Prefix-cache snapshots: whole GDN states of one sequence each, from the --prefix-cache-state-mb
  // budget, at most 4 per sequence slot (enough for every running conversation's last turns; a
  // tiny model would otherwise get millions).
  if (!o.no_prefix_caching) {
    const int64_t per_snapshot = std::max<int64_t>(gdn_state_bytes(c), 1);
    limits.num_snapshots = static_cast<int32_t>(
        std::min<int64_t>((o.prefix_cache_state_mb << 20) / per_snapshot, 4LL * o.max_num_seqs));
  }
  auto runner = make_runner(o, c, limits);
  if (!runner) return fail(runner.message());

  ServeContext ctx;
  const std::string name = o.served_model_name.empty() ? o.model : o.served_model_name;
  ServerMetrics metrics(name);
  EngineConfig ec;
  ec.max_num_seqs = o.max_num_seqs;
  ec.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.max_model_len = max_model_len;
  ec.vocab_size = static_cast<int64_t>(tokenizer->vocab_size());
  ec.enable_prefix_caching = !o.no_prefix_caching;
  ec.snapshot_interval = o.prefix_cache_snapshot_interval;
  Engine engine(**runner, ec, &metrics);

  ctx.engine = &engine;
  ctx.tokenizer = &*tokenizer;
  ctx.vocab_texts = VocabTexts::build(*tokenizer);  // for tool_choice required / named
  ctx.chat_template = tmpl ? &*tmpl : nullptr;
  ctx.metrics = &metrics;
  ctx.info.names = {name};
  ctx.info.max_model_len = max_model_len;
  ctx.info.vocab_size = ec.vocab_size;
  ctx.model_root = o.model;
  ctx.defaults = defaults;
  ctx.api_key = o.api_key;
  if (ctx.api_key.empty())
    if (const char* k = std::getenv("SPARKSERVE_API_KEY")) ctx.api_key = k;
  ctx.max_body_bytes = static_cast<size_t>(o.max_body_bytes);
  ctx.request_timeout_s = o.request_timeout;

  httplib::Server svr;
  const int http_threads = o.http_threads;
  svr.new_task_queue = [http_threads] { return new httplib::ThreadPool(static_cast<size_t>(http_threads)); };
  svr.set_keep_alive_timeout(5);
  install_handlers(svr, ctx);

  engine.start();
  int bound = o.port;
  if (o.port == 0) bound = svr.bind_to_any_port(o.host);
  else if (!svr.bind_to_port(o.host, o.port)) bound = -1;
  if (bound < 0) {
    engine.shutdown();
    return fail("cannot listen on " + o.host + ":" + std::to_string(o.port));
  }
  std::atomic<bool> listen_ended{false}, waiter_done{false};
  std::thread signal_waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    waiter_done.store(true);
    if (listen_ended.load()) return;  // our own wake-up after listen ended on its own
    std::fprintf(stderr, "received %s: stopping\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    ctx.shutting_down.store(true);
    svr.stop();
  });
  std::fprintf(stderr,
               "sparkserve: serving %s on http://%s:%d (max_model_len %lld, %lld KV blocks of %d, %d sequences, "
               "prefix cache %s with %d state snapshots)\n",
               name.c_str(), o.host.c_str(), bound, static_cast<long long>(max_model_len),
               static_cast<long long>(blocks), o.block_size, o.max_num_seqs, o.no_prefix_caching ? "off" : "on",
               limits.num_snapshots);
  std::fflush(stderr);
  const bool ok = svr.listen_after_bind();
  listen_ended.store(true);
  ctx.shutting_down.store(true);
  engine.shutdown();
  // listen ended without a signal (an error): wake the waiter so it can be joined.
  if (!waiter_done.load()) pthread_kill(signal_waiter.native_handle(), SIGTERM);
  signal_waiter.join();
  std::fprintf(stderr, "sparkserve: stopped\n");
  return ok ? 0 : 1;
}

void add_serve_options(CLI::App* cmd, ServeOptions& opts) {
  ServeOptions* o = &opts;
  cmd->add_option("--model", o->model, "Model folder (config.json, *.safetensors, tokenizer.json, chat template)")->required();
  cmd->add_option("--host", o->host, "Address to listen on")->default_val("127.0.0.1");
  cmd->add_option("--port", o->port, "Port (0: any free port)")->default_val(8000);
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on every route but /health and /metrics (or env SPARKSERVE_API_KEY)");
  cmd->add_option("--served-model-name", o->served_model_name, "Model name clients send (default: --model)");
  cmd->add_option("--max-model-len", o->max_model_len, "Context length (default: max_position_embeddings, capped by the KV cache)");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Sequences running at once (GDN state slots)")->default_val(64);
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Tokens per engine step")->default_val(2048);
  cmd->add_option("--kv-blocks", o->kv_blocks, "KV cache blocks (default: from --kv-cache-mb)");
  cmd->add_option("--kv-cache-mb", o->kv_cache_mb, "KV cache budget in MiB (f32)")->default_val(256);
  cmd->add_option("--block-size", o->block_size, "Tokens per KV block")->default_val(16);
  cmd->add_option("--threads", o->threads, "Model worker threads (default: all cores)");
  cmd->add_option("--device", o->device, "Backend: cpu or cuda")->default_val("cpu");
  add_load_options(cmd, o->load);
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body (413 above)")->default_val(8 << 20);
  cmd->add_option("--request-timeout", o->request_timeout, "Seconds before a request is cancelled (0: never)")->default_val(600);
  cmd->add_option("--http-threads", o->http_threads, "HTTP worker threads (one per open connection)")->default_val(256);
  cmd->add_flag("--no-prefix-caching,--no-enable-prefix-caching", o->no_prefix_caching,
                "Turn the prefix cache off (shared KV blocks + GDN state snapshots; on by default)");
  cmd->add_option("--prefix-cache-state-mb", o->prefix_cache_state_mb,
                  "Memory for the prefix cache's GDN state snapshots, MiB (at most 4 per --max-num-seqs)")
      ->default_val(4096);
  cmd->add_option("--prefix-cache-snapshot-interval", o->prefix_cache_snapshot_interval,
                  "Tokens between state snapshots of a long prompt (0: only at its end and at shared prefixes)")
      ->default_val(2048);
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
