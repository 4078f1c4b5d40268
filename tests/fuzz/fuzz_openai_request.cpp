// libFuzzer entry point: any byte string as a request body must parse into a request or a 4xx
// error (never crash, hang or throw), and what a valid request leads to (default resolution,
// one sampling step, response and error serialization) must not crash either. The bodies' fast
// JSON parser is checked against nlohmann's on every input: it gives exactly nlohmann's value (the
// same types down to signed / unsigned / float numbers, the same member order) or nothing.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"
#include "server/openai_request.h"
#include "server/json_parse.h"
#include "server/openai_response.h"
#include "../common/request_json_same.h"

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

void check_fast_parse(std::string_view body) {
  const std::optional<RequestJson> fast = parse_json_fast(body, 64);
  if (!fast) return;
  RequestJson ref;
  try {
    ref = RequestJson::parse(body.begin(), body.end());
  } catch (...) {
    __builtin_trap();  // the fast parser accepted what nlohmann rejects
  }
  if (!same_request_json(*fast, ref)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  static const ServedModelInfo info{{"qwen"}, 4096, kVocab};
  check_fast_parse(body);

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
