// The engine tests' model runner: no model, exact state bookkeeping (see FakeRunner).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "runtime/model_runner.h"

namespace sparkserve::test {

constexpr int64_t kFakeVocab = 50;

// A model runner without a model, exact by construction. Its "state" is a hash of every token
// folded in and its "KV cache" holds the token ids written at each position, so every step checks
// that the scheduler's plan is consistent: the state row of each chunk holds exactly the tokens
// its KV blocks hold at positions [0, start_pos) (a wrong restore, a missing block, a shared block
// overwritten by another sequence all show up as an error). Next token = (last input token + 1)
// % vocab, as a one-hot row; or, with prefix_dependent, a function of every token before it (the
// state hash), so any prefix-cache mistake changes the output.
class FakeRunner : public ModelRunner {
 public:
  std::vector<std::vector<int64_t>> batches;  // per step: tokens per sequence
  std::chrono::microseconds delay{0};         // per forward, to keep a request running
  bool prefix_dependent = false;
  int64_t tokens_run = 0;                     // tokens through the "model", all steps
  int64_t saves_run = 0;                      // state saves inside forwards, all steps

  explicit FakeRunner(CacheGeometry g)
      : geo_(g),
        hash_(static_cast<size_t>(g.num_slots + g.num_snapshots), 0),
        len_(hash_.size(), -1),
        kv_(static_cast<size_t>(g.num_blocks), std::vector<int32_t>(static_cast<size_t>(g.block_size), -1)) {}
  CacheGeometry geometry() const override { return geo_; }

  Expected<StepOutput> execute(const StepPlan& plan) override {
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    run_ops(plan.before);
    StepOutput out;
    out.logits.vocab = kFakeVocab;
    std::vector<int64_t> sizes;
    for (const ScheduledChunk& c : plan.chunks) {
      const size_t row = static_cast<size_t>(c.gdn_slot);
      if (c.gdn_slot < 0 || c.gdn_slot >= geo_.num_slots) return make_error("chunk without a live slot");
      if (len_[row] != c.start_pos)
        return make_error("state row holds " + std::to_string(len_[row]) + " tokens, chunk starts at " +
                          std::to_string(c.start_pos));
      const int64_t end = c.start_pos + static_cast<int64_t>(c.tokens.size());
      if (static_cast<int64_t>(c.block_table.size()) * geo_.block_size < end) return make_error("block table too short");
      uint64_t h = 0;
      for (int64_t p = 0; p < c.start_pos; ++p) {
        const int32_t t = at(c.block_table, p);
        if (t < 0) return make_error("KV position " + std::to_string(p) + " was never written");
        h = mix(h, t);
      }
      if (h != hash_[row]) return make_error("the KV blocks do not hold the tokens of the state");
      size_t save = 0;
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        at(c.block_table, c.start_pos + static_cast<int64_t>(i)) = c.tokens[i];
        hash_[row] = mix(hash_[row], c.tokens[i]);
        for (; save < c.saves.size() && c.saves[save].tokens == static_cast<int64_t>(i) + 1; ++save) {
          const auto dst = static_cast<size_t>(c.saves[save].row);
          if (c.saves[save].row < geo_.num_slots || dst >= hash_.size()) return make_error("save into a live row");
          hash_[dst] = hash_[row];
          len_[dst] = c.start_pos + static_cast<int64_t>(i) + 1;
        }
      }
      if (save != c.saves.size()) return make_error("a save outside its chunk or out of order");
      saves_run += static_cast<int64_t>(save);
      len_[row] = end;
      sizes.push_back(static_cast<int64_t>(c.tokens.size()));
      tokens_run += static_cast<int64_t>(c.tokens.size());
      for (int64_t r = 0; r < c.num_logits; ++r) {
        const int32_t last = c.tokens[c.tokens.size() - static_cast<size_t>(c.num_logits - r)];
        const int64_t next = prefix_dependent ? static_cast<int64_t>((hash_[row] >> 17) % kFakeVocab) : (last + 1) % kFakeVocab;
        out.logits.data.resize(out.logits.data.size() + kFakeVocab, 0.0f);
        out.logits.data[out.logits.data.size() - kFakeVocab + static_cast<size_t>(next)] = 10.0f;
        ++out.logits.rows;
      }
    }
    if (!plan.chunks.empty()) batches.push_back(sizes);
    return out;
  }

 private:
  static uint64_t mix(uint64_t h, int32_t t) { return (h ^ static_cast<uint64_t>(t + 1)) * 0x100000001b3ULL + 7; }
  int32_t& at(std::span<const int32_t> table, int64_t pos) {
    return kv_[static_cast<size_t>(table[static_cast<size_t>(pos / geo_.block_size)])]
              [static_cast<size_t>(pos % geo_.block_size)];
  }
  void run_ops(const std::vector<StateOp>& ops) {
    for (const StateOp& op : ops) {
      switch (op.kind) {
        case StateOp::Kind::kZeroState:
          hash_[static_cast<size_t>(op.dst)] = 0;
          len_[static_cast<size_t>(op.dst)] = 0;
          break;
        case StateOp::Kind::kCopyState:
          hash_[static_cast<size_t>(op.dst)] = hash_[static_cast<size_t>(op.src)];
          len_[static_cast<size_t>(op.dst)] = len_[static_cast<size_t>(op.src)];
          break;
        case StateOp::Kind::kCopyKvBlock:
          kv_[static_cast<size_t>(op.dst)] = kv_[static_cast<size_t>(op.src)];
          break;
      }
    }
  }

  CacheGeometry geo_;
  std::vector<uint64_t> hash_;
  std::vector<int64_t> len_;
  std::vector<std::vector<int32_t>> kv_;
};

}  // namespace sparkserve::test
