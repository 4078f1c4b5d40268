// Next-token selection for one sequence, in vLLM v1's order:
//   raw logits --(logprobs are read here: log_softmax of the raw row)
//   -> allowed_token_ids and constraint masks -> logit_bias -> min_tokens mask (EOS + stop ids)
//   -> repetition penalty (prompt + output), frequency and presence penalties (output only)
//   -> greedy: argmax (lowest id on exact ties, as torch.argmax)
//   -> random: / temperature -> min_p -> top_k -> top_p -> one draw from what is left.
// The draw is inverse-CDF over the kept tokens in id order with one uniform number that is a pure function of (seed, step), step = number of tokens generated so
// far. So a request's output depends only on its own logits, history, parameters and step,
// never on the batch it ran in or on other requests (batch invariance, reproducible seeds,
// identical draws after a preemption recomputes the sequence).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "runtime/sampling_params.h"

namespace sparkserve {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  // Only when params.num_logprobs >= 0. Raw-model logprobs (vLLM's default logprobs_mode
  // "raw_logprobs"): log_softmax of the logits before any penalty, bias, mask or temperature.
  std::optional<float> logprob;     // of `token`
  int32_t rank = 0;                 // 1 + number of tokens with a strictly larger raw logit
  std::vector<TokenLogprob> top;    // num_logprobs most likely, logit desc then id asc
  // Set when the raw logits held NaN or +Inf (the first such token id): nothing was sampled and
  // the request must fail instead.
  std::optional<int32_t> nonfinite_logit;
};

// logits: [vocab] f32; prompt / output: token ids of the sequence (output = generated so far);
// allowed: empty, or [vocab] 0/1 from the request's TokenConstraint (0 = masked).
SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::span<const int32_t> prompt, std::span<const int32_t> output,
                          std::span<const uint8_t> allowed = {});

// Raw logprobs of `token` in a logits row: its log_softmax value, rank (1 + tokens with a larger
// logit) and the num_top most likely tokens (logit desc, id asc). logits: [vocab] f32.
SampleResult token_logprobs(std::span<const float> logits, int32_t token, int num_top);

// ---- the steps, exposed for tests -------------------------------------------------------------

// Uniform double in [0, 1) from (seed, step): a counter-based hash (two splitmix64 rounds).
double uniform_for_step(uint64_t seed, uint64_t step);

// logits: [vocab] f32 -> [vocab] f32 log_softmax (computed in double).
std::vector<float> log_softmax(std::span<const float> logits);

// The processors before greedy / random selection (masks, bias, min_tokens, penalties), in place.
// logits: [vocab] f32, in place; allowed: empty or [vocab] 0/1 (a constraint's mask, applied
// with allowed_token_ids).
void apply_logits_processors(std::span<float> logits, const SamplingParams& params,
                             std::span<const int32_t> prompt, std::span<const int32_t> output,
                             std::span<const uint8_t> allowed = {});

// logits: [vocab] f32, in place. vLLM/HF repetition penalty over prompt+output: positive logits
// are divided by `penalty`, the others multiplied; then OpenAI's frequency (x count in output)
// and presence (x [in output]) penalties are subtracted.
void apply_penalties(std::span<float> logits, float repetition_penalty, float frequency_penalty,
                     float presence_penalty, std::span<const int32_t> prompt,
                     std::span<const int32_t> output);

// Lowest index of the maximum (NaN never wins). logits: [vocab] f32.
int32_t argmax_lowest(std::span<const float> logits);
// What a backend must do where the logits are to pick the token sample_token would pick: an argmax
// (draw.temperature 0) or a draw (Backend::draw with the step's uniform number), leaving out
// `excluded` (the stop ids while fewer than min_tokens were generated, min_tokens' mask; empty
// after). nullopt when another logits processor changes the row (penalties, bias, allowed ids, a
// constraint) or logprobs are wanted: then the whole row comes back. num_generated: the sequence's
// output tokens so far.
struct DeviceChoice {
  std::vector<int32_t> excluded;
  RowDraw draw;
};
std::optional<DeviceChoice> device_choice(const SamplingParams& params, bool constrained, int64_t num_generated);

struct Candidate {
  int32_t token;
  double prob;  // renormalized over the kept candidates
};

// The distribution a random draw uses: softmax(logits / temperature), then min_p (keep
// p >= min_p * p_max), top_k (keep logits >= the k-th largest, ties kept, as vLLM), top_p (keep,
// in (prob desc, id asc) order, each token whose preceding cumulative probability is < top_p:
// the minimal prefix reaching top_p). Returned in id order, renormalized. Empty when no token
// has a finite logit. Cost O(vocab) plus a sort of the kept head only.
// logits: [vocab] f32 (after the processors).
std::vector<Candidate> truncated_distribution(std::span<const float> logits, float temperature,
                                              int32_t top_k, float top_p, float min_p);

}  // namespace sparkserve
