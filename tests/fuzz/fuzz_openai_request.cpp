// libFuzzer entry point: any byte string as a request body must parse into a request or a 4xx
// error (never crash, hang or throw), and what a valid request leads to (default resolution,
// one sampling step, response and error serialization) must not crash either.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"
#include "server/openai_request.h"
#include "server/openai_response.h"

namespace {

using namespace sparkserve;

constexpr int64_t kVocab = 512;

void check_error(const ApiError& e) {
  if (e.status < 400 || e.status > 499 || e.message.empty()) __builtin_trap();
  (void)serialize_json(error_json(e));
}

void run_sampling(const GenerationRequest& g) {
  auto budget = check_context_length(8, g.sampling.max_tokens, 4096);
  if (!budget.ok()) return check_error(budget.error());
  SamplingParams p = resolve_sampling_params(g.sampling, GenerationDefaults{}, *budget);
  std::vector<float> logits(kVocab);
  for (int64_t i = 0; i < kVocab; ++i) logits[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 23) * 0.3f;
  std::vector<int32_t> prompt = {1, 2, 3}, output = {4, 4, 5};
  SampleResult r = sample_token(logits, p, prompt, output);
  if (r.token < 0 || r.token >= kVocab) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  static const ServedModelInfo info{{"qwen"}, 4096, kVocab};

  if (auto chat = parse_chat_request(body, info); chat.ok()) {
    (void)serialize_json(chat->messages);
    (void)serialize_json(chat->tools);
    run_sampling(*chat);
  } else {
    check_error(chat.error());
  }
  if (auto c = parse_completion_request(body, info); c.ok()) run_sampling(*c);
  else check_error(c.error());
  if (auto t = parse_tokenize_request(body, info); !t.ok()) check_error(t.error());
  if (auto d = parse_detokenize_request(body, info); !d.ok()) check_error(d.error());
  return 0;
}
