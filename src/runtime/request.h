// One generation request as the engine sees it, and the channel its results travel back on.
// The HTTP side creates the request, submits it, and drains `out`; the engine thread only ever
// pushes to `out` (never blocks on a client) and reads `cancelled` at the start of every step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/multimodal.h"
#include "runtime/sampler.h"
#include "runtime/sampling_params.h"
#include "runtime/token_constraint.h"

namespace sparkserve {

// The logprob of one prompt token given the tokens before it (EngineRequest::prompt_logprobs).
struct PromptLogprob {
  int32_t position = 0;  // index in the prompt, >= 1 (the first token has no logprob)
  SampleResult lp;       // token = prompt[position], logprob, rank, top
};

// What the engine reports: one generated token, prompt logprobs, or the end of the request.
struct EngineEvent {
  bool finished = false;
  int32_t token = -1;                  // -1 in a prompt-logprobs event
  std::vector<PromptLogprob> prompt;   // prompt logprobs of one prefill chunk (token -1)
  SampleResult sample;          // logprob fields filled when params.num_logprobs >= 0
  std::string finish_reason;    // "stop" | "length" | "abort" | "error" (finished only)
  std::optional<int32_t> stop_token;  // the request stop id that ended it
  std::string error;            // finish_reason "error": what went wrong
  // On the first generated token: how many prompt tokens the prefix cache supplied (else -1).
  int64_t num_cached_tokens = -1;
};

// A thread-safe queue: the engine pushes, one HTTP thread pops.
class OutputChannel {
 public:
  void push(EngineEvent e);
  // Waits up to `timeout` for events; returns everything queued (empty on timeout).
  std::vector<EngineEvent> pop_all(std::chrono::milliseconds timeout);
  // Called after every push, on the pushing thread (quick, never blocking): lets one consumer
  // service many channels from a worker pool instead of one waiting thread per channel.
  void set_on_push(std::function<void()> fn);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineEvent> q_;
  std::function<void()> on_push_;
};

// When the engine first admitted a request and when it produced its first token (metrics).
struct RequestTimeline {
  std::optional<std::chrono::steady_clock::time_point> admitted, first_token;
};

struct EngineRequest {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  SamplingParams params;
  // The prompt's images (prompt already expanded: one image token per merged patch block) and its
  // M-RoPE positions; null for text. The model runner hands it to every chunk that starts inside
  // the prompt part it covers; once submitted only the engine thread touches it, and it is freed
  // (with the image embeddings in backend memory) on that thread when the request ends.
  std::shared_ptr<MultimodalPrompt> mm;
  // k >= 0: report each prompt token's logprob plus the top k (echo with logprobs, as
  // lm-eval's loglikelihood requests send). Needs the logits of every prompt position, so the
  // prompt goes through in chunks of at most kPromptLogprobsChunk tokens and never resumes from
  // the prefix cache.
  int prompt_logprobs = -1;
  // max_tokens 0 (echo): finish with "length" after the prompt, without sampling.
  bool prompt_only = false;
  // Constrained decoding (tool_choice required / named): masks every sampled token and sees
  // every token taken. Used only by the engine thread once submitted.
  std::shared_ptr<TokenConstraint> constraint;
  // Prompt positions where a conversation is likely to continue differently (the HTTP side gives
  // where the chat template's generation prompt starts): the prefix cache saves the state there.
  std::vector<int64_t> snapshot_hints;
  // Speculative decoding: drafts per step for this request, at most the engine's setting;
  // -1: the engine's setting, 0: none (per-request opt-out).
  int64_t num_speculative_tokens = -1;
  std::atomic<bool> cancelled{false};  // set by the HTTP side (disconnect, timeout, stop string)
  // Set (before `cancelled`) when the HTTP side ended the request on a stop string: the engine
  // then counts it as finished with "stop", not "abort".
  std::atomic<bool> stopped_by_string{false};
  OutputChannel out;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
};

}  // namespace sparkserve
