// Start-up warm-up for GPU serving: throwaway prompts of every power-of-two length up to the step
// budget, run through a private engine before the real one takes requests.
//
// Why: CUDA loads each kernel into the context on its first launch, and cuBLASLt picks (and loads)
// its kernels per token-count bucket, so without this the first requests of each size pay several
// ms per new kernel (a 320-token prefill of the 35B measured 69 ms cold against 39 ms warm on the
// H200). Every op's regime is a contiguous range of token counts, so powers of two reach each
// regime and each cuBLASLt bucket once.
#pragma once

#include <cstdint>

#include "runtime/engine.h"
#include "runtime/model_runner.h"

namespace sparkserve {

struct WarmUpResult {
  int prompts = 0;
  double seconds = 0;
};

// Runs prompts of 1, 2, 4, ... tokens up to min(config.max_num_batched_tokens, max_model_len - 2)
// (each with 2 generated tokens: a decode step too) on an engine with no observer and no prefix
// cache, so nothing shows in the server's metrics or cache. The runner's state memory is left as
// garbage that the next engine's accounting treats as free.
WarmUpResult warm_up(ModelRunner& runner, EngineConfig config);

}  // namespace sparkserve
