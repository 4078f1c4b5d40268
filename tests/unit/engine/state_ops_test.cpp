// The model runner's state operations (StateOp: zero a GDN row, copy a GDN row, copy a KV block)
// against running them one by one in list order on a host copy of the state. The runner sends its
// copies to Backend::copy_batch, which runs a batch's copies at once: lists whose ops read what an
// earlier op wrote (or write what it read) must come out as in list order. Random lists over few rows
// make such chains common. Exact: the ops move bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/load.h"
#include "runtime/model_runner.h"

namespace sparkserve::test {
namespace {

const std::filesystem::path kTiny = std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests/fixtures/qwen35-moe-tiny";

// Every state tensor, with whether its rows are GDN rows (else KV blocks).
std::vector<std::pair<Tensor, bool>> state_tensors(ModelState& s) {
  std::vector<std::pair<Tensor, bool>> t;
  for (int l = 0; l < s.gdn().num_layers(); ++l) {
    t.emplace_back(s.gdn().conv_pool(l), true);
    t.emplace_back(s.gdn().recurrent_pool(l), true);
  }
  for (int l = 0; l < s.kv().num_layers(); ++l) {
    const KvPool& p = s.kv().pool(l);
    for (const Tensor* x : {&p.k, &p.v, &p.k_scale, &p.v_scale})
      if (x->data) t.emplace_back(*x, false);
  }
  return t;
}

TEST(StateOps, BatchedCopiesEndAsListOrder) {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  auto model = load_qwen35(kTiny, *backend);
  ASSERT_TRUE(model.ok()) << model.message();
  // fp8 KV (scale pools too) and an MTP pool: every kind of tensor a block copy moves.
  ModelState state(*backend, (*model)->config(), StateLimits{2, 4, 16, 2, DType::kF8E4M3, true});
  Qwen35Runner runner(**model, state);
  const auto tensors = state_tensors(state);
  ASSERT_GT(tensors.size(), 4u);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    // Fresh random bytes everywhere; the reference is a host copy updated op by op.
    std::vector<std::vector<unsigned char>> ref;
    for (const auto& [t, gdn] : tensors) {
      auto* p = static_cast<unsigned char*>(t.data);
      for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng());
      ref.emplace_back(p, p + t.nbytes());
    }
    StepPlan plan;
    const int n = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) {
      StateOp op;
      op.kind = static_cast<StateOp::Kind>(rng() % 3);
      const int32_t rows = 4;  // GDN rows: 2 slots + 2 snapshots; KV blocks: 4
      op.dst = static_cast<int32_t>(rng() % rows);
      if (op.kind != StateOp::Kind::kZeroState) {
        op.src = static_cast<int32_t>(rng() % (rows - 1));
        if (op.src >= op.dst) ++op.src;
      }
      plan.before.push_back(op);
      const bool gdn_op = op.kind != StateOp::Kind::kCopyKvBlock;
      for (size_t k = 0; k < tensors.size(); ++k) {
        if (tensors[k].second != gdn_op) continue;
        const size_t row = ref[k].size() / static_cast<size_t>(tensors[k].first.dim(0));
        unsigned char* d = ref[k].data() + row * static_cast<size_t>(op.dst);
        if (op.kind == StateOp::Kind::kZeroState)
          std::memset(d, 0, row);
        else
          std::memcpy(d, ref[k].data() + row * static_cast<size_t>(op.src), row);
      }
    }
    ASSERT_TRUE(runner.execute(plan).ok());
    for (size_t k = 0; k < tensors.size(); ++k)
      ASSERT_EQ(0, std::memcmp(tensors[k].first.data, ref[k].data(), ref[k].size()))
          << "trial " << trial << ", state tensor " << k << ", " << n << " ops";
  }
}

TEST(StateOps, CopyBatchRejectsDependentCopies) {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  Buffer pool(backend.get(), DType::kF32, {4, 8});
  const Tensor& t = pool.tensor();
  // Sources may share rows; destinations may not be read or written by another copy of the batch.
  backend->copy_batch(std::vector<TensorCopy>{{t.rows(1, 1), t.rows(0, 1)}, {t.rows(2, 1), t.rows(0, 1)}});
  EXPECT_DEATH(backend->copy_batch(std::vector<TensorCopy>{{t.rows(1, 1), t.rows(0, 1)}, {t.rows(2, 1), t.rows(1, 1)}}),
               "overlaps");
  EXPECT_DEATH(backend->copy_batch(std::vector<TensorCopy>{{t.rows(1, 1), t.rows(0, 1)}, {t.rows(1, 1), t.rows(2, 1)}}),
               "overlaps");
  EXPECT_DEATH(backend->copy(t.rows(1, 2), t.rows(2, 2)), "overlaps");
}

}  // namespace
}  // namespace sparkserve::test
