#include "runtime/warm_up.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace sparkserve {

WarmUpResult warm_up(ModelRunner& runner, EngineConfig config) {
  const auto t0 = std::chrono::steady_clock::now();
  config.enable_prefix_caching = false;
  const int64_t longest = std::min(config.max_num_batched_tokens, config.max_model_len - 2);
  WarmUpResult r;
  if (longest < 1 || config.vocab_size < 1) return r;
  Engine engine(runner, config, nullptr);
  uint64_t id = 1;
  for (int64_t n = 1; n <= longest; n *= 2) {
    auto req = std::make_shared<EngineRequest>();
    req->id = id++;
    req->prompt.resize(static_cast<size_t>(n));
    // Token ids spread over the vocabulary (any ids do: only the shapes matter).
    for (int64_t i = 0; i < n; ++i)
      req->prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + n * 104729) % config.vocab_size);
    req->params.temperature = 0.0f;
    req->params.max_tokens = 2;
    req->params.ignore_eos = true;
    engine.submit(req);
    while (engine.step()) {
    }
    ++r.prompts;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace sparkserve
