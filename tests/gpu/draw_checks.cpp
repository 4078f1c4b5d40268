// Backend::draw on CUDA vs the CPU backend (whose draw is the host sampler's draw_truncated) on fresh
// random rows: the drawn ids must be identical for every parameter set and uniform number.
// Why identical and not "close": both compute s = logit / temperature in float, the weights exp(s -
// max) and every sum in double; they differ only in exp's last bit and the summation order, so a
// draw can differ only where u * total lands within ~1e-15 of a cumulative boundary (~1e-12 per
// draw). The same holds for the cut of top_p. The CUDA draw decides most rows from a list of at most
// 4,096 candidates (the largest s) and sends the rest over the whole row: the sets and rows below
// take every route (top_k within / above the list, top_p mass within / beyond it, min_p deciding
// or not, a row kept whole, a row of equal logits that overflows the list, a row with no possible
// token). Grouped as `draw`: gpu_ops --only draw.
#include <cmath>
#include <limits>

#include "gpu_harness.h"

namespace sparkserve {
namespace {

void check_draws(Harness& h) {
  struct Params {
    const char* name;
    RowDraw d;
  };
  const Params sets[] = {
      {"temperature 1", {1.0f, 0, 1.0f, 0.0f, 0.0}},
      {"temperature 0.6 top_k 20 top_p 0.95", {0.6f, 20, 0.95f, 0.0f, 0.0}},
      {"temperature 0.7 top_p 0.8", {0.7f, 0, 0.8f, 0.0f, 0.0}},
      {"temperature 1 min_p 0.05", {1.0f, 0, 1.0f, 0.05f, 0.0}},
      {"temperature 1.5 top_k 1", {1.5f, 1, 1.0f, 0.0f, 0.0}},
      {"temperature 0.3 top_k 50 top_p 0.5 min_p 0.01", {0.3f, 50, 0.5f, 0.01f, 0.0}},
      {"temperature 0.7 top_p 0.95", {0.7f, 0, 0.95f, 0.0f, 0.0}},
      {"temperature 1 top_p 0.95 (mass beyond the list)", {1.0f, 0, 0.95f, 0.0f, 0.0}},
      {"temperature 2 top_k 3000", {2.0f, 3000, 1.0f, 0.0f, 0.0}},
      {"temperature 0.8 top_k 10000 (above the list)", {0.8f, 10000, 1.0f, 0.0f, 0.0}},
      {"temperature 1 min_p 0.0001 (below the list)", {1.0f, 0, 1.0f, 0.0001f, 0.0}},
  };
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  for (auto [R, V, vocab] : std::vector<std::array<int64_t, 3>>{{8, 1000, 1000}, {8, 5000, 4099}, {64, 248320, 248077}}) {
    auto v = randn(R * V, 3.0f);
    for (int64_t r = 0; r < R; ++r) {
      float* row = v.data() + r * V;
      if (r % 8 == 1) row[(r * 977) % vocab] = std::numeric_limits<float>::quiet_NaN();
      if (r % 8 == 2)  // ties at the top: top_k / top_p cuts inside a run of equal logits
        for (int64_t i = 0; i < 40; ++i) row[(i * 131 + r) % vocab] = 9.0f;
      if (r % 8 == 3)  // a peaked row: top_p keeps one or two tokens
        row[(r * 53) % vocab] = 40.0f;
      if (r % 8 == 4)  // masked tokens (-inf), as a processor leaves them
        for (int64_t i = 0; i < vocab; i += 3) row[i] = -std::numeric_limits<float>::infinity();
      if (r % 8 == 5)  // all equal: every token tied, more than the candidate list holds
        for (int64_t i = 0; i < vocab; ++i) row[i] = 0.25f;
      if (r % 16 == 6)  // nothing possible: the lowest column not excluded
        for (int64_t i = 0; i < vocab; ++i) row[i] = -std::numeric_limits<float>::infinity();
      if (vocab < V) row[vocab] = 1e30f;  // beyond the limit: never drawn
    }
    Pair l = h.f32({R, V}, v);
    std::vector<int32_t> excluded = {0, static_cast<int32_t>((7 * 13) % vocab), static_cast<int32_t>(vocab / 2)};
    for (const Params& ps : sets)
      for (const std::vector<int32_t>& ex : {std::vector<int32_t>{}, excluded}) {
        int64_t bad = 0, drawn = 0;
        for (int rep = 0; rep < 3; ++rep) {
          std::vector<RowDraw> rows(static_cast<size_t>(R), ps.d);
          for (int64_t r = 0; r < R; ++r) {
            rows[static_cast<size_t>(r)].u = rep == 2 ? 0.999999999 : uni(g_rng);
            if (r % 8 == 7) rows[static_cast<size_t>(r)].temperature = 0.0f;  // not drawn
          }
          const auto a = h.cpu->draw(l.cpu(), vocab, ex, rows), b = h.gpu->draw(l.gpu(), vocab, ex, rows);
          if (a.size() != b.size()) {
            bad = -1;
            break;
          }
          for (size_t i = 0; i < a.size(); ++i) {
            bad += !(a[i] == b[i]);
            drawn += rows[i].temperature > 0.0f;
          }
        }
        record("draw", std::string(ps.name) + " rows " + sz({R, V}) + " vocab " + std::to_string(vocab) +
                           (ex.empty() ? "" : ", 3 excluded") + " (" + std::to_string(drawn) + " draws)",
               bad < 0 ? INFINITY : static_cast<double>(bad), kExact);
      }
  }
}

RegisterOpChecks reg_draw("draw", check_draws);

}  // namespace
}  // namespace sparkserve
