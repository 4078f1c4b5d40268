// The random draw of the sampler (runtime/sampler.h), shared by the host sampler and the backends
// that draw where the logits are: / temperature -> min_p and top_k -> top_p -> one inverse-CDF
// draw over the kept tokens in id order with a uniform number u in [0, 1).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sparkserve {

struct TruncatedItem {
  float s;  // logit / temperature
  int32_t id;
};

// The kept tokens in id order with their unnormalized weights exp(s - max s) and their sum.
struct Truncation {
  std::vector<TruncatedItem> items;
  std::vector<double> w;
  double total = 0.0;
};

// logits: [vocab] f32 (-inf and NaN are impossible tokens); temperature > 0; top_k 0 = off,
// top_p 1 = off, min_p 0 = off.
Truncation truncate(std::span<const float> logits, float temperature, int32_t top_k, float top_p, float min_p);

// One draw from truncate()'s distribution: the first kept token (id order) whose cumulative weight
// exceeds u * total, the last kept one when rounding leaves u * total at the end; -1 when no token is
// possible (no finite logit).
int32_t draw_truncated(std::span<const float> logits, float temperature, int32_t top_k, float top_p, float min_p,
                       double u);

}  // namespace sparkserve
