#include "cli/bench_spec.h"

#include <algorithm>
#include <chrono>

namespace sparkserve::cli {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }


}  // namespace

Expected<SpecResult> run_spec_case(Backend& be, Qwen35Model& m, StateLimits lim, const SpecCase& sc,
                                   const PrefillFn& prefill, std::mt19937& rng) {
  if (!m.has_mtp()) return make_error("--spec-k: the model has no multi-token-prediction layer");
  const ModelConfig& c = m.config();
  const int B = sc.batch, k = sc.k;
  // Warm-up steps: kernel loads and host tables (step 0), the recordings of the verify step (step 1)
  // and of the commit after it (step 2).
  constexpr int kWarmUp = 3;
  const int64_t positions = sc.context + static_cast<int64_t>(sc.steps + kWarmUp) * (k + 1) + k + 1;
  lim.max_sequences = B;
  lim.mtp = true;
  lim.num_kv_blocks = static_cast<int32_t>(B * (positions / lim.block_size + 2));
  DirectState st(be, c, lim);
  std::vector<SequenceState> seqs;
  for (int i = 0; i < B; ++i) {
    SS_ASSIGN_OR_RETURN(SequenceState s, st.open_sequence());
    seqs.push_back(s);
  }
  if (sc.fill_zeros) {
    const StatePools& pools = st.state().pools();
    std::vector<const KvPool*> all;
    for (const KvPool& p : pools.kv) all.push_back(&p);
    all.push_back(&pools.mtp_kv);
    for (const KvPool* p : all)
      for (const Tensor* t : {&p->k, &p->v, &p->k_scale, &p->v_scale})
        if (t->data) be.fill_zero(*t);
    for (auto& s : seqs) SS_RETURN_IF_ERROR(st.skip_ahead(s, sc.context));
  } else {
    for (auto& s : seqs)
      if (sc.context > 0) SS_RETURN_IF_ERROR(prefill(st, s, sc.context).status());
  }
  auto random_id = [&] { return static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size)); };
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::vector<int32_t> next(static_cast<size_t>(B));
  std::vector<std::vector<int32_t>> drafts(static_cast<size_t>(B));
  for (int i = 0; i < B; ++i) {
    next[static_cast<size_t>(i)] = random_id();
    for (int j = 0; j < k; ++j) drafts[static_cast<size_t>(i)].push_back(random_id());
  }
  std::vector<SequenceInput> batch(static_cast<size_t>(B));
  SpecCapture capture;
  SpecResult r;
  int64_t emitted = 0;
  for (int step = 0; step < sc.steps + kWarmUp; ++step) {
    const bool timed = step >= kWarmUp;
    for (int i = 0; i < B; ++i) {
      SequenceInput& in = batch[static_cast<size_t>(i)];
      in.state = &seqs[static_cast<size_t>(i)];
      in.speculative = true;
      in.argmax_vocab = c.vocab_size;  // as a served greedy verify step: ids come back, not rows
      in.tokens.assign(1, next[static_cast<size_t>(i)]);
      in.tokens.insert(in.tokens.end(), drafts[static_cast<size_t>(i)].begin(), drafts[static_cast<size_t>(i)].end());
    }
    be.synchronize();
    const auto t0 = Clock::now();
    SS_ASSIGN_OR_RETURN(Logits logits, st.forward(m, batch, &capture));  // on the host: synchronised
    const double verify_ms = ms_since(t0);
    const auto t1 = Clock::now();
    std::vector<int64_t> accepted(static_cast<size_t>(B));
    std::vector<std::vector<int32_t>> rows_next(static_cast<size_t>(B));
    std::vector<Qwen35Model::DraftSeq> ds(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) {
      const auto bi = static_cast<size_t>(i);
      int a = 0;
      int32_t after = 0;
      if (sc.forced_accept >= 0) {
        while (a < k && u01(rng) < sc.forced_accept) ++a;
        after = random_id();
      } else {
        for (;; ++a) {
          after = logits.argmax[static_cast<size_t>(i * (k + 1) + a)].id;
          if (a == k || after != drafts[bi][static_cast<size_t>(a)]) break;
        }
      }
      accepted[bi] = a + 1;
      emitted += timed ? a + 1 : 0;
      // MTP rows of the accepted tokens (row p pairs with the token at p + 1), padded to the verify
      // span's k + 1 rows as the engine does (one MTP shape per batch: recorded once).
      rows_next[bi].assign(batch[bi].tokens.begin() + 1, batch[bi].tokens.begin() + 1 + a);
      rows_next[bi].push_back(after);
      rows_next[bi].resize(static_cast<size_t>(k + 1), after);
      ds[bi].draft_row = a;
      next[bi] = after;
      SequenceState& s = seqs[bi];
      const int64_t start = s.num_tokens;
      s.num_tokens += a + 1;
      SS_RETURN_IF_ERROR(st.reserve(s, s.num_tokens + k + 1));
      ds[bi].block_table = s.block_table;
      ds[bi].start_pos = start;
      ds[bi].next_tokens = rows_next[bi];
      ds[bi].hidden_row = static_cast<int64_t>(i) * (k + 1);
      ds[bi].num_drafts = k;
    }
    SS_RETURN_IF_ERROR(m.commit_speculative(capture, accepted, st.state().pools()));
    be.synchronize();
    const double commit_ms = ms_since(t1);
    const auto t2 = Clock::now();
    SS_ASSIGN_OR_RETURN(Qwen35Model::DraftResult d, m.draft(ds, capture.hidden, st.state().pools()));
    be.synchronize();
    drafts = std::move(d.drafts);
    if (timed) {
      r.verify_ms += verify_ms;
      r.commit_ms += commit_ms;
      r.propose_ms += ms_since(t2);
      r.pass_ms.resize(std::max(r.pass_ms.size(), d.pass_ms.size()));
      for (size_t i = 0; i < d.pass_ms.size(); ++i) r.pass_ms[i] += d.pass_ms[i];
    }
  }
  r.verify_ms /= sc.steps;
  r.commit_ms /= sc.steps;
  r.propose_ms /= sc.steps;
  for (double& ms : r.pass_ms) ms /= sc.steps;
  r.sampled_tokens_per_step = static_cast<double>(emitted) / (static_cast<double>(sc.steps) * B);
  r.tokens_per_step = r.sampled_tokens_per_step;
  if (sc.forced_accept >= 0) {
    double p = 1.0;
    r.tokens_per_step = 0.0;
    for (int i = 0; i <= k; ++i, p *= sc.forced_accept) r.tokens_per_step += p;
  }
  return r;
}

}  // namespace sparkserve::cli
