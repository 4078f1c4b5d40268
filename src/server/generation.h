// One generation as the HTTP side drives it: the engine request, the text pipeline its tokens
// go through (streaming detokenizer with stop strings, output parser for reasoning and tool
// calls), and GenerationJobs, which runs every in-flight generation's step function on the
// server's workers whenever there is something to do, so no thread waits per request.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/request.h"
#include "server/api_error.h"
#include "server/openai_response.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace sparkserve {

// Destroying it cancels the engine request (its slot and blocks are freed at the next step).
struct Generation {
  std::shared_ptr<EngineRequest> er;
  std::unique_ptr<StreamingDetokenizer> detok;
  std::unique_ptr<StreamingOutputParser> parser;  // chat only
  bool include_reasoning = true;
  int num_logprobs = -1;
  std::vector<int32_t> token_ids;    // generated
  int64_t cached_tokens = -1;        // prompt tokens the prefix cache supplied (engine's first token)
  std::string text;                  // detokenized (completions)
  std::vector<TokenLogprobs> logprobs;
  std::vector<PromptLogprob> prompt_logprobs;  // er->prompt_logprobs >= 0: positions 1.. in order
  std::optional<std::chrono::steady_clock::time_point> first_token;  // when the first token arrived
  bool done = false;
  std::string finish_reason;
  ResponseJson stop_reason = nullptr;
  std::optional<ApiError> error;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  ~Generation() {
    if (er) er->cancelled.store(true);
  }
};

// New text / token pieces since the last pump, for one chunk.
struct Piece {
  std::string text;
  OutputDelta delta;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprobs> logprobs;
};

// Takes what the engine has produced so far (never waits) into `p`; sets g.done at the end, and
// g.error when the generation failed. timeout_s > 0: past it the request is cancelled and ends
// with finish_reason "abort".
void pump(Generation& g, const Tokenizer& tok, double timeout_s, Piece& p);

// Runs step functions on a worker pool. A job's step runs when woken (its engine channel got
// events, its client drained or went away) and at least every kTick; never two at once for one
// job. A step returns true when the job is finished; it is then dropped.
class GenerationJobs {
 public:
  static constexpr auto kTick = std::chrono::milliseconds(100);

  explicit GenerationJobs(std::function<void(std::function<void()>)> post);
  ~GenerationJobs();  // stops the ticker; jobs still queued on the pool keep their state alive

  // `channel`: the engine request whose pushes wake the job (set before it is submitted).
  // Returns a wake function (e.g. for Responder::on_wake).
  std::function<void()> add(OutputChannel& channel, std::function<bool()> step);
  size_t active() const;

  struct Job;

 private:
  void wake(const std::shared_ptr<Job>& job);
  void tick_loop();

  std::function<void(std::function<void()>)> post_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Job>> jobs_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread ticker_;
};

}  // namespace sparkserve
