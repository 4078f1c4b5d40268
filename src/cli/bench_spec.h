// bench's speculative decoding cases (--spec-k): B sequences decode with k MTP drafts per step,
// each step = one verify forward of k + 1 tokens per sequence, then the GDN commit of the accepted
// prefix and the MTP pass that proposes the next drafts (what the engine runs per step, without
// scheduling or sampling). Acceptance is either the model's own (greedy: a draft is accepted iff it
// is the argmax of its verify row) or forced: each draft in order is accepted with probability A
// until the first rejection, which simulates a real model's acceptance on random synthetic weights.
// The verify rows come back as their argmax only (as a served greedy step's do).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "core/status.h"
#include "model/qwen35.h"
#include "runtime/direct_state.h"

namespace sparkserve::cli {

struct SpecCase {
  int batch = 1;
  int context = 0;
  int k = 1;                // drafts per step
  double forced_accept = -1;  // [0, 1]: forced acceptance rate; < 0: the model's own drafts (greedy)
  int steps = 32;           // timed steps (after 2 warm-up steps)
  bool fill_zeros = true;   // the context as zeros in the KV cache (else prefilled by `prefill`)
};

struct SpecResult {
  double verify_ms = 0;   // per step: the verify forward (logits on the host)
  double commit_ms = 0;   // per step: the GDN commit of the accepted prefix
  double propose_ms = 0;  // per step: MTP rows + chained drafts (draft ids on the host)
  std::vector<double> pass_ms;  // per step: each MTP pass of the proposal (the first: the rows + draft 1)
  // Per sequence and step: accepted drafts + 1. Forced acceptance: the simulation's expectation
  // 1 + A + ... + A^k (a batch-1 run of a few dozen steps draws it with a spread of ~±10%, which would
  // swing the speedup as much); the model's own acceptance: the mean of the steps run.
  double tokens_per_step = 0;
  double sampled_tokens_per_step = 0;  // the mean of the steps run, either way
  double step_ms() const { return verify_ms + commit_ms + propose_ms; }
};

using PrefillFn = std::function<Expected<Logits>(DirectState&, SequenceState&, int64_t)>;

// limits: block size and KV dtype (the rest is sized here). The model must have its MTP layer.
Expected<SpecResult> run_spec_case(Backend& backend, Qwen35Model& model, StateLimits limits, const SpecCase& c,
                                   const PrefillFn& prefill, std::mt19937& rng);

}  // namespace sparkserve::cli
